"""An endpoint's own URL: the one mapping between its own model names and the shared ones, and its paths."""

from __future__ import annotations

import pytest

from turnout.core.endpoint_urls import api_path, base_urls, own_name, shared_name


@pytest.mark.parametrize(
    ("endpoint", "model", "shared"),
    [
        (None, "qwen2.5:7b", "qwen2.5:7b"),  # the shared URL: as sent
        (None, "mac/qwen2.5:7b", "mac/qwen2.5:7b"),
        ("mac", "qwen2.5:7b", "mac/qwen2.5:7b"),
        ("mac", "meta-llama/Llama-3.1-8B", "mac/meta-llama/Llama-3.1-8B"),  # a slash of the model's own
        ("mac", "mac/x", "mac/mac/x"),  # never "already namespaced": names there are the endpoint's own
    ],
)
def test_shared_name(endpoint: str | None, model: str, shared: str) -> None:
    assert shared_name(endpoint, model) == shared
    if endpoint is not None:
        assert own_name(endpoint, shared) == model  # and back


@pytest.mark.parametrize(
    ("endpoint", "shared", "own"),
    [
        ("mac", "qwen3:8b", None),  # a fleet model
        ("mac", "macbook/qwen3:8b", None),  # another endpoint whose name starts alike
        ("mac", "mac/", None),
        ("mac", "mac/qwen3:8b", "qwen3:8b"),
    ],
)
def test_own_name(endpoint: str, shared: str, own: str | None) -> None:
    assert own_name(endpoint, shared) == own


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/api/tags", "/api/tags"),
        ("/endpoints/mac/v1/chat/completions", "/v1/chat/completions"),
        ("/endpoints/mac/api/chat", "/api/chat"),
        ("/endpoints/mac/", "/"),
        ("/endpoints/mac", "/"),
        ("/admin/api/endpoints/mac", "/admin/api/endpoints/mac"),
    ],
)
def test_api_path(path: str, api: str) -> None:
    assert api_path(path) == api


def test_base_urls() -> None:
    assert base_urls("http://gw:8080/", "mac") == {
        "openai": "http://gw:8080/endpoints/mac/v1",
        "ollama": "http://gw:8080/endpoints/mac",
        "shared_openai": "http://gw:8080/v1",
        "shared_ollama": "http://gw:8080",
    }
