"""How `turnout endpoint ...` and `turnout key ...` reach the running gateway's admin API.

The gateway is looked for at the config's ``listen`` address (``0.0.0.0`` / ``::`` are reached on loopback),
with ``TURNOUT_ADMIN_TOKEN``, else the personal admin token `turnout login` stored in the user's config dir
(:func:`user_token_path`), else the admin token the gateway itself reads, the data dir's ``admin-token`` file
(never created here). When it answers, the command is the admin API call, so it acts on the gateway's
live state and under the gateway's own settings (an endpoint test dials through the gateway's network
policy, not this shell's). When nothing listens there, or what answers cannot be this config's gateway (no
gateway on this machine holds the config's data dir, or no admin token is known here), :func:`connect` returns
None after one line on stderr saying so, and the command works on the store directly (a gateway on that
store reads it).

Only a refused connection falls back: once a request may have reached the gateway, a failure is reported,
never retried on the store (a registration must not be made twice). Kept to the standard library so a
command that talks to a gateway does not import the database stack.
"""

from __future__ import annotations

import getpass
import http.client
import json
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from turnout.config import Settings

__all__ = ["AdminClient", "GatewayError", "connect", "gateway_address", "gateway_origin", "user_token_path"]

TOKEN_FILE = "admin-token"  # turnout.admin.auth.TOKEN_FILE (not imported: that pulls in the web stack)
ACTOR_HEADER = "X-Turnout-Actor"  # turnout.admin.ui.security.ACTOR_HEADER
CONNECT_TIMEOUT_S = 2.0


class GatewayError(Exception):
    """The admin API answered with an error (``status``, its ``code`` and message, and the bad ``field``)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def gateway_address(settings: Settings) -> tuple[str, int]:
    """Where a gateway serving ``settings`` listens, as a client on this machine dials it: where the gateway holding
    its data dir recorded it listens (``turnout serve --host/--port`` may differ from the config), else ``listen``."""
    from turnout.state.running import recorded_address

    recorded = recorded_address(settings.data_dir)
    host, port = recorded if recorded is not None else (settings.listen.host, settings.listen.port)
    return _dialled(host), port


def _dialled(host: str) -> str:
    """A listening host as a client on this machine dials it (any address: the loopback one)."""
    host = host.strip("[]")
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def gateway_origin(settings: Settings) -> str:
    """``http://host:port`` of :func:`gateway_address` (the origin of the URLs clients on this machine use)."""
    return _url(*gateway_address(settings))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


@dataclass(frozen=True, slots=True)
class AdminClient:
    host: str
    port: int
    token: str
    timeout_s: float

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """The JSON answer of one admin API call; GatewayError for an error answer; a one-line exit (2) when
        the gateway went away or answered something that is not the admin API."""
        given = {k: v for k, v in (query or {}).items() if v is not None}
        target = path + ("?" + urllib.parse.urlencode(given) if given else "")
        headers = {"Authorization": f"Bearer {self.token}", ACTOR_HEADER: _actor(), "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s or self.timeout_s)
        try:
            conn.request(method, target, body=payload, headers=headers)
            resp = conn.getresponse()
            status, data = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            _exit(f"the gateway at {self.url} did not complete {method} {path}: {exc}; see its log, then retry")
            raise  # unreachable
        finally:
            conn.close()
        try:
            answer = json.loads(data or b"null")
        except ValueError:
            _exit(f"{self.url} answered {method} {path} with HTTP {status} and no JSON: is a Turnout gateway there?")
            raise  # unreachable
        if status >= 400:
            error = answer.get("error") if isinstance(answer, dict) else None
            if not isinstance(error, dict):
                _exit(f"{self.url} answered {method} {path} with HTTP {status}: is a Turnout gateway there?")
                raise  # unreachable
            if status == 401:
                _exit(
                    f"the gateway at {self.url} refused the token ({error.get('message')}): run `turnout login` "
                    "with a personal token from the admin UI's Account page, or set TURNOUT_ADMIN_TOKEN"
                )
            if status == 403 and error.get("code") == "forbidden_role":
                _exit(f"not allowed: {error.get('message')}")
            raise GatewayError(status, str(error.get("code")), str(error.get("message")), error.get("field"))
        return answer


def _exit(message: str) -> None:
    typer.echo(f"turnout: {message}", err=True)
    raise typer.Exit(2)


def user_token_path() -> Path:
    """Where `turnout login` keeps a personal admin token: ``$XDG_CONFIG_HOME/turnout/admin-token``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "turnout" / "admin-token"


def _token(settings: Settings) -> tuple[str | None, str]:
    """The token to call the admin API with and where it came from: the environment, the user's `turnout login`
    token, the data dir's admin token."""
    if settings.admin_token:
        return settings.admin_token, "TURNOUT_ADMIN_TOKEN"
    personal = user_token_path()
    try:
        stored = personal.read_text(encoding="utf-8").strip()
    except OSError:
        stored = ""
    if stored:
        return stored, str(personal)
    path = settings.data_dir / TOKEN_FILE
    try:
        return path.read_text(encoding="utf-8").strip() or None, str(path)
    except OSError:
        return None, str(path)


def _listening(host: str, port: int) -> OSError | None:
    """None when something accepts connections at host:port, else the error of the attempt."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return exc
    return None


def connect(settings: Settings, *, timeout_s: float = 30.0, fallback: str | None = None) -> AdminClient | None:
    """A client of the gateway serving ``settings``, or None (after saying so on stderr, with what the command does
    instead: ``fallback``, by default working on the store) when none answers, or when the one answering cannot be
    this config's: on this machine, while no gateway holds the data dir (another config's gateway on the same port),
    or with no admin token known here."""
    host, port = gateway_address(settings)
    where = fallback or f"working on the store in {settings.data_dir} directly"
    problem = _listening(host, port)
    if problem is not None:
        reason = problem.strerror or type(problem).__name__
        if isinstance(problem, TimeoutError | socket.timeout):
            reason = f"no answer in {CONNECT_TIMEOUT_S:g} s"
        held = _held(settings.data_dir)
        note = " (a gateway holds this data dir at another address; it reads the change within seconds)" if held else ""
        _say(f"no gateway at {_url(host, port)} ({reason.lower()}); {where}{note}")
        return None
    if _loopback(host) and _held(settings.data_dir) is False:
        _say(f"the gateway at {_url(host, port)} does not serve {settings.data_dir}; {where}")
        return None
    token, source = _token(settings)
    if not token:
        _say(
            f"a gateway answers at {_url(host, port)} but no admin token is known here ({source} is missing; "
            f"set TURNOUT_ADMIN_TOKEN to the token it was started with); {where}"
        )
        return None
    return AdminClient(host, port, token, timeout_s)


def _say(message: str) -> None:
    typer.echo(f"turnout: {message}", err=True)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _held(data_dir: Path) -> bool | None:
    """Whether a gateway on this machine holds ``data_dir`` (``gateway.lock``); None when that cannot be told."""
    from turnout.state.running import gateway_running

    try:
        return gateway_running(data_dir)
    except OSError:  # the lock file belongs to another user, say
        return None
