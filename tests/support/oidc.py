"""A real OpenID Provider for the single sign-on tests: npm ``oidc-provider`` (certified), run by node on a loopback
port with the test's own users and groups (``tests/support/oidc_provider.mjs``). ``scripts/test`` installs it
(``scripts/oidc-provider``, cached) and exports ``TURNOUT_OIDC_PROVIDER``; without it the script is run here.

Its login page is the package's development login (any password; the login must be one of ``users``), followed
by its consent page. Signing keys are the test's (``keys``), so a test can rotate them by restarting it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joserfc.jwk import KeySet

__all__ = ["CLIENT_ID", "CLIENT_SECRET", "USERS", "Provider", "oidc_provider", "provider_modules"]

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "turnout-test"
CLIENT_SECRET = "turnout-test-client-secret"
# Each person's groups; the gateway's auth.oidc.roles map the groups to roles.
USERS: dict[str, dict[str, Any]] = {
    "vera": {"email": "vera@example.com", "email_verified": True, "name": "Vera Viewer", "groups": ["watchers"]},
    "otto": {"email": "otto@example.com", "email_verified": True, "name": "Otto Operator", "groups": ["ops"]},
    "ada": {"email": "ada@example.com", "email_verified": True, "name": "Ada Admin", "groups": ["ops", "platform"]},
    "tom": {"email": "tom@example.com", "email_verified": True, "name": "Tom Team", "groups": ["team-a"]},
    "nina": {"email": "nina@example.com", "email_verified": True, "name": "Nina Nobody", "groups": ["visitors"]},
    "gus": {"email": "gus@example.com", "email_verified": True, "name": "Gus Groupstring", "groups": "ops"},
}
ROLES = {"watchers": "viewer", "ops": "operator", "platform": "admin", "team-a": "team-admin:a"}


def provider_modules() -> str:
    found = os.environ.get("TURNOUT_OIDC_PROVIDER")
    if found:
        return found
    out = subprocess.run([str(ROOT / "scripts" / "oidc-provider")], check=True, capture_output=True, text=True)
    return out.stdout.strip()


@dataclass
class Provider:
    issuer: str
    process: subprocess.Popen[bytes]
    keys: KeySet


@contextmanager
def oidc_provider(port: int, redirect_uris: list[str], *, keys: KeySet | None = None) -> Iterator[Provider]:
    """The provider at ``http://127.0.0.1:<port>``, its client ``CLIENT_ID`` allowed to come back to
    ``redirect_uris``; stopped when the block ends."""
    issuer = f"http://127.0.0.1:{port}"
    keys = keys or KeySet.generate_key_set("RSA", 2048, count=1)
    config = {
        "issuer": issuer,
        "port": port,
        "clients": [
            {
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uris": redirect_uris,
                "response_types": ["code"],
                "grant_types": ["authorization_code"],
                "token_endpoint_auth_method": "client_secret_basic",
            },
            {
                "client_id": "someone-else",
                "client_secret": "someone-else-secret",
                "redirect_uris": redirect_uris,
                "response_types": ["code"],
                "grant_types": ["authorization_code"],
            },
        ],
        "users": USERS,
        "jwks": keys.as_dict(private=True),
    }
    with tempfile.TemporaryDirectory(prefix="oidc-provider-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        log = (Path(tmp) / "log").open("wb")
        process = subprocess.Popen(
            ["node", str(ROOT / "tests" / "support" / "oidc_provider.mjs"), str(path)],
            env={**os.environ, "OIDC_PROVIDER_DIR": provider_modules()},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"{issuer}/.well-known/openid-configuration", timeout=1):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"oidc-provider did not start: {(Path(tmp) / 'log').read_text()[-2000:]}"
                        ) from None
                    time.sleep(0.1)
            yield Provider(issuer, process, keys)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
