"""Who is calling and what it costs: key authentication, limit admission and settlement, usage rows.

Flow per client request: ``authenticate`` (401) -> scope check (403) -> ``admit`` (429) -> proxy ->
``finish`` (settle tokens with the real usage, or refund on failure; queue one usage row). A request refused
by the scope check or a limit is finished too, so it shows in usage as an error of its key.
Usage rows are written in batches by a background task, off the request path; shutdown flushes. A roll-up
the database refuses is logged and counted (``on_dropped``) and never holds back the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from turnout.config import Settings
from turnout.core.batches import line_limits
from turnout.core.limits import Decision, completion_budget, learn_bytes_per_token, prompt_estimate
from turnout.dialects.base import Call
from turnout.errors import Forbidden, TurnoutError, Unauthorized
from turnout.gateway.limiter import LocalLimiter, RedisLimiter, Subject, TokenLimiter
from turnout.store.keys import KeyRecord, KeyStore
from turnout.store.usage import Rollup, UsageRow, UsageStore, WriteResult

__all__ = ["Accountant", "Outcome", "Ticket", "UsageBatcher"]

log = logging.getLogger("turnout.accounting")

_NEGATIVE_CACHE_S = 2.0
_REFRESH_AFTER = 0.75  # share of a cached key lookup's life after which it is renewed in the background
_MAX_PENDING_GROUPS = 100_000
_MAX_LEARNED = 10_000  # (model, API) pairs whose bytes per token are kept


@dataclass(slots=True)
class Outcome:
    """What the proxy learned about one request, for accounting.

    A token count is None when the worker reported none (llama_cpp.server streams carry no usage); ``finish``
    then uses the gateway's own prompt estimate, and 0 for the completion (the proxy counts a stream's content
    events as its completion tokens when the worker reports none).
    """

    worker: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    failed: bool = False
    fallback_from: str | None = None
    # Awaited by the proxy with the whole answer (a stream's: its last frame) before that reaches the client, for a
    # call whose answer is kept (a stored Responses answer: a continuation right after it finds it).
    keep: Callable[[dict[str, Any]], Awaitable[None]] | None = None


@dataclass(slots=True)
class Ticket:
    key: KeyRecord | None
    reserved: int
    admitted: list[tuple[Subject, Decision]]  # limits this request holds (key chain, tenant)
    started: float
    prompt_estimate: int = 0  # the gateway's own prompt token estimate (the prompt part of ``reserved``)


class UsageBatcher:
    """Collects usage rows and writes them in batches (at most ``interval_s`` late, or when ``batch`` full)."""

    def __init__(self, store: UsageStore, *, interval_s: float = 1.0, batch: int = 500) -> None:
        self.store = store
        self.interval_s = interval_s
        self.batch = batch  # distinct groups that trigger an early write
        self._groups: dict[tuple[Any, ...], Rollup] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()  # one write at a time: a flush returns once what came before is written
        self._write_task: asyncio.Task[bool] | None = None  # the write under way (it outlives a cancelled flush)
        self.on_dropped: Callable[[int], None] = lambda _count: None  # roll-ups the database refused

    def add(self, row: UsageRow) -> None:
        """Roll the request into its group (cheap; runs on the request path)."""
        group = self._groups.get(row.group)
        if group is None:
            if len(self._groups) >= _MAX_PENDING_GROUPS:
                return  # the database has been failing for a long while; keep memory bounded
            group = self._groups[row.group] = Rollup()
            if len(self._groups) >= self.batch:
                self._wake.set()
        group.add(row)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="turnout-usage")

    async def flush(self) -> bool:
        """Write what has been added; whether all of it is in the database now (False: the database was away, the
        rows are kept for the next write). Waits for a write already under way (the loop's), which may hold rows
        added before this call: a reader that flushes first (a key's last use) then sees every row added before."""
        async with self._writing:
            if self._write_task is not None and not self._write_task.done():
                await asyncio.shield(self._write_task)  # a write whose flush was cancelled: it lands first
            # Shielded: a flush cancelled while its rows are on their way (a batch run's flusher stopped at the run's
            # end) must not cancel the write. Its rows are out of ``_groups`` by then, and a thread's work cancelled
            # before it began never runs: the rows were lost, and a batch whose answers were kept lacked a usage row.
            task = self._write_task = asyncio.ensure_future(self._write())
            return await asyncio.shield(task)

    async def _write(self) -> bool:
        groups, self._groups = self._groups, {}
        if not groups:
            return True
        try:
            result = await asyncio.to_thread(self.store.insert_rollups, groups)
        except Exception:  # a bug, not the database: keep the rows, and keep the loop alive
            log.exception("could not write %d usage roll-ups (will retry)", len(groups))
            result = WriteResult(unwritten=groups)
        for refused in result.refused:
            log.error("usage roll-up dropped, the database refused it: %s", refused.describe())
        if result.refused:
            self.on_dropped(len(result.refused))
        if result.unwritten:
            log.warning("could not write %d usage roll-ups (will retry): %s", len(result.unwritten), result.error)
            for key, pending in result.unwritten.items():  # merge back: nothing is lost while the database is down
                self._groups.setdefault(key, Rollup()).absorb(pending)
        return not result.unwritten

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            await self.flush()


@dataclass(slots=True)
class _Cached:
    record: KeyRecord | None
    until: float  # monotonic: after this, a request waits for a fresh lookup
    refresh_at: float  # monotonic: from this, the first request starts a lookup in the background


class Accountant:
    def __init__(
        self,
        settings: Settings,
        keys: KeyStore,
        usage: UsageStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        limiter: TokenLimiter | None = None,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.open = settings.auth.open
        self.usage = UsageBatcher(usage)
        if limiter is None:
            limiter = RedisLimiter(settings.storage.redis_url) if settings.storage.redis_url else LocalLimiter()
        self.limiter: TokenLimiter = limiter
        self.clock = clock
        self._cache: dict[str, _Cached] = {}
        self._loading: dict[str, asyncio.Task[KeyRecord | None]] = {}  # one store lookup per token at a time
        self._generation = 0  # bumped by forget(): a lookup begun before it never fills the cache
        # (model, API) -> request-body bytes per prompt token, learned from the workers' own counts
        self._bytes_per_token: dict[tuple[str, str], float] = {}

    # -- auth ------------------------------------------------------------------------------------
    async def authenticate(self, request: web.Request) -> KeyRecord | None:
        """The caller's key, from ``Authorization: Bearer <key>`` or, without that header, ``x-api-key: <key>``
        (what the Anthropic SDKs and Claude Code send); None only under open access without a key. Raises
        Unauthorized."""
        headers = request.headers
        header = headers.get("Authorization")
        if not header:
            token = headers.get("x-api-key", "").strip()
            if not token:
                if self.open:
                    return None
                raise Unauthorized(
                    "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>' "
                    "(create one: turnout key create)",
                    code="missing_api_key",
                )
        else:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                if self.open:
                    return None
                raise Unauthorized("the Authorization header must be 'Bearer <key>'", code="invalid_api_key")
        record = await self._lookup(token)
        why = "invalid API key" if record is None else record.usable(time.time())
        if why is None:
            return record
        if self.open:
            return None  # open access: SDKs send placeholder keys; a key that is not valid gets no privileges
        raise Unauthorized(why, code="invalid_api_key")

    def forget(self) -> None:
        """Drop cached lookups (after a revoke or rotate through the admin API): the next request of every
        token reads the store, and a lookup already under way no longer fills the cache."""
        self._cache.clear()
        self._loading.clear()
        self._generation += 1

    async def _lookup(self, token: str) -> KeyRecord | None:
        """Cached by the presented token itself (it is in this process's memory anyway): no hashing on a hit.

        Single flight: concurrent requests for a token share one store lookup. Refresh ahead: in the last
        quarter of an entry's life the first request starts a lookup in the background and is answered from
        the cache, so a busy key's entry is renewed before it expires and no request waits for the store; an
        entry is never used past ``auth.key_cache_s`` (a change written to the store reaches the gateway
        within that time, as before)."""
        cached = self._cache.get(token)
        if cached is not None:
            now = self.clock()
            if now < cached.until:
                if now >= cached.refresh_at and token not in self._loading:
                    self._load(token)
                return cached.record
        return await asyncio.shield(self._loading.get(token) or self._load(token))

    def _load(self, token: str) -> asyncio.Task[KeyRecord | None]:
        task = asyncio.create_task(self._fetch(token, self._generation))
        self._loading[token] = task
        task.add_done_callback(lambda t: _log_failed_refresh(t, self._cache.get(token) is not None))
        return task

    async def _fetch(self, token: str, generation: int) -> KeyRecord | None:
        try:
            record = await asyncio.to_thread(self.keys.find, token)
        finally:
            if generation == self._generation:
                self._loading.pop(token, None)
        if generation != self._generation:
            return record  # forget() ran meanwhile: answer this lookup's waiters, cache nothing
        ttl = (
            self.settings.auth.key_cache_s
            if record is not None
            else min(_NEGATIVE_CACHE_S, self.settings.auth.key_cache_s)
        )
        now = self.clock()
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[token] = _Cached(record, now + ttl, now + ttl * _REFRESH_AFTER)
        return record

    @staticmethod
    def check_scope(key: KeyRecord | None, model: str, alias: str | None = None) -> None:
        """403 unless the key may use ``model`` (for a request naming an alias: the model it stands for)."""
        if key is not None and not key.allows(model):
            scopes = ", ".join(f"model:{p.text}" for p in key.scopes)
            asked = "" if alias is None else f' (asked for as alias "{alias}")'
            raise Forbidden(
                f'model "{model}"{asked} is not allowed for this API key (scopes: {scopes})', code="model_not_allowed"
            )

    # -- limits and usage --------------------------------------------------------------------------
    def subjects(self, key: KeyRecord | None, *, batch: bool = False) -> list[Subject]:
        """The limits a request of ``key`` counts against; ``batch``: a Batch API line's, which count against the
        daily token budgets and never the rates (:func:`turnout.core.batches.line_limits`)."""
        if key is None or (key.rpm is None and key.daily_tokens is None and key.tenant not in self.settings.tenants):
            return []  # the common case, kept cheap: it runs on every request
        out = [Subject.of_key(key)]
        tenant = self.settings.tenants.get(key.tenant)
        if tenant is not None:
            out.append(Subject(f"t:{key.tenant}", tenant.rpm, tenant.daily_tokens, f'tenant "{key.tenant}": '))
        if batch:
            out = [Subject(s.id, *line_limits(s.rpm, s.daily_tokens), s.label) for s in out]
        return [s for s in out if s.limited]

    def estimate(self, call: Call) -> int:
        """The call's prompt tokens as the gateway estimates them: what it is billed when its worker counts none,
        and what a translated answer then tells the client (:attr:`~turnout.dialects.base.Call.estimate`). The
        body's size over the bytes per token learned for the model and API from earlier answers' counts (a model
        not counted yet: the API's figure over every model; :func:`turnout.core.limits.prompt_estimate`); 0 for
        a call that generates nothing."""
        if not call.endpoint.generates:  # a token count (count_tokens) costs a request, never tokens
            return 0
        learned = self._bytes_per_token
        api = call.api_name
        ratio = learned.get((call.model, api)) or learned.get(("", api))  # a model's own, else the API's
        return prompt_estimate(len(call.body), ratio)

    def learn(self, call: Call, prompt_tokens: int | None) -> None:
        """One more answer whose worker counted ``prompt_tokens`` for ``call``'s prompt."""
        if prompt_tokens is None or not call.endpoint.generates:
            return
        learned = self._bytes_per_token
        api = call.api_name
        for key in ((call.model, api), ("", api)):  # the model's own figure, and its API's over every model
            ratio = learn_bytes_per_token(learned.get(key), len(call.body), prompt_tokens)
            if ratio is not None:
                if key not in learned and len(learned) >= _MAX_LEARNED:
                    learned.clear()
                learned[key] = ratio

    async def admit(self, key: KeyRecord | None, call: Call, *, batch: bool = False) -> Ticket:
        """Admit against every limit that applies; a refusal by one undoes the others (all or nothing). ``batch``: a
        Batch API line (see :meth:`subjects`)."""
        started = time.perf_counter()
        prompt = self.estimate(call)  # the prompt part alone
        subjects = self.subjects(key, batch=batch)
        if not subjects:
            return Ticket(key, 0, [], started, prompt)
        default = self.settings.auth.default_completion_tokens
        reserved = prompt + completion_budget(_max_tokens(call), default) if call.endpoint.generates else 0
        admitted: list[tuple[Subject, Decision]] = []
        try:
            for subject in subjects:
                admitted.append((subject, await self.limiter.admit(subject, reserved)))
        except TurnoutError:
            for subject, decision in admitted:
                await self.limiter.release(subject, decision, reserved)
            raise
        return Ticket(key, reserved, admitted, started, prompt)

    async def finish(
        self,
        ticket: Ticket,
        call: Call,
        outcome: Outcome,
        status: int,
        *,
        batch_id: str | None = None,
        record: bool = True,
    ) -> UsageRow:
        """Settle the limits and queue the usage row (returned: the access log writes it too). For a request
        that succeeded, a prompt count the worker did not report is the ticket's estimate (a completion count,
        0); a failed one is refunded and recorded with the counts reported, else zero. ``batch_id``: the Batch API
        batch whose line this was (in the usage row). ``record`` False: the row is returned, not written (a batch
        request stopped for another, and sent again: :mod:`turnout.gateway.preemption`)."""
        failed = outcome.failed or status >= 400
        prompt, completion = outcome.prompt_tokens, outcome.completion_tokens
        if not failed:
            self.learn(call, prompt)
        prompt_used = (prompt or 0) if failed or prompt is not None else ticket.prompt_estimate
        completion_used = completion or 0
        if ticket.admitted:
            actual = 0 if failed else prompt_used + completion_used
            if not failed and (actual == 0 or (prompt is None and completion is None)):
                actual = ticket.reserved  # the worker reported no usage at all: keep the reservation
            for subject, decision in ticket.admitted:
                await self.limiter.settle(subject, decision, ticket.reserved, actual)
        row = UsageRow(
            ts=time.time(),
            key_id=None if ticket.key is None else ticket.key.id,
            endpoint=call.api_name,
            model=call.model,
            worker=outcome.worker,
            status=status,
            error=failed,
            prompt_tokens=prompt_used,
            completion_tokens=completion_used,
            latency_ms=(time.perf_counter() - ticket.started) * 1000,
            fallback_from=outcome.fallback_from,
            alias=call.alias,
            batch_id=batch_id,
        )
        if record:
            self.usage.add(row)
        return row

    async def start(self) -> None:
        self.usage.start()

    async def close(self) -> None:
        await self.usage.close()
        await self.limiter.close()


def _log_failed_refresh(task: asyncio.Task[KeyRecord | None], background: bool) -> None:
    """A background refresh that failed: its entry expires as usual and the next lookup retries (a request
    waiting on a lookup gets the error itself)."""
    error = None if task.cancelled() else task.exception()  # retrieved here, whoever else waits on it
    if background and error is not None:
        log.warning("could not refresh a cached API key lookup (the cached one is used until it expires): %s", error)


def _max_tokens(call: Call) -> int | None:
    p = call.payload
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = p.get(name)
        if isinstance(value, int):
            return value
    options = p.get("options")
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int):
        return int(options["num_predict"])
    return None
