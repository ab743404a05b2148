"""A worker's answer as the client gets it: a 2xx answer in one piece checked to be the JSON object its route
promises (anything else a 502), the worker's errors in the client's dialect (4xx kept, 5xx a 502, a refused
credential the operator's 502), and every answer of a fallback call tagged with where it fell back from. Used by
the proxy (:mod:`turnout.gateway.proxy`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from turnout.dialects import api, worker_error_message
from turnout.dialects.base import Call
from turnout.dialects.streams import FrameError, parse_object
from turnout.errors import UpstreamError
from turnout.fleet.state import WorkerState
from turnout.metrics import Metrics
from turnout.responses import error_response, json_response

__all__ = ["WorkerAnswers", "json_answer", "raw_json", "tagged"]


class WorkerAnswers:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def checked(self, worker: WorkerState, model: str, data: bytes, now: float) -> dict[str, Any]:
        """A 2xx non-stream answer must be the JSON object its route promises; anything else is a 502."""
        try:
            answer = parse_object(data)
        except FrameError as exc:
            self.metrics.upstream_errors.labels(worker.name, "invalid_answer").inc()
            worker.record_model_failure(model, "invalid answer", now)
            raise UpstreamError(f"{worker.name}: the worker answered with {_what(data, exc)}") from None
        worker.record_success(now, model)
        return answer

    def worker_error(
        self, call: Call, worker: WorkerState, model: str, status: int, data: bytes, now: float
    ) -> web.StreamResponse:
        """A worker's error answer in the caller's dialect: 4xx keep their status and the worker's message;
        5xx (and nonsense statuses) become 502, 503 stays 503. A 401/403 is about the gateway's credential
        for the worker (the client's key never goes upstream): 502 ``upstream_auth_failed``, never relayed."""
        if status in (401, 403):
            return self._credential_rejected(call, worker, status, data, now)
        if status >= 500:
            self.metrics.upstream_errors.labels(worker.name, f"http_{status}").inc()
            worker.record_model_failure(model, f"HTTP {status}", now)
        else:
            worker.record_success(now)  # it answered: alive (a 4xx says nothing about the model)
        if 400 <= status < 500:
            try:
                parsed: dict[str, Any] | None = parse_object(data)
            except FrameError:
                parsed = None
            if parsed is not None and api(call.dialect).error_in_dialect(parsed):
                return json_answer(parsed, status, call)
        message = worker_error_message(data, status)
        err = UpstreamError(message if message.startswith("upstream") else f"worker answered HTTP {status}: {message}")
        err.status = status if 400 <= status < 500 or status == 503 else 502
        if status < 400:
            err.code = "upstream_bad_status"
        return tagged(error_response(call.dialect, err), call)

    def _credential_rejected(
        self, call: Call, worker: WorkerState, status: int, data: bytes, now: float
    ) -> web.Response:
        """The worker refused the credential the gateway holds for it: the operator's problem. Its own answer
        (which may echo part of that credential, or read like the client's key is wrong) goes to the log only."""
        self.metrics.upstream_errors.labels(worker.name, "auth").inc()
        detail = " ".join(worker_error_message(data, status).split())[:200]
        worker.reject_credential(status, f"{call.path}: {detail}", now)
        err = UpstreamError(
            f'the {worker.kind} "{worker.name}" rejected its credential (HTTP {status}): the gateway\'s '
            "configuration, not your API key; ask the gateway's operator to fix it",
            code="upstream_auth_failed",
        )
        return tagged(error_response(call.dialect, err), call)


def _what(data: bytes, exc: FrameError) -> str:
    if not data:
        return "an empty body, not JSON"
    head = data[:60].decode("utf-8", "replace")
    printable = "".join(ch if ch.isprintable() else "?" for ch in head)
    return f"{exc} (starts {printable!r})"


def tagged(response: web.Response, call: Call | None) -> web.Response:
    """Every non-stream answer of a fallback call says where it fell back from (a stream: in its headers)."""
    if call is not None and call.fallback_from is not None:
        response.headers["X-Fallback-From"] = call.fallback_from
    return response


def raw_json(data: bytes, status: int, call: Call) -> web.Response:
    """A worker's JSON answer relayed byte for byte (it was checked to be a JSON object)."""
    return tagged(web.Response(status=status, body=data, content_type="application/json"), call)


def json_answer(obj: Any, status: int = 200, call: Call | None = None) -> web.Response:
    return tagged(json_response(obj, status), call)
