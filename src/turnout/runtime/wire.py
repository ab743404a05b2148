"""The runtime agent's answers in AIBrix's wire shapes, so an AIBrix controller can drive a Turnout agent and a
Turnout controller an AIBrix runtime sidecar.

The shapes are AIBrix's protocol models (``aibrix.openapi.protocol`` in vllm-project/aibrix
``python/aibrix/aibrix/openapi/protocol.py``, as published in the ``aibrix`` 0.8.0 package):
``RuntimeSnapshotResponse`` / ``RuntimeSnapshotModel`` / ``RuntimeAcceleratorSnapshot`` for the snapshot,
``RuntimeModelInfo`` for the model list, ``ActivateRuntimeModelResponse`` and ``RuntimeOperationResponse`` for
operations. Turnout adds a few fields of its own to each model (:data:`MODEL_EXTENSIONS`); AIBrix's Go client
(``pkg/controller/modelclaim/runtime_client.go``) ignores fields it does not know. Figures AIBrix reports as
``-1`` when unknown (a KV segment not there yet) are ``-1`` here too, never ``null``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from turnout.runtime.kvcached import KvUsage
from turnout.runtime.supervisor import EngineRecord, host_port

__all__ = [
    "MODEL_EXTENSIONS",
    "UNKNOWN",
    "activate_result",
    "iso",
    "list_entry",
    "operation_result",
    "snapshot_model",
]

UNKNOWN = -1  # AIBrix's KV_UNKNOWN: the figure could not be read (no kvcached segment yet)

# Fields a Turnout agent adds to each snapshot model (and list entry) beyond AIBrix's RuntimeSnapshotModel.
MODEL_EXTENSIONS = ("engine", "args", "pid", "kv_prealloc_bytes", "sleep_level", "listen_address", "download")


def iso(ts: float) -> str:
    """An RFC 3339 UTC time, as pydantic writes AIBrix's datetimes and Go's time.Time reads them."""
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def snapshot_model(
    record: EngineRecord,
    usage: KvUsage | None,
    requests: dict[str, int | None],
    hbm_peak_bytes: int | None,
    download: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One engine as AIBrix's ``RuntimeSnapshotModel``, plus :data:`MODEL_EXTENSIONS`.

    ``requests`` is the engine's own metrics as ``{"running","waiting","success_total"}`` (None where not
    observable); AIBrix flattens them behind ``request_metrics_observed`` (False: do not infer idleness).
    ``download``: the artifact's download under way (:meth:`turnout.runtime.artifacts.Progress.to_json`), or
    None."""
    observed = any(requests.get(k) is not None for k in ("running", "waiting", "success_total"))
    ref = record.claim_ref
    return {
        "model_name": record.model_name,
        "artifact_url": record.artifact_url,
        # AIBrix's RuntimeClaimRef needs all three; anything less is reported as no reference
        "claim_ref": {k: str(ref[k]) for k in ("namespace", "name", "uid")}
        if all(ref.get(k) for k in ("namespace", "name", "uid"))
        else None,
        "port": record.port,
        "ipc_name": record.ipc_name,
        "phase": record.phase,
        "ready": record.ready,
        "alive": record.pid is not None,
        "restart_count": record.restarts,
        "last_error": record.last_error,
        "last_transition": iso(record.last_transition),
        "kv_used_bytes": UNKNOWN if usage is None else usage.used + usage.prealloc,
        "kv_capacity_bytes": UNKNOWN if usage is None else usage.total,
        "hbm_peak_bytes": hbm_peak_bytes or 0,
        "request_metrics_observed": observed,
        "requests_running": requests.get("running") or 0,
        "requests_waiting": requests.get("waiting") or 0,
        "request_success_total": requests.get("success_total"),
        # Turnout's own
        "engine": record.engine,
        "args": dict(record.args),
        "pid": record.pid,
        "kv_prealloc_bytes": UNKNOWN if usage is None else usage.prealloc,
        "sleep_level": record.sleep_level,
        "listen_address": host_port(record.host, record.port),
        "download": download,
    }


def list_entry(model: dict[str, Any]) -> dict[str, Any]:
    """A model list entry: AIBrix's ``RuntimeModelInfo`` (``kv_total_bytes``) on top of the snapshot model."""
    return {**model, "kv_total_bytes": model["kv_capacity_bytes"]}


def activate_result(record: EngineRecord) -> dict[str, Any]:
    """AIBrix's ``ActivateRuntimeModelResponse``, plus the engine's phase."""
    return {
        "status": "success",
        "model_name": record.model_name,
        "port": record.port,
        "ipc_name": record.ipc_name,
        "phase": record.phase,
    }


def operation_result(model_name: str, operation_id: str, applied: bool, phase: str) -> dict[str, Any]:
    """AIBrix's ``RuntimeOperationResponse``: ``applied`` is False when the operation id was already carried
    out, or when there was nothing to do (sleeping an engine that sleeps, waking one that is awake)."""
    return {
        "status": "success",
        "model_name": model_name,
        "operation_id": operation_id,
        "applied": applied,
        "phase": phase,
    }
