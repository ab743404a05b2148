"""External endpoints in the fleet: registered in the database, checked in the background, routed like
workers under namespaced model names (``<endpoint>/<model>``), always dialed through the SSRF guard.

Turnout only lists models and forwards inference to an endpoint; it never starts, stops, wakes or loads
anything on it.

The manager also keeps, in memory per gateway replica (not in the store; a restart forgets them), when
each endpoint entered its current state (``state_since``), when a check last saw it online or degraded
(``last_online``), and the failure of its last check. :meth:`EndpointManager.test_unsaved` probes a URL
that is not registered (the "Test connection" button) through the same client, SSRF guard and hints.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from turnout.config import Settings, Worker, WorkerType
from turnout.core.endpoint_health import SLOW_MS, CheckResult, EndpointState, Failure, hint, next_state
from turnout.core.endpoint_rules import name_clash
from turnout.core.endpoint_urls import shared_name
from turnout.core.health import ProbePolicy, ProbeResult, failure_reason, probe_event, should_probe
from turnout.core.names import model_name_problem
from turnout.core.ssrf import check_address
from turnout.errors import UpstreamError
from turnout.fleet.poller import apply_openai_models, apply_tags
from turnout.fleet.state import External, Fleet, WorkerState
from turnout.masking import SECRETS
from turnout.store.db import StoreError
from turnout.store.endpoints import EndpointRecord, EndpointStore
from turnout.store.secrets import SecretBox, SecretError
from turnout.upstream.client import UpstreamClient
from turnout.upstream.http1 import DialGuard

__all__ = ["EndpointManager", "Probe", "hint_field", "probe", "url_private"]

log = logging.getLogger("turnout.endpoints")

_SYNC_S = 5.0  # how often registrations made elsewhere (the CLI) are picked up
_FAILURES = {f.value: f for f in Failure}
# the form field a failed check's hint is about (the UI shows the hint next to it)
_FIELDS = {
    Failure.REFUSED: "url",
    Failure.DNS: "url",
    Failure.TLS: "url",
    Failure.TIMEOUT: "url",
    Failure.PRIVATE: "url",
    Failure.FORBIDDEN_ADDRESS: "url",
    Failure.HTTP: "url",
    Failure.AUTH: "credential",
    Failure.WRONG_API: "api",
    Failure.BAD_ANSWER: "api",
}


def hint_field(failure: Failure | None) -> str | None:
    """Which field of an endpoint (``url``, ``api``, ``credential``) a failure's hint is about."""
    return None if failure is None else _FIELDS.get(failure, "url")


