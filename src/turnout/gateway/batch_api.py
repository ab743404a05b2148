"""The OpenAI Batch API's routes: ``/v1/files`` (input files up, output and error files down) and ``/v1/batches``.

Objects and errors are OpenAI's (its Python SDK parses them: ``openai/types/batch.py``, ``file_object.py``,
``file_deleted.py``; lists are its cursor pages, newest first, ``after`` an id, ``has_more``). Every route needs a
key as the inference routes do (open access: none), and a key sees only its app's files and batches: another app's
id is 404, as for one that never existed. An upload is checked line by line before it is kept
(:func:`turnout.core.batches.parse_batch_file`): a file with a bad line is a 400 naming the lines, and nothing is
stored. The batches run in :mod:`.batch_runner`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from turnout.core.batches import (
    BATCH_URLS,
    FileProblem,
    can_cancel,
    metadata_problem,
    one_model,
    parse_batch_file,
    parse_window,
)
from turnout.errors import BadRequest, Conflict, NotFound, PayloadTooLarge, TurnoutError
from turnout.gateway.access import CALLER
from turnout.gateway.keys import ACCOUNTANT, BATCH_RUNNER, BATCH_STORE, SETTINGS
from turnout.responses import json_response
from turnout.store.batches import BatchFile, BatchRecord, FileInUse
from turnout.store.db import StoreError
from turnout.store.keys import KeyRecord

__all__ = ["BATCH_ROUTES", "batch_object", "file_object"]

_CHUNK = 1 << 16
_FILE_PAGE = 10_000  # OpenAI's default and largest page of files
_BATCH_PAGE = 20  # OpenAI's default page of batches (at most 100)
_MIN_EXPIRES_S, _MAX_EXPIRES_S = 3600, 2_592_000  # OpenAI's bounds of expires_after.seconds


def _ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def file_object(file: BatchFile) -> dict[str, Any]:
    """OpenAI's File object."""
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at),
        "expires_at": _ts(file.expires_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(record: BatchRecord) -> dict[str, Any]:
    """OpenAI's Batch object. ``usage``: the tokens of the lines answered so far (cached and reasoning tokens are
    not counted apart: 0)."""
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": None if not record.errors else {"object": "list", "data": record.errors},
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": int(record.created_at),
        "in_progress_at": _ts(record.in_progress_at),
        "expires_at": _ts(record.expires_at),
        "finalizing_at": _ts(record.finalizing_at),
        "completed_at": _ts(record.completed_at),
        "failed_at": _ts(record.failed_at),
        "expired_at": _ts(record.expired_at),
        "cancelling_at": _ts(record.cancelling_at),
        "cancelled_at": _ts(record.cancelled_at),
        "request_counts": {"total": record.total, "completed": record.completed, "failed": record.failed},
        "usage": {
            "input_tokens": record.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": record.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": record.prompt_tokens + record.completion_tokens,
        },
        "metadata": record.metadata,
        "model": record.model,
    }


async def _caller(request: web.Request) -> KeyRecord | None:
    key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
    return key


def _app_of(key: KeyRecord | None) -> str | None:
    return None if key is None else key.app


