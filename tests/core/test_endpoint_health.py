import pytest

from turnout.core.endpoint_health import CheckResult, EndpointState, Failure, hint, next_state

S = EndpointState
OK = CheckResult(ok=True, latency_ms=50)
SLOW = CheckResult(ok=True, latency_ms=5000)


def fail(f: Failure, status: int | None = None) -> CheckResult:
    return CheckResult(ok=False, latency_ms=0, failure=f, status=status)


@pytest.mark.parametrize(
    ("previous", "result", "expected"),
    [
        (S.UNKNOWN, OK, S.ONLINE),
        (S.UNREACHABLE, OK, S.ONLINE),
        (S.ONLINE, SLOW, S.DEGRADED),
        (S.ONLINE, fail(Failure.TIMEOUT), S.ASLEEP),
        (S.DEGRADED, fail(Failure.TIMEOUT), S.ASLEEP),
        (S.ASLEEP, fail(Failure.TIMEOUT), S.ASLEEP),
        (S.UNKNOWN, fail(Failure.TIMEOUT), S.UNREACHABLE),
        (S.UNREACHABLE, fail(Failure.TIMEOUT), S.UNREACHABLE),
        (S.ONLINE, fail(Failure.REFUSED), S.UNREACHABLE),
        (S.ASLEEP, fail(Failure.DNS), S.UNREACHABLE),
        (S.ONLINE, fail(Failure.TLS), S.UNREACHABLE),
        (S.UNKNOWN, fail(Failure.PRIVATE), S.UNREACHABLE),
        (S.ONLINE, fail(Failure.HTTP, 500), S.DEGRADED),
        (S.ONLINE, fail(Failure.AUTH, 401), S.DEGRADED),
        (S.UNKNOWN, fail(Failure.WRONG_API, 404), S.DEGRADED),
    ],
)
def test_next_state(previous: EndpointState, result: CheckResult, expected: EndpointState) -> None:
    assert next_state(previous, result) is expected


@pytest.mark.parametrize(
    ("failure", "api", "fragment"),
    [
        (Failure.REFUSED, "ollama", "OLLAMA_HOST"),
        (Failure.TIMEOUT, "ollama", "asleep"),
        (Failure.AUTH, "openai", "credential"),
        (Failure.PRIVATE, "ollama", "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true"),
        (Failure.TLS, "openai", "https://"),
        (Failure.WRONG_API, "ollama", "--api openai"),
        (Failure.WRONG_API, "openai", "--api ollama"),
    ],
)
def test_hints(failure: Failure, api: str, fragment: str) -> None:
    assert fragment in hint(failure, api, status=404, timeout_s=3)


def test_routable() -> None:
    assert [s for s in S if s.routable] == [S.ONLINE, S.DEGRADED]
