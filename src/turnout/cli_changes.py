"""Audit entries of the routing changes the CLI makes outside the admin API: ``turnout worker add|remove`` (the
config file's workers) and ``turnout claim apply|delete`` (the local controller's claim files).

Every change to routing is audited, whoever makes it (the admin API audits its own). These commands write
files, not the store, so :func:`audit_log` opens the store the config names *before* the change (a change that
could not be audited is not made) and :func:`record` appends the entry, actor ``cli:<user>``, after it (said,
exit 1, when that fails: the change is made by then). Entries keep no secret: a worker's ``api_key`` is
replaced by whether it is set, and a password in a URL by ``***``.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from turnout.cli_accounts import cli_audit, fail

if TYPE_CHECKING:
    from turnout.store.db import Database

__all__ = ["audit_log", "audited_claim", "audited_worker", "record"]


@contextmanager
def audit_log(database_url: str | None, data_dir: Path, what: str) -> Iterator[Database]:
    """The store (``database_url``, else SQLite in ``data_dir``), opened and brought to the current schema before
    anything changes; exit 2, nothing changed, when it cannot be. ``what`` names the changed thing for that
    message ("the workers")."""
    from turnout.store.db import Database, StoreError
    from turnout.store.db import database_url as url_of

    try:
        db = Database(url_of(database_url, data_dir))
        db.migrate()
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
