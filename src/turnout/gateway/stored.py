"""Stored answers of the OpenAI Responses API: ``store``, ``previous_response_id`` and the routes that read them
(``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``DELETE /v1/responses/{id}``).

Before a ``POST /v1/responses`` is proxied, :meth:`StoredResponses.prepare` gives it its answer's id and, for a
continuation, rebuilds the conversation: the stored response's input items, then its output, then the new input
(the previous response's ``instructions`` are not carried over, as OpenAI's API does it), so any worker, whichever
answered before, sees the whole conversation. A worker that serves the Responses API itself gets that conversation
too, without the ``previous_response_id`` it could not know.

The answer is kept (unless ``store: false``) by :meth:`StoredResponses.keeper`'s callback, which the proxy awaits
before the answer, or a stream's last event, reaches the client: a client that sends the continuation the moment
it has the answer finds it. A response that could not be written is logged, and the answer still goes out.

A stored response belongs to the app of the key that asked for it; another app's key gets 404, as for an id that
never existed. It expires after ``responses.store_days`` (default 30); expired ones are deleted at most once a
minute, in the background of a write. The table is in the store, so backups hold it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from turnout.dialects.base import Call
from turnout.dialects.responses.request import input_items, stored_item
from turnout.errors import BadRequest, NotFound, TurnoutError
from turnout.store.db import StoreError
from turnout.store.keys import KeyRecord
from turnout.store.responses import ResponseStore, StoredResponse

__all__ = ["StoredResponses"]

log = logging.getLogger("turnout.gateway")

_PURGE_EVERY_S = 60.0
_MAX_ITEMS_PAGE = 100
_DEFAULT_ITEMS_PAGE = 20


class StoredResponses:
    def __init__(self, store: ResponseStore, keep_days: float, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.keep_s = keep_days * 86_400
        self.clock = clock
        self._writing: dict[tuple[str | None, str], StoredResponse] = {}  # written now: found before the commit
        self._batch: list[StoredResponse] = []  # waiting for the next write
        self._batch_done: asyncio.Future[None] | None = None  # its commit, which its requests await
        self._writer: asyncio.Task[None] | None = None
        self._purged = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- POST /v1/responses -------------------------------------------------------------------------
    async def prepare(self, key: KeyRecord | None, call: Call) -> Call:
        """``call`` with its answer's id and, for a continuation, the whole conversation as its input."""
        payload = call.payload
        store = payload.get("store")
        if store is not None and not isinstance(store, bool):
            raise BadRequest('"store" must be true or false')
        answer_id = "resp_" + secrets.token_hex(24)
        previous = payload.get("previous_response_id")
        if previous is None:
            return call._replace(answer_id=answer_id)
        if not isinstance(previous, str) or not previous:
            raise BadRequest('"previous_response_id" must be the id of a stored response')
        found = await self.find(key, previous)
        if found is None:
            raise NotFound(
                f"no stored response with id '{previous}' for this key's app: stored responses are kept for "
                f"{self.keep_s / 86_400:g} days, and one made with store: false is not kept",
                code="previous_response_not_found",
            )
        try:
            new = input_items(payload)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        output = found.response.get("output")
        answered = [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []
        history = found.input_items + answered
        whole = {**payload, "input": history + new}
        worker = {k: v for k, v in whole.items() if k != "previous_response_id"}  # a native worker never saw it
        return call._replace(payload=whole, body=orjson.dumps(worker), answer_id=answer_id)

    def keeper(self, key: KeyRecord | None, call: Call) -> Callable[[dict[str, Any]], Awaitable[None]] | None:
        """What keeps the call's answer (None: ``store: false``, nothing is kept)."""
        if call.payload.get("store") is False:
            return None

        async def keep(answer: dict[str, Any]) -> None:
            response = answer.get("response") if answer.get("object") != "response" else answer
            if not isinstance(response, dict) or not isinstance(response.get("id"), str):
                return
            await self._keep(key, call, response)

        return keep

    async def _keep(self, key: KeyRecord | None, call: Call, response: dict[str, Any]) -> None:
        now = self.clock()
        answer_id = response["id"]
        try:
            given = input_items(call.payload)
        except ValueError:
            return
        previous = call.payload.get("previous_response_id")
        record = StoredResponse(
            answer_id,
            _app(key),
            call.model,
            previous if isinstance(previous, str) else None,
            now,
            now + self.keep_s,
            [stored_item(item, answer_id, n) for n, item in enumerate(given)],
            response,
        )
        slot = (record.app, answer_id)
        self._writing[slot] = record
        try:
            await self._write(record)
        finally:
            self._writing.pop(slot, None)
        if now - self._purged >= _PURGE_EVERY_S:
            self._purged = now
            task = asyncio.create_task(self._purge(now))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, record: StoredResponse) -> None:
        """Returns once ``record`` is committed, written together with the others that wait meanwhile (one
        transaction for them all: a busy gateway writes in batches, an idle one at once)."""
        if self._batch_done is None:
            self._batch_done = asyncio.get_running_loop().create_future()
        done = self._batch_done
        self._batch.append(record)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_batches())
            self._tasks.add(self._writer)
            self._writer.add_done_callback(self._tasks.discard)
        await asyncio.shield(done)  # a client that leaves does not take the others' write with it

    async def _write_batches(self) -> None:
        while self._batch:
            batch, done = self._batch, self._batch_done
            self._batch, self._batch_done = [], None
            try:
                await asyncio.to_thread(self.store.put_many, batch)
            except StoreError as exc:
                ids = ", ".join(r.id for r in batch)
                log.error("could not store responses %s (a continuation or GET will not find them): %s", ids, exc)
            finally:
                assert done is not None
                done.set_result(None)

    async def _purge(self, now: float) -> None:
        try:
            gone = await asyncio.to_thread(self.store.purge, now)
        except StoreError as exc:
            log.warning("could not delete expired stored responses (tried again in a minute): %s", exc)
            return
        if gone:
            log.info("deleted %d expired stored responses", gone)

    async def close(self) -> None:
        """Wait for a purge under way (the database closes after this)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- reads and deletes ---------------------------------------------------------------------------
    async def find(self, key: KeyRecord | None, response_id: str) -> StoredResponse | None:
        app = _app(key)
        writing = self._writing.get((app, response_id))
        if writing is not None:
            return writing
        try:
            return await asyncio.to_thread(self.store.get, response_id, app, self.clock())
        except StoreError as exc:
            raise TurnoutError(f"the stored responses cannot be read: {exc}", code="store_unavailable") from None

    async def response(self, key: KeyRecord | None, response_id: str) -> dict[str, Any]:
        return (await self._found(key, response_id)).response

    async def items(self, key: KeyRecord | None, response_id: str, query: dict[str, str]) -> dict[str, Any]:
        """A page of the input items of ``response_id`` (``limit`` 1-100, default 20; ``order`` ``desc``, the
        default, or ``asc``; ``after``: the id of the item the page starts after)."""
        found = await self._found(key, response_id)
        limit = _limit(query.get("limit"))
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequest('"order" must be "asc" or "desc"')
        items = found.input_items if order == "asc" else found.input_items[::-1]
        after = query.get("after")
        if after:
            ids = [i.get("id") for i in items]
            if after not in ids:
                raise BadRequest(f"\"after\": response '{response_id}' has no input item '{after}'")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }

    async def delete(self, key: KeyRecord | None, response_id: str) -> dict[str, Any]:
        try:
            gone = await asyncio.to_thread(self.store.delete, response_id, _app(key))
        except StoreError as exc:
            raise TurnoutError(f"the stored responses cannot be changed: {exc}", code="store_unavailable") from None
        if not gone:
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def _found(self, key: KeyRecord | None, response_id: str) -> StoredResponse:
        found = await self.find(key, response_id)
        if found is None:
            raise _not_found(response_id)
        return found


def _app(key: KeyRecord | None) -> str | None:
    return None if key is None else key.app


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", code="response_not_found")


def _limit(value: str | None) -> int:
    if value is None:
        return _DEFAULT_ITEMS_PAGE
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= _MAX_ITEMS_PAGE:
        raise BadRequest(f'"limit" must be a whole number from 1 to {_MAX_ITEMS_PAGE}, got {value!r}')
    return limit
