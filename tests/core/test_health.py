"""Worker health decisions: when to probe, which probe results count, health after each event."""

from __future__ import annotations

import pytest

from turnout.core.health import (
    MAX_RETRY_FACTOR,
    Event,
    Health,
    ModelHealth,
    ProbePolicy,
    ProbeResult,
    after,
    failure_reason,
    model_after,
    model_checked,
    probe_event,
    should_probe,
)

ALWAYS, IDLE = ProbePolicy.ALWAYS, ProbePolicy.IDLE_ONLY
NOW, INTERVAL = 100.0, 10.0


@pytest.mark.parametrize(
    ("policy", "in_flight", "healthy", "current", "last_progress", "expected"),
    [
        (ALWAYS, 0, True, True, None, True),
        (ALWAYS, 3, True, True, NOW, True),  # Ollama's listings never touch a runner: probe busy workers too
        (ALWAYS, 1, False, False, None, True),
        (IDLE, 0, False, False, None, True),  # never checked: first round before serving
        (IDLE, 0, True, True, None, True),
        (IDLE, 1, True, True, None, False),  # busy: its own requests tell
        (IDLE, 1, True, True, NOW - 1, False),
        (IDLE, 1, True, False, NOW - 1000, False),  # busy with a stale inventory: still not
        (IDLE, 5, False, True, None, False),  # busy and down: requests in flight still report
        (IDLE, 0, True, True, NOW - 1, False),  # a fresh answer proves it alive: a probe adds only risk
        (IDLE, 0, True, True, NOW - INTERVAL + 0.01, False),
        (IDLE, 0, True, True, NOW - INTERVAL, True),  # evidence one interval old: probe
        (IDLE, 0, True, True, NOW - 1000, True),
        (IDLE, 0, True, False, NOW - 1, True),  # alive, but the inventory is stale or unknown: fetch it
        (IDLE, 0, False, True, NOW - 1, True),  # down (taken down by failures): probe to bring it back
    ],
)
def test_should_probe(
    policy: ProbePolicy, in_flight: int, healthy: bool, current: bool, last_progress: float | None, expected: bool
) -> None:
    decided = should_probe(
        policy,
        in_flight=in_flight,
        healthy=healthy,
        inventory_current=current,
        last_progress=last_progress,
        now=NOW,
        interval_s=INTERVAL,
    )
    assert decided is expected


STARTED, WINDOW = 50.0, 3.0


@pytest.mark.parametrize(
    ("result", "last_progress", "expected"),
    [
        (ProbeResult.ANSWERED, None, Event.ALIVE),  # any HTTP answer, any status
        (ProbeResult.ANSWERED, STARTED + 1, Event.ALIVE),
        (ProbeResult.UNREACHABLE, None, Event.PROBE_FAILED),
        (ProbeResult.UNREACHABLE, STARTED + 1, Event.PROBE_FAILED),  # refused while streaming: still counts
        (ProbeResult.TIMED_OUT, None, Event.PROBE_FAILED),  # idle and silent
        (ProbeResult.TIMED_OUT, STARTED + 1, None),  # its requests progressed during the probe
        (ProbeResult.TIMED_OUT, STARTED - WINDOW, None),  # ... or just before it
        (ProbeResult.TIMED_OUT, STARTED - WINDOW - 0.01, Event.PROBE_FAILED),  # long silent
        (ProbeResult.BROKEN, None, Event.PROBE_FAILED),
        (ProbeResult.BROKEN, STARTED + 2, None),
        (ProbeResult.BROKEN, STARTED - 100, Event.PROBE_FAILED),
    ],
)
def test_probe_event(result: ProbeResult, last_progress: float | None, expected: Event | None) -> None:
    assert probe_event(result, started=STARTED, last_progress=last_progress, window_s=WINDOW) is expected


UP, DOWN = Health(healthy=True), Health()
ALIVE, PROBE_FAILED = Event.ALIVE, Event.PROBE_FAILED
SERVED, FAILED = Event.SERVED, Event.REQUEST_FAILED


@pytest.mark.parametrize(
    ("before", "event", "down_after", "expected"),
    [
        (DOWN, ALIVE, 1, UP),
        (DOWN, SERVED, 1, UP),
        (UP, PROBE_FAILED, 1, Health(False, 1, 0)),
        (UP, PROBE_FAILED, 2, Health(True, 1, 0)),  # one miss tolerated
        (Health(True, 1, 0), PROBE_FAILED, 2, Health(False, 2, 0)),
        (Health(False, 2, 0), PROBE_FAILED, 2, Health(False, 3, 0)),
        (DOWN, PROBE_FAILED, 3, Health(False, 1, 0)),  # never up: one failure keeps it down
        (Health(False, 2, 0), ALIVE, 2, UP),
        (UP, FAILED, 1, Health(False, 0, 1)),
        (UP, FAILED, 3, Health(True, 0, 1)),
        (Health(True, 0, 2), FAILED, 3, Health(False, 0, 3)),
        (Health(True, 0, 2), SERVED, 3, UP),  # a complete answer resets the count
        (Health(True, 1, 2), SERVED, 3, UP),  # ... and probe misses too
        (Health(True, 1, 0), FAILED, 2, Health(True, 1, 1)),  # counted apart: neither reached 2
        (Health(True, 0, 1), PROBE_FAILED, 2, Health(True, 1, 1)),
        (Health(True, 0, 1), ALIVE, 2, Health(True, 0, 1)),  # a listing answer is no proof requests work
        (Health(False, 0, 2), ALIVE, 2, Health(True, 0, 2)),  # back after ejection, on probation ...
        (Health(True, 0, 2), FAILED, 2, Health(False, 0, 3)),  # ... one more failure ejects it again
    ],
)
def test_after(before: Health, event: Event, down_after: int, expected: Health) -> None:
    assert after(before, event, down_after, down_after) == expected


