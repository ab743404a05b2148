"""Worker health: passive evidence first, probes only where they cannot hurt, and which results count.

Pure decisions (no I/O, no clock: times are parameters, seconds on one monotonic clock). The fleet
poller asks :func:`should_probe` before each probe and :func:`probe_event` what its result means;
the poller and the proxy feed events into :func:`after` (through ``WorkerState``).

Like Envoy's outlier detection, a worker answering the gateway's own requests is alive, and that
evidence is free. Probes are not free:

* ``llama_cpp.server`` (Python) serves every route, ``/v1/models`` included, behind one lock, and by
  default (``interrupt_requests=True``) a running stream stops with ``[DONE]`` as soon as another
  request waits for that lock (``llama_cpp/server/app.py``: ``get_llama_proxy``'s outer/inner lock and
  ``get_event_publisher``'s ``if interrupt_requests and llama_outer_lock.locked()``). A probe during a
  stream cuts the user's answer short; a probe queued behind a long non-streamed answer times out.
  So an OpenAI-style worker (:attr:`ProbePolicy.IDLE_ONLY`) is probed only when nothing is in flight
  there through this gateway, and not when a fresh answer already shows it alive (unless its inventory
  is stale or unknown).
* llama.cpp's own C++ server answers ``/v1/models`` on its HTTP threads, beside the slots that run requests
  (``tools/server/server.cpp``); vLLM and SGLang serve their routes from an asyncio server beside their engine
  loop. Engines known to be one of these by their listing (:mod:`turnout.core.engines`) are probed every round
  (:func:`probe_policy`).
* Ollama serves ``/api/version`` straight from the HTTP router and ``/api/tags`` / ``/api/ps`` from
  the manifest store and the scheduler's table, without calling a model runner (ollama/ollama
  ``server/routes.go``: ``GenerateRoutes``, ``ListHandler``, ``PsHandler``), so Ollama workers
  (:attr:`ProbePolicy.ALWAYS`) are probed every round, busy or not.

Either way, a probe that timed out or broke while the worker's requests were progressing says the
worker is loaded, not dead: it does not count. A refused connection always counts.

A failed proxied request is judged by whose failure it is. One that never reached an answer (refused,
connect timeout, a connection reset before the first byte of the answer) is the worker's: it counts toward
taking the whole worker out (:func:`after`). One the worker answered badly (an HTTP 5xx, an invalid answer,
a stream broken after it started) is the model's: a worker that serves five models, one of them broken,
keeps serving the other four. :func:`model_after` takes that model out on that worker, after
``failures_to_out`` in a row, for ``retry_s`` (doubled after each further failure, up to 16x), then lets
requests try it again; one success brings it back (Envoy's outlier ejection, per model).

:func:`failure_reason` names a failure in a few words (``connection refused``, ``timeout``, ``HTTP 500``):
the state-change log lines and the 503 that lists why each worker is down use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "MAX_RETRY_FACTOR",
    "Event",
    "Health",
    "ModelHealth",
    "ProbePolicy",
    "ProbeResult",
    "after",
    "failure_reason",
    "model_after",
    "model_checked",
    "probe_event",
    "probe_policy",
    "should_probe",
]


class ProbePolicy(Enum):
    ALWAYS = "always"  # probing cannot disturb the worker's requests (Ollama's listing routes)
    IDLE_ONLY = "idle_only"  # a probe can disturb them (OpenAI-style engines, llama.cpp above all)


class ProbeResult(Enum):
    ANSWERED = "answered"  # an HTTP answer, any status: the worker's server is up
    TIMED_OUT = "timed_out"  # connected, but no complete answer in time
    BROKEN = "broken"  # connected, but the connection closed or broke before an answer
    UNREACHABLE = "unreachable"  # nothing reached the worker (refused, DNS, connect timeout)


class Event(Enum):
    ALIVE = "alive"  # a probe was answered
    PROBE_FAILED = "probe_failed"  # a probe failure that counts
    SERVED = "served"  # a proxied request got a complete answer
    REQUEST_FAILED = "request_failed"  # a proxied request failed for real (stream broke, invalid answer)


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool = False
    probe_failures: int = 0  # consecutive counted probe failures
    request_failures: int = 0  # consecutive real request failures


def probe_policy(ollama: bool, family: str | None) -> ProbePolicy:
    """Ollama workers and OpenAI-style engines known to answer probes beside their requests (``family``: llama.cpp's
    server, vLLM, SGLang) are probed every round; any other OpenAI-style server only when idle."""
    return ProbePolicy.ALWAYS if ollama or family is not None else ProbePolicy.IDLE_ONLY


def should_probe(
    policy: ProbePolicy,
    *,
    in_flight: int,
    healthy: bool,
    inventory_current: bool,
    last_progress: float | None,
    now: float,
    interval_s: float,
) -> bool:
    """Probe now, or let passive evidence stand? ``last_progress``: when bytes last arrived for a proxied
    request; ``inventory_current``: the last inventory poll worked (not stale, not unknown)."""
    if policy is ProbePolicy.ALWAYS:
        return True
    if in_flight > 0:
        return False  # its own requests will tell: success, failure or a refused connection
    # An answer within the last interval proves a healthy worker alive; unless its inventory needs
    # fetching again, a probe would add only risk.
    fresh = last_progress is not None and now - last_progress < interval_s
    return not (healthy and fresh and inventory_current)


def probe_event(result: ProbeResult, *, started: float, last_progress: float | None, window_s: float) -> Event | None:
    """What one probe's result means; ``None``: nothing (ignore it).

    A timeout or broken answer does not count when the worker's requests made progress during the probe
    or within ``window_s`` before it started (the probe's own timeout is the natural window)."""
    if result is ProbeResult.ANSWERED:
        return Event.ALIVE
    if result is ProbeResult.UNREACHABLE:
        return Event.PROBE_FAILED
    progressing = last_progress is not None and last_progress >= started - window_s
    return None if progressing else Event.PROBE_FAILED


def after(health: Health, event: Event, failures_to_down: int, request_failures_to_down: int = 5) -> Health:
    """Health after one event. Probe and request failures count separately: a worker whose listing answers
    while its real requests keep failing still goes down. A probe answer brings a worker taken down by
    request failures back (nothing else would: it gets no traffic), but its request-failure count stays,
    so the next failed request takes it down again."""
    if event is Event.SERVED:
        return Health(healthy=True)
    if event is Event.ALIVE:
        return Health(healthy=True, request_failures=health.request_failures)
    if event is Event.PROBE_FAILED:
        count = health.probe_failures + 1
        return Health(health.healthy and count < failures_to_down, count, health.request_failures)
    # one failed request says little (a bad prompt can make an engine answer 500): take the worker out
    # only after ``request_failures_to_down`` in a row, as Envoy's consecutive-5xx outlier detection does
    count = health.request_failures + 1
    return Health(health.healthy and count < request_failures_to_down, health.probe_failures, count)


MAX_RETRY_FACTOR = 16  # a model that keeps failing is tried again at most this many ``retry_s`` later


@dataclass(frozen=True, slots=True)
class ModelHealth:
    """One model on one worker, as its proxied requests found it."""

    failures: int = 0  # consecutive failed requests for the model (kept while out: the next failure counts)
    out_until: float | None = None  # out of routing until then (monotonic seconds); None: never taken out
    outs: int = 0  # times taken out since its last success: each doubles the next time out
    reason: str | None = None  # the last failure in a few words (``HTTP 500``)

    def out(self, now: float) -> bool:
        """Taken out and not yet due for another try."""
        return self.out_until is not None and now < self.out_until

    @property
    def ok(self) -> bool:
        """Nothing against it: the state a success leaves."""
        return self.failures == 0 and self.out_until is None


def model_after(
    health: ModelHealth, failed: bool, now: float, *, failures_to_out: int, retry_s: float, reason: str | None = None
) -> ModelHealth:
    """One proxied request's verdict on a model. A success clears everything. A failure counts; at
    ``failures_to_out`` in a row the model is out until ``now + retry_s * 2**outs`` (at most
    :data:`MAX_RETRY_FACTOR` times ``retry_s``). A failure while it is out (a request already in flight when
    it was taken out) changes nothing but the count; the first failure after the time is up takes it out
    again at once, for twice as long."""
    if not failed:
        return ModelHealth()
    count = health.failures + 1
    if health.out(now) or count < failures_to_out:
        return ModelHealth(count, health.out_until, health.outs, reason or health.reason)
    factor = min(2**health.outs, MAX_RETRY_FACTOR)
    return ModelHealth(count, now + retry_s * factor, health.outs + 1, reason or health.reason)


def model_checked(health: ModelHealth) -> ModelHealth:
    """A health check found the worker serving (an external endpoint's list route answered in time): a model
    taken out there is tried again from the next request, its time out over at once (the endpoints design: the
    next request tries the endpoint first again as soon as a health check sees it online). Its failure count
    and times out are kept, so a failure then takes it out again at once, for twice as long, as when its time
    is up."""
    if health.out_until is None:
        return health
    return ModelHealth(health.failures, None, health.outs, health.reason)


# What an upstream error code (the dialer's, the client's, an endpoint check's) means, in a few words.
_REASONS = {
    "connect_refused": "connection refused",
    "dns_error": "host name does not resolve",
    "tls_error": "TLS handshake failed",
    "timeout": "timeout",
    "headers_timeout": "timeout",
    "dial_refused_private": "SSRF guard: private address not allowed",
    "dial_refused": "SSRF guard: address never allowed",
    "auth": "credential rejected",
    "wrong_api": "wrong API type",
    "bad_answer": "unexpected answer",
    "invalid_answer": "invalid answer",
    "stream": "stream broke",
}


def failure_reason(code: str | None, status: int | None = None) -> str:
    """Why a probe, check or request failed, in a few words (``connection refused``, ``HTTP 503``).
    ``code``: the failure's error code; ``status``: the HTTP status it answered with, if any."""
    words = _REASONS.get(code or "")
    if status is not None:
        return f"{words} (HTTP {status})" if words else f"HTTP {status}"
    return words or "connection broke before an answer"
