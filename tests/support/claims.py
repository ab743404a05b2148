"""A ModelClaim for the generated tiny GGUF model on a CPU pool (llama.cpp), as the local controller reads it.

Used by the runtime and UI tests and by scripts/screenshot_state.py.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["claim_yaml"]

_CLAIM = """
kind: ModelClaim
metadata: {name: NAME}
spec:
  modelName: NAME
  podSelector: {matchLabels: {pool: cpu}}
  artifactURL: file://MODEL
  engine: llamacpp
  engineConfig: {args: {"--ctx-size": "256"}}
"""


def claim_yaml(name: str, model: Path | str) -> str:
    """The claim ``name`` serving model ``name`` from the GGUF file ``model``."""
    return _CLAIM.replace("NAME", name).replace("MODEL", str(model))
