"""Admin JSON API for the Persistence page: where state lives, backup download, restore upload.

- ``GET /admin/api/persistence``: every state file and store with path, size, last write and whether a
  backup holds it (:mod:`turnout.state.persistence`).
- ``GET /admin/api/backup?include_secret_key=false``: one ZIP (:mod:`turnout.state.backup`), as an
  attachment, never cached. Audited as ``backup.create``.
- ``POST /admin/api/backup/restore``: the ZIP as the body (``application/zip``), or as the file part of a
  ``multipart/form-data`` form; at most :data:`MAX_UPLOAD_BYTES`. The ZIP is checked whole before anything
  is replaced; what the running gateway can take live is reloaded (placement overrides, keys, endpoints;
  claims on the controller's next tick), and the answer says when a restart is needed (a changed
  ``config.json`` or secret key). Audited as ``backup.restore``, in the restored audit log.

Errors: a bad ZIP is 400 ``invalid_backup``; a ZIP for another kind of store 409 ``backup_refused``; a
restore already running 409 ``restore_in_progress``; too large 413; a failed (and undone) restore 500
``restore_failed``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from aiohttp import BodyPartReader, web
from pydantic import BaseModel, ConfigDict

from turnout.admin.changes import audit_change
from turnout.admin.inputs import parse_input
from turnout.errors import BadRequest, Conflict, PayloadTooLarge, TurnoutError
from turnout.gateway.keys import ACCOUNTANT, ALIASES, DATABASE, ENDPOINTS, FLEET, PEERS, SETTINGS
from turnout.responses import json_response
from turnout.state.backup import (
    BackupError,
    BackupInvalid,
    BackupRefused,
    StatePaths,
    create_backup,
    default_backup_name,
)
from turnout.state.persistence import persistence
from turnout.state.restore import restore_backup

__all__ = ["MAX_UPLOAD_BYTES", "add_backup_routes"]

MAX_UPLOAD_BYTES = 1024**3  # a restore upload (the ZIP as sent)
_CHUNK = 256 * 1024
_RESTORING: web.AppKey[asyncio.Lock] = web.AppKey("backup_restoring")


class BackupQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    include_secret_key: bool = False


def _paths(request: web.Request) -> StatePaths:
    try:
        return StatePaths.of(request.app[SETTINGS])
    except BackupError as exc:
        raise BadRequest(str(exc), code="no_config_file") from None


async def list_persistence(request: web.Request) -> web.Response:
    paths = _paths(request)
    entries = await asyncio.to_thread(persistence, paths, request.app[DATABASE])
    return json_response({"data_dir": str(paths.data_dir), "store": paths.store, "entries": entries})


async def _open_for_reading(path: Path) -> IO[bytes]:
    """Open in a worker thread; a cancel during the open (the client left) closes the file once it is open,
    instead of dropping it unclosed."""
    opening: asyncio.Future[IO[bytes]] = asyncio.ensure_future(asyncio.to_thread(path.open, "rb"))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_result)
        raise


def _close_result(opened: asyncio.Future[IO[bytes]]) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


async def download_backup(request: web.Request) -> web.StreamResponse:
    query = parse_input(BackupQuery, request.query)
    settings = request.app[SETTINGS]
    paths = _paths(request)
    now = time.time()
    name = default_backup_name(now)
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=".backup-download-", dir=paths.data_dir))
    try:
        try:
            created = await asyncio.to_thread(
                create_backup, settings, workdir / name, include_secret_key=query.include_secret_key, now=now
            )
        except BackupError as exc:
            raise TurnoutError(f"the backup could not be made: {exc}", code="backup_failed") from None
        handle = await _open_for_reading(created.path)
    finally:  # the open handle keeps the file readable; nothing is left in the data dir, however the send ends
        await asyncio.to_thread(shutil.rmtree, workdir, True)
    with handle:
        await audit_change(
            request,
            "backup.create",
            f"backup:{name}",
            after={
                "size": created.size,
                "secret_key_included": created.manifest.secret_key_included,
                "schema_revision": created.manifest.schema_revision,
                "files": [f.path for f in created.manifest.files],
            },
        )
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/zip",
                "Content-Disposition": f'attachment; filename="{name}"',
                "Cache-Control": "no-store",
                "Content-Length": str(created.size),
                "X-Content-Type-Options": "nosniff",
            }
        )
        await response.prepare(request)
        while chunk := await asyncio.to_thread(handle.read, _CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response


async def _receive(request: web.Request, out: IO[bytes]) -> int:
    """Copy the upload into ``out``, refusing more than MAX_UPLOAD_BYTES; the byte count."""
    if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES + 64 * 1024:
        raise PayloadTooLarge(f"a backup upload may be at most {MAX_UPLOAD_BYTES} bytes")
    if request.content_type == "multipart/form-data":
        reader = await request.multipart()
        part: Any = await reader.next()
        while part is not None and not (isinstance(part, BodyPartReader) and part.filename):
            part = await reader.next()
        if part is None:
            raise BadRequest("the form holds no file: send the backup ZIP as a file field", code="invalid_backup")

        async def chunks() -> Any:
            while chunk := await part.read_chunk(_CHUNK):
                yield chunk

        source = chunks()
    else:
        source = request.content.iter_chunked(_CHUNK)
    size = 0
    async for chunk in source:
        size += len(chunk)
        if size > MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(f"a backup upload may be at most {MAX_UPLOAD_BYTES} bytes")
        await asyncio.to_thread(out.write, chunk)
    if size == 0:
        raise BadRequest("the request has no body: send the backup ZIP", code="invalid_backup")
    return size


async def restore(request: web.Request) -> web.Response:
    app = request.app
    lock = app[_RESTORING]
    if lock.locked():
        raise Conflict("a restore is already running on this gateway", code="restore_in_progress")
    async with lock:
        settings = app[SETTINGS]
        paths = _paths(request)
        env = {"TURNOUT_SECRET_KEY": paths.secret_from_env} if paths.secret_from_env else {}
        with tempfile.NamedTemporaryFile(prefix=".backup-upload-", suffix=".zip", dir=paths.data_dir) as upload:
            size = await _receive(request, upload)
            await asyncio.to_thread(upload.flush)
            try:
                result = await asyncio.to_thread(
                    restore_backup,
                    Path(upload.name),
                    paths.config,
                    env=env,
                    from_running_gateway=True,
                )
            except BackupInvalid as exc:
                raise BadRequest(f"not restored, nothing was changed: {exc}", code="invalid_backup") from None
            except BackupRefused as exc:
                raise Conflict(f"not restored, nothing was changed: {exc}", code="backup_refused") from None
            except BackupError as exc:
                raise TurnoutError(str(exc), code="restore_failed") from None
    # What this process can take live; the rest waits for a restart. The other processes and replicas take it
    # when this answer announces the change (the restore moved the store's change version too).
    app[ACCOUNTANT].forget()
    async with app[PEERS].quiet():  # the pool is replaced: its connections know the tables before the restore
        await asyncio.to_thread(app[DATABASE].engine.dispose)
    await app[FLEET].placement.pull()
    await app[ENDPOINTS].sync()
    await app[ALIASES].reload()
    reasons = []
    if result.config_changed:
        reasons.append("config.json changed: workers, limits and pools are read at start")
    if result.secret_key_changed:
        reasons.append("secret.key changed: the key that decrypts endpoint credentials is read at start")
    body: dict[str, Any] = {
        **result.to_json(),
        "size": size,
        "reloaded": ["model-placement.json", "keys", "endpoints", "aliases", "claims (next controller tick)"]
        if settings.pools is not None and settings.pools.agents
        else ["model-placement.json", "keys", "endpoints", "aliases"],
        "restart_required": bool(reasons),
        "restart_reasons": reasons,
    }
    try:
        await audit_change(request, "backup.restore", f"backup:{result.manifest.created_at}", after=body)
    except TurnoutError as exc:  # restored either way: say so rather than answer 500
        body["warnings"] = [*body["warnings"], exc.message]
    return json_response(body)


def add_backup_routes(app: web.Application) -> None:
    app[_RESTORING] = asyncio.Lock()
    r = app.router
    r.add_get("/admin/api/persistence", list_persistence)
    r.add_get("/admin/api/backup", download_backup)
    r.add_post("/admin/api/backup/restore", restore)
