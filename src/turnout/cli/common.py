"""What every `turnout` command group shares: the config options, failing in one line, the validators of the
long-running commands' options, the admin API's input rules on the command line, the store path, audit entries
made from the command line, and readable output (tables, local times, ``--json``).

Tables: aligned columns sized to their content (so they fit 80 columns where the values allow), times in local
ISO 8601 (``2026-12-03 18:20:05``), ``-`` for nothing; ``--json`` prints the data instead.

Audit entries of the routing changes the CLI makes outside the admin API (``turnout worker add|remove``: the
config file's workers; ``turnout claim apply|delete``: the local controller's claim files): every change to
routing is audited, whoever makes it (the admin API audits its own). These commands write files, not the store,
so :func:`audit_log` opens the store the config names *before* the change (a change that could not be audited is
not made) and :func:`record` appends the entry, actor ``cli:<user>``, after it (said, exit 1, when that fails: the
change is made by then). Entries keep no secret: a worker's ``api_key`` is replaced by whether it is set, and a
password in a URL by ``***``.

Only the standard library and typer are imported here: `turnout --help` and the commands that talk to a running
gateway stay quick. The store stack is imported by the helpers that use it.
"""

from __future__ import annotations

import getpass
import json
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.cli.client import AdminClient, GatewayError, connect
from turnout.defaults import DEFAULT_CONFIG
from turnout.errors import TurnoutError, Unprocessable

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.store.db import Database

__all__ = [
    "DEFAULT_CONFIG",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "WIDTH",
    "ConfigOption",
    "LogFormatOption",
    "LogLevelOption",
    "OptionalConfigOption",
    "admin_errors",
    "api_error",
    "audit_log",
    "audited_claim",
    "audited_worker",
    "bad_field",
    "cli_actor",
    "cli_audit",
    "cli_audit_key",
    "cli_input",
    "clip",
    "echo_json",
    "fail",
    "gateway",
    "load_config",
    "local_time",
    "ms",
    "open_store",
    "record",
    "render",
    "table",
    "valid_host",
    "valid_interval",
    "valid_log_format",
    "valid_log_level",
    "valid_optional_port",
    "valid_port",
]

# -- options ------------------------------------------------------------------------------------------------
# The store commands' config (default ./turnout-data/config.json); serve's and the claims' (created when missing).
ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="config file")]
OptionalConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help=f"config file (default: ./{DEFAULT_CONFIG}, created when missing)"),
]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")  # turnout.config.LogFormat (not imported here: the CLI starts without pydantic)
MAX_INTERVAL_S = 3600.0


def valid_port(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 65535:
        raise typer.BadParameter("must be a port from 1 to 65535")
    return value


def valid_optional_port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise typer.BadParameter("must be a port from 1 to 65535, or 0 for off")
    return value


def valid_interval(value: float) -> float:
    if not 0 < value <= MAX_INTERVAL_S:  # also refuses nan; inf is over the cap
        raise typer.BadParameter(f"must be a number of seconds above 0 and at most {MAX_INTERVAL_S:g}")
    return value


def valid_log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def valid_log_format(value: str | None) -> str | None:
    if value is not None and value.lower() not in LOG_FORMATS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_FORMATS)}")
    return None if value is None else value.lower()


def valid_host(value: str | None) -> str | None:
    if value is not None and (not value or len(value) > 253 or any(ch <= " " or ch == "\x7f" for ch in value)):
        raise typer.BadParameter("must be a host name or address (no spaces or control characters)")
    return value


LogLevelOption = Annotated[str, typer.Option(callback=valid_log_level, help="debug, info, warning or error")]
# The long-running commands other than serve (whose default comes from its config file): agent, controller, operator
LogFormatOption = Annotated[
    str, typer.Option(callback=valid_log_format, metavar="text|json", help="text, or json: one JSON object per line")
]


