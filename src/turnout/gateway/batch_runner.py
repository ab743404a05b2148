"""Running batches of the OpenAI Batch API: every gateway process looks for batches with work to do, takes a batch's
lease (:mod:`.batch_lease`) and sends its lines through the normal path (:func:`turnout.gateway.serving.answer`:
the key's scopes, placement, routing, limits, a usage row naming the batch), each at the dispatcher's ``batch``
priority (``Dispatcher.acquire(..., priority=Priority.BATCH)``), at most ``batches.lines_in_flight`` at once.

A line's answer, whatever it is, is written to the store (:meth:`BatchStore.record`) before the line counts as done;
a batch resumes from the lines without an answer, in whichever process takes it over next.

What "exactly once" means here: **every line of a batch has exactly one answer in its output or error file**,
however often the gateways running it are killed or restarted. The store keeps the first answer written for a line
and refuses any other (the primary key (batch, line)). A line whose answer had not been written when its runner
died (it was in flight, or waiting to be written, at most a fraction of a second) is sent again by the runner that
resumes the batch: the engine may then have computed it twice, and the first answer, never written, is lost with
the process (as is its usage row when the process dies before writing it). A runner that lost its lease stops
taking lines at once; what it still writes for a line in flight is kept only if nobody wrote that line before.

What a line's answer makes the runner do is :func:`turnout.core.batches.verdict`: record it (a 2xx in the output
file, any other answer in the error file), wait and send it again (429: the key's daily tokens are spent, until
they renew; 503: no capacity now), or try again (a worker that failed, up to ``batches.max_attempts`` times).
Waiting never outlives the batch's completion window: when it passes, every line without an answer gets the
error line ``batch_expired`` and the batch is ``expired``.

A line in flight may be stopped (at most three times) for an interactive or standard request that finds no free slot
(:mod:`turnout.core.preemption`, :mod:`turnout.gateway.preemption`): it is sent again at once, behind that request
in the queue; the stopped attempt is not an attempt (``max_attempts``), has no answer and no usage row.

A cancel stops new lines at once (in this process when the cancel came here; within half a second in the one that
runs the batch otherwise); lines in flight end, and the lines never sent get ``batch_cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from turnout.config import Batches
from turnout.core import batches as batch_rules
from turnout.core.admission import Priority
from turnout.core.batches import (
    ACTIVE,
    CANCELLED,
    EXPIRED,
    FileProblem,
    Line,
    Verdict,
    end_status,
    failed_line,
    kept,
    output_line,
    parse_batch_file,
    retry_wait_s,
    verdict,
)
from turnout.core.preemption import may_stop
from turnout.core.routing import NoRouteReason
from turnout.dialects import CLIENT_APIS, api
from turnout.dialects.base import Call, Dialect, Endpoint
from turnout.errors import TurnoutError, Unauthorized
from turnout.gateway.access import USAGE_ROW
from turnout.gateway.aliases import Aliases
from turnout.gateway.batch_lease import Leases
from turnout.gateway.calls import call_of
from turnout.gateway.keys import ACCOUNTANT, DISPATCHER
from turnout.gateway.preemption import STOPPABLE, Partial, Stoppable, partial_of
from turnout.gateway.serving import answer
from turnout.gateway.timing import PHASES, Phases
from turnout.store.batches import BatchFile, BatchRecord, BatchStore, Result
from turnout.store.db import StoreError
from turnout.store.keys import KeyRecord, KeyStore

__all__ = ["BatchRunner", "LineRequest", "line_route"]

log = logging.getLogger("turnout.batches")

_CHECK_S = 0.5  # how often a running batch's status (cancel) and completion window are checked
_FLUSH_S = 0.1  # answers wait at most this long to be written (a line is done once written)
_FLUSH_LINES = 256  # or until this many wait
_UNWRITTEN_MOST = 4 * _FLUSH_LINES  # answers not yet written (the store failing) before no new line is sent
_KEY_S = 5.0  # how long a run uses its key's record before reading it again (a revocation reaches it then)
_PURGE_S = 60.0  # retention is applied at most this often per process
_RETRY_MOST_S = 10.0  # longest wait before another attempt at a line whose worker failed
_WAITING_MOST = 4  # lines of a run in its tasks at once, as a multiple of lines_in_flight (the others wait to go)


def line_route(url: str) -> tuple[Dialect, Endpoint]:
    """(dialect, endpoint) of a batch line's ``url``: the client route's own (:data:`turnout.dialects.CLIENT_APIS`)."""
    for dialect, client in CLIENT_APIS.items():
        for route in client.routes:
            if route.path == url and route.method == "POST":
                return dialect, route.endpoint
    raise KeyError(url)


class LineRequest(dict[Any, Any]):
    """What the proxy reads of a request for a call answered in one piece, for a batch line (sent by no client):
    its app, its headers (none) and a mapping for what the access log would read (a batch line has no access line),
    with the timing the proxy records (:mod:`turnout.gateway.timing`; a line has no ``Server-Timing``, histograms or
    span). A line never streams (the input file's rules refuse ``stream``), so nothing is ever written to it."""

    def __init__(self, app: web.Application) -> None:
        super().__init__()
        self.app = app
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self[PHASES] = Phases(time.perf_counter())


class _Stop(Exception):
    pass


class _Run:
    """One batch running in this process."""

    def __init__(self, record: BatchRecord) -> None:
        self.id = record.id
        self.record = record
        self.stop = asyncio.Event()
        self.why = ""  # cancel | expire | lease | shutdown
        self.pending: list[Result] = []
        self.flushed = asyncio.Event()
        self.key: KeyRecord | None = None
        self.key_read = -_KEY_S
        self.task: asyncio.Task[None] | None = None
        self.attempts: dict[int, Stoppable] = {}  # each line in flight's current attempt, by line number
        self.places = asyncio.Semaphore(1)  # lines at work at once (batches.lines_in_flight: set by _send_all)
        self.unlisted: dict[str, float] = {}  # model -> since when no worker known to hold it could serve it
        self.told: set[tuple[str, bool]] = set()  # (model, unlisted): the waits this run has logged

    def halt(self, why: str) -> None:
        if not self.stop.is_set():
            self.why = why
            self.stop.set()

    async def pause(self, seconds: float) -> None:
        """Sleep, unless the run stops first (raises _Stop then)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), max(seconds, 0.0))
        if self.stop.is_set():
            raise _Stop


class BatchRunner:
    def __init__(
        self,
        app: web.Application,
        store: BatchStore,
        settings: Batches,
        leases: Leases,
        *,
        keys: KeyStore,
        aliases: Aliases,
        request_ids: Iterator[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``app``: the gateway whose objects answer each line (:func:`turnout.gateway.serving.answer`)."""
        self.app = app
        self.keys = keys
        self.aliases = aliases
        self.request_ids = request_ids
        self.store = store
        self.settings = settings
        self.leases = leases
        self.clock = clock
        self.runs: dict[str, _Run] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._purged = 0.0

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="turnout-batches")

    async def stop(self) -> None:
        """Stop every run here (lines in flight are sent again by whoever resumes the batch) and give back their
        leases, after writing the answers that arrived."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        runs = list(self.runs.values())
        for run in runs:
            run.halt("shutdown")
            for attempt in list(run.attempts.values()):
                attempt.stop()  # stopped, not failed: no usage row (nobody was answered; it is sent again on resume)
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(r.task for r in runs if r.task is not None), return_exceptions=True)
        await self.leases.close()

    def nudge(self) -> None:
        """A batch was created through this process: look for work now."""
        self._wake.set()

    def cancelled(self, batch_id: str) -> None:
        """A batch was marked cancelling through this process: when it runs here, no new line starts from now."""
        run = self.runs.get(batch_id)
        if run is not None:
            run.halt("cancel")
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self._look()
            except StoreError as exc:
                log.warning("cannot look for batches to run (trying again in %g s): %s", self.settings.poll_s, exc)
            except Exception:  # a bug: logged, and the loop keeps going
                log.exception("looking for batches to run failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_s)
            self._wake.clear()

    async def _look(self) -> None:
        now = self.clock()
        if now - self._purged >= _PURGE_S:
            self._purged = now
            gone = await asyncio.to_thread(self.store.purge, now, self.settings.retention_days * 86_400)
            if any(gone):
                log.info("deleted %d batches and %d files past their retention", *gone)
        for batch_id in await asyncio.to_thread(self.store.runnable, now, free_only=self.leases.in_sql):
            if batch_id in self.runs or not await self.leases.claim(batch_id):
                continue
            record = await asyncio.to_thread(self.store.batch, batch_id)
            if record is None or record.status not in ACTIVE:
                await self.leases.release(batch_id)
                continue
            run = self.runs[batch_id] = _Run(record)
            run.task = asyncio.create_task(self._run(run), name=f"turnout-batch-{batch_id}")

    # -- one batch ----------------------------------------------------------------------------------------
    async def _run(self, run: _Run) -> None:
        watch = asyncio.create_task(self._watch(run))
        try:
            lines = await self._lines(run)
            if lines is not None:
                await self._send_all(run, lines)
                await self._flush(run)
                if run.why not in ("lease", "shutdown"):
                    await self._end(run, lines)
        except asyncio.CancelledError:
            with contextlib.suppress(StoreError):
                await self._flush(run)
            raise
        except StoreError as exc:
            log.warning("batch %s stopped here (another gateway, or this one, resumes it): %s", run.id, exc)
        except Exception:
            log.exception("batch %s stopped here after an unexpected error (it is resumed)", run.id)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            self.runs.pop(run.id, None)
            await self.leases.release(run.id)

    async def _lines(self, run: _Run) -> list[Line] | None:
        """The batch's lines (None: it failed, it cannot be read); a validating batch goes in_progress."""
        record = run.record
        content = await asyncio.to_thread(self.store.content, record.input_file_id)
        try:
            if content is None:
                raise FileProblem([], 0, f"the input file {record.input_file_id} is gone")
            lines = await asyncio.to_thread(parse_batch_file, content, 2**31)
        except FileProblem as exc:
            errors = [
                {"code": p.code, "message": p.message, "param": p.param, "line": p.line} for p in exc.problems
            ] or [{"code": "invalid_file", "message": str(exc), "param": None, "line": None}]
            await asyncio.to_thread(self.store.fail, run.id, errors, self.clock())
            log.warning("batch %s failed: its input file cannot be read: %s", run.id, exc)
            return None
        if record.status == "validating":
            await asyncio.to_thread(
                self.store.set_status, run.id, "in_progress", self.clock(), only_from=("validating",)
            )
        log.info("running batch %s (%d lines) as %s", run.id, len(lines), self.leases.runner)
        return lines

    async def _watch(self, run: _Run) -> None:
        """Renew the lease, and stop the run when it is cancelled, its window passes, or the lease is lost."""
        renew_every = self.settings.lease_s / 3
        renewed = self.clock()
        while not run.stop.is_set():
            await asyncio.sleep(min(_CHECK_S, renew_every))
            now = self.clock()
            if now >= run.record.expires_at:
                run.halt("expire")
                return
            if now - renewed >= renew_every:
                if not await self.leases.renew(run.id):
                    log.warning("batch %s: this gateway lost its lease; another one runs it", run.id)
                    run.halt("lease")
                    return
                renewed = now
            try:
                status = await asyncio.to_thread(self.store.status, run.id)
            except StoreError:
                continue
            if status == "cancelling":
                run.halt("cancel")
            elif status not in ACTIVE:
                run.halt("lease")  # ended or deleted elsewhere: nothing left for this run to write

    async def _send_all(self, run: _Run, lines: list[Line]) -> None:
        if run.record.status == "cancelling":
            run.halt("cancel")
            return
        if self.clock() >= run.record.expires_at:
            run.halt("expire")
            return
        done = await asyncio.to_thread(self.store.answered, run.id)
        flusher = asyncio.create_task(self._flusher(run))
        in_flight: set[asyncio.Task[None]] = set()
        run.places = asyncio.Semaphore(self.settings.lines_in_flight)
        try:
            for line in lines:
                if line.number in done:
                    continue
                # a line waiting to be sent again (no worker can take it now) gives its place to the next line,
                # so a few lines that cannot go never hold the batch back; at most this many lines wait so
                while len(in_flight) >= _WAITING_MOST * self.settings.lines_in_flight and not run.stop.is_set():
                    stopped = asyncio.ensure_future(run.stop.wait())
                    await asyncio.wait([*in_flight, stopped], return_when=asyncio.FIRST_COMPLETED)
                    stopped.cancel()
                    in_flight = {t for t in in_flight if not t.done()}
                if not await self._place(run):
                    break
                while len(run.pending) >= _UNWRITTEN_MOST and not run.stop.is_set():
                    # the store does not take the answers (down?): no new line until it does
                    run.flushed.clear()
                    waits = [asyncio.ensure_future(e.wait()) for e in (run.flushed, run.stop)]
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    for waiting in waits:
                        waiting.cancel()
                if run.stop.is_set():
                    run.places.release()
                    break
                task = asyncio.create_task(self._line(run, line))
                in_flight.add(task)
            await self._drain(run, in_flight)
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher

    @staticmethod
    async def _drain(run: _Run, in_flight: set[asyncio.Task[None]]) -> None:
        """Wait for the lines in flight. Once the run stops, a line still waiting for a slot ends unsent (a cancel
        starts no line, OpenAI's "no new requests"); at the window's end a line at work is stopped too (expired:
        an answer after the window is not kept); otherwise it ends (a cancel lets it finish)."""
        stopped: asyncio.Future[Any] = asyncio.ensure_future(run.stop.wait())
        try:
            pending: set[asyncio.Future[Any]] = set(in_flight)
            while pending and not run.stop.is_set():
                _, pending = await asyncio.wait([*pending, stopped], return_when=asyncio.FIRST_COMPLETED)
                pending.discard(stopped)
            if pending:
                for attempt in list(run.attempts.values()):
                    if run.why == "expire" or not attempt.sent:
                        attempt.stop()
                await asyncio.gather(*pending)
        finally:
            stopped.cancel()

    @staticmethod
    async def _place(run: _Run) -> bool:
        """Take one of the run's places for a line at work (``lines_in_flight`` of them); False: the run stopped
        first."""
        acquiring = asyncio.ensure_future(run.places.acquire())
        stopped = asyncio.ensure_future(run.stop.wait())
        try:
            await asyncio.wait([acquiring, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not acquiring.done():
                acquiring.cancel()
        if acquiring.cancelled():
            return False
        if run.stop.is_set():
            run.places.release()
            return False
        return True

    async def _line(self, run: _Run, line: Line) -> None:
        """Send one line until it has an answer to record (or the run stops: it is left to whoever goes on). It
        holds one of the run's places (taken by :meth:`_send_all`) except while it waits to be sent again."""
        dialect, endpoint = line_route(line.url)
        try:
            call = call_of(line.body, dialect, endpoint, line.url, aliases=self.aliases.table)
        except TurnoutError as exc:
            run.places.release()
            self._keep(run, line, exc.status, orjson.loads(api(dialect).error_body(exc)), None)
            return
        attempt = waits = 0
        held = True  # its place
        stops = 0  # times stopped for a request of a higher class (core.preemption.may_stop)
        partial: Partial | None = None  # what the stopped attempts answered, continued (gateway.preemption)
        try:
            while not run.stop.is_set():
                attempt += 1
                left = run.record.expires_at - self.clock()  # it waits for a slot as long as its window lasts
                if left <= 0:
                    return  # left unanswered: the run ends it as expired
                # (a little past the window: at its end the run stops the line, which then leaves no usage row)
                stop = run.attempts[line.number] = Stoppable(
                    preemptible=may_stop(stops), queue_s=left + 2 * _CHECK_S, partial=partial
                )
                sent = await self._send(run, call, stop)
                if sent is None:  # stopped for another request: sent again at once (queued behind it), not an attempt
                    stops += 1  # (or by this run, which has stopped: the loop ends)
                    attempt -= 1
                    partial = partial_of(stop.frames, partial) if endpoint is Endpoint.CHAT else None
                    continue
                status, body, retry_after, request, code = sent
                unlisted = self._unlisted(run, call, code)
                decided = verdict(status, attempt, self.settings.max_attempts, unlisted_s=unlisted)
                if decided is Verdict.RECORD:
                    self._keep(run, line, status, body, request)
                    return
                if decided is Verdict.RETRY:
                    await run.pause(retry_wait_s(None, attempt - 1, most_s=_RETRY_MOST_S))
                    continue
                attempt -= 1  # a wait is not an attempt
                waits += 1
                if status == 503:
                    _tell_waiting(run, call.model, body, unlisted is not None)
                left = run.record.expires_at - self.clock()
                run.places.release()  # another line works meanwhile
                held = False
                await run.pause(min(retry_wait_s(retry_after, waits - 1, unlisted_s=unlisted), left))
                held = await self._place(run)
                if not held:
                    return
        except _Stop:
            return
        finally:
            run.attempts.pop(line.number, None)
            if held:
                run.places.release()

    def _unlisted(self, run: _Run, call: Call, code: str | None) -> float | None:
        """For an answer that no worker can serve the line's model now, where none that may serve it is known to
        hold it (:meth:`Dispatcher.worth_waiting_for`), how long this run has been answered that way for that
        model; None otherwise (and the clock starts again)."""
        now = self.clock()
        if code == NoRouteReason.NO_HEALTHY.value and not self.app[DISPATCHER].worth_waiting_for(call.model):
            return now - run.unlisted.setdefault(call.model, now)
        run.unlisted.pop(call.model, None)
        return None

    async def _send(
        self, run: _Run, call: Call, stop: Stoppable
    ) -> tuple[int, Any, int | None, LineRequest, str | None] | None:
        """One attempt: (status, answer body, Retry-After, the request it was sent as, the gateway's error code when
        it refused it); None: it was stopped (for a request of a higher class, :mod:`turnout.gateway.preemption`, or
        by the run: :meth:`_drain`)."""
        request = LineRequest(self.app)
        request[STOPPABLE] = stop
        try:
            key = await self._key(run)
            if run.stop.is_set():
                return None  # stopped while its key was read: never sent
            sending = asyncio.ensure_future(
                answer(cast(web.Request, request), key, call, priority=Priority.BATCH, batch_id=run.id)
            )
            stop.task = sending
            response = await sending
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not stop.stopped or (current is not None and current.cancelling()):
                raise  # the run itself is stopping
            return None
        except TurnoutError as exc:
            return exc.status, orjson.loads(api(call.dialect).error_body(exc)), exc.retry_after, request, exc.code
        body = response.body if isinstance(response, web.Response) else None
        if not isinstance(body, bytes):
            error = TurnoutError("the answer could not be kept (a stream)", code="internal_error")
            return 500, orjson.loads(api(call.dialect).error_body(error)), None, request, None
        try:
            parsed: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = body.decode("utf-8", "replace")
        retry = response.headers.get("Retry-After", "")
        return response.status, parsed, int(retry) if retry.isdigit() else None, request, None

    async def _key(self, run: _Run) -> KeyRecord | None:
        """The key the batch runs as: the one that created it, or the key it was rotated to (re-read every few
        seconds, so a revocation stops the batch's lines). Unauthorized when it can no longer be used."""
        key_id = run.record.key_id
        if key_id is None:
            return None
        now = self.clock()
        if run.key is None or now - run.key_read >= _KEY_S:
            run.key = await asyncio.to_thread(_current_key, self.keys, key_id)
            run.key_read = now
        why = run.key.usable(now) if run.key is not None else "the key that created this batch is gone"
        if why is not None:
            raise Unauthorized(why, code="invalid_api_key")
        return run.key

    def _keep(self, run: _Run, line: Line, status: int, body: Any, request: LineRequest | None) -> None:
        request_id = next(self.request_ids)
        row = request.get(USAGE_ROW) if request is not None else None
        shaped = output_line(_line_id(), line.custom_id, status, request_id, body)
        run.pending.append(
            Result(
                line.number,
                200 <= status < 300,
                kept(orjson.dumps(shaped)),  # it may wait to be written (the store away): its own size
                row.prompt_tokens if row is not None else 0,
                row.completion_tokens if row is not None else 0,
            )
        )

    # -- writing answers ---------------------------------------------------------------------------------
    async def _flusher(self, run: _Run) -> None:
        while True:
            await asyncio.sleep(_FLUSH_S)
            try:
                await self._flush(run)
            except StoreError as exc:
                log.warning("batch %s: answers not written yet (tried again shortly): %s", run.id, exc)

    async def _flush(self, run: _Run) -> None:
        """Write the answers that arrived (a line is done once its answer is written), their usage rows first: a
        gateway killed between the two has billed a line it sends again (its engine ran it twice), never kept an
        answer nobody was billed for."""
        while run.pending:
            batch, run.pending = run.pending[:_FLUSH_LINES], run.pending[_FLUSH_LINES:]
            try:  # (these answers' rows were added before they were kept: this write has them)
                if not await self.app[ACCOUNTANT].usage.flush():
                    raise StoreError("their usage rows could not be written yet")
                await asyncio.to_thread(self.store.record, run.id, batch, self.clock())
            except BaseException:
                run.pending[:0] = batch  # not written: kept for the next try (or sent again by the next runner)
                raise
            run.flushed.set()

    async def _end(self, run: _Run, lines: list[Line]) -> None:
        """Every line has its answer, or the run stopped for a cancel or the window: end the batch."""
        record = await asyncio.to_thread(self.store.batch, run.id)
        if record is None or record.status not in ACTIVE:
            return
        now = self.clock()
        answered = await asyncio.to_thread(self.store.answered, run.id)
        missing = [line for line in lines if line.number not in answered]
        status = end_status(record.status, now, record.expires_at, answered_all=not missing)
        if status is None:
            return  # a line stopped early without a reason to end: left for the next run
        if missing:
            never = CANCELLED if status == "cancelled" else EXPIRED
            for line in missing:
                shaped = failed_line(_line_id(), line.custom_id, never)
                run.pending.append(Result(line.number, False, kept(orjson.dumps(shaped)), unanswered=True))
            await self._flush(run)
        else:
            await asyncio.to_thread(self.store.set_status, run.id, "finalizing", now, only_from=("in_progress",))
        output_keep = record.output_expires_s or self.settings.retention_days * 86_400
        output, errors = (
            BatchFile(_file_id(), record.app, purpose, f"{record.id}_{kind}.jsonl", 0, 0, now, now + output_keep)
            for purpose, kind in (("batch_output", "output"), ("batch_error", "error"))
        )
        ended = await asyncio.to_thread(self.store.end, run.id, status, self.clock(), (output, errors))
        if ended is not None:
            log.info(
                "batch %s %s: %d answered, %d failed of %d",
                run.id,
                ended.status,
                ended.completed,
                ended.failed,
                ended.total,
            )


def _current_key(keys: KeyStore, key_id: int) -> KeyRecord | None:
    try:
        record = keys.get(str(key_id))
        seen = {record.id}
        while record.rotated_to is not None and record.rotated_to not in seen:  # its lineage's newest key
            record = keys.get(str(record.rotated_to))
            seen.add(record.id)
    except KeyError:
        return None
    return record


def _tell_waiting(run: _Run, model: str, body: Any, unlisted: bool) -> None:
    """Log, once per run and model, that its lines wait for a worker, and why (an operator's answer to "why does
    this batch not move")."""
    if (model, unlisted) in run.told:
        return
    run.told.add((model, unlisted))
    error = body.get("error") if isinstance(body, dict) else None
    why = error.get("message") if isinstance(error, dict) else None
    then = (
        f"no worker that may serve it is known to hold it: they are answered with that 503 after "
        f"{batch_rules.UNLISTED_WAIT_S:g} s unless one that lists it comes back"
        if unlisted
        else "they wait as long as the batch's window lasts"
    )
    log.warning("batch %s: lines for model %r wait (%s); %s", run.id, model, why or "503", then)


def _line_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def _file_id() -> str:
    return f"file-{secrets.token_hex(12)}"
