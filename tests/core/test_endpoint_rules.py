"""Endpoint registration rules: a pasted URL's API suffix, and names taken by configured workers."""

from __future__ import annotations

import pytest

from turnout.core.endpoint_rules import base_url, name_clash, url_note


@pytest.mark.parametrize(
    ("given", "url", "dropped"),
    [
        ("http://host:1234", "http://host:1234", ""),
        ("http://host:1234/", "http://host:1234", "/"),
        ("http://host:1234//", "http://host:1234", "//"),
        ("http://host:1234/v1", "http://host:1234", "/v1"),  # LM Studio's "server address"
        ("http://host:1234/v1/", "http://host:1234", "/v1/"),
        ("http://host:1234/V1", "http://host:1234", "/V1"),
        ("http://mac.lan:11434/api", "http://mac.lan:11434", "/api"),  # Ollama's API root
        ("http://mac.lan:11434/api/", "http://mac.lan:11434", "/api/"),
        ("https://api.groq.com/openai/v1", "https://api.groq.com/openai", "/v1"),
        ("https://openrouter.ai/api/v1", "https://openrouter.ai/api", "/v1"),  # one segment only
        ("http://h/proxy/llm", "http://h/proxy/llm", ""),
        ("http://h/v10", "http://h/v10", ""),
        ("http://h/myapi", "http://h/myapi", ""),
        ("http://[::1]:8080/v1", "http://[::1]:8080", "/v1"),
        ("http://h/v1?x=1", "http://h/v1?x=1", ""),  # a query is left for the validator to judge
        ("not a url", "not a url", ""),
    ],
)
def test_base_url(given: str, url: str, dropped: str) -> None:
    found = base_url(given)
    assert (found.url, found.dropped) == (url, dropped)


def test_url_note_says_what_was_dropped() -> None:
    assert url_note("http://host:1234/v1") == "using http://host:1234 (dropped /v1)"
    assert url_note("http://host:1234") is None


def test_name_clash() -> None:
    assert name_clash("a", {"a", "b"}) is not None and "configured worker" in (name_clash("a", ["a"]) or "")
    assert name_clash("mac", {"a"}) is None
