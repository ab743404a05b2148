"""Masking credentials in text that is about to be written down: log lines, access lines, audit entries.

Pure string work (standard library only), so that the store can mask an audit entry without importing the
HTTP stack. :func:`redact` masks API keys (``tk_...``), admin UI session tokens (``tses_...``), personal admin
tokens (``tpat_...``), bearer and
basic credentials, credential-like headers and query parameters, and every value in :data:`SECRETS`.

Some credentials have no shape to recognise: the admin token (any text ``TURNOUT_ADMIN_TOKEN`` holds), a
worker's ``api_key``, an endpoint's credential. Their values are registered in :data:`SECRETS` where they
enter the process (:func:`turnout.wiring.create_app`, :class:`turnout.store.secrets.SecretBox`,
:meth:`turnout.fleet.endpoints.EndpointManager.test_unsaved`), and :func:`redact` masks each of them wherever it
appears, percent-encoded spellings included. It is a module registry, the one mutable global of the package,
because logging itself is process-wide: every handler's filter, the access log and the audit log must see the
same values.

Used by :mod:`turnout.redaction` (the log handlers), :mod:`turnout.gateway.access` and
:mod:`turnout.store.audit`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["REDACTED", "SECRETS", "SecretValues", "redact", "redact_target"]

REDACTED = "[redacted]"
_SECRET_HEADERS = r"authorization|proxy-authorization|x-api-key|api-key|x-auth-token|x-admin-token|cookie|set-cookie"
# A query parameter whose name holds one of these words (admin_token, X-Amz-Signature, sessionid, client_secret).
_SECRET_WORDS = r"key|token|auth|passw|pwd|secret|session|credential|signature|sig"
_SECRET_PARAMS = rf"[A-Za-z0-9_.\[\]-]*(?:{_SECRET_WORDS})[A-Za-z0-9_.\[\]-]*"
_PATTERNS = (
    # a key is tk_ + 43 characters; its display prefix (tk_ + 7, as `turnout key list` shows it) stays readable
    (re.compile(r"tk_[A-Za-z0-9_-]{8,}"), f"tk_{REDACTED}"),
    # an admin UI session's cookie token (turnout.admin.ui.sessions)
    (re.compile(r"tses_[A-Za-z0-9_-]{8,}"), f"tses_{REDACTED}"),
    # a personal admin token (turnout.store.people); its display prefix (tpat_ + 7) stays readable
    (re.compile(r"tpat_[A-Za-z0-9_-]{8,}"), f"tpat_{REDACTED}"),
    (re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)[^\s'\",;&]+"), rf"\1\2{REDACTED}"),
    # a URL's user:password@ (a database URL in an error, a URL pasted with its credential)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@'\"]*:[^/\s@'\"]+@"), rf"\1{REDACTED}@"),
    (re.compile(rf"(?i)\b({_SECRET_HEADERS})(\s*[:=]\s*)[^\r\n'\"]*"), rf"\1\2{REDACTED}"),
    (re.compile(rf"(?i)([?&;]({_SECRET_PARAMS})=)[^&;\s#'\"]*"), rf"\1{REDACTED}"),
)
# Every pattern above needs one of these words (case-insensitive) to match: text without any is returned as it
# is, without running the patterns (most log lines and request paths; the patterns cost tens of µs a line).
_HINTS = (
    *("tk_", "tses_", "tpat_", "bearer", "basic", "auth", "key", "token", "cookie"),
    *("passw", "pwd", "secret", "session", "credential", "sig", "://"),
)


class SecretValues:
    """Credentials known by value, masked by :func:`redact` wherever they appear: as they are, and in any
    percent-encoded spelling (``%41`` or ``%61`` for ``A``... each character either way, ``+`` for a space).

    :meth:`add` counts: a value added twice (two apps in one process, a test's gateways) stays until discarded
    twice. :meth:`keep` is for values met while serving (a decrypted endpoint credential): kept for good,
    however often they are met. Values shorter than :attr:`MIN_LENGTH` are not kept: masking every ``abc``
    in every log line would hide more than it protects, and such a value is no secret anyway."""

    MIN_LENGTH = 6

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._kept: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.version = 0  # changes with the set: a cache of redacted text made before it is stale

    def add(self, value: str | None) -> None:
        if value is None or len(value) < self.MIN_LENGTH:
            return
        self._counts[value] = self._counts.get(value, 0) + 1
        if self._counts[value] == 1:
            self._changed()

    def keep(self, value: str | None) -> None:
        if value is None or len(value) < self.MIN_LENGTH or value in self._kept:
            return
        self._kept.add(value)
        self._changed()

    def discard(self, value: str | None) -> None:
        if value is None or value not in self._counts:
            return
        self._counts[value] -= 1
        if not self._counts[value]:
            del self._counts[value]
            self._changed()

    def __contains__(self, value: object) -> bool:
        return value in self._counts or value in self._kept

    def sub(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(REDACTED, text)

    def _changed(self) -> None:
        self.version += 1
        values = sorted(
            self._counts.keys() | self._kept, key=len, reverse=True
        )  # the longest first: one value may hold another
        self._pattern = re.compile("|".join(_spelled(v) for v in values)) if values else None


def _spelled(value: str) -> str:
    """A pattern for ``value`` and every percent-encoded spelling of it (hex digits in either case)."""
    parts = []
    for ch in value:
        encoded = "".join(
            "%" + "".join(f"[{d}{d.lower()}]" if d.isalpha() else d for d in f"{byte:02X}") for byte in ch.encode()
        )
        plain = r"(?:\ |\+)" if ch == " " else re.escape(ch)
        parts.append(f"(?:{plain}|{encoded})")
    return "".join(parts)


_SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE)


def redact_target(target: str) -> str:
    """A request target (``/path?query``) as a log may show it: :func:`redact`, and then every query
    parameter whose name, percent-decoded, holds a credential word has its value masked (``admin%5Ftoken``,
    ``%74oken`` and ``Token`` alike)."""
    path, mark, query = redact(target).partition("?")
    if not mark:
        return path
    pairs = []
    for pair in re.split(r"([&;])", query):
        name, equals, _value = pair.partition("=")
        if equals and _SECRET_NAME.search(unquote_plus(name)) and _value != REDACTED:
            pair = f"{name}={REDACTED}"
        pairs.append(pair)
    return f"{path}?{''.join(pairs)}"


# The process's credentials known by value (see the module's docstring).
SECRETS = SecretValues()


# A run of URL characters with at least one percent-escape: a value a client may have encoded to hide its shape.
_ENCODED = re.compile(r"[A-Za-z0-9%._~+\-]*%[0-9A-Fa-f]{2}[A-Za-z0-9%._~+\-]*")


def redact(text: str) -> str:
    """``text`` with known credentials (:data:`SECRETS`), API keys, session tokens, bearer tokens and
    credential-like header and query values masked, also where they are percent-encoded (``tk%5F...``)."""
    text = _by_shape(SECRETS.sub(text))
    if "%" in text:
        text = _ENCODED.sub(_encoded, text)
    return text


def _by_shape(text: str) -> str:
    low = text.lower()
    if not any(hint in low for hint in _HINTS):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _encoded(match: re.Match[str]) -> str:
    """A percent-encoded run, masked whole when what it decodes to would be masked."""
    raw = match.group(0)
    decoded = unquote_plus(raw)
    return REDACTED if _by_shape(decoded) != decoded else raw
