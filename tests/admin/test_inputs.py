"""The admin input models and time parsing, table-driven (no gateway)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from turnout.admin.inputs import (
    MAX_DURATION_S,
    MAX_INT,
    AuditQuery,
    EndpointChange,
    EndpointCreate,
    KeyCreate,
    KeyRotate,
    PlacementToggle,
    UsageQuery,
    parse_input,
    parse_when,
)
from turnout.errors import Unprocessable

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "future", "expected"),
    [
        ("24h", False, NOW - 86_400),
        ("30m", True, NOW + 1800),
        ("1.5d", True, NOW + 129_600),
        ("10s", False, NOW - 10),
        ("3650d", True, NOW + MAX_DURATION_S),
        ("2026-12-31", False, 1_798_675_200.0),
        ("2026-12-31T12:00:00Z", False, 1_798_718_400.0),
        ("2026-12-31T12:00:00+02:00", False, 1_798_711_200.0),
        ("1893456000", True, 1_893_456_000.0),
        (" 1893456000.5 ", True, 1_893_456_000.5),
        (1893456000, True, 1_893_456_000.0),
        (0, False, 0.0),
        (None, False, None),
        ("", False, None),
    ],
)
def test_parse_when_reads(text: Any, future: bool, expected: float | None) -> None:
    assert parse_when(text, NOW, future=future, field="since") == expected


@pytest.mark.parametrize(
    "text",
    [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "1e999",
        "1e3",
        "-1",
        "+5",
        "1_000",
        "²h",  # a digit to str.isdigit(), not to float()
        "\u0661\u0662h",  # Arabic-Indic digits
        "3651d",
        "99999999999d",
        "24 h",
        "h",
        "someday",
        "0001-01-01T00:00:00+01:00",  # before the epoch, and past what datetime can shift
        "1969-12-31",
        "9999-12-31T23:59:59-05:00",  # after year 9999 in UTC
        "2026-13-01",
        "x" * 65,
        "9" * 40,
        "\x00",
        float("nan"),
        float("inf"),
        -1.0,
        1e300,
    ],
)
def test_parse_when_refuses_naming_the_field(text: Any) -> None:
    with pytest.raises(Unprocessable) as caught:
        parse_when(text, NOW, field="expires")
    assert caught.value.status == 422 and caught.value.field == "expires" and '"expires"' in caught.value.message


def bad(model: type[BaseModel], data: dict[str, Any]) -> Unprocessable:
    with pytest.raises(Unprocessable) as caught:
        parse_input(model, data)
    return caught.value


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (KeyCreate, {}, "app"),
        (KeyCreate, {"app": ""}, "app"),
        (KeyCreate, {"app": "   "}, "app"),
        (KeyCreate, {"app": "a\nb"}, "app"),
        (KeyCreate, {"app": "a\u2028b"}, "app"),
        (KeyCreate, {"app": "a" * 129}, "app"),
        (KeyCreate, {"app": 5}, "app"),
        (KeyCreate, {"app": "x", "tenant": "t\x00"}, "tenant"),
        (KeyCreate, {"app": "x", "tenant": ["t"]}, "tenant"),
        (KeyCreate, {"app": "x", "rpm": 0}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": -1}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": MAX_INT + 1}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": 2**63}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": True}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": 1.0}, "rpm"),
        (KeyCreate, {"app": "x", "rpm": "10"}, "rpm"),
        (KeyCreate, {"app": "x", "daily_tokens": 2**31}, "daily_tokens"),
        (KeyCreate, {"app": "x", "daily_tokens": float("nan")}, "daily_tokens"),
        (KeyCreate, {"app": "x", "expires": True}, "expires"),
        (KeyCreate, {"app": "x", "expires": float("inf")}, "expires"),
        (KeyCreate, {"app": "x", "expires": -5}, "expires"),
        (KeyCreate, {"app": "x", "expires": ["30d"]}, "expires"),
        (KeyCreate, {"app": "x", "models": "model:*"}, "models"),
        (KeyCreate, {"app": "x", "models": [5]}, "models[0]"),
        (KeyCreate, {"app": "x", "models": ["ok", "model:"]}, "models[1]"),
        (KeyCreate, {"app": "x", "models": ["a\x00"]}, "models[0]"),
        (KeyCreate, {"app": "x", "models": ["m" * 300]}, "models[0]"),
        (KeyCreate, {"app": "x", "models": ["q*x"]}, "models[0]"),
        (KeyCreate, {"app": "x", "models": ["m"] * 101}, "models"),
        (KeyCreate, {"app": "x", "colour": "red"}, "colour"),
        (KeyRotate, {"grace_s": float("nan")}, "grace_s"),
        (KeyRotate, {"grace_s": float("inf")}, "grace_s"),
        (KeyRotate, {"grace_s": -1}, "grace_s"),
        (KeyRotate, {"grace_s": MAX_DURATION_S + 1}, "grace_s"),
        (KeyRotate, {"grace_s": "60"}, "grace_s"),
        (KeyRotate, {"grace_s": "nan"}, "grace_s"),
        (KeyRotate, {"grace_s": True}, "grace_s"),
        (KeyRotate, {"grace": 60}, "grace"),
        (UsageQuery, {"bucket": "week"}, "bucket"),
        (UsageQuery, {"key": "k\x00"}, "key"),
        (UsageQuery, {"key": "k" * 200}, "key"),
        (UsageQuery, {"since": "x" * 100}, "since"),
        (AuditQuery, {"limit": "0"}, "limit"),
        (AuditQuery, {"limit": "10001"}, "limit"),
        (AuditQuery, {"limit": "9223372036854775808"}, "limit"),
        (AuditQuery, {"limit": "-1"}, "limit"),
        (AuditQuery, {"limit": "1e3"}, "limit"),
        (AuditQuery, {"limit": " 5"}, "limit"),
        (AuditQuery, {"limit": "\uff15"}, "limit"),  # fullwidth digit: int() reads it, the API does not
        (AuditQuery, {"limit": True}, "limit"),
        (AuditQuery, {"action": "a" * 65}, "action"),
        (AuditQuery, {"action": "key.create\r\n"}, "action"),
        (EndpointCreate, {"url": "http://x"}, "name"),
        (EndpointCreate, {"name": "x" * 65, "url": "http://x"}, "name"),
        (EndpointCreate, {"name": "x/y", "url": "http://x"}, "name"),
        (EndpointCreate, {"name": "x"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://user:pw@mac.lan:11434"}, "url"),
        (EndpointCreate, {"name": "x", "url": "https://token@api.example.com"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x:99999"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x:0"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x:port"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://a b"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x/\r\nHost: y"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://"}, "url"),
        (EndpointCreate, {"name": "x", "url": "file:///etc/passwd"}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x/" + "p" * 2048}, "url"),
        (EndpointCreate, {"name": "x", "url": "http://x", "api": "grpc"}, "api"),
        (EndpointCreate, {"name": "x", "url": "http://x", "api": None}, "api"),
        (EndpointCreate, {"name": "x", "url": "http://x", "credential": "a\r\nX-Evil: 1"}, "credential"),
        (EndpointCreate, {"name": "x", "url": "http://x", "credential": "c" * 9000}, "credential"),
        (EndpointCreate, {"name": "x", "url": "http://x", "credential": 5}, "credential"),
        (EndpointCreate, {"name": "x", "url": "http://x", "fallback_model": "m\x00"}, "fallback_model"),
        (EndpointCreate, {"name": "x", "url": "http://x", "fallback_model": "m" * 257}, "fallback_model"),
        (EndpointCreate, {"name": "x", "url": "http://x", "fallback_model": "qwen3:*"}, "fallback_model"),
        (EndpointCreate, {"name": "x", "url": "http://x", "fallback_model": 5}, "fallback_model"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": 0}, "latency_budget_ms"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": 600_001}, "latency_budget_ms"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": 2**63}, "latency_budget_ms"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": 1.5}, "latency_budget_ms"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": "nan"}, "latency_budget_ms"),
        (EndpointCreate, {"name": "x", "url": "http://x", "latency_budget_ms": True}, "latency_budget_ms"),
        (EndpointChange, {"url": None}, "url"),
        (EndpointChange, {"api": None}, "api"),
        (EndpointChange, {"url": ""}, "url"),
        (EndpointChange, {"latency_budget_ms": 10**9}, "latency_budget_ms"),
        (EndpointChange, {"fallback_model": "m\x7f"}, "fallback_model"),
        (EndpointChange, {"name": "y"}, "name"),
        (PlacementToggle, {}, "model"),
        (PlacementToggle, {"model": "gemma4:*"}, "model"),
        (PlacementToggle, {"model": "m\x00"}, "model"),
        (PlacementToggle, {"model": 5}, "model"),
        (PlacementToggle, {"model": "m", "extra": 1}, "extra"),
    ],
)
def test_bad_fields_are_named(model: type[BaseModel], data: dict[str, Any], field: str) -> None:
    err = bad(model, data)
    assert err.status == 422 and err.field == field
    assert f'"{field}"' in err.message, err.message


def test_messages_never_repeat_a_credential() -> None:
    secret = "sk-do-not-echo\x00" + "x" * 9000
    assert "sk-do-not-echo" not in bad(EndpointCreate, {"name": "x", "url": "http://x", "credential": secret}).message


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (KeyCreate, {"app": "web", "tenant": "team-a", "models": ["model:qwen3:*", "llama3.2"], "rpm": MAX_INT}),
        (KeyCreate, {"app": "web", "daily_tokens": 1, "expires": "30d"}),
        (KeyCreate, {"app": "web", "expires": 1_893_456_000}),
        (KeyCreate, {"app": "web", "models": None, "expires": None}),
        (KeyRotate, {"grace_s": 0}),
        (KeyRotate, {"grace_s": 3600.5}),
        (KeyRotate, {"grace_s": MAX_DURATION_S}),
        (UsageQuery, {"since": "7d", "bucket": "day", "key": "tk_abcdefg", "_": "cache-buster"}),
        (AuditQuery, {"limit": "10000", "since": "2026-01-01", "action": "key.create"}),
        (EndpointCreate, {"name": "mac.lan-1", "url": "https://mac:11434/v1", "api": "ollama"}),
        (EndpointCreate, {"name": "x", "url": "http://[::1]:8080", "latency_budget_ms": 600_000, "credential": ""}),
        (EndpointChange, {"fallback_model": "", "credential": None, "latency_budget_ms": None}),
        (PlacementToggle, {"model": "qwen3:8b"}),
    ],
)
def test_good_inputs_pass(model: type[BaseModel], data: dict[str, Any]) -> None:
    parse_input(model, data)


def test_endpoint_change_says_what_to_clear() -> None:
    change = parse_input(EndpointChange, {"fallback_model": "", "credential": "", "latency_budget_ms": None})
    assert change.changes() == {"fallback_model": None, "credential": None, "latency_budget_ms": None}
    assert parse_input(EndpointChange, {"api": "ollama"}).changes() == {"api": "ollama"}
