"""What ``/api/show`` says a model on an OpenAI-style worker can do: Ollama's ``capabilities`` (pure).

Ollama answers ``capabilities`` with the names of ``types/model/capability.go`` (``completion``, ``tools``,
``insert``, ``vision``, ``embedding``, ``thinking``, ``audio``...), derived from the model file and its template
(``server/images.go``, ``Model.Capabilities``); clients decide by them (llm-ollama registers a chat model only for
``completion`` and an embedding model only for ``embedding``, and offers tools, images and thinking by the rest).
An Ollama worker's own answer is relayed as it is. For a model on an OpenAI-style worker the list holds what is
known of it, and nothing that is not:

* ``completion``: the gateway serves the model's chat and completion routes from that worker;
* ``embedding``: the worker answered an embedding of a word for the model (``/v1/embeddings``, a vector back: a
  llama.cpp or llama-cpp-python server started with ``--embedding`` on a model with pooling, vLLM with a pooling
  model, LM Studio with an embedding model);
* from llama.cpp's own server, its ``/props`` (``tools/server/server-context.cpp``, ``get_props``):
  ``modalities.vision`` and ``modalities.audio`` (a multimodal projector is loaded), and the chat template's
  capabilities (``chat_template_caps``, llama.cpp's ``common/jinja/caps``): ``supports_tools`` for ``tools``;
  a template that takes a reasoning effort, a thinking switch or keeps reasoning in the history for ``thinking``;
* from the worker's model listing, where it says so (llama.cpp's ``/v1/models`` entries): the input modalities
  (``architecture.input_modalities``: ``image`` for ``vision``, ``audio`` for ``audio``).

``/props`` says nothing of embeddings (checked against llama.cpp 2026.10 through xllamacpp: the same answer with
and without ``--embedding``), hence the embedding call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["EMBEDDING_PROBE", "capabilities", "embeds"]

# The input of the embedding call that tells whether a model embeds (one word: a token or two on any tokenizer)
EMBEDDING_PROBE = "capabilities"
# chat_template_caps flags that say the template renders or steers a model's reasoning
_THINKING_CAPS = ("supports_reasoning_effort", "supports_enable_thinking", "supports_preserve_reasoning")
# Ollama lists capabilities in this order (server/images.go: completion first, then what the template adds)
_ORDER = ("completion", "embedding", "tools", "thinking", "vision", "audio")


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def embeds(answer: object) -> bool:
    """Whether an ``/v1/embeddings`` answer holds an embedding (a non-empty list of numbers)."""
    data = _obj(answer).get("data")
    first = _obj(data[0]) if isinstance(data, list) and data else {}
    vector = first.get("embedding")
    return (
        isinstance(vector, list)
        and bool(vector)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
    )


def capabilities(entry: Mapping[str, Any], props: Mapping[str, Any] | None, embedding: bool) -> list[str]:
    """The capabilities known of a model on an OpenAI-style worker: its listing ``entry`` (``/v1/models``), the
    worker's llama.cpp ``props`` (None: not a llama.cpp server, or not read) and whether it answered an
    embedding for the model."""
    found = {"completion"}
    if embedding:
        found.add("embedding")
    inputs = _obj(entry.get("architecture")).get("input_modalities")
    if isinstance(inputs, list):
        if "image" in inputs:
            found.add("vision")
        if "audio" in inputs:
            found.add("audio")
    if props is not None:
        modalities = _obj(props.get("modalities"))
        if modalities.get("vision") is True:
            found.add("vision")
        if modalities.get("audio") is True:
            found.add("audio")
        caps = _obj(props.get("chat_template_caps"))
        if caps.get("supports_tools") is True:
            found.add("tools")
        if any(caps.get(flag) is True for flag in _THINKING_CAPS):
            found.add("thinking")
    return [name for name in _ORDER if name in found]
