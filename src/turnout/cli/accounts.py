"""`turnout key ...`, `turnout usage`, `turnout audit`: the same actions as the admin API.

Key commands are the admin API's calls when the gateway named by the config runs (:mod:`turnout.cli.client`),
so a revocation or a change takes effect at once there. When none runs, they say so in one line and work on
the store directly (a gateway started later reads it). Either way the input models, store rules and audit
entries are the admin API's. ``usage`` and ``audit`` read through the gateway the same way (its usage answer
includes what it has not written to the store yet); all listings print a table by default and JSON with
``--json`` (:mod:`turnout.cli.common`).
"""

from __future__ import annotations

import time
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.cli.client import GatewayError
from turnout.cli.common import (
    DEFAULT_CONFIG,
    WIDTH,
    ConfigOption,
    admin_errors,
    api_error,
    cli_audit,
    cli_audit_key,
    cli_input,
    clip,
    echo_json,
    fail,
    gateway,
    load_config,
    local_time,
    ms,
    open_store,
    render,
    table,
)
from turnout.store.bounds import MAX_AUDIT_ENTRIES

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.store.keys import KeyRecord

# The store stack (SQLAlchemy, the admin input models) is imported inside the commands, so that
# `turnout --help` does not pay for it, nor a command that talks to a running gateway.

__all__ = ["audit", "key_app", "register", "usage"]

key_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Create, list, edit, revoke and rotate API keys."
)


def _key_path(ref: str, action: str = "") -> str:
    """The admin API path of a key given by id, prefix or whole key. A whole key goes as its prefix: a key
    never travels in a URL (paths end up in access logs)."""
    ref = ref.strip()
    if ref.startswith("tk_") and len(ref) > 10:
        ref = ref[:10]
    return "/admin/api/keys/" + urllib.parse.quote(ref, safe="") + action


