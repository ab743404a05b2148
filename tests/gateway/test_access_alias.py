"""The access line of a request that named a model alias: the model served, then the name asked for."""

from __future__ import annotations

from tests.gateway.test_access_line import _access_log, _Key, _line, _row


def test_the_line_names_the_model_served_and_the_alias_asked_for() -> None:
    log, capture = _access_log()
    key = _Key("tk_AAAAAAA", "claude-code")
    line = _line(log, capture, "/v1/chat/completions", key, _row("qwen3-coder:30b")._replace(alias="claude-sonnet-4-5"))
    assert line == (
        '- "POST /v1/chat/completions HTTP/1.1" 200 0 0.250s key=tk_AAAAAAA app=claude-code api=openai:chat '
        "model=qwen3-coder:30b worker=w1 tokens=5+4 alias=claude-sonnet-4-5"
    )
    record = capture.records[-1]
    assert (record.model, record.alias) == ("qwen3-coder:30b", "claude-sonnet-4-5")  # type: ignore[attr-defined]
    odd = _line(log, capture, "/api/chat", key, _row("m")._replace(alias="my alias tk_secret1234567890"))
    assert 'alias="my alias tk_[redacted]"' in odd and "secret" not in odd  # quoted; a key is never written
    plain = _line(log, capture, "/v1/chat/completions", key, _row("qwen3-coder:30b"))
    assert "alias=" not in plain and not hasattr(capture.records[-1], "alias")