async def _store(function: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except StoreError as exc:
        raise TurnoutError(f"the batch store cannot be reached: {exc}", code="store_unavailable") from None


def _no_file(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", code="file_not_found")


def _no_batch(batch_id: str) -> NotFound:
    return NotFound(f"No batch found with id '{batch_id}'.", code="batch_not_found")


def _limit(value: str | None, default: int, most: int) -> int:
    if value is None:
        return default
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise BadRequest(f'"limit" must be a whole number from 1 to {most}, got {value!r}', code="invalid_limit")
    return limit


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


# -- files ------------------------------------------------------------------------------------------
async def upload_file(request: web.Request) -> web.Response:
    """``POST /v1/files``: multipart ``purpose=batch`` and ``file`` (JSONL), optional ``expires_after``."""
    key = await _caller(request)
    settings = request.app[SETTINGS].batches
    if request.content_type != "multipart/form-data":
        raise BadRequest(
            'POST /v1/files takes multipart/form-data with the fields "purpose" (batch) and "file" (the JSONL '
            "requests)",
            code="invalid_content_type",
        )
    fields, filename, data = await _form(request, settings.max_file_bytes)
    purpose = fields.get("purpose")
    if purpose != "batch":
        shown = "nothing" if purpose is None else orjson.dumps(purpose).decode()
        raise BadRequest(
            f'Turnout keeps files for the Batch API only: "purpose" must be "batch", got {shown}',
            code="invalid_purpose",
        )
    if filename is None:
        raise BadRequest('the form has no "file" field: send the JSONL requests as a file', code="missing_file")
    now = time.time()
    keep_s = _expires_after(fields, settings.retention_days * 86_400)
    try:
        lines = await asyncio.to_thread(parse_batch_file, data, settings.max_lines)
    except FileProblem as exc:
        raise _file_error(exc) from None
    file = BatchFile(
        f"file-{secrets.token_hex(12)}", _app_of(key), "batch", filename[:512], len(data), len(lines), now, now + keep_s
    )
    await _store(request.app[BATCH_STORE].add_file, file, data)
    return json_response(file_object(file))


def _file_error(exc: FileProblem) -> BadRequest:
    return BadRequest(f"the batch input file cannot be used: {exc}", code="invalid_batch_file")


async def _form(request: web.Request, most: int) -> tuple[dict[str, str], str | None, bytes]:
    """The form's text fields, the file's name and content (at most ``most`` bytes)."""
    reader = await request.multipart()
    fields: dict[str, str] = {}
    filename: str | None = None
    content = bytearray()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise BadRequest("a nested multipart form is not taken here", code="invalid_form")
        if part.name == "file":
            filename = part.filename or "upload.jsonl"
            while chunk := await part.read_chunk(_CHUNK):
                content += chunk
                if len(content) > most:
                    raise PayloadTooLarge(
                        f"the file is larger than the limit of {most} bytes (batches.max_file_bytes); split it into "
                        "several batches",
                        code="file_too_large",
                    )
        elif part.name:
            value = await part.read(decode=True)
            if len(value) > 1024:
                raise BadRequest(f'the form field "{part.name}" is longer than 1024 bytes', code="invalid_form")
            fields[part.name] = value.decode("utf-8", "replace")
    return fields, filename, bytes(content)


def _expires_after(fields: dict[str, str], default_s: float) -> float:
    """How long an upload is kept: ``expires_after`` (anchor ``created_at``, 3600 to 2592000 seconds) or the
    retention the operator set."""
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return default_s
    if anchor != "created_at":
        raise BadRequest('"expires_after.anchor" must be "created_at"', code="invalid_expires_after")
    try:
        value = int(seconds or "")
    except ValueError:
        value = 0
    if not _MIN_EXPIRES_S <= value <= _MAX_EXPIRES_S:
        raise BadRequest(
            f'"expires_after.seconds" must be from {_MIN_EXPIRES_S} to {_MAX_EXPIRES_S}', code="invalid_expires_after"
        )
    return float(value)


async def list_files(request: web.Request) -> web.Response:
    key = await _caller(request)
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest('"order" must be "asc" or "desc"', code="invalid_order")
    limit = _limit(query.get("limit"), _FILE_PAGE, _FILE_PAGE)
    after = query.get("after") or None
    found = await _store(
        request.app[BATCH_STORE].files,
        _app_of(key),
        time.time(),
        purpose=query.get("purpose") or None,
        after=after,
        limit=limit,
        newest_first=order == "desc",
    )
    if found is None:
        raise _no_file(str(after))
    files, more = found
    return json_response(_page([file_object(f) for f in files], more))


async def _own_file(request: web.Request) -> BatchFile:
    key = await _caller(request)
    file_id = request.match_info["file_id"]
    file = await _store(request.app[BATCH_STORE].file, file_id, _app_of(key), time.time())
    if file is None:
        raise _no_file(file_id)
    assert isinstance(file, BatchFile)
    return file


async def get_file(request: web.Request) -> web.Response:
    return json_response(file_object(await _own_file(request)))


async def file_content(request: web.Request) -> web.StreamResponse:
    """``GET /v1/files/{id}/content``: an input file as uploaded, or an output or error file's lines in the order of
    the input file's."""
    file = await _own_file(request)
    store = request.app[BATCH_STORE]
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Disposition": f'attachment; filename="{_safe_name(file.filename)}"',
    }
    if file.purpose == "batch":
        data = await _store(store.content, file.id)
        return web.Response(body=data or b"", headers=headers)
    assert file.batch_id is not None
    ok = file.purpose == "batch_output"
    page = await _store(store.results, file.batch_id, ok)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    while page:
        await response.write(b"".join(line + b"\n" for _, line in page))
        page = await _store(store.results, file.batch_id, ok, after=page[-1][0])
    await response.write_eof()
    return response


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)[:200] or "file.jsonl"


async def delete_file(request: web.Request) -> web.Response:
    key = await _caller(request)
    file_id = request.match_info["file_id"]
    try:
        gone = await _store(request.app[BATCH_STORE].delete_file, file_id, _app_of(key))
    except FileInUse as exc:
        raise Conflict(
            f"file {file_id} is the input file of batch {exc.batch_id}, which is {exc.status}: cancel the batch (or "
            "let it end) first",
            code="file_in_use",
        ) from None
    if not gone:
        raise _no_file(file_id)
    return json_response({"id": file_id, "object": "file", "deleted": True})


