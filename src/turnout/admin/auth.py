"""Admin authentication: the admin token (break-glass), which signs in as an ``admin`` with actor ``token``.

The token is ``TURNOUT_ADMIN_TOKEN`` when set (read by the config loader), else one generated on
first start and stored 0600 as ``admin-token`` in the data dir, printed once. ``auth.break_glass: false``
turns it off once single sign-on works: it then opens nothing (the file is still made, for the day it is
turned back on).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from turnout.atomic import write_atomic
from turnout.errors import Unauthorized

__all__ = ["TOKEN_FILE", "AdminAuth", "ensure_admin_token"]

TOKEN_FILE = "admin-token"


@dataclass(frozen=True, slots=True)
class AdminAuth:
    token: str
    enabled: bool = True  # auth.break_glass

    def check(self, header: str | None) -> None:
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise Unauthorized(
                "admin API needs 'Authorization: Bearer <token>' (a personal token from the UI's Account page, "
                "or the admin token)"
            )
        self.check_token(value.strip())

    def check_token(self, value: str) -> None:
        if not self.enabled:
            raise Unauthorized(
                "the admin token is turned off (auth.break_glass is false): use a personal token from the UI's "
                "Account page (turnout login), or sign in with single sign-on"
            )
        if not hmac.compare_digest(value.encode(), self.token.encode()):
            raise Unauthorized("admin token is not valid")


def ensure_admin_token(data_dir: Path, from_env: str | None) -> tuple[str, bool]:
    """(token, created_now). Generates and stores one when neither the env nor the file has it."""
    if from_env:
        return from_env, False
    path = data_dir / TOKEN_FILE
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing, False
    token = secrets.token_urlsafe(32)
    write_atomic(path, (token + "\n").encode(), mode=0o600)
    return token, True
