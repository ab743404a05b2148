"""Server-side browser sessions of the admin UI, kept in the SQL store (table ``admin_sessions``).

The browser holds a random token (``tses_`` + 43 characters, a shape logs recognise and mask) in an
``HttpOnly; SameSite=Strict`` cookie; the store keeps only its SHA-256, the session's CSRF token and when it
was last used. A session unused for ``IDLE_S`` is gone (any replica sees the same table, so a load balancer
may send each request elsewhere). Used by :mod:`turnout.admin.ui.security`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update

from turnout.store.db import Database
from turnout.store.schema import admin_sessions

__all__ = ["IDLE_S", "MAX_AGE_S", "TOUCH_EVERY_S", "Session", "SessionStore"]

IDLE_S = 30 * 60.0  # a session unused this long is signed out
MAX_AGE_S = 12 * 3600.0  # and none lives longer than this, used or not
TOUCH_EVERY_S = 30.0  # last_seen is written at most this often (not on every request)
TOKEN_PREFIX = "tses_"  # so that logs recognise a session token wherever it shows (turnout.masking)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    id: str  # the SHA-256 of the cookie value
    csrf: str
    created_at: float
    last_seen: float

    def csrf_ok(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(str(sent).encode(), self.csrf.encode())


class SessionStore:
    """Blocking calls (run them with ``asyncio.to_thread``); time is a parameter."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, *, remote: str | None, now: float) -> tuple[str, Session]:
        """A new session: (cookie token, session). Expired sessions are swept on the way."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        session = Session(_digest(token), secrets.token_urlsafe(32), now, now)
        with self.db.begin() as conn:
            conn.execute(delete(admin_sessions).where(admin_sessions.c.last_seen < now - IDLE_S))
            conn.execute(
                insert(admin_sessions).values(
                    id=session.id,
                    csrf=session.csrf,
                    created_at=now,
                    last_seen=now,
                    remote=(remote or "")[:64] or None,
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
            if now - row.last_seen > IDLE_S or now - row.created_at > MAX_AGE_S:
                conn.execute(delete(admin_sessions).where(admin_sessions.c.id == key))
                return None
            last_seen = row.last_seen
            if now - last_seen >= TOUCH_EVERY_S:
                conn.execute(update(admin_sessions).where(admin_sessions.c.id == key).values(last_seen=now))
                last_seen = now
        return Session(row.id, row.csrf, row.created_at, last_seen)

    def delete(self, token: str) -> bool:
        with self.db.begin() as conn:
            result = conn.execute(delete(admin_sessions).where(admin_sessions.c.id == _digest(token)))
        return bool(result.rowcount)