# -- batches -----------------------------------------------------------------------------------------
async def create_batch(request: web.Request) -> web.Response:
    key = await _caller(request)
    body = await _json_object(request)
    endpoint = body.get("endpoint")
    if endpoint not in BATCH_URLS:
        shown = orjson.dumps(endpoint).decode() if endpoint is not None else "nothing"
        raise BadRequest(f'"endpoint" must be one of {", ".join(BATCH_URLS)}, got {shown}', code="invalid_endpoint")
    window = body.get("completion_window")
    try:
        window_s = parse_window(window)
    except ValueError as exc:
        raise BadRequest(str(exc), code="invalid_completion_window") from None
    problem = metadata_problem(body.get("metadata"))
    if problem is not None:
        raise BadRequest(problem, code="invalid_metadata")
    output_s = _output_expires(body.get("output_expires_after"))
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise BadRequest('"input_file_id" must name a file uploaded with purpose "batch"', code="missing_input_file")
    store = request.app[BATCH_STORE]
    app = _app_of(key)
    now = time.time()
    file = await _store(store.file, file_id, app, now)
    if file is None:
        raise _no_file(file_id)
    if file.purpose != "batch":
        raise BadRequest(f'file {file_id} is a {file.purpose} file: a batch reads a file uploaded with purpose "batch"')
    content = await _store(store.content, file_id)
    try:
        lines = await asyncio.to_thread(parse_batch_file, content or b"", 2**31)
    except FileProblem as exc:
        raise _file_error(exc) from None
    other = [line for line in lines if line.url != endpoint]
    if other:
        named = ", ".join(f"line {line.number} ({line.url})" for line in other[:10])
        more = f" and {len(other) - 10} more" if len(other) > 10 else ""
        raise BadRequest(
            f"every line of the input file must go to the batch's endpoint {endpoint}; these go elsewhere: "
            f"{named}{more}",
            code="mismatched_endpoint",
        )
    record = BatchRecord(
        id=f"batch_{secrets.token_hex(16)}",
        app=app,
        key_id=None if key is None else key.id,
        endpoint=str(endpoint),
        input_file_id=file_id,
        completion_window=str(window),
        status="validating",
        created_at=now,
        expires_at=now + window_s,
        total=len(lines),
        metadata=body.get("metadata"),
        output_expires_s=output_s,
        model=one_model(lines),
    )
    await _store(store.add_batch, record)
    request.app[BATCH_RUNNER].nudge()
    return json_response(batch_object(record))


async def _json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _output_expires(value: Any) -> float | None:
    if value is None:
        return None
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("anchor") != "created_at" or not isinstance(seconds, int):
        raise BadRequest(
            '"output_expires_after" must be {"anchor": "created_at", "seconds": N}', code="invalid_output_expires_after"
        )
    if not _MIN_EXPIRES_S <= seconds <= _MAX_EXPIRES_S:
        raise BadRequest(
            f'"output_expires_after.seconds" must be from {_MIN_EXPIRES_S} to {_MAX_EXPIRES_S}',
            code="invalid_output_expires_after",
        )
    return float(seconds)


async def _own_batch(request: web.Request) -> BatchRecord:
    key = await _caller(request)
    batch_id = request.match_info["batch_id"]
    record = await _store(request.app[BATCH_STORE].batch, batch_id)
    if record is None or record.app != _app_of(key):
        raise _no_batch(batch_id)
    assert isinstance(record, BatchRecord)
    return record


async def get_batch(request: web.Request) -> web.Response:
    return json_response(batch_object(await _own_batch(request)))


async def list_batches(request: web.Request) -> web.Response:
    key = await _caller(request)
    limit = _limit(request.query.get("limit"), _BATCH_PAGE, 100)
    after = request.query.get("after") or None
    found = await _store(request.app[BATCH_STORE].batches, _app_of(key), after=after, limit=limit)
    if found is None:
        raise _no_batch(str(after))
    records, more = found
    return json_response(_page([batch_object(r) for r in records], more))


async def cancel_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/cancel``: no new line starts; lines in flight end; ``cancelling``, then
    ``cancelled`` once they have."""
    record = await _own_batch(request)
    if record.status in ("cancelling", "cancelled"):
        return json_response(batch_object(record))
    if not can_cancel(record.status):
        raise Conflict(
            f"batch {record.id} is {record.status}: only a validating or in_progress batch can be cancelled (a "
            "cancelling or cancelled one is answered as it is)",
            code="batch_not_cancellable",
        )
    after = await _store(request.app[BATCH_STORE].request_cancel, record.id, time.time())
    request.app[BATCH_RUNNER].cancelled(record.id)
    return json_response(batch_object(after or record))


BATCH_ROUTES = (
    ("POST", "/v1/files", upload_file),
    ("GET", "/v1/files", list_files),
    ("GET", "/v1/files/{file_id}", get_file),
    ("GET", "/v1/files/{file_id}/content", file_content),
    ("DELETE", "/v1/files/{file_id}", delete_file),
    ("POST", "/v1/batches", create_batch),
    ("GET", "/v1/batches", list_batches),
    ("GET", "/v1/batches/{batch_id}", get_batch),
    ("POST", "/v1/batches/{batch_id}/cancel", cancel_batch),
)
