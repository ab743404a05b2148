"""Server-side browser sessions of the admin UI, kept in the SQL store (table ``admin_sessions``).

The browser holds a random token (``tses_`` + 43 characters, a shape logs recognise and mask) in an
``HttpOnly; SameSite=Strict`` cookie; the store keeps only its SHA-256, the session's CSRF token, when it
was last used, and who signed in (the audit actor, the person's row, their role and team tenants as at sign-in,
the label the header shows). A session unused for ``auth.session_idle_s``, or older than ``auth.session_max_s``,
is gone (any replica sees the same table, so a load balancer may send each request elsewhere); a person's
sessions all end when they sign out or are disabled. Used by :mod:`turnout.admin.ui.security`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update

from turnout.store.db import Database
from turnout.store.schema import admin_sessions

__all__ = ["BREAK_GLASS_ACTOR", "IDLE_S", "MAX_AGE_S", "TOUCH_EVERY_S", "Identity", "Session", "SessionStore"]

IDLE_S = 30 * 60.0  # a session unused this long is signed out
MAX_AGE_S = 12 * 3600.0  # and none lives longer than this, used or not
TOUCH_EVERY_S = 30.0  # last_seen is written at most this often (not on every request)
TOKEN_PREFIX = "tses_"  # so that logs recognise a session token wherever it shows (turnout.masking)
BREAK_GLASS_ACTOR = "token"  # the audit actor of the admin token (break-glass)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a session belongs to: the audit ``actor``, the people table's row (None: the admin token), the
    role and team tenants as at sign-in, and what the header shows."""

    actor: str = BREAK_GLASS_ACTOR
    person_id: int | None = None
    role: str | None = "admin"
    teams: tuple[str, ...] = ()
    label: str = "admin token"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    id: str  # the SHA-256 of the cookie value
    csrf: str
    created_at: float
    last_seen: float
    identity: Identity = Identity()

    def csrf_ok(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(str(sent).encode(), self.csrf.encode())


class SessionStore:
    """Blocking calls (run them with ``asyncio.to_thread``); time is a parameter."""

    def __init__(self, db: Database, *, idle_s: float = IDLE_S, max_age_s: float = MAX_AGE_S) -> None:
        self.db = db
        self.idle_s = idle_s
        self.max_age_s = max_age_s

    def create(self, *, remote: str | None, now: float, identity: Identity | None = None) -> tuple[str, Session]:
        """A new session: (cookie token, session). Expired sessions are swept on the way."""
        identity = identity or Identity()
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        session = Session(_digest(token), secrets.token_urlsafe(32), now, now, identity)
        with self.db.begin() as conn:
            conn.execute(delete(admin_sessions).where(admin_sessions.c.last_seen < now - self.idle_s))
            conn.execute(
                insert(admin_sessions).values(
                    id=session.id,
                    csrf=session.csrf,
                    created_at=now,
                    last_seen=now,
                    remote=(remote or "")[:64] or None,
                    actor=identity.actor,
                    person_id=identity.person_id,
                    role=identity.role,
                    teams=list(identity.teams),
                    label=identity.label[:320],
                )
            )
        return token, session

    def get(self, token: str, *, now: float) -> Session | None:
        """The live session for a cookie token, its idle clock restarted; None if unknown or expired."""
        if not token or len(token) > 128:
            return None
        key = _digest(token)
        with self.db.begin() as conn:
            row = conn.execute(select(admin_sessions).where(admin_sessions.c.id == key)).first()
            if row is None:
                return None
            if now - row.last_seen > self.idle_s or now - row.created_at > self.max_age_s:
                conn.execute(delete(admin_sessions).where(admin_sessions.c.id == key))
                return None
            last_seen = row.last_seen
            if now - last_seen >= TOUCH_EVERY_S:
                conn.execute(update(admin_sessions).where(admin_sessions.c.id == key).values(last_seen=now))
                last_seen = now
        identity = Identity()  # actor NULL: a session from before people existed, signed in with the admin token
        if row.actor is not None:
            identity = Identity(row.actor, row.person_id, row.role, tuple(row.teams or ()), row.label or row.actor)
        return Session(row.id, row.csrf, row.created_at, last_seen, identity)

    def delete(self, token: str) -> bool:
        with self.db.begin() as conn:
            result = conn.execute(delete(admin_sessions).where(admin_sessions.c.id == _digest(token)))
        return bool(result.rowcount)

    def delete_person(self, person_id: int) -> int:
        """End every session of a person (sign-out everywhere, a disabled person): how many ended."""
        with self.db.begin() as conn:
            result = conn.execute(delete(admin_sessions).where(admin_sessions.c.person_id == person_id))
        return int(result.rowcount or 0)
