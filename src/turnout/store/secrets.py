"""Encrypting stored credentials (Fernet). The key comes from TURNOUT_SECRET_KEY or a 0600 key file."""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from turnout.atomic import write_atomic
from turnout.masking import SECRETS

__all__ = ["SECRET_KEY_FILE", "SecretBox", "SecretError"]

SECRET_KEY_FILE = "secret.key"


class SecretError(Exception):
    """A stored secret cannot be decrypted (the secret key changed) or the key is malformed."""


class SecretBox:
    def __init__(self, key: bytes) -> None:
        try:
            self._fernet = Fernet(key)
        except ValueError:
            raise SecretError("TURNOUT_SECRET_KEY must be a Fernet key (32 url-safe base64-encoded bytes)") from None

    @classmethod
    def load(cls, data_dir: Path, from_env: str | None) -> SecretBox:
        if from_env:
            return cls(from_env.encode())
        path = data_dir / SECRET_KEY_FILE
        try:
            return cls(path.read_bytes().strip())
        except FileNotFoundError:
            key = Fernet.generate_key()
            write_atomic(path, key + b"\n", mode=0o600)
            return cls(key)

    # Every credential that passes through the box is masked in logs and audit entries from then on.
    def encrypt(self, plaintext: str) -> str:
        SECRETS.keep(plaintext)
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            plaintext = self._fernet.decrypt(token.encode()).decode()
            SECRETS.keep(plaintext)
            return plaintext
        except InvalidToken:
            raise SecretError("a stored credential cannot be decrypted: was TURNOUT_SECRET_KEY changed?") from None
