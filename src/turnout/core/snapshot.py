"""A runtime agent's snapshot read into one form, whichever agent wrote it.

The form is AIBrix's (``RuntimeSnapshotResponse`` in vllm-project/aibrix
``python/aibrix/aibrix/openapi/protocol.py``): ``observed_at``, ``accelerators[] {id, hbm_total_bytes,
hbm_free_bytes}``, ``models[]`` with ``restart_count`` and flat request fields behind
``request_metrics_observed``, ``cached_artifacts``. Earlier Turnout agents wrote ``engines[]``,
``restarts`` and a nested ``requests {running, waiting, success_total}``; those spellings are converted here,
once, so the controllers and the admin UI read AIBrix's names only. Figures AIBrix reports as ``-1`` (unknown)
and ``null`` alike read as unknown through :func:`known`.

Pure: the controller's agent client hands the decoded JSON in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Snapshot", "known", "read_model", "read_snapshot"]


def known(value: Any) -> int | None:
    """A byte count or request count as reported, or None when it is unknown (absent, null, negative)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Snapshot:
    models: list[dict[str, Any]]
    accelerators: list[dict[str, Any]] = field(default_factory=list)
    cached_artifacts: frozenset[str] = frozenset()

    @property
    def free_hbm_bytes(self) -> int | None:
        """Free device memory over all accelerators; None without accelerators or with one unreadable."""
        free = [known(a.get("hbm_free_bytes")) for a in self.accelerators]
        if not free or None in free:
            return None
        return sum(f for f in free if f is not None)


def read_model(raw: Mapping[str, Any]) -> dict[str, Any]:
    """One model in AIBrix's names (``restart_count``; ``request_metrics_observed``, ``requests_running``,
    ``requests_waiting``, ``request_success_total``), from either spelling."""
    model = dict(raw)
    restarts = model.pop("restarts", 0)
    if "restart_count" not in model:
        model["restart_count"] = known(restarts) or 0
    nested = model.pop("requests", None)
    if "request_metrics_observed" not in model:
        requests = nested if isinstance(nested, Mapping) else {}
        running, waiting, done = (known(requests.get(k)) for k in ("running", "waiting", "success_total"))
        model["request_metrics_observed"] = not (running is None and waiting is None and done is None)
        model["requests_running"] = running or 0
        model["requests_waiting"] = waiting or 0
        model["request_success_total"] = done
    return model


def read_snapshot(body: Any) -> Snapshot | None:
    """The snapshot, or None when ``body`` is not one (no ``models`` or ``engines`` list)."""
    if not isinstance(body, Mapping):
        return None
    models = body.get("models", body.get("engines"))
    if not isinstance(models, list):
        return None
    accelerators = body.get("accelerators")
    cached = body.get("cached_artifacts")
    return Snapshot(
        [read_model(m) for m in models if isinstance(m, Mapping) and isinstance(m.get("model_name"), str)],
        [dict(a) for a in accelerators if isinstance(a, Mapping)] if isinstance(accelerators, list) else [],
        frozenset(str(k) for k in cached) if isinstance(cached, list) else frozenset(),
    )