@pytest.mark.parametrize(
    ("before", "event", "expected"),
    [
        (UP, PROBE_FAILED, Health(False, 1, 0)),  # polls: the first threshold (1)
        (UP, FAILED, Health(True, 0, 1)),  # requests: their own threshold (5)
        (Health(True, 0, 3), FAILED, Health(True, 0, 4)),
        (Health(True, 0, 4), FAILED, Health(False, 0, 5)),
    ],
)
def test_request_failures_have_their_own_threshold(before: Health, event: Event, expected: Health) -> None:
    assert after(before, event, 1, 5) == expected


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("connect_refused", None, "connection refused"),
        ("timeout", None, "timeout"),
        ("headers_timeout", None, "timeout"),
        ("dns_error", None, "host name does not resolve"),
        ("tls_error", None, "TLS handshake failed"),
        ("dial_refused_private", None, "SSRF guard: private address not allowed"),
        ("dial_refused", None, "SSRF guard: address never allowed"),
        ("http_error", 500, "HTTP 500"),
        ("auth", 401, "credential rejected (HTTP 401)"),
        ("wrong_api", 404, "wrong API type (HTTP 404)"),
        ("upstream_error", None, "connection broke before an answer"),
        (None, None, "connection broke before an answer"),
    ],
)
def test_failure_reason(code: str | None, status: int | None, expected: str) -> None:
    assert failure_reason(code, status) == expected


_OUT = ModelHealth(5, 130.0, 1, "requests failing: HTTP 500")


@pytest.mark.parametrize(
    ("before", "failed", "now", "expected"),
    [
        (ModelHealth(), False, 100.0, ModelHealth()),
        (ModelHealth(), True, 100.0, ModelHealth(1, None, 0, "r")),
        (ModelHealth(3, None, 0, "r"), True, 100.0, ModelHealth(4, None, 0, "r")),
        (ModelHealth(4, None, 0, "r"), True, 100.0, ModelHealth(5, 130.0, 1, "r")),  # the fifth: out for 30 s
        (ModelHealth(4, None, 0, "r"), False, 100.0, ModelHealth()),  # one success clears the count
        (_OUT, True, 110.0, ModelHealth(6, 130.0, 1, "r")),  # a failure while out (in flight): counted only
        (_OUT, True, 131.0, ModelHealth(6, 191.0, 2, "r")),  # first failure after the time: out again, twice as long
        (ModelHealth(9, 150.0, 3, "r"), True, 151.0, ModelHealth(10, 391.0, 4, "r")),  # 8x
        (ModelHealth(20, 150.0, 9, "r"), True, 151.0, ModelHealth(21, 151.0 + 30 * MAX_RETRY_FACTOR, 10, "r")),
        (_OUT, False, 131.0, ModelHealth()),  # back at its first success
    ],
)
def test_model_after(before: ModelHealth, failed: bool, now: float, expected: ModelHealth) -> None:
    assert model_after(before, failed, now, failures_to_out=5, retry_s=30.0, reason="r") == expected


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        (ModelHealth(), ModelHealth()),  # nothing against it: nothing changes
        (ModelHealth(3, None, 0, "r"), ModelHealth(3, None, 0, "r")),  # failing, not out: its count stands
        (_OUT, ModelHealth(5, None, 1, "requests failing: HTTP 500")),  # out: in again at once
        (ModelHealth(9, 391.0, 4, "r"), ModelHealth(9, None, 4, "r")),  # however long it was out for
    ],
)
def test_a_health_check_that_sees_the_endpoint_online_brings_its_models_back(
    before: ModelHealth, expected: ModelHealth
) -> None:
    after_check = model_checked(before)
    assert after_check == expected and not after_check.out(0.0)
    # its count and times out stand: a failure then takes it out again at once, for twice as long as before
    if before.out_until is not None:
        again = model_after(after_check, True, 500.0, failures_to_out=5, retry_s=30.0)
        assert again.out(500.0) and again.out_until == 500.0 + 30.0 * min(2**before.outs, MAX_RETRY_FACTOR)


@pytest.mark.parametrize(
    ("health", "now", "out"),
    [(ModelHealth(), 0.0, False), (_OUT, 129.9, True), (_OUT, 130.0, False), (ModelHealth(7, None, 0), 1.0, False)],
)
def test_model_out_until_its_time(health: ModelHealth, now: float, out: bool) -> None:
    assert health.out(now) is out
