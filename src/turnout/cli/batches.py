"""`turnout batch list|show|cancel`: the OpenAI Batch API's batches of every app, as the admin API shows them.

The commands are the admin API's calls (``GET /admin/api/batches``, ``GET /admin/api/batches/{id}``,
``POST /admin/api/batches/{id}/cancel``) when the gateway named by the config runs (:mod:`turnout.cli.client`), so a
cancel stops the batch's new lines at once there. When none runs they say so in one line and work on the store
directly: a cancel marks the batch ``cancelling`` (audited as ``batch.cancel``) and the gateway that runs or resumes
it next ends it. Listings print a table by default and JSON with ``--json``.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Annotated, Any

import typer

from turnout.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    admin_errors,
    cli_audit,
    cli_input,
    echo_json,
    fail,
    gateway,
    load_config,
    local_time,
    open_store,
    render,
    table,
)

__all__ = ["batch_app", "register"]

batch_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="List the OpenAI Batch API's batches of every app with their progress, show one, cancel one.",
)


def _batch_id(given: str) -> str:
    """The id as given, trimmed; an empty one is refused here (it would name the list, not a batch)."""
    if not given.strip():
        fail("give the batch's id (batch_...): turnout batch list shows them")
    return given.strip()


def _path(batch_id: str, action: str = "") -> str:
    return "/admin/api/batches/" + urllib.parse.quote(_batch_id(batch_id), safe="") + action


def _store_views(db: Any, *, app: str | None, status: str | None, limit: int) -> list[dict[str, Any]]:
    from turnout.admin.batches_api import batch_view
    from turnout.store.batches import BatchStore
    from turnout.store.keys import KeyStore

    tenants = {a["name"]: a["tenant"] for a in KeyStore(db).apps()}
    apps = None if app is None else [app]
    return [batch_view(r, tenants) for r in BatchStore(db).listing(apps=apps, status=status, limit=limit)]


@batch_app.command("list")
def batch_list(
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    app: Annotated[str | None, typer.Option(help="only this app's batches")] = None,
    status: Annotated[
        str | None,
        typer.Option(help="validating, in_progress, finalizing, completed, failed, expired, cancelling or cancelled"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="the newest this many")] = 100,
) -> None:
    """List batches, newest first: id, app, state, lines answered of the total, lines in the error file, created."""
    from turnout.admin.inputs import BatchListQuery, parse_input

    filters: dict[str, Any] = {"app": app, "status": status, "limit": str(limit)}
    with cli_input():
        query = parse_input(BatchListQuery, {k: v for k, v in filters.items() if v is not None})
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            views = admin.call("GET", "/admin/api/batches", query=filters)["batches"]
    else:
        with open_store(settings) as (_, db):
            views = _store_views(db, app=query.app, status=query.status, limit=query.limit)
    if as_json:
        echo_json(views)
        return
    if not views:
        filtered = [f"{name} {value}" for name, value in (("app", app), ("state", status)) if value is not None]
        which = " with " + " and ".join(filtered) if filtered else ""
        typer.echo(f"no batch{which} (the Batch API's POST /v1/batches makes them)")
        return
    render(batch_table(views))


def batch_table(views: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            v["id"],
            v["app"] or "-",
            v["status"],
            f"{v['done']}/{v['request_counts']['total']} ({v['progress']:.0%})",
            v["request_counts"]["failed"],
            local_time(v["created_at"], seconds=False),
        ]
        for v in views
    ]
    return table(["ID", "APP", "STATE", "ANSWERED", "FAILED", "CREATED"], rows, right=(4,))


def _show(view: dict[str, Any]) -> list[str]:
    counts = view["request_counts"]
    ended = next((view[f] for f in ("completed_at", "cancelled_at", "expired_at", "failed_at") if view.get(f)), None)
    lines = [
        f"batch      {view['id']}",
        f"app        {view['app'] or '-'} (tenant {view['tenant'] or '-'})",
        f"endpoint   {view['endpoint']}" + (f", model {view['model']}" if view.get("model") else ""),
        f"state      {view['status']}" + (f", run by {view['runner']}" if view.get("runner") else ""),
        f"answered   {view['done']} of {counts['total']} ({view['progress']:.0%}): {counts['completed']} in the "
        f"output file, {counts['failed']} in the error file"
        + (f" ({view['unanswered']} of them never answered)" if view.get("unanswered") else ""),
        f"tokens     {view['usage']['input_tokens']} in, {view['usage']['output_tokens']} out",
        f"created    {local_time(view['created_at'])}, window {view['completion_window']}",
        f"expires    {local_time(view['expires_at'])}" if ended is None else f"ended      {local_time(ended)}",
        f"input      {view['input_file_id']}",
    ]
    if view.get("output_file_id"):
        lines.append(f"output     {view['output_file_id']}")
    if view.get("error_file_id"):
        lines.append(f"errors     {view['error_file_id']}")
    for error in (view.get("errors") or {}).get("data", []):
        lines.append(f"failed     {error.get('message')}")
    return lines


@batch_app.command("show")
def batch_show(
    batch_id: Annotated[str, typer.Argument(help="the batch's id (batch_...)")],
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of text")] = False,
) -> None:
    """Show one batch: its state, progress, tokens, window and files."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            view = admin.call("GET", _path(batch_id))
    else:
        from turnout.admin.batches_api import batch_view
        from turnout.store.batches import BatchStore
        from turnout.store.keys import KeyStore

        with open_store(settings) as (_, db):
            record = BatchStore(db).batch(_batch_id(batch_id))
            if record is None:
                fail(f"no batch {batch_id} (turnout batch list shows them)")
            assert record is not None
            view = batch_view(record, {a["name"]: a["tenant"] for a in KeyStore(db).apps()})
    if as_json:
        echo_json(view)
        return
    render(_show(view))


@batch_app.command("cancel")
def batch_cancel(
    batch_id: Annotated[str, typer.Argument(help="the batch's id (batch_...)")],
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Cancel a batch that is validating or in progress: no new line starts, lines in flight end, the others get
    batch_cancelled in the error file."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            view = admin.call("POST", _path(batch_id, "/cancel"))
    else:
        from turnout.admin.batches_api import batch_view
        from turnout.core.batches import can_cancel
        from turnout.store.batches import BatchStore

        now = time.time()
        with open_store(settings) as (_, db):
            store = BatchStore(db)
            record = store.batch(_batch_id(batch_id))
            if record is None:
                fail(f"no batch {batch_id} (turnout batch list shows them)")
            assert record is not None
            if record.status not in ("cancelling", "cancelled"):
                if not can_cancel(record.status):
                    fail(
                        f"batch {record.id} is {record.status}: only a validating or in_progress batch can be cancelled"
                    )
                after = store.request_cancel(record.id, now) or record
                cli_audit(
                    db,
                    action="batch.cancel",
                    target=f"batch:{record.id}",
                    before={"status": record.status},
                    after={"status": after.status},
                    now=now,
                )
                record = after
            view = batch_view(record, {})
    typer.echo(f"batch {view['id']}: {view['status']} ({view['done']} of {view['request_counts']['total']} answered)")


def register(app: typer.Typer) -> None:
    app.add_typer(batch_app, name="batch")