def url_private(url: str, nat64: tuple[ipaddress.IPv6Network, ...] = ()) -> bool | None:
    """Whether the URL's host is an address the SSRF guard refuses without the private-network opt-in:
    True for a private or loopback IP literal (or ``localhost``), False for a public literal, None for a
    host name (only known once resolved: the check then fails with ``dial_refused_private``). ``nat64``: the
    declared NAT64 prefixes, as the guard reads them."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    verdict = check_address(host, allow_private=False, nat64=nat64)
    return not verdict.allowed and not verdict.always


@dataclass(frozen=True, slots=True)
class Probe:
    """Result of one list-models call against an endpoint: health, latency, models, and advice."""

    ok: bool
    latency_ms: float
    models: list[str] = field(default_factory=list)
    failure: Failure | None = None
    status: int | None = None
    error: str | None = None
    hint: str | None = None
    body: Any = None

    def result(self) -> CheckResult:
        return CheckResult(self.ok, self.latency_ms, self.failure, self.status)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "latency_ms": round(self.latency_ms, 1),
            "models": self.models,
            "failure": None if self.failure is None else self.failure.value,
            "status": self.status,
            "error": self.error,
            "hint": self.hint,
            "field": hint_field(self.failure),
        }


async def probe(
    client: UpstreamClient, url: str, api: str, credential: str | None, guard: DialGuard, timeout_s: float
) -> Probe:
    """Call the endpoint's list-models route (``/api/tags`` or ``/v1/models``); redirects are not followed."""
    route = "/api/tags" if api == "ollama" else "/v1/models"
    headers = {"Authorization": f"Bearer {credential}"} if credential else None
    started = time.perf_counter()

    def failed(failure: Failure, error: str, status: int | None = None) -> Probe:
        return Probe(
            False,
            (time.perf_counter() - started) * 1000,
            [],
            failure,
            status,
            error,
            hint(failure, api, status=status, timeout_s=timeout_s),
        )

    try:
        async with client.request(
            "GET", url.rstrip("/") + route, label="endpoint", headers=headers, timeout_s=timeout_s, guard=guard
        ) as resp:
            data = await resp.read()
            status = resp.status
    except UpstreamError as exc:
        failure = _FAILURES.get(exc.code, Failure.REFUSED if exc.code != "upstream_error" else Failure.BAD_ANSWER)
        return failed(failure, exc.message)
    elapsed = (time.perf_counter() - started) * 1000
    if status in (401, 403):
        return failed(Failure.AUTH, f"HTTP {status} from {route}", status)
    if status == 404:
        return failed(Failure.WRONG_API, f"HTTP 404 from {route}", status)
    if 300 <= status < 400:
        return failed(Failure.HTTP, f"HTTP {status} redirect from {route} (redirects are not followed)", status)
    if status >= 400:
        return failed(Failure.HTTP, f"HTTP {status} from {route}", status)
    try:
        body = orjson.loads(data)
        listed = body["models"] if api == "ollama" else body["data"]
        models = sorted(m["name"] if api == "ollama" else m["id"] for m in listed)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return failed(Failure.BAD_ANSWER, f"{route} did not return the expected JSON", status)
    return Probe(True, elapsed, models, status=status, body=body)


