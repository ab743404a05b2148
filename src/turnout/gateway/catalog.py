"""What clients may discover: models on healthy workers, hiding those placement blocks there.

``/api/tags`` and ``/v1/models`` list a model if at least one healthy worker has it installed and
its placement rules allow it, and every claimed model the claim bindings list (``Fleet.claim_listing``: a
sleeping one too, since a request for it wakes it; never in ``/api/ps``). The admin inventory (unfiltered)
lives in the admin API. On an endpoint's own
URL (``endpoint`` given) only that endpoint's models are listed, by their own names
(:mod:`turnout.core.endpoint_urls`).

What real clients rely on in these listings (each rule decided in one function here):

* :func:`model_digest`: every listed name has a stable digest that no other name routing elsewhere shares.
  llm-ollama groups ``/api/tags`` by ``digest`` and registers the names of one group as aliases of one model
  (``register_models`` in taketwo/llm-ollama ``llm_ollama/__init__.py``), so two OpenAI-worker models with the
  same ``""`` digest became one, and a chat for one went to the other.
* :func:`modified_at`: Ollama's own value for an Ollama worker's model; for an OpenAI-style worker's, the
  model's ``created`` or the time this gateway first listed it, whichever is earlier, fixed from then on (vLLM
  and llama.cpp report the time of the request as ``created``, which is not a modification time).
* model aliases (:mod:`turnout.core.aliases`): ``/api/tags`` and ``/v1/models`` list an alias wherever the model
  it stands for is listed for the caller, as that model's entry under the alias's name (its digest too: llm-ollama
  then registers the alias as another name of the same model, which it is); an alias hides a model of the same
  name, since requests for that name go to the alias's model. ``/api/ps`` lists models as they run, not aliases.
* :func:`ollama_ps`: Ollama workers' own ``/api/ps``; every model of an OpenAI-style worker or endpoint,
  which the gateway treats as loaded (such a server serves the models it lists). An Ollama endpoint's
  residency is not polled, so its models are not listed there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from turnout.config import WorkerType
from turnout.core.aliases import AliasTable
from turnout.core.endpoint_urls import own_name
from turnout.core.names import canonical, lookup
from turnout.core.placement import resolve_placement
from turnout.fleet.state import Fleet, WorkerState
from turnout.store.db import StoreError

__all__ = [
    "NEVER_EXPIRES",
    "anthropic_model",
    "anthropic_models",
    "iso_time",
    "model_digest",
    "modified_at",
    "ollama_ps",
    "ollama_tags",
    "openai_models",
    "unknown_details",
]

log = logging.getLogger("turnout.gateway")


Visible = Callable[[str], bool]

# ``expires_at`` of a model an OpenAI-style worker keeps loaded: far enough ahead that Ollama's own CLI shows
# "Forever" (format.HumanTime: more than 20 years ahead), like Ollama's for ``keep_alive: -1``.
NEVER_EXPIRES = "2318-01-01T00:00:00Z"


def _everything(_: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class _Listed:
    name: str  # as the caller sees it (the endpoint's own name on its own URL)
    shared: str  # the name on the shared URL (what scopes, placement and routing use)
    state: WorkerState | None  # the first healthy worker allowed to serve it; None: a claim not routable now
    entry: dict[str, Any]  # that worker's raw inventory entry
    openai: bool  # the worker is OpenAI-style (its entry is a /v1/models object)


def _workers(fleet: Fleet, endpoint: str | None) -> Iterable[WorkerState]:
    if endpoint is None:
        return fleet.workers.values()
    state = fleet.workers.get(endpoint)
    return () if state is None or state.external is None else (state,)


def _visible(fleet: Fleet, allowed: Visible, endpoint: str | None) -> list[_Listed]:
    """One entry per model name that a healthy worker may serve (placement) and ``allowed`` accepts (the
    caller's key scopes), from the first such worker, sorted by the name the caller sees."""
    out: dict[str, _Listed] = {}
    for state in _workers(fleet, endpoint):
        if not state.healthy or state.inventory is None:
            continue
        rules, _ = fleet.rules(state.name)
        openai = fleet.is_openai(state.name)
        for shared, entry in state.tags.items():
            if shared in out or not allowed(shared) or not resolve_placement(rules, shared).allowed:
                continue
            name = shared if endpoint is None else own_name(endpoint, shared)
            if name is not None:
                out[shared] = _Listed(name, shared, state, entry, openai)
    if endpoint is None:  # claimed models whose engine is asleep or waking stay listed
        for shared, entry in fleet.claim_listing.items():
            if shared in out or not allowed(shared):
                continue
            bound = fleet.bindings.get(shared)  # its engine's column in the matrix: a block there hides it
            if bound is not None and not resolve_placement(fleet.rules(bound.name)[0], shared).allowed:
                continue
            out[shared] = _Listed(shared, shared, None, entry, True)
    return sorted(out.values(), key=lambda m: m.name)


def _with_aliases(models: list[_Listed], aliases: AliasTable | None, endpoint: str | None) -> list[_Listed]:
    """``models`` with every alias that works on this URL and whose model is among them (as that model's entry
    under the alias's name); a model of the same name as such an alias is left out (the alias shadows it)."""
    if not aliases:
        return models
    names = aliases.names_on(endpoint)
    if not names:
        return models
    shadowed = {canonical(shown) for shown, _ in names}
    by_shared = {m.shared: m for m in models}
    listed = [m for m in models if canonical(m.name) not in shadowed]
    for shown, alias in names:
        served = lookup(alias.target, by_shared)
        if served is not None:
            listed.append(dataclasses.replace(by_shared[served], name=shown))
    return sorted(listed, key=lambda m: m.name)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def model_digest(shared: str, entry: dict[str, Any], state: WorkerState | None, *, own_url: bool) -> str:
    """The ``digest`` clients see for a model: stable, and never shared by two names that route apart.

    An Ollama worker's own digest where it gives one (names with one digest are one model there, as on
    Ollama itself); an endpoint's on the shared URL is namespaced by the endpoint, so ``mac/llama3.2`` and the
    fleet's ``llama3.2`` stay two models. Otherwise (OpenAI-style servers report none) a sha256 of the model's
    shared name, which does not depend on which worker serves it."""
    real = entry.get("digest")
    if state is not None and state.config.type is WorkerType.OLLAMA and isinstance(real, str) and real:
        if state.external is None or own_url:
            return real
        return _sha256(f"{state.external.prefix}{real}")
    return _sha256(f"turnout-model:{shared}")


def _modified_epoch(fleet: Fleet, shared: str, entry: dict[str, Any], now: float) -> float:
    known = fleet.first_listed.get(shared)
    if known is None:
        created = entry.get("created")
        first = now
        if isinstance(created, int | float) and not isinstance(created, bool) and created > 0:
            first = min(float(created), now)  # llama.cpp's server and vLLM say the time of the request: no earlier
        known = first
        if fleet.keep_listing is not None:
            try:  # once per model and process: the time the first process recorded, or this one
                known = fleet.keep_listing(shared, first)
            except StoreError as exc:
                log.warning("could not record when %s was first listed (kept in this process only): %s", shared, exc)
        fleet.first_listed[shared] = known
    return known


def modified_at(fleet: Fleet, shared: str, entry: dict[str, Any], now: float) -> str:
    """``modified_at`` of an OpenAI-style worker's model: its ``created`` or the time this gateway first listed
    it, whichever is earlier, decided once and kept (a first listing in the store, where the gateway has one:
    the same in every process and after a restart, also for a server whose ``created`` is the time of each
    request, as llama.cpp's and vLLM's are)."""
    return iso_time(_modified_epoch(fleet, shared, entry, now))


def _tag(fleet: Fleet, model: _Listed, own_url: bool, now: float) -> dict[str, Any]:
    digest = model_digest(model.shared, model.entry, model.state, own_url=own_url)
    if not model.openai:
        return {**model.entry, "name": model.name, "model": model.name, "digest": digest}
    return {
        "name": model.name,
        "model": model.name,
        "modified_at": modified_at(fleet, model.shared, model.entry, now),
        "size": 0,
        "digest": digest,
        "details": unknown_details(),
    }


def ollama_tags(
    fleet: Fleet,
    allowed: Visible = _everything,
    endpoint: str | None = None,
    *,
    aliases: AliasTable | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    own_url, when = endpoint is not None, time.time() if now is None else now
    listed = _with_aliases(_visible(fleet, allowed, endpoint), aliases, endpoint)
    return {"models": [_tag(fleet, m, own_url, when) for m in listed]}


def openai_models(
    fleet: Fleet,
    allowed: Visible = _everything,
    endpoint: str | None = None,
    *,
    aliases: AliasTable | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    when = time.time() if now is None else now
    data = []
    for m in _with_aliases(_visible(fleet, allowed, endpoint), aliases, endpoint):
        if m.openai:
            created = _modified_epoch(fleet, m.shared, m.entry, when)
            owner = m.entry.get("owned_by") or (m.state.name if m.state is not None else "")
        else:
            created = _epoch(m.entry.get("modified_at"))
            owner = "library"
        data.append({"id": m.name, "object": "model", "created": int(created), "owned_by": owner})
    return {"object": "list", "data": data}


def anthropic_models(listing: dict[str, Any]) -> dict[str, Any]:
    """An :func:`openai_models` listing that the Anthropic SDKs read as well (``GET /v1/models`` with an
    ``anthropic-version`` header): each entry also has Anthropic's ``type``, ``display_name``, ``created_at``
    (RFC 3339) and ``lifecycle``, and the list Anthropic's ``has_more``, ``first_id`` and ``last_id``."""
    data = [
        {**m, "type": "model", "display_name": m["id"], "created_at": iso_time(m["created"]), "lifecycle": "active"}
        for m in listing["data"]
    ]
    ids = [m["id"] for m in data]
    return {
        **listing,
        "data": data,
        "has_more": False,
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
    }


def anthropic_model(entry: dict[str, Any]) -> dict[str, Any]:
    """One entry of :func:`anthropic_models` (``GET /v1/models/{id}``)."""
    model: dict[str, Any] = anthropic_models({"object": "list", "data": [entry]})["data"][0]
    return model


def ollama_ps(fleet: Fleet, allowed: Visible = _everything, endpoint: str | None = None) -> dict[str, Any]:
    """Running models: each Ollama worker's own ``/api/ps`` entries, and every model an OpenAI-style worker
    lists (the gateway treats them as loaded: such servers serve what they have in memory)."""
    own_url = endpoint is not None
    seen: dict[str, dict[str, Any]] = {}
    for m in _visible(fleet, allowed, endpoint):
        if m.openai and m.state is not None and m.shared in m.state.loaded:
            seen[m.name] = {
                "name": m.name,
                "model": m.name,
                "size": 0,
                "digest": model_digest(m.shared, m.entry, m.state, own_url=own_url),
                "details": unknown_details(),
                "expires_at": NEVER_EXPIRES,
                "size_vram": 0,
                "context_length": 0,
            }
    for state in _workers(fleet, endpoint):
        if not state.healthy or fleet.is_openai(state.name):
            continue
        rules, _ = fleet.rules(state.name)
        for entry in state.ps:
            shared = entry.get("name")
            if not isinstance(shared, str) or not allowed(shared) or not resolve_placement(rules, shared).allowed:
                continue
            name = shared if endpoint is None else own_name(endpoint, shared)
            if name is not None and name not in seen:
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


def _epoch(iso: object) -> int:
    if not isinstance(iso, str):
        return 0
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
