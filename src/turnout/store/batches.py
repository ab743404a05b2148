"""The OpenAI Batch API's files, batches and answered lines, in the SQL store.

Files live here rather than in the data dir because replicas share the store and not, as a rule, a data dir: any
replica can then run or resume any batch, and backups hold them with the rest of the store. An input file keeps its
content (up to ``batches.max_file_bytes``); an output or error file is a row naming its batch, and its lines are that
batch's rows in ``batch_results`` (read in order of the input file's lines when the file is read), so an answer is
stored once.

A line's answer is written once: the primary key (batch, line) keeps the first, whoever wrote it, and the batch's
counts grow only by the rows a write added (:meth:`BatchStore.record`). A batch's runner holds a lease on it
(:meth:`BatchStore.claim`, :meth:`BatchStore.renew`) unless Redis holds the leases
(:mod:`turnout.gateway.batch_lease`).

Sync SQLAlchemy Core, like the rest of the store: the gateway calls it from worker threads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import ColumnElement, Connection, Insert, and_, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from turnout.core.batches import ACTIVE
from turnout.store.db import Database
from turnout.store.schema import batch_files, batch_results, batches

__all__ = ["BatchFile", "BatchRecord", "BatchStore", "FileInUse", "Result"]


class FileInUse(Exception):
    """A file that a batch still running reads (its input file): not deleted."""

    def __init__(self, batch_id: str, status: str) -> None:
        super().__init__(batch_id, status)
        self.batch_id = batch_id
        self.status = status


@dataclass(frozen=True, slots=True)
class BatchFile:
    id: str
    app: str | None
    purpose: str  # batch | batch_output | batch_error
    filename: str
    bytes: int
    lines: int
    created_at: float
    expires_at: float | None
    batch_id: str | None = None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    app: str | None
    key_id: int | None
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: float
    expires_at: float
    total: int
    completed: int = 0
    failed: int = 0  # lines in the error file: answered with an error, or never answered (``unanswered``)
    unanswered: int = 0  # of ``failed``, the lines that got no answer (``batch_cancelled``, ``batch_expired``)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    output_expires_s: float | None = None
    model: str | None = None  # the model every line names (None: they name several)
    runner: str | None = None
    lease_until: float | None = None


class Result:
    """A line's answer as written: the line number, whether it goes to the output file (2xx) or the error file, its
    JSON line, and the tokens it used; ``unanswered``: the line got no answer (its batch was cancelled, or its window
    ended, first)."""

    __slots__ = ("completion_tokens", "line", "ok", "output", "prompt_tokens", "unanswered")

    def __init__(
        self,
        line: int,
        ok: bool,
        output: bytes,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        *,
        unanswered: bool = False,
    ) -> None:
        self.line = line
        self.ok = ok
        self.output = output
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.unanswered = unanswered


_FILE_FIELDS = [f.name for f in fields(BatchFile)]
_BATCH_FIELDS = [f.name for f in fields(BatchRecord)]


class BatchStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        module = postgresql if db.dialect == "postgresql" else sqlite
        # RETURNING says whether the row went in (a driver's rowcount for ON CONFLICT DO NOTHING is not reliable:
        # psycopg's said 1 for a row that was not written)
        insert: Insert = (
            module.insert(batch_results)
            .on_conflict_do_nothing(index_elements=[batch_results.c.batch_id, batch_results.c.line])
            .returning(batch_results.c.line)
        )
        self._record_one = insert

    # -- files -------------------------------------------------------------------------------------
    def add_file(self, file: BatchFile, content: bytes | None) -> None:
        row = {name: getattr(file, name) for name in _FILE_FIELDS}
        with self.db.begin() as conn:
            conn.execute(batch_files.insert().values(**row, content=content))

    def file(self, file_id: str, app: str | None, now: float) -> BatchFile | None:
        """The file ``file_id`` of ``app``, unless it expired."""
        live = or_(batch_files.c.expires_at.is_(None), batch_files.c.expires_at > now)
        with self.db.begin() as conn:
            row = conn.execute(
                select(*(batch_files.c[n] for n in _FILE_FIELDS)).where(_file_of(file_id, app), live)
            ).first()
        return None if row is None else BatchFile(**row._mapping)

    def content(self, file_id: str) -> bytes | None:
        """An input file's content (None: an output or error file, whose lines are :meth:`results`)."""
        with self.db.begin() as conn:
            data = conn.execute(select(batch_files.c.content).where(batch_files.c.id == file_id)).scalar()
        return None if data is None else bytes(data)

    def files(
        self, app: str | None, now: float, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[BatchFile], bool] | None:
        """A page of ``app``'s files and whether more follow; None when ``after`` is not one of its files."""
        live = or_(batch_files.c.expires_at.is_(None), batch_files.c.expires_at > now)
        query = select(*(batch_files.c[n] for n in _FILE_FIELDS)).where(_owner(batch_files.c.app, app), live)
        if purpose is not None:
            query = query.where(batch_files.c.purpose == purpose)
        with self.db.begin() as conn:
            if after is not None:
                mark = conn.execute(select(batch_files.c.created_at).where(_file_of(after, app))).scalar()
                if mark is None:
                    return None
                query = query.where(_beyond(batch_files.c.created_at, batch_files.c.id, mark, after, newest_first))
            order = (batch_files.c.created_at, batch_files.c.id)
            query = query.order_by(*(c.desc() if newest_first else c.asc() for c in order)).limit(limit + 1)
            rows = conn.execute(query).all()
        found = [BatchFile(**r._mapping) for r in rows]
        return found[:limit], len(found) > limit

    def delete_file(self, file_id: str, app: str | None) -> bool:
        """Delete ``app``'s file ``file_id``; False when it has none. Raises FileInUse for the input file of a batch
        that is still running."""
        with self.db.begin() as conn:
            busy = conn.execute(
                select(batches.c.id, batches.c.status).where(
                    batches.c.input_file_id == file_id, batches.c.status.in_(ACTIVE)
                )
            ).first()
            if busy is not None:
                raise FileInUse(busy.id, busy.status)
            return bool(conn.execute(delete(batch_files).where(_file_of(file_id, app))).rowcount)

    # -- batches -------------------------------------------------------------------------------------
    def add_batch(self, record: BatchRecord) -> None:
        with self.db.begin() as conn:
            conn.execute(batches.insert().values(**{n: getattr(record, n) for n in _BATCH_FIELDS}))

    def batch(self, batch_id: str) -> BatchRecord | None:
        with self.db.begin() as conn:
            return _batch(conn, batch_id)

    def status(self, batch_id: str) -> str | None:
        with self.db.begin() as conn:
            found: str | None = conn.execute(select(batches.c.status).where(batches.c.id == batch_id)).scalar()
        return found

    def batches(self, app: str | None, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool] | None:
        """A page of ``app``'s batches, newest first, and whether more follow; None when ``after`` is not one of its
        batches."""
        query = select(batches).where(_owner(batches.c.app, app))
        with self.db.begin() as conn:
            if after is not None:
                mark = conn.execute(
                    select(batches.c.created_at).where(batches.c.id == after, _owner(batches.c.app, app))
                ).scalar()
                if mark is None:
                    return None
                query = query.where(_beyond(batches.c.created_at, batches.c.id, mark, after, True))
            rows = conn.execute(query.order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit + 1))
            found = [_record(r._mapping) for r in rows]
        return found[:limit], len(found) > limit

    def listing(
        self, *, apps: Iterable[str] | None = None, status: str | None = None, limit: int = 100
    ) -> list[BatchRecord]:
        """The newest batches of every app (``apps``: of those only), for the admin API."""
        query = select(batches)
        if apps is not None:
            query = query.where(batches.c.app.in_(list(apps)))
        if status is not None:
            query = query.where(batches.c.status == status)
        with self.db.begin() as conn:
            rows = conn.execute(query.order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit))
            return [_record(r._mapping) for r in rows]

    def runnable(self, now: float, *, free_only: bool) -> list[str]:
        """Batches with work to do, oldest first (``free_only``: only those whose SQL lease is free)."""
        query = select(batches.c.id).where(batches.c.status.in_(ACTIVE))
        if free_only:
            query = query.where(or_(batches.c.lease_until.is_(None), batches.c.lease_until < now))
        with self.db.begin() as conn:
            return list(conn.execute(query.order_by(batches.c.created_at, batches.c.id)).scalars())

    def request_cancel(self, batch_id: str, now: float) -> BatchRecord | None:
        """Mark a batch that has not finished its lines ``cancelling`` (a batch in another state is left as it is);
        the batch as it is now, or None."""
        with self.db.begin() as conn:
            conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status.in_(("validating", "in_progress")))
                .values(status="cancelling", cancelling_at=now)
            )
            return _batch(conn, batch_id)

    def set_status(self, batch_id: str, status: str, now: float, *, only_from: tuple[str, ...]) -> bool:
        """Move a batch to ``status`` (its ``<status>_at`` set to ``now``) if it is in one of ``only_from``."""
        with self.db.begin() as conn:
            moved = conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status.in_(only_from))
                .values(status=status, **{f"{status}_at": now})
            )
            return bool(moved.rowcount)

    def fail(self, batch_id: str, errors: list[dict[str, Any]], now: float) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status.in_(ACTIVE))
                .values(status="failed", failed_at=now, ended_at=now, errors=errors, runner=None, lease_until=None)
            )

    # -- leases (when Redis does not hold them) --------------------------------------------------------
    def claim(self, batch_id: str, runner: str, now: float, lease_s: float) -> bool:
        """Take the lease on a batch with work to do: when nobody holds it, or its holder let it lapse (or holds it
        itself)."""
        free = or_(batches.c.lease_until.is_(None), batches.c.lease_until < now, batches.c.runner == runner)
        with self.db.begin() as conn:
            taken = conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.status.in_(ACTIVE), free)
                .values(runner=runner, lease_until=now + lease_s)
            )
            return bool(taken.rowcount)

    def renew(self, batch_id: str, runner: str, now: float, lease_s: float) -> bool:
        """Extend ``runner``'s lease; False when it no longer holds it."""
        with self.db.begin() as conn:
            kept = conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.runner == runner)
                .values(lease_until=now + lease_s)
            )
            return bool(kept.rowcount)

    def release(self, batch_id: str, runner: str) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.runner == runner)
                .values(runner=None, lease_until=None)
            )

    # -- answered lines --------------------------------------------------------------------------------
    def answered(self, batch_id: str) -> set[int]:
        """The lines of a batch whose answer is written."""
        with self.db.begin() as conn:
            return set(conn.execute(select(batch_results.c.line).where(batch_results.c.batch_id == batch_id)).scalars())

    def record(self, batch_id: str, results: list[Result], now: float) -> int:
        """Write lines' answers, and add the ones written to the batch's counts, in one transaction; a line that has
        an answer already keeps it (and counts once). Returns how many were written."""
        completed = failed = unanswered = prompt = completion = 0
        with self.db.begin() as conn:
            for r in results:
                values = {
                    "batch_id": batch_id,
                    "line": r.line,
                    "ok": r.ok,
                    "output": r.output,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "recorded_at": now,
                }
                if conn.execute(self._record_one, values).first() is not None:
                    completed += r.ok
                    failed += not r.ok
                    unanswered += r.unanswered
                    prompt += r.prompt_tokens
                    completion += r.completion_tokens
            if completed or failed:
                conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(
                        completed=batches.c.completed + completed,
                        failed=batches.c.failed + failed,
                        unanswered=batches.c.unanswered + unanswered,
                        prompt_tokens=batches.c.prompt_tokens + prompt,
                        completion_tokens=batches.c.completion_tokens + completion,
                    )
                )
        return completed + failed

    def results(self, batch_id: str, ok: bool, *, after: int = 0, limit: int = 500) -> list[tuple[int, bytes]]:
        """A page of the output (``ok``) or error file's lines: (line number, JSON line) after line ``after``, in
        the input file's order."""
        with self.db.begin() as conn:
            rows = conn.execute(
                select(batch_results.c.line, batch_results.c.output)
                .where(batch_results.c.batch_id == batch_id, batch_results.c.ok == ok, batch_results.c.line > after)
                .order_by(batch_results.c.line)
                .limit(limit)
            ).all()
        return [(int(r.line), bytes(r.output)) for r in rows]

    def end(self, batch_id: str, status: str, now: float, files: tuple[BatchFile, BatchFile]) -> BatchRecord | None:
        """End a batch whose every line has its answer: ``status`` (completed, expired, cancelled), with its output
        and error files (``files``: their ids and lifetimes; each is kept only when it has a line, with the lines
        and bytes its results hold), in one transaction. A batch that ended already is left as it is."""
        with self.db.begin() as conn:
            record = _batch(conn, batch_id)
            if record is None or record.status not in ACTIVE:
                return record
            ids: dict[str, str | None] = {}
            for ok, file in zip((True, False), files, strict=True):
                count, size = conn.execute(
                    select(func.count(), func.coalesce(func.sum(func.length(batch_results.c.output)), 0)).where(
                        batch_results.c.batch_id == batch_id, batch_results.c.ok == ok
                    )
                ).one()
                name = "output_file_id" if ok else "error_file_id"
                ids[name] = None
                if count:
                    row = {n: getattr(file, n) for n in _FILE_FIELDS}
                    row.update(lines=int(count), bytes=int(size) + int(count), batch_id=batch_id)
                    conn.execute(batch_files.insert().values(**row, content=None))
                    ids[name] = file.id
            stamps: dict[str, Any] = {f"{status}_at": now, "ended_at": now}
            if record.finalizing_at is None and status == "completed":
                stamps["finalizing_at"] = now
            conn.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(status=status, runner=None, lease_until=None, **stamps, **ids)
            )
            return _batch(conn, batch_id)

    # -- retention -------------------------------------------------------------------------------------
    def purge(self, now: float, retention_s: float) -> tuple[int, int]:
        """Delete the batches that ended ``retention_s`` ago with their answers and output and error files, and every
        file past its expiry that no running batch reads. Returns (batches, files) deleted."""
        with self.db.begin() as conn:
            old = list(
                conn.execute(
                    select(batches.c.id).where(batches.c.ended_at.is_not(None), batches.c.ended_at <= now - retention_s)
                ).scalars()
            )
            for start in range(0, len(old), 500):
                part = old[start : start + 500]
                conn.execute(delete(batch_results).where(batch_results.c.batch_id.in_(part)))
                conn.execute(delete(batch_files).where(batch_files.c.batch_id.in_(part)))
                conn.execute(delete(batches).where(batches.c.id.in_(part)))
            running = select(batches.c.input_file_id).where(batches.c.status.in_(ACTIVE))
            gone = conn.execute(
                delete(batch_files).where(
                    batch_files.c.expires_at.is_not(None),
                    batch_files.c.expires_at <= now,
                    batch_files.c.id.not_in(running),
                )
            ).rowcount
        return len(old), int(gone)


def _owner(column: Any, app: str | None) -> ColumnElement[bool]:
    result: ColumnElement[bool] = column.is_(None) if app is None else column == app
    return result


def _file_of(file_id: str, app: str | None) -> ColumnElement[bool]:
    return and_(batch_files.c.id == file_id, _owner(batch_files.c.app, app))


def _beyond(created: Any, ident: Any, mark: float, after: str, descending: bool) -> ColumnElement[bool]:
    """Rows after the cursor row (``mark``, ``after``) in (created, id) order, descending or ascending."""
    if descending:
        return or_(created < mark, and_(created == mark, ident < after))
    return or_(created > mark, and_(created == mark, ident > after))


def _batch(conn: Connection, batch_id: str) -> BatchRecord | None:
    row = conn.execute(select(batches).where(batches.c.id == batch_id)).first()
    return None if row is None else _record(row._mapping)


def _record(row: Any) -> BatchRecord:
    values = {name: row[name] for name in _BATCH_FIELDS}
    values["errors"] = list(values["errors"]) if values["errors"] is not None else None
    values["metadata"] = dict(values["metadata"]) if values["metadata"] is not None else None
    return BatchRecord(**values)
