"""What the gateway knows of an API dialect: the small interface every dialect module implements.

A client-facing dialect (:class:`ClientAPI`) owns, for its API:

- its routes: the paths it serves and which :class:`Endpoint` each is (the gateway serves them on the shared URL
  and on each external endpoint's own URL);
- its request rules beyond the common ones (where the model is named, whether ``stream`` defaults to true);
- its error shape: the JSON body of an error answer, and the last frame of a stream that failed after it started
  (given what the stream carried so far: the Responses API numbers its events);
- its stream framing (:class:`~turnout.dialects.streams.StreamKind`);
- its translation onto a worker that speaks another dialect (:meth:`ClientAPI.translation`: None when the worker
  takes the client's request as it is);
- what the router reads of a request for prefix-cache-aware routing: the prompt's parts in the order the worker
  will see them (:meth:`ClientAPI.prompt_parts`), and the session the client names, if it names one
  (:meth:`ClientAPI.session_key`).

Everything here is pure (no I/O, no clock, no web framework): the gateway turns these bytes and objects into
answers (:mod:`turnout.responses`, :mod:`turnout.gateway.proxy`).

A :class:`Translation` carries one call from the client's dialect to the worker's and its answer back:
``request`` (the worker's path and body), ``alternate`` (a second form of the request to try when the worker
refuses the first), ``headers`` (what the client's answer says about the translation, such as tools the worker
cannot run), ``answer`` (a whole answer) and ``stream`` (a :class:`StreamTranslation` fed with the worker's
stream events). Each says what the worker counted (:class:`Counts`) for accounting and learned speeds.

Prefix routing (:mod:`turnout.core.prefix`) hashes the prompt in fixed-size blocks and remembers which worker was
sent which chain of blocks, so that a request goes where its prefix is likely still in the engine's KV cache. It
needs two things from a dialect, both cheap and both total (never raising, whatever the body holds; a call the
request rules accepted may still carry odd fields):

- ``prompt_parts(call)``: the prompt as a list of strings, in the order the worker's chat template renders them:
  the system (or developer) instructions first, then the tools' definitions, then every message or input item in
  order, each with its role and everything the template renders of it (text, tool calls and results, a stable
  stand-in for images). Two requests whose rendered prompts share a beginning must give parts that share a
  beginning, and a change anywhere must change the parts from there on; the exact rendering does not matter
  (the parts are joined and hashed, never sent). ``[]`` for calls with no prompt to cache (embeddings).
- ``session_key(call, headers)``: the name the client gives its conversation, when its API has one (OpenAI chat's
  ``prompt_cache_key`` or ``user``, Anthropic's ``metadata.user_id``, the Responses API's ``prompt_cache_key``, a
  header its well-known clients send), else None. The gateway checks the operator's own header
  (``routing.session_header``) before asking, so a dialect never looks for that one. The value is only compared
  with other calls' values: it may be any string (the gateway hashes it and never logs it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = [
    "JSON",
    "NATIVE_APIS",
    "Call",
    "ClientAPI",
    "Counts",
    "Dialect",
    "Endpoint",
    "Route",
    "StreamTranslation",
    "Timing",
    "TokenCounter",
    "Translation",
    "TranslationError",
    "WorkerAPI",
]

JSON = dict[str, Any]


class Dialect(StrEnum):
    """The shape of an answer: a client API's, or the admin API's (errors only)."""

    OPENAI = "openai"
    OLLAMA = "ollama"
    RESPONSES = "responses"  # the OpenAI Responses API (its usage rows and access lines say "openai:responses")
    ANTHROPIC = "anthropic"  # the Anthropic Messages API
    ADMIN = "admin"


# Client APIs a worker may also serve itself (config ``workers[].native_apis``, an endpoint's ``native_apis``): a
# call in such an API goes to that worker unchanged, nothing lost in translation (llama.cpp's llama-server and
# Ollama serve the Anthropic Messages API; vLLM, Ollama and LM Studio the OpenAI Responses API).
NATIVE_APIS = ("anthropic", "responses")


class WorkerAPI(StrEnum):
    """What a worker speaks (a worker's ``type`` in the config)."""

    OLLAMA = "ollama"
    OPENAI = "openai"


class Endpoint(StrEnum):
    CHAT = "chat"  # /v1/chat/completions, /api/chat
    COMPLETIONS = "completions"  # /v1/completions
    EMBEDDINGS = "embeddings"  # /v1/embeddings
    GENERATE = "generate"  # /api/generate
    EMBED = "embed"  # /api/embed
    EMBED_LEGACY = "embeddings_legacy"  # /api/embeddings
    SHOW = "show"  # /api/show
    RESPONSES = "responses"  # /v1/responses
    MESSAGES = "messages"  # /v1/messages (Anthropic)
    COUNT_TOKENS = "count_tokens"  # /v1/messages/count_tokens (Anthropic)

    @property
    def streams(self) -> bool:
        return self in _STREAMING

    @property
    def generates(self) -> bool:
        """Whether a call produces tokens (and so reserves a completion against token limits)."""
        return self not in (Endpoint.SHOW, Endpoint.COUNT_TOKENS)


_STREAMING = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.GENERATE, Endpoint.RESPONSES, Endpoint.MESSAGES})
# The API family a dialect's calls are named by in usage rows and the access log, where it is not the dialect's own
_FAMILY = {Dialect.RESPONSES: "openai"}


class Route(NamedTuple):
    method: str
    path: str  # on the shared URL; the gateway serves it under each endpoint's own URL too
    endpoint: Endpoint