@key_app.command("create")
def key_create(
    app: Annotated[str, typer.Option(help="application the key is for (created when new)")],
    tenant: Annotated[str | None, typer.Option(help="tenant of a new app (default: default)")] = None,
    models: Annotated[str | None, typer.Option(help="comma-separated scopes, e.g. model:qwen3:*,llama3.2")] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="requests per minute")] = None,
    daily_tokens: Annotated[int | None, typer.Option(min=1, help="tokens per UTC day")] = None,
    expires: Annotated[str | None, typer.Option(help="2026-12-31, an ISO time, or a duration such as 30d")] = None,
    priority: Annotated[
        str | None, typer.Option(help="priority class: interactive, standard or batch (default: the tenant's)")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Create a key; it is printed once and only its hash is stored."""
    from turnout.admin.inputs import KeyCreate, parse_input

    now = time.time()
    body = {
        "app": app,
        "tenant": tenant,
        "models": models.split(",") if models else None,
        "rpm": rpm,
        "daily_tokens": daily_tokens,
        "expires": expires or None,
        "priority": priority,
    }
    with cli_input():
        spec = parse_input(KeyCreate, body)
        expires_at = spec.expires_at(now)
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            answer = admin.call("POST", "/admin/api/keys", {k: v for k, v in body.items() if v is not None})
        plaintext, view = answer["key"], answer["record"]
    else:
        from turnout.store.keys import KeyStore, parse_scopes

        with open_store(settings) as (_, db):
            record, plaintext = KeyStore(db).create(
                app=spec.app,
                tenant=spec.tenant,
                scopes=parse_scopes(spec.models),
                rpm=spec.rpm,
                daily_tokens=spec.daily_tokens,
                expires_at=expires_at,
                now=now,
                priority=spec.priority_class(),
            )
            cli_audit(db, action="key.create", target=f"key:{record.prefix}", after=record.to_json(now), now=now)
        view = _view(record, now, settings)
    typer.echo(plaintext)
    typer.echo(
        f"key {view['prefix']} for app {view['app']} (tenant {view['tenant']}, priority "
        f"{view['effective_priority']}); shown only once",
        err=True,
    )


def _view(record: KeyRecord, now: float, settings: Settings, used: dict[int, float] | None = None) -> dict[str, Any]:
    """A key as the admin API shows it, read from the store (its class with the config's tenant default)."""
    served_at = record.priority_class(settings.tenant_class(record.tenant))
    view = {**record.to_json(now), "effective_priority": served_at.value}
    if used is not None:
        view["last_used"] = used.get(record.id)
    return view


@key_app.command("list")
def key_list(
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's keys")] = None,
    app: Annotated[str | None, typer.Option(help="only this app's keys")] = None,
    endpoint: Annotated[str | None, typer.Option(help="only keys whose scopes reach this endpoint's models")] = None,
    state: Annotated[str | None, typer.Option(help="active, revoked, expired or in_grace")] = None,
) -> None:
    """List keys: prefix, app, tenant, state, when it stops working (a rotated key: the end of its grace),
    last use, limits and models."""
    filters = {"tenant": tenant, "app": app, "endpoint": endpoint, "state": state}
    settings = load_config(config)
    admin = gateway(settings)
    now = time.time()
    views: list[dict[str, Any]]
    if admin is not None:  # the gateway checks the filters by the same input model (a 422 names the option)
        with admin_errors():
            views = admin.call("GET", "/admin/api/keys", query=filters)["keys"]
    else:
        from turnout.admin.inputs import KeyListQuery, parse_input
        from turnout.store.keys import KeyStore
        from turnout.store.usage import UsageStore

        with cli_input():
            query = parse_input(KeyListQuery, filters)
        with open_store(settings) as (_, db):
            records = KeyStore(db).all()
            used = UsageStore(db).last_used()
        views = [_view(r, now, settings, used) for r in records if query.matches(r, now)]
    if as_json:
        echo_json(views)
        return
    render(key_table(views))


def key_table(views: list[dict[str, Any]]) -> list[str]:
    """One row per key; UNTIL is a rotated key's grace end, else its expiry. TENANT, LIMITS and CLASS (the
    priority class its requests get) appear only when some key has them (so the usual table fits 80 columns)."""
    tenants = any(v["tenant"] != "default" for v in views)
    limited = any(v.get("rpm") or v.get("daily_tokens") for v in views)
    classes = any(v.get("effective_priority", "standard") != "standard" for v in views)
    headers = ["ID", "PREFIX", "APP", *(["TENANT"] if tenants else []), "STATE", "UNTIL", "LAST USED"]
    headers += [*(["LIMITS"] if limited else []), *(["CLASS"] if classes else []), "MODELS"]
    rows = []
    for v in views:
        until = v.get("grace_until") if v["state"] == "in_grace" else v.get("expires_at")
        limits = [
            f"{v['rpm']} rpm" if v.get("rpm") else "",
            f"{v['daily_tokens']} tok/d" if v.get("daily_tokens") else "",
        ]
        rows.append(
            [
                v["id"],
                v["prefix"],
                v["app"],
                *([v["tenant"]] if tenants else []),
                v["state"],
                local_time(until, seconds=False) if until else "-",
                local_time(v.get("last_used"), seconds=False),
                *([", ".join(x for x in limits if x) or "-"] if limited else []),
                *([v.get("effective_priority", "standard")] if classes else []),
                ",".join(m.removeprefix("model:") for m in v["models"]),
            ]
        )
    return table(headers, rows, right=(0,))


@key_app.command("edit")
def key_edit(
    ref: Annotated[str, typer.Argument(help="key id or prefix")],
    models: Annotated[str | None, typer.Option(help="new comma-separated scopes (replace the old ones)")] = None,
    rpm: Annotated[str | None, typer.Option(help="requests per minute; 'none' removes the limit")] = None,
    daily_tokens: Annotated[str | None, typer.Option(help="tokens per UTC day; 'none' removes the limit")] = None,
    expires: Annotated[str | None, typer.Option(help="2026-12-31, an ISO time, 30d ...; 'never' removes it")] = None,
    priority: Annotated[
        str | None,
        typer.Option(help="interactive, standard or batch; 'default' removes the key's own (its tenant's applies)"),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Change a key's scopes, limits and priority class (PATCH /admin/api/keys/{ref}); only the options given
    change."""
    from turnout.admin.inputs import KeyChange, parse_input

    body: dict[str, object] = {}
    if models is not None:
        body["models"] = [m for m in models.split(",") if m]
    for name, value in (("rpm", rpm), ("daily_tokens", daily_tokens)):
        if value is not None:
            body[name] = None if value.lower() == "none" else _count(value, name)
    if expires is not None:
        body["expires"] = None if expires.lower() == "never" else expires
    if priority is not None:
        body["priority"] = None if priority.lower() == "default" else priority
    now = time.time()
    with cli_input():
        changes = parse_input(KeyChange, body).changes(now)
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            echo_json(admin.call("PATCH", _key_path(ref), body))
        return
    from turnout.store.keys import KeyStore

    with open_store(settings) as (_, db):
        before, after = KeyStore(db).update(ref, now=now, **changes)
        cli_audit_key(db, "key.change", before, after, now)
    echo_json(_view(after, now, settings))


def _count(value: str, name: str) -> int | str:
    """An integer option given as text (so 'none' can remove it); left as text when it is not digits, so
    the shared input model says what is wrong."""
    return int(value) if value.isascii() and value.isdigit() else value


@key_app.command("revoke")
def key_revoke(
    ref: Annotated[str, typer.Argument(help="key id or prefix")], config: ConfigOption = DEFAULT_CONFIG
) -> None:
    """Revoke a key at once (through the running gateway: refused from its next request on). A key revoked
    already is left as it is: the command says so and exits 0, and nothing new is audited."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        try:
            prefix = admin.call("POST", _key_path(ref, "/revoke"))["prefix"]
        except GatewayError as exc:
            if exc.code != "key_revoked":
                api_error(exc)
            typer.echo(f"turnout: {exc.message}", err=True)
            return
    else:
        from turnout.store.keys import KeyRevoked, KeyStore

        now = time.time()
        with open_store(settings) as (_, db):
            try:
                before, after = KeyStore(db).revoke(ref, now=now)
            except KeyRevoked as exc:
                typer.echo(f"turnout: {exc}", err=True)
                return
            cli_audit_key(db, "key.revoke", before, after, now)
        prefix = after.prefix
    typer.echo(f"revoked {prefix}")


@key_app.command("rotate")
def key_rotate(
    ref: Annotated[str, typer.Argument(help="key id or prefix")],
    grace: Annotated[
        float | None, typer.Option(help="seconds the old key keeps working (default auth.rotate_grace_s)")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Issue a replacement key; the old one keeps working for the grace period."""
    from turnout.admin.inputs import KeyRotate, parse_input

    now = time.time()
    with cli_input(grace_s="grace"):
        spec = parse_input(KeyRotate, {"grace_s": grace})
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors(grace_s="grace"):
            answer = admin.call("POST", _key_path(ref, "/rotate"), {"grace_s": spec.grace_s})
        plaintext, new, old = answer["key"], answer["record"], answer["old"]
    else:
        from turnout.store.keys import KeyStore

        with open_store(settings) as (_, db):
            grace_s = settings.auth.rotate_grace_s if spec.grace_s is None else spec.grace_s
            old_record, new_record, plaintext = KeyStore(db).rotate(ref, grace_s=grace_s, now=now)
            cli_audit_key(db, "key.rotate", old_record, new_record, now)
        new, old = new_record.to_json(now), old_record.to_json(now)
    typer.echo(plaintext)
    until = old.get("grace_until") or old.get("expires_at")
    typer.echo(f"new key {new['prefix']}; {old['prefix']} works until {local_time(until)} (local time)", err=True)


def usage(
    key: Annotated[str | None, typer.Option(help="key id or prefix")] = None,
    since: Annotated[str, typer.Option(help="24h, 7d, 2026-12-01 ...")] = "24h",
    until: Annotated[str | None, typer.Option(help="end of the range (default now)")] = None,
    bucket: Annotated[str, typer.Option(help="minute, hour or day")] = "hour",
    endpoint: Annotated[
        str | None, typer.Option(help="an external endpoint (served by it or fell back from it)")
    ] = None,
    worker: Annotated[str | None, typer.Option(help="the worker that served the requests")] = None,
    model: Annotated[str | None, typer.Option(help="the model served (an alias counts as its model)")] = None,
    route: Annotated[str | None, typer.Option(help="the client API route, e.g. openai:chat")] = None,
    batch: Annotated[str | None, typer.Option(help="only the lines of this Batch API batch (batch_...)")] = None,
    series: Annotated[bool, typer.Option("--series", help="one point per bucket (totals, as charted)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    output_format: Annotated[str | None, typer.Option("--format", help="table (default), json or csv")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Usage per key, endpoint and worker (or, with --series, one total per bucket): a table with local times,
    latency p50/p95 and totals; JSON with --json, CSV with --format csv."""
    from turnout.admin.inputs import UsageQuery, parse_input

    now = time.time()
    shape = "json" if as_json else (output_format or "table")
    if shape not in ("table", "json", "csv"):
        fail(f"--format: must be table, json or csv, not {shape!r}")
    given = {
        "key": key,
        "since": since,
        "until": until,
        "bucket": bucket,
        "endpoint": endpoint,
        "worker": worker,
        "model": model,
        "route": route,
        "batch": batch,
    }
    with cli_input():
        query = parse_input(UsageQuery, {**given, "format": "csv" if shape == "csv" else "json"})
        since_ts = query.since_ts(now)
        until_ts = query.until_ts(now) if series or until is not None else None
    settings = load_config(config)
    admin = gateway(settings)
    rows: list[dict[str, Any]]
    if admin is not None:  # its answer includes what it has not written to the store yet
        with admin_errors():
            answer = admin.call("GET", "/admin/api/usage" + ("/series" if series else ""), query=given)
        rows = answer["points" if series else "rows"]
        since_ts, until_ts = answer["since"], answer["until"]
    else:
        rows = _usage_on_store(settings, query, series, since_ts, until_ts)
    if shape == "csv":
        from turnout.store.usage import SERIES_COLUMNS, SUMMARY_COLUMNS, to_csv

        typer.echo(to_csv(rows, SERIES_COLUMNS if series else SUMMARY_COLUMNS), nl=False)
    elif shape == "json":
        echo_json(rows)
    else:
        render(usage_table(rows, series=series, since=since_ts, until=until_ts or now))


def _usage_on_store(
    settings: Settings, query: Any, series: bool, since_ts: float, until_ts: float | None
) -> list[dict[str, Any]]:
    from turnout.store.keys import KeyStore
    from turnout.store.usage import UsageFilter, UsageStore

    rows: list[dict[str, Any]] = []
    with open_store(settings) as (_, db):
        key_id = KeyStore(db).get(query.key).id if query.key else None
        where = UsageFilter(
            key_id=key_id,
            endpoint=query.endpoint,
            worker=query.worker,
            model=query.model,
            route=query.route,
            batch=query.batch,
        )
        store = UsageStore(db)
        try:
            if series:
                assert until_ts is not None
                rows = store.series(since=since_ts, until=until_ts, bucket=query.bucket, where=where)
            else:
                rows = store.summary(since=since_ts, bucket=query.bucket, where=where, until=until_ts)
        except ValueError as exc:
            fail(f"--bucket: {exc}")
    return rows


def usage_table(rows: list[dict[str, Any]], *, series: bool, since: float, until: float) -> list[str]:
    """Usage rows (or series points) as a table: bucket start in local time, requests, errors, tokens in and
    out, latency p50/p95; then the totals over the range."""
    head = ["TIME", "REQ", "ERR", "IN", "OUT", "P50", "P95"]
    picked = rows if not series else [p for p in rows if p["requests"]]
    lines = []
    if picked:
        out = []
        for r in sorted(picked, key=lambda r: (r["bucket_start"], str(r.get("model")))):
            measures = [
                r["requests"],
                r["errors"],
                r["prompt_tokens"],
                r["completion_tokens"],
                ms(r.get("latency_ms_p50")),
                ms(r.get("latency_ms_p95")),
            ]
            served = r.get("worker") or "-"
            if r.get("fallback_from"):
                served = f"{served} (from {r['fallback_from']})"
            model = r.get("model") or "-"
            if r.get("alias"):
                model = f"{model} (as {r['alias']})"  # the alias the requests named
            labels = [] if series else [r.get("key") or "-", model, served]
            out.append([local_time(r["bucket_start"], seconds=False), *labels, *measures])
        headers = head if series else [head[0], "KEY", "MODEL", "SERVED BY", *head[1:]]
        first = 1 if series else 4
        lines = table(headers, out, right=range(first, first + 6), gap=" ")
    else:
        lines = ["no requests in this range"]
    total = sum(r["requests"] for r in rows)
    lines.append(
        f"total: {total} requests, {sum(r['errors'] for r in rows)} errors, "
        f"{sum(r['prompt_tokens'] for r in rows)} prompt + {sum(r['completion_tokens'] for r in rows)} "
        "completion tokens"
    )
    lines.append(f"from {local_time(since, seconds=False)} to {local_time(until, seconds=False)} (local time)")
    return lines


def audit(
    since: Annotated[str | None, typer.Option(help="24h, 7d, 2026-12-01 ...")] = None,
    until: Annotated[str | None, typer.Option(help="end of the range (default now)")] = None,
    action: Annotated[str | None, typer.Option(help="e.g. key.create, placement.toggle")] = None,
    actor: Annotated[
        str | None,
        typer.Option(help="oidc:<sub> (a person), token (the admin token), cli:<user>, or a prefix such as 'oidc:*'"),
    ] = None,
    target: Annotated[str | None, typer.Option(help="a target prefix, e.g. key:tk_ab or worker:a")] = None,
    limit: Annotated[int, typer.Option(help=f"at most {MAX_AUDIT_ENTRIES}")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (with before/after) instead of a table")] = False,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """The audit log, newest first: a table of local time, actor, action, target and what changed."""
    from turnout.admin.inputs import AuditQuery, parse_input

    now = time.time()
    given = {"since": since, "until": until, "action": action, "actor": actor, "target": target, "limit": limit}
    with cli_input():
        query = parse_input(AuditQuery, given)
        since_ts, until_ts = query.since_ts(now), query.until_ts(now)
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            entries = admin.call("GET", "/admin/api/audit", query=given)["entries"]
    else:
        from turnout.store.audit import AuditLog

        with open_store(settings) as (_, db):
            found = AuditLog(db).entries(
                since=since_ts,
                until=until_ts,
                action=query.action,
                actor=query.actor,
                target=query.target,
                limit=query.limit,
            )
        entries = [e.to_json() for e in found]
    if as_json:
        echo_json(entries)
        return
    if not entries:
        typer.echo("no audit entries match")
        return
    render(audit_table(entries))


def audit_table(entries: list[dict[str, Any]]) -> list[str]:
    """TIME, ACTOR, ACTION, TARGET; what changed on the line under each entry, cut to fit 80 columns
    (``--json`` has the whole before and after)."""
    rows = [[local_time(e["ts"]), e["actor"], e["action"], e["target"]] for e in entries]
    lines = table(["TIME", "ACTOR", "ACTION", "TARGET"], rows)
    indent = " " * (len(local_time(0)) + 2)
    out = [lines[0]]
    for line, e in zip(lines[1:], entries, strict=True):
        out.append(line)
        change = change_summary(e["before"], e["after"])
        if change:
            out.append(indent + clip(change, WIDTH - len(indent)))
    return out


_UNSHOWN = frozenset({"updated_at", "created_at", "etag", "id"})


def change_summary(before: Any, after: Any) -> str:
    """What an audit entry changed, in one short line: ``rpm: 5 -> none, credential: replaced``."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return ""
    parts = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if name in _UNSHOWN or old == new:
            continue
        if new == "replaced":
            parts.append(f"{name}: replaced")
        else:
            parts.append(f"{name}: {_word(old)} -> {_word(new)}")
    return ", ".join(parts)


def _word(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "set" if value else "none"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and value > 1e9:  # an epoch time (revoked_at, expires_at)
        return local_time(value, seconds=False)
    return str(value)


def register(app: typer.Typer) -> None:
    app.add_typer(key_app, name="key")
    app.command("usage")(usage)
    app.command("audit")(audit)
