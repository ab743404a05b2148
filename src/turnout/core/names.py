"""Model names: the one place that says which names are the same model and which names are acceptable.

Ollama treats a name without a tag as ``<name>:latest`` (``gemma4`` and ``gemma4:latest`` are one model;
a tag is what follows the last ``:`` of the last ``/``-separated segment, so ``host:5000/m`` is tagless).
Turnout applies that rule to every worker type and every place a name is compared: placement rules,
key scopes, per-model limits, inventory look-ups, discovery lists and the placement matrix. Comparing
through :func:`canonical` is what keeps a rule shown as blocking from being bypassed by the other spelling.

Used by :mod:`turnout.core.patterns` (and so placement, scopes and limits), :mod:`turnout.core.routing`,
and the intake of every client and admin path (:func:`model_name_problem`).
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["DEFAULT_TAG", "MAX_MODEL_NAME", "canonical", "has_tag", "lookup", "model_name_problem"]

DEFAULT_TAG = "latest"
_LATEST = ":" + DEFAULT_TAG
MAX_MODEL_NAME = 256  # characters; longer names are refused at intake (no engine uses longer ones)


def has_tag(name: str) -> bool:
    """Whether ``name`` carries an explicit tag (``:`` in its last path segment)."""
    return ":" in name.rsplit("/", 1)[-1]


def canonical(name: str) -> str:
    """The comparison form of a model name: tagless names get Ollama's implicit ``:latest``."""
    return name if has_tag(name) else f"{name}:{DEFAULT_TAG}"


def lookup(model: str, names: Collection[str] | None) -> str | None:
    """The entry of ``names`` (an inventory) that is ``model``: the same spelling first, else the other
    spelling of the same model (``gemma4`` <-> ``gemma4:latest``). None when absent or unknown."""
    if names is None:
        return None
    if model in names:
        return model
    if not has_tag(model):
        tagged = f"{model}:{DEFAULT_TAG}"
        return tagged if tagged in names else None
    if model.endswith(_LATEST):
        bare = model[: -len(_LATEST)]
        if bare in names and not has_tag(bare):
            return bare
    return None


def model_name_problem(name: object, field: str = "model") -> str | None:
    """Why ``name`` cannot be a model name (a message naming ``field``), or None when it can."""
    if not isinstance(name, str):
        return f'"{field}" must be a string naming the model'
    if not name.strip():
        return f'"{field}" is empty: name the model to use'
    if len(name) > MAX_MODEL_NAME:
        return f'"{field}" is {len(name)} characters long; model names are at most {MAX_MODEL_NAME}'
    if name.isprintable():  # at C speed: none of the characters below is printable
        return None
    for ch in name:
        if ch < " " or ch == "\x7f" or "\x80" <= ch <= "\x9f" or ch in "\u2028\u2029":
            return f'"{field}" contains the control character U+{ord(ch):04X}; model names are printable text'
    return None
