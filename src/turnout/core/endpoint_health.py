"""Health states of external endpoints, and what to tell the operator when a check fails.

States: ``unknown`` (never checked), ``online``, ``degraded`` (answers, but with errors or slowly),
``asleep`` (was reachable, now times out: a laptop gone to sleep), ``unreachable`` (refused, DNS, TLS,
SSRF-refused, or timing out without ever having been reachable). Only online and degraded endpoints are
routed to; the others go straight to their fallback model when one is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["SLOW_MS", "CheckResult", "EndpointState", "Failure", "hint", "next_state"]

SLOW_MS = 2000.0  # a list-models answer slower than this marks the endpoint degraded


class EndpointState(StrEnum):
    UNKNOWN = "unknown"
    ONLINE = "online"
    DEGRADED = "degraded"
    ASLEEP = "asleep"
    UNREACHABLE = "unreachable"

    @property
    def routable(self) -> bool:
        return self in (EndpointState.ONLINE, EndpointState.DEGRADED)


class Failure(StrEnum):
    REFUSED = "connect_refused"
    DNS = "dns_error"
    TLS = "tls_error"
    TIMEOUT = "timeout"
    PRIVATE = "dial_refused_private"
    FORBIDDEN_ADDRESS = "dial_refused"
    AUTH = "auth"
    HTTP = "http_error"
    WRONG_API = "wrong_api"
    BAD_ANSWER = "bad_answer"


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    latency_ms: float
    failure: Failure | None = None
    status: int | None = None


def next_state(previous: EndpointState, result: CheckResult) -> EndpointState:
    if result.ok:
        return EndpointState.DEGRADED if result.latency_ms > SLOW_MS else EndpointState.ONLINE
    if result.failure is Failure.TIMEOUT:
        was_up = previous in (EndpointState.ONLINE, EndpointState.DEGRADED, EndpointState.ASLEEP)
        return EndpointState.ASLEEP if was_up else EndpointState.UNREACHABLE
    if result.failure in (Failure.AUTH, Failure.HTTP, Failure.WRONG_API, Failure.BAD_ANSWER):
        return EndpointState.DEGRADED
    return EndpointState.UNREACHABLE


def hint(failure: Failure, api: str, *, status: int | None = None, timeout_s: float = 0) -> str:
    """One sentence saying what to change."""
    other = "openai" if api == "ollama" else "ollama"
    route = "/api/tags" if api == "ollama" else "/v1/models"
    return {
        Failure.REFUSED: "connection refused: is the server running and listening on a reachable address? "
        "Ollama binds 127.0.0.1 by default (set OLLAMA_HOST=0.0.0.0 on that machine); LM Studio needs "
        "'Serve on Local Network'; mlx_lm.server needs --host 0.0.0.0",
        Failure.DNS: "the host name does not resolve: check the name (or use the machine's IP address)",
        Failure.TLS: "TLS failed: check http:// versus https:// and the server's certificate",
        Failure.TIMEOUT: f"no answer within {timeout_s:g}s: the machine may be asleep, or a firewall drops "
        "the connection",
        Failure.PRIVATE: "the address is on a private network: set APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true "
        "to allow endpoints on private networks",
        Failure.FORBIDDEN_ADDRESS: "the address is never allowed (link-local, cloud metadata, unspecified, or a "
        "NAT64 address whose IPv4 address cannot be read; the error says which): use the server's routable address, "
        "or declare this network's NAT64 prefix in config.json (network.nat64_prefixes)",
        Failure.AUTH: f"the server refused the credential (HTTP {status}): check the key given with "
        "--credential-from-env",
        Failure.HTTP: f"the server answered HTTP {status} on {route}: check the URL (no path needed) and the server",
        Failure.WRONG_API: f"the server has no {route} (HTTP {status}): is it an {other} server? try --api {other}",
        Failure.BAD_ANSWER: f"{route} did not answer with the expected JSON: wrong --api type? try --api {other}",
    }[failure]
