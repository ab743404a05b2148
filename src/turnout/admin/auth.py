"""Admin authentication: one bearer token.

The token is ``TURNOUT_ADMIN_TOKEN`` when set (read by the config loader), else one generated on
first start and stored 0600 as ``admin-token`` in the data dir, printed once.
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

    def check(self, header: str | None) -> None:
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise Unauthorized("admin API needs 'Authorization: Bearer <admin token>'")
        if not hmac.compare_digest(value.strip().encode(), self.token.encode()):
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
