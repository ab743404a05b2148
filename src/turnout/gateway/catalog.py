"""What clients may discover: models on healthy workers, hiding those placement blocks there.

``/api/tags`` and ``/v1/models`` list a model if at least one healthy worker has it installed and
its placement rules allow it. The admin inventory (unfiltered) lives in the admin API.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from turnout.core.placement import resolve_placement
from turnout.fleet.state import Fleet, WorkerState

__all__ = ["iso_time", "ollama_ps", "ollama_tags", "openai_models", "unknown_details"]


Visible = Callable[[str], bool]


def _everything(_: str) -> bool:
    return True


def _visible(fleet: Fleet, allowed: Visible) -> dict[str, list[tuple[WorkerState, dict[str, Any]]]]:
    """Model name -> (worker, raw inventory entry) for every healthy worker allowed to serve it, limited to
    the names ``allowed`` accepts (the caller's key scopes)."""
    out: dict[str, list[tuple[WorkerState, dict[str, Any]]]] = {}
    for state in fleet.workers.values():
        if not state.healthy or state.inventory is None:
            continue
        rules, _ = fleet.rules(state.name)
        for name, entry in state.tags.items():
            if allowed(name) and resolve_placement(rules, name).allowed:
                out.setdefault(name, []).append((state, entry))
    return out


def ollama_tags(fleet: Fleet, allowed: Visible = _everything) -> dict[str, Any]:
    models = []
    for name, holders in sorted(_visible(fleet, allowed).items()):
        state, entry = holders[0]
        if fleet.is_openai(state.name):
            entry = _tag_from_openai(name, entry)
        models.append(entry)
    return {"models": models}


def openai_models(fleet: Fleet, allowed: Visible = _everything) -> dict[str, Any]:
    data = []
    for name, holders in sorted(_visible(fleet, allowed).items()):
        state, entry = holders[0]
        if fleet.is_openai(state.name):
            created = entry.get("created")
            owner = entry.get("owned_by") or state.name
        else:
            created = _epoch(entry.get("modified_at"))
            owner = "library"
        data.append({"id": name, "object": "model", "created": int(created or 0), "owned_by": owner})
    return {"object": "list", "data": data}


def ollama_ps(fleet: Fleet, allowed: Visible = _everything) -> dict[str, Any]:
    seen: dict[str, dict[str, Any]] = {}
    for state in fleet.workers.values():
        if not state.healthy:
            continue
        rules, _ = fleet.rules(state.name)
        for entry in state.ps:
            name = entry.get("name")
            if isinstance(name, str) and name not in seen and allowed(name) and resolve_placement(rules, name).allowed:
                seen[name] = entry
    return {"models": [seen[n] for n in sorted(seen)]}


def iso_time(epoch: object = None) -> str:
    """Ollama-style UTC timestamp of ``epoch`` (seconds), or of now when it is not a number."""
    when = datetime.fromtimestamp(epoch, UTC) if isinstance(epoch, int | float) and epoch > 0 else datetime.now(UTC)
    return when.isoformat().replace("+00:00", "Z")


def unknown_details() -> dict[str, Any]:
    """Ollama's ``details`` object for a model served by an OpenAI-style worker, which reports none of it."""
    return {
        "parent_model": "",
        "format": "",
        "family": "",
        "families": [],
        "parameter_size": "",
        "quantization_level": "",
    }


def _tag_from_openai(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": iso_time(entry.get("created")),
        "size": 0,
        "digest": "",
        "details": unknown_details(),
    }


def _epoch(iso: object) -> int:
    if not isinstance(iso, str):
        return 0
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