class Call(NamedTuple):
    """What a client request asks for (a named tuple: one is made per request)."""

    dialect: Dialect
    endpoint: Endpoint
    path: str
    body: bytes
    payload: dict[str, Any]
    model: str
    stream: bool
    fallback_from: str | None = None  # "<endpoint>/<model>" when this call is a fallback
    answer_id: str = ""  # the gateway's id for this call's answer (the Responses API names its response so)
    alias: str | None = None  # the alias the client named; ``model`` (and the body's model) is what it stands for
    # The prompt's tokens as the gateway estimates them (:mod:`turnout.gateway.accounting` decides, once per call):
    # what the call is billed, and what a translated answer tells the client, when the worker counts none.
    estimate: int = 0

    @property
    def api_name(self) -> str:
        """The call as usage rows and the access log name it: ``openai:chat``, ``ollama:generate``,
        ``openai:responses``..."""
        return f"{_FAMILY.get(self.dialect, self.dialect.value)}:{self.endpoint.value}"


class TranslationError(ValueError):
    """The request cannot be expressed in the worker's dialect; the message says which field (a 400)."""


@dataclass(frozen=True, slots=True)
class Timing:
    """What the adapter measured, in nanoseconds, plus the ISO timestamp for ``created_at``."""

    created_at: str
    total_ns: int = 0
    first_token_ns: int = 0  # from request start to the first content token (prompt evaluation)


class Counts(NamedTuple):
    """What a translated answer says the worker did: tokens (None: not reported) and the decode time."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0


class StreamTranslation(Protocol):
    @property
    def finish_reason(self) -> object:
        """None until the worker's stream said why the model stopped."""
        ...

    def feed(self, events: list[JSON], created_at: str) -> list[JSON]:
        """The client's frames for the worker's stream events that arrived together (one read of its stream:
        a translator may join what they carry into fewer frames)."""
        ...

    def finish(self, timing: Timing) -> tuple[list[JSON], Counts]:
        """The client's last frames once the worker's stream ended with the model's finish."""
        ...

    def fail(self, err: TurnoutError) -> list[JSON]:
        """The client's last frames when the stream fails after it started (the worker broke, the gateway stops)."""
        ...


class Translation(Protocol):
    """One call carried from the client's dialect to a worker's and back (see the module's docstring)."""

    worker_stream: StreamKind  # how the worker frames its stream
    content_type: str  # of the client's stream

    def request(self, call: Call, model: str) -> tuple[str, JSON]:
        """(the worker's path, the request body) for ``call`` with the worker's name of the model."""
        ...

    def alternate(self, request: JSON) -> JSON | None:
        """Another form of ``request`` to try once when the worker refuses it (None: none)."""
        ...

    def headers(self, call: Call) -> dict[str, str]:
        """Headers of the client's answer that say what the translation left out (empty: nothing)."""
        ...

    def answer(self, call: Call, answer: JSON, timing: Timing) -> tuple[JSON, Counts]:
        """The client's answer for the worker's whole answer. Raises on a worker answer of the wrong shape."""
        ...

    def stream(self, call: Call) -> StreamTranslation: ...

    def frame(self, obj: JSON) -> bytes:
        """One frame of the client's stream."""
        ...


@runtime_checkable
class TokenCounter(Protocol):
    """How a token-counting call (:attr:`Endpoint.COUNT_TOKENS`) is answered by a worker that does not serve the
    client's API itself: with the worker's own tokenizer where it has one, else the gateway's estimate."""

    def tokenize(self, call: Call, model: str) -> list[tuple[str, JSON]]:
        """The tokenizer requests (path, body) to try in turn on the worker (empty: it has none)."""
        ...

    def count(self, answer: JSON) -> int | None:
        """The token count in a tokenizer's answer (None: not one)."""
        ...

    def answer(self, call: Call, tokens: int | None) -> JSON:
        """The client's answer: ``tokens`` from the worker's tokenizer, or None for the gateway's estimate."""
        ...


class ClientAPI(Protocol):
    """A client-facing dialect (see the module's docstring)."""

    dialect: Dialect
    routes: tuple[Route, ...]
    stream_kind: StreamKind

    def stream_default(self, endpoint: Endpoint) -> bool:
        """Whether a request that does not say ``stream`` streams."""
        ...

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        """(the field that names the model, its value) in a request body."""
        ...

    def error_body(self, err: TurnoutError) -> bytes: ...

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        """The last frame of a stream that fails after it started; ``watch``: what the worker's stream carried so far,
        when it is passed through (None: a stream the gateway writes itself)."""
        ...

    def error_in_dialect(self, body: JSON) -> bool:
        """Whether a worker's error body already has this dialect's shape (then it is relayed as it is)."""
        ...

    def translation(
        self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]
    ) -> Translation | TokenCounter | None:
        """How a call reaches a worker that speaks ``worker`` and serves the client APIs in ``native`` itself
        (:data:`NATIVE_APIS`): None when it takes the call as it is; a :class:`TokenCounter` for
        :attr:`Endpoint.COUNT_TOKENS`, a :class:`Translation` for every other endpoint."""
        ...

    def prompt_parts(self, call: Call) -> list[str]:
        """The prompt's parts in the order the worker renders them (system, tools, then each message or input
        item); ``[]`` when the call has no prompt worth caching. Never raises (see the module's docstring)."""
        ...

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        """The client's own name for its session (a body field or a header of this API), or None. Never raises;
        the operator's header (``routing.session_header``) is checked by the gateway before this is asked."""
        ...
