"""Every place a gateway keeps state, for the admin API's Persistence listing (``GET /admin/api/persistence``).

One entry per file, directory or store: where it is, its size and last write (None when absent or not
knowable from here), and whether a backup holds it (``included``, ``optional``: only with the secret key
option, ``excluded``). Built from :class:`turnout.state.backup.StatePaths`, so the listing and the backup
agree on what is where.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from turnout.state.backup import StatePaths
from turnout.store.db import Database

__all__ = ["persistence", "public_url"]


def public_url(url: str) -> str:
    """A database URL without its password (``postgresql://user@host:5432/db``)."""
    try:
        parsed = make_url(url)
    except Exception:  # a URL SQLAlchemy cannot parse: say nothing more than its scheme
        return url.split(":", 1)[0] + "://..."
    shown = URL.create(
        parsed.drivername.split("+", 1)[0], parsed.username, None, parsed.host, parsed.port, parsed.database
    )  # no password, no query (it may carry one too)
    return shown.render_as_string(hide_password=False)


def _stat(path: Path) -> tuple[bool, int | None, float | None]:
    try:
        st = os.stat(path)
    except OSError:
        return False, None, None
    return True, st.st_size, st.st_mtime


def _file(ident: str, kind: str, path: Path, backup: str, note: str | None = None) -> dict[str, Any]:
    exists, size, mtime = _stat(path)
    return {
        "id": ident,
        "kind": kind,
        "path": str(path),
        "exists": exists,
        "size": size,
        "modified_at": mtime,
        "backup": backup,
        "note": note,
    }


def _elsewhere(ident: str, kind: str, location: str, note: str) -> dict[str, Any]:
    return {
        "id": ident,
        "kind": kind,
        "path": location,
        "exists": None,
        "size": None,
        "modified_at": None,
        "backup": "excluded",
        "note": note,
    }


def _sqlite(path: Path) -> dict[str, Any]:
    entry = _file("database", "sqlite", path, "included", "keys (hashes), usage, audit, endpoints")
    wal = Path(f"{path}-wal")
    exists, size, mtime = _stat(wal)
    if exists and entry["exists"]:
        entry["size"] = (entry["size"] or 0) + (size or 0)  # committed rows not yet checkpointed live here
        entry["modified_at"] = max(entry["modified_at"] or 0.0, mtime or 0.0)
    return entry


def _postgres(url: str, database: Database | None) -> dict[str, Any]:
    size = None
    if database is not None:
        try:
            with database.engine.connect() as conn:
                size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar()
        except SQLAlchemyError:
            size = None
    return {
        "id": "database",
        "kind": "postgresql",
        "path": public_url(url),
        "exists": size is not None if database is not None else None,
        "size": size,
        "modified_at": None,
        "backup": "included",
        "note": "keys (hashes), usage, audit, endpoints; exported table by table in one snapshot",
    }


def _claims(directory: Path) -> dict[str, Any]:
    entry = _file("claims", "directory", directory, "included", "the local controller's ModelClaims")
    if entry["exists"]:
        files = [p for p in directory.glob("*.json") if not p.name.startswith(".")]
        stats = [s for s in (_stat(p) for p in files) if s[0]]
        entry["size"] = sum(s[1] or 0 for s in stats)
        entry["modified_at"] = max([entry["modified_at"], *(s[2] or 0.0 for s in stats)])
        entry["count"] = len(stats)
    return entry


def persistence(paths: StatePaths, database: Database | None = None) -> list[dict[str, Any]]:
    """The listing; ``database`` (the gateway's open store) sizes a PostgreSQL database."""
    entries = [
        _file("config", "file", paths.config, "included", "workers, placement baseline, limits, pools"),
        _file(
            "model_placement",
            "file",
            paths.placement,
            "included",
            "placement overrides from the admin UI: this data dir's copy of the store's; in the backup when present",
        ),
        _sqlite(paths.sqlite) if paths.sqlite is not None else _postgres(paths.database_url, database),
    ]
    if paths.secret_from_env:
        key = _elsewhere("secret_key", "environment", "TURNOUT_SECRET_KEY", "")
        key.update(backup="optional", note="from the environment; in the backup only with include_secret_key")
    else:
        key = _file(
            "secret_key",
            "file",
            paths.secret_key,
            "optional",
            "encrypts endpoint credentials; in the backup only with include_secret_key (the credentials stay "
            "encrypted either way)",
        )
    entries.append(key)
    if paths.admin_token_from_env:
        entries.append(_elsewhere("admin_token", "environment", "TURNOUT_ADMIN_TOKEN", "never in a backup"))
    else:
        entries.append(
            _file("admin_token", "file", paths.admin_token, "excluded", "never in a backup; each gateway keeps its own")
        )
    if paths.claims_dir is not None:
        entries.append(_claims(paths.claims_dir))
        for ident, path in (("claim_status", paths.claim_status), ("claim_events", paths.claim_events)):
            entries.append(_file(ident, "file", path, "excluded", "derived by the controller on its next ticks"))
    for name, url in paths.agents:
        entries.append(
            _elsewhere(
                f"engine_registry:{name}",
                "agent",
                url,
                f"engines.json of runtime agent {name}, kept by the agent; engines follow the claims",
            )
        )
    if paths.kubernetes:
        entries.append(
            _elsewhere(
                "claims",
                "kubernetes",
                "ModelClaim objects in the cluster",
                "reconciled by turnout operator; back them up with the cluster",
            )
        )
    if paths.redis_url:
        entries.append(
            _elsewhere("redis", "redis", public_url(paths.redis_url), "shared rate and token counters; not backed up")
        )
    return entries