class EndpointManager:
    def __init__(
        self, settings: Settings, fleet: Fleet, client: UpstreamClient, store: EndpointStore, secrets: SecretBox
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.client = client
        self.store = store
        self.secrets = secrets
        self.guard = DialGuard(allow_private=settings.endpoint_env.allow_private, nat64=settings.network.nat64)
        self._records: dict[str, EndpointRecord] = {}
        self._since: dict[str, float] = {}  # epoch time each endpoint entered its current state
        self._last_online: dict[str, float] = {}  # epoch time of the last check that found it routable
        self._failure: dict[str, Failure | None] = {}  # the failure of the last check
        self._task: asyncio.Task[None] | None = None
        self.on_change: Any = None

    @property
    def timeout_s(self) -> float:
        return self.settings.health.timeout_s

    @property
    def private_networks_allowed(self) -> bool:
        """The gateway's opt-in (APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS) for private destinations."""
        return self.settings.endpoint_env.allow_private

    async def test_unsaved(self, url: str, api: str, credential: str | None) -> Probe:
        """Probe an endpoint that is not registered: nothing is stored and the fleet does not change."""
        SECRETS.keep(credential)  # masked in logs from now on, saved or not
        return await probe(self.client, url, api, credential, self.guard, self.timeout_s)

    def configured_workers(self) -> set[str]:
        """The names of the config's workers (an endpoint may not take one: :func:`name_clash`)."""
        return {n for n, w in self.fleet.workers.items() if w.external is None}

    def credential(self, record: EndpointRecord) -> str | None:
        return None if record.credential is None else self.secrets.decrypt(record.credential)

    # -- registry -> fleet -------------------------------------------------------------------------
    async def sync(self) -> None:
        """Make the fleet's endpoint entries match the database."""
        try:
            records = {r.name: r for r in await asyncio.to_thread(self.store.all)}
        except StoreError as exc:
            log.warning("cannot read endpoints: %s", exc)
            return
        for name in list(self._records):
            if name not in records:
                self.fleet.workers.pop(name, None)
                del self._records[name]
                for memo in (self._since, self._last_online, self._failure):
                    memo.pop(name, None)
        changed = []
        for name, record in records.items():
            if self._records.get(name) == record:
                continue
            clash = name_clash(name, self.configured_workers())
            if clash is not None:
                log.error('endpoint "%s" is ignored: %s', name, clash)
                continue
            try:
                state = self._worker_state(record)
            except SecretError as exc:
                log.error('endpoint "%s": %s', name, exc)
                continue
            previous = self.fleet.workers.get(name)
            if previous is not None and previous.external is not None and self._records[name].url == record.url:
                state.external.state = previous.external.state  # type: ignore[union-attr]
            else:
                self._since[name] = time.time()  # new, or a new URL: its state starts over (unknown)
                self._failure.pop(name, None)
            self.fleet.workers[name] = state
            self._records[name] = record
            changed.append(name)
        self.fleet.endpoints = sum(1 for w in self.fleet.workers.values() if w.external is not None)
        await asyncio.gather(*(self.check(name) for name in changed))

    def _worker_state(self, record: EndpointRecord) -> WorkerState:
        fallback = record.fallback_model
        problem = None if fallback is None else model_name_problem(fallback, "fallback_model")
        if problem is not None:  # stored before names were checked (the admin API refuses it now): never used
            log.warning('endpoint "%s": its fallback model is ignored: %s', record.name, problem)
            fallback = None
        config = Worker.model_validate(
            {
                "name": record.name,
                "url": record.url,
                "type": record.api,
                "api_key": self.credential(record),
                "native_apis": record.native,
            }
        )
        return self.fleet.state_for(
            config,
            external=External(
                prefix=shared_name(record.name, ""),
                guard=self.guard,
                fallback_model=fallback,
                latency_budget_ms=record.latency_budget_ms,
            ),
        )

    # -- health ------------------------------------------------------------------------------------
    def _due(self, name: str, now: float) -> bool:
        """Whether the background check may probe this endpoint now (``turnout.core.health``): an
        OpenAI-style server (LM Studio, mlx_lm.server, llama.cpp) may serve one request at a time, so it is
        not probed while this gateway has requests in flight there or a fresh answer shows it alive."""
        state = self.fleet.workers.get(name)
        if state is None:
            return False
        policy = ProbePolicy.ALWAYS if state.config.type is WorkerType.OLLAMA else ProbePolicy.IDLE_ONLY
        return should_probe(
            policy,
            in_flight=state.in_flight,
            healthy=state.healthy,
            inventory_current=state.inventory is not None,
            last_progress=state.last_progress,
            now=now,
            interval_s=self.settings.endpoint_env.health_interval_s,
        )

    async def check(self, name: str, *, background: bool = False) -> Probe | None:
        """Probe one endpoint and apply the result. ``background``: a periodic check, whose timeout while
        the endpoint's requests are progressing says it is busy, not asleep (then nothing changes)."""
        state = self.fleet.workers.get(name)
        record = self._records.get(name)
        if state is None or state.external is None or record is None:
            return None
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await probe(self.client, record.url, record.api, state.config.api_key, self.guard, self.timeout_s)
        if background and result.failure is Failure.TIMEOUT:
            window = self.timeout_s
            if (
                probe_event(ProbeResult.TIMED_OUT, started=started, last_progress=state.last_progress, window_s=window)
                is None
            ):
                return result
        ext = state.external
        before = ext.state
        ext.state = next_state(before, result.result())
        ext.last_check, ext.latency_ms, ext.hint = time.time(), result.latency_ms, result.hint
        self._failure[name] = result.failure
        if ext.state.routable:
            self._last_online[name] = ext.last_check
        if ext.state is not before or name not in self._since:
            self._since[name] = ext.last_check
        reason = _reason(result)
        state.healthy = ext.state.routable
        state.checked = True
        state.last_error = result.error
        state.down_reason = None if ext.state.routable else f"{ext.state.value}: {reason}"
        if result.ok:
            _namespaced_inventory(state, record.api, result.body)
            # the endpoints design: the next request tries it first again as soon as a check sees it online
            state.models_back(loop.time(), "a health check found the endpoint online")
        if ext.state is not before:
            _log_change(name, before, ext.state, reason, result)
            if self.on_change is not None:
                self.on_change()
        return result

    async def start(self) -> None:
        for hint_text in self.settings.endpoint_env.hints:
            log.warning(hint_text)
        await self.sync()
        self._task = asyncio.create_task(self._loop(), name="turnout-endpoints")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        interval = self.settings.endpoint_env.health_interval_s
        last_check = time.monotonic()
        while True:
            await asyncio.sleep(_SYNC_S if interval <= 0 else min(_SYNC_S, interval))
            try:
                await self.sync()
                if interval > 0 and time.monotonic() - last_check >= interval:
                    last_check = time.monotonic()
                    now = asyncio.get_running_loop().time()
                    due = [n for n in list(self._records) if self._due(n, now)]
                    await asyncio.gather(*(self.check(n, background=True) for n in due))
            except Exception:  # one bad round must not end endpoint checking
                log.exception("endpoint check round failed")

    def describe(self) -> list[dict[str, Any]]:
        return [self._describe(name, record) for name, record in sorted(self._records.items())]

    def describe_one(self, name: str) -> dict[str, Any] | None:
        record = self._records.get(name)
        return None if record is None else self._describe(name, record)

    def _describe(self, name: str, record: EndpointRecord) -> dict[str, Any]:
        state = self.fleet.workers.get(name)
        ext = state.external if state is not None else None
        failure = self._failure.get(name)
        return {
            **record.to_json(),
            "state": ext.state.value if ext else EndpointState.UNKNOWN.value,
            "state_since": self._since.get(name),
            "last_online": self._last_online.get(name),
            "last_check": ext.last_check if ext else None,
            "latency_ms": None if ext is None or ext.latency_ms is None else round(ext.latency_ms, 1),
            "last_error": state.last_error if state else None,
            "last_failure": None if failure is None else failure.value,
            "hint": ext.hint if ext else None,
            "hint_field": hint_field(failure),
            "url_private": url_private(record.url, self.guard.nat64),
            "models": sorted(state.inventory) if state is not None and state.inventory is not None else [],
        }


def _reason(result: Probe) -> str:
    """A check's outcome in a few words: its failure (``connection refused``), or ``slow`` for a slow answer."""
    if result.failure is not None:
        return failure_reason(result.failure.value, result.status)
    return f"slow: listed its models in {result.latency_ms:.0f} ms" if result.latency_ms > SLOW_MS else "ok"


def _log_change(name: str, before: EndpointState, after: EndpointState, reason: str, result: Probe) -> None:
    """One line per change of an endpoint's state, with its reason and what to change."""
    if after is EndpointState.ONLINE:
        was = "" if before is EndpointState.UNKNOWN else f" again (was {before.value})"
        log.info('endpoint "%s" is online%s', name, was)
        return
    detail = f" [{result.error}]" if result.error else ""
    advice = f"; {result.hint}" if result.hint else ""
    log.warning('endpoint "%s" is %s: %s%s%s', name, after.value, reason, detail, advice)


def _namespaced_inventory(state: WorkerState, api: str, body: Any) -> None:
    assert state.external is not None
    if api == WorkerType.OLLAMA.value:
        apply_tags(state, body)
        state.tags = {
            f"{state.external.prefix}{n}": {
                **e,
                "name": f"{state.external.prefix}{n}",
                "model": f"{state.external.prefix}{n}",
            }
            for n, e in state.tags.items()
        }
        state.inventory = frozenset(state.tags)
    else:
        apply_openai_models(state, body)
        state.tags = {f"{state.external.prefix}{n}": e for n, e in state.tags.items()}
        state.inventory = frozenset(state.tags)
    state.loaded = state.inventory
