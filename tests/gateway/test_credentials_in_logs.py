"""No credential reaches a log line or the audit log, wherever a client puts it.

`turnout serve` as a user runs it (access log on, debug level: every line it writes), with each kind of
credential the gateway knows: the admin token (a plain text with no shape a pattern could know), an API key, a
browser session's token and an endpoint's stored credential. Each is sent in every place a client might put it:
query parameters by name (every spelling of the name) and by value, percent-encoded either way, path segments,
headers and request bodies, on client, admin and UI routes. Then every line of the log and every audit entry is
read: none may hold any credential in any spelling.
"""

from __future__ import annotations

import http.client
import json
import re
import sqlite3
import urllib.parse
from pathlib import Path

import pytest

from tests.gateway.test_logging import _serving
from turnout.masking import SECRETS, SecretValues, redact, redact_target

ADMIN = "adm1n-Plain-Secret-7391"  # TURNOUT_ADMIN_TOKEN may be any text: nothing but its value can find it
ENDPOINT_CREDENTIAL = "upstream-Cred-5521-value"


def _request(
    port: int, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, target, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def _sign_in(port: int, token: str) -> str:
    """A real browser session's token (the sign-in form, then the POST), as a browser would get it."""
    form = _request(port, "GET", "/admin")
    signin_cookie = form.getheader("Set-Cookie", "").split(";", 1)[0]
    csrf = signin_cookie.split("=", 1)[1]
    answer = _request(
        port,
        "POST",
        "/admin/signin",
        headers={"Cookie": signin_cookie, "Content-Type": "application/x-www-form-urlencoded"},
        body=urllib.parse.urlencode({"csrf_token": csrf, "token": token, "next": "/admin/overview"}).encode(),
    )
    assert answer.status == 303, answer.status
    cookies = [v for k, v in answer.getheaders() if k.lower() == "set-cookie" and v.startswith("turnout_session=")]
    return cookies[0].split(";", 1)[0].split("=", 1)[1]


def _every_spelling(secret: str) -> list[str]:
    upper = "".join(f"%{b:02X}" for b in secret.encode())
    return [secret, urllib.parse.quote(secret, safe=""), upper, upper.lower(), urllib.parse.quote_plus(secret)]


def _places(secret: str) -> list[tuple[str, str, dict[str, str], bytes | None]]:
    """(method, target, headers, body): every place a client might put ``secret``."""
    names = [
        *("admin_token", "token", "key", "api_key", "api-key", "apikey", "access_token", "session", "sessionid"),
        *("password", "secret", "client_secret", "auth", "X-Amz-Signature", "sig", "Token", "ADMIN_TOKEN"),
        *("admin%5Ftoken", "%74oken", "admin%5ftoken", "q", "next", "model", "x"),
    ]
    places: list[tuple[str, str, dict[str, str], bytes | None]] = []
    for path in ("/admin/api/keys", "/admin", "/v1/models", "/api/tags", "/admin/overview", "/metrics", "/nowhere"):
        for name in names:
            for spelled in _every_spelling(secret):
                places.append(("GET", f"{path}?{name}={spelled}", {}, None))
        places.append(("GET", f"{path}?a=1&{names[0]}={secret}&b=2;token={secret}", {}, None))
    quoted = urllib.parse.quote(secret, safe="")
    for target in (f"/admin/api/keys/{quoted}", f"/v1/{quoted}", f"/endpoints/{quoted}/v1/models", f"/{quoted}"):
        places.append(("GET", target, {}, None))
    for header in ("Authorization", "X-Api-Key", "X-Admin-Token", "X-Custom", "User-Agent", "Referer"):
        places.append(("GET", "/admin/api/keys", {header: secret}, None))
        places.append(("GET", "/v1/models", {header: f"Bearer {secret}"}, None))
    places.append(("GET", "/admin/api/keys", {"Cookie": f"turnout_session={secret}"}, None))
    places.append(("GET", "/admin/overview", {"Cookie": f"turnout_session={secret}; other={secret}"}, None))
    for target, body in (
        ("/v1/chat/completions", {"model": secret, "messages": [{"role": "user", "content": secret}]}),
        ("/api/chat", {"model": secret, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/embeddings", {"model": f"x/{secret}", "input": secret}),
        ("/admin/api/keys", {"app": secret, "models": [secret]}),
        ("/admin/api/placement/w/rules", {"pattern": secret, "verdict": "allow"}),
    ):
        places.append(("POST", target, {"Content-Type": "application/json"}, json.dumps(body).encode()))
    places.append(
        ("POST", "/admin/signin", {"Content-Type": "application/x-www-form-urlencoded"}, f"token={secret}".encode())
    )
    return places


def test_no_credential_reaches_a_log_line_or_the_audit_log(tmp_path: Path) -> None:
    env = {"TURNOUT_ADMIN_TOKEN": ADMIN, "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}
    with _serving(tmp_path, "--access-log", "--log-level", "debug", env=env) as gateway:
        admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
        registered = _request(
            gateway.port,
            "POST",
            "/admin/api/endpoints",
            headers=admin,
            body=json.dumps(
                {"name": "mac", "url": "http://127.0.0.1:9/v1", "api": "openai", "credential": ENDPOINT_CREDENTIAL}
            ).encode(),
        )
        assert registered.status == 201, registered.status
        session = _sign_in(gateway.port, ADMIN)
        assert session.startswith("tses_")
        credentials = {"admin token": ADMIN, "key": gateway.key, "session": session, "endpoint": ENDPOINT_CREDENTIAL}
        sent = 0
        for secret in credentials.values():
            for method, target, headers, body in _places(secret):
                _request(gateway.port, method, target, headers=headers, body=body)
                sent += 1
            # the same with a real admin token beside it: authorised requests log too (audit, errors)
            for method, target, headers, body in _places(secret)[-6:]:
                _request(gateway.port, method, target, headers={**headers, **admin}, body=body)
        gateway.stop()
        log = gateway.text()
    assert log.count('"GET /admin/api/keys?') >= len(credentials) * 20, "the access log did not write the requests"
    decoded = urllib.parse.unquote_plus(log)
    for what, secret in credentials.items():
        for text, how in ((log, "as sent"), (decoded, "percent-decoded")):
            assert secret not in text, f"the {what} reached the log ({how}):\n" + "\n".join(
                line for line in text.splitlines() if secret in line
            )
    # every audit entry, every column
    database = next(tmp_path.rglob("turnout.db"))
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT * FROM audit").fetchall()
    assert rows, "nothing was audited"
    audit = urllib.parse.unquote_plus(json.dumps(rows))
    for what, secret in credentials.items():
        assert secret not in audit, f"the {what} reached the audit log"
    assert sent > 500


def test_known_values_are_masked_in_every_spelling() -> None:
    values = SecretValues()
    values.add("s3cret value/ä")
    spelled = [
        "s3cret value/ä",
        "s3cret+value%2F%C3%A4",
        "%73%33%63%72%65%74%20%76%61%6c%75%65%2f%c3%a4",
        "s3cret%20value/%C3%a4",
    ]
    for text in spelled:
        assert values.sub(f"x={text}&y=1") == "x=[redacted]&y=1", text
    values.discard("s3cret value/ä")
    assert values.sub("s3cret value/ä") == "s3cret value/ä"
    values.add("abc")  # too short to be a secret worth masking everywhere
    assert values.sub("abcdef") == "abcdef"


def test_counted_values_stay_until_the_last_owner_lets_go() -> None:
    values = SecretValues()
    values.add("token-one-1")
    values.add("token-one-1")
    values.discard("token-one-1")
    assert values.sub("token-one-1") == "[redacted]"
    values.discard("token-one-1")
    assert values.sub("token-one-1") == "token-one-1"
    values.keep("kept-for-good")
    values.discard("kept-for-good")
    assert "kept-for-good" in values


@pytest.mark.parametrize(
    "text",
    [
        "cannot connect to postgresql://turnout:s3cr3t-pw@db.internal:5432/turnout",
        "redis://:s3cr3t-pw@127.0.0.1:6379/0 refused",
        "dialing HTTPS://admin:s3cr3t-pw@mac.lan/v1",
    ],
)
def test_a_password_in_a_url_is_masked(text: str) -> None:
    masked = redact(text)
    assert "s3cr3t-pw" not in masked and "[redacted]@" in masked, masked


def test_query_parameters_named_for_a_credential_are_masked_in_any_spelling() -> None:
    for name in ("admin_token", "admin%5Ftoken", "%74%6F%6B%65%6E", "X-Amz-Signature", "sessionid", "Client_Secret"):
        masked = redact_target(f"/admin?{name}=opaque-value-1&model=llama3")
        assert "opaque-value-1" not in masked and masked.endswith("&model=llama3"), masked
    assert redact_target("/v1/models?model=llama3&stream=true") == "/v1/models?model=llama3&stream=true"
    assert re.search(r"tses_\[redacted\]", redact("cookie was tses_AbCdEfGhIjKlMnOp"))
    assert "value" in SECRETS.sub("value")  # the process's registry masks nothing that was not registered