# -- failing in one line, the admin API's input rules, the store path ------------------------------------
def fail(message: str, code: int = 2) -> None:
    typer.echo(f"turnout: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def cli_input(**flags: str) -> Iterator[None]:
    """Checks by the admin API's own input models (same bounds): a bad value exits 2 naming the option
    (``--<field>``, or ``flags[field]`` where the option is named otherwise)."""
    try:
        yield
    except Unprocessable as exc:
        bad_field(exc.field, exc.message, flags)


def bad_field(field: str | None, message: str, flags: dict[str, str]) -> None:
    """Exit 2 with ``message`` about ``field`` (an input model's or the admin API's), naming its option."""
    name = (field or "").split(".")[0].split("[")[0]
    flag = flags.get(name, name.replace("_", "-"))
    fail(f"--{flag}: {message}" if flag else message)


def load_config(config: Path) -> Settings:
    """The settings of ``config``, or a one-line exit (2) naming what is wrong with it."""
    from turnout.config import ConfigError, load_settings

    try:
        return load_settings(config)
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


def gateway(settings: Settings) -> AdminClient | None:
    """The running gateway's admin API, or None (said on stderr) when none answers: then work on the store."""
    return connect(settings, timeout_s=settings.health.timeout_s + 30)


def api_error(exc: GatewayError, **flags: str) -> None:
    """An error answer of the admin API, said as the store path would say it: a bad field names its option."""
    if exc.field is not None:
        bad_field(exc.field, exc.message, flags)
    fail(exc.message)


@contextmanager
def admin_errors(**flags: str) -> Iterator[None]:
    """Around admin API calls: an error answer exits as :func:`api_error` says it (``flags`` name the options)."""
    try:
        yield
    except GatewayError as exc:
        api_error(exc, **flags)


@contextmanager
def open_store(config: Path | Settings) -> Iterator[tuple[Settings, Database]]:
    from turnout.config import ConfigError, Settings, load_settings
    from turnout.core.patterns import PatternError
    from turnout.store.db import Database, StoreError, database_url
    from turnout.store.secrets import SecretError

    try:
        settings = config if isinstance(config, Settings) else load_settings(config)
        db = Database.migrated(database_url(settings.storage.database_url, settings.data_dir))
    except (ConfigError, StoreError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    try:
        yield settings, db
    except (StoreError, KeyError, TurnoutError, PatternError, SecretError) as exc:
        fail(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
    finally:
        db.close()


def cli_audit(db: Database, **entry: Any) -> None:
    """Append an audit entry made from the command line (actor ``cli:<user>``), for a change written to the store
    while no gateway answered; and tell the gateway replicas sharing the store (its change version), so that
    they re-read it within a second rather than at their next refresh."""
    from turnout.store.audit import AuditLog
    from turnout.store.db import StoreError
    from turnout.store.shared_state import SharedState

    AuditLog(db).record(actor=cli_actor(), **entry)
    try:
        SharedState(db).bump_changes(now=time.time())
    except StoreError as exc:
        typer.echo(
            f"turnout: the change was made, but gateway replicas could not be told through the store ({exc}): they "
            "take it at their next refresh",
            err=True,
        )


def cli_audit_key(db: Database, action: str, before: Any, after: Any, now: float) -> None:
    """The audit entry of a key changed from the command line (``key.change``, ``key.rotate``, ``key.revoke`` by
    ``key revoke`` or ``endpoint remove``): the key as it was and as it is (a rotation's ``after`` is the new key;
    the target is the key as it was)."""
    cli_audit(
        db, action=action, target=f"key:{before.prefix}", before=before.to_json(now), after=after.to_json(now), now=now
    )


def cli_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


# -- audit entries of routing changes made outside the admin API ----------------------------------------------
@contextmanager
def audit_log(database_url: str | None, data_dir: Path, what: str) -> Iterator[Database]:
    """The store (``database_url``, else SQLite in ``data_dir``), opened and brought to the current schema before
    anything changes; exit 2, nothing changed, when it cannot be. ``what`` names the changed thing for that
    message ("the workers")."""
    from turnout.store.db import Database, StoreError
    from turnout.store.db import database_url as url_of

    try:
        db = Database.migrated(url_of(database_url, data_dir))
    except StoreError as exc:
        fail(f"not changed: every change to {what} is audited, and the store cannot be opened: {exc}")
        raise  # unreachable: fail exits
    try:
        yield db
    finally:
        db.close()


def record(db: Database, changed: str, *, action: str, target: str, before: Any = None, after: Any = None) -> None:
    """Append the audit entry of a change already made to ``changed`` (a file); exit 1 saying so if it fails."""
    from turnout.store.db import StoreError

    try:
        cli_audit(db, action=action, target=target, before=before, after=after, now=time.time())
    except StoreError as exc:
        typer.echo(f"turnout: {changed} was changed, but the change could not be audited: {exc}", err=True)
        raise typer.Exit(1) from None


def audited_worker(entry: Any) -> Any:
    """A worker's config entry as the audit log keeps it: ``api_key_set`` instead of the key, no URL password."""
    if not isinstance(entry, dict):
        return entry
    out = {k: v for k, v in entry.items() if k != "api_key"}
    if entry.get("api_key") is not None:
        out["api_key_set"] = True
    for field in ("url", "metrics_url"):
        if isinstance(out.get(field), str):
            out[field] = without_password(out[field])
    return out


def audited_claim(doc: Any) -> Any:
    """A ModelClaim document as the audit log keeps it: its artifact URL without a password."""
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        return doc
    spec = doc["spec"]
    if isinstance(spec.get("artifactURL"), str):
        spec = {**spec, "artifactURL": without_password(spec["artifactURL"])}
    return {**doc, "spec": spec}


def without_password(url: str) -> str:
    """``url`` with the password of its user info (if any) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL that parses: keep nothing of what may be in it after an '@'
        return url.rsplit("@", 1)[-1] if "@" in url else url
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


# -- output ----------------------------------------------------------------------------------------------------
GAP = "  "
WIDTH = 80  # the terminal width tables aim for


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (ending in ``...`` when cut)."""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def local_time(ts: float | None, *, seconds: bool = True) -> str:
    """``2026-12-03 18:20:05`` in the machine's time zone (``-`` for None)."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.localtime(ts))


def ms(value: float | None) -> str:
    """A latency for a table: ``12 ms``, ``1.2 s`` (``-`` for None)."""
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = (), gap: str = GAP
) -> list[str]:
    """Lines of an aligned table: columns as wide as their widest cell, numbers (``right``) right-aligned,
    the last column unpadded."""
    cells = [[str(h) for h in headers], *[["-" if c is None or c == "" else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            (cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])) if i < len(row) - 1 else cell
            for i, cell in enumerate(row)
        ]
        if len(row) - 1 in right:
            parts[-1] = row[-1].rjust(widths[-1])
        lines.append(gap.join(parts).rstrip())
    return lines


def render(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))
