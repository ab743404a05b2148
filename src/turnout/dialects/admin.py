"""The admin API's error shape: OpenAI's error object, with the bad field of a 422 (the UI shows the message next
to it). Not a client API: it serves no proxied route and translates nothing."""

from __future__ import annotations

from collections.abc import Mapping

from turnout.dialects import openai
from turnout.dialects.base import JSON, Call, Dialect, Endpoint, Route, Translation, WorkerAPI
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = ["API", "AdminShape"]


class AdminShape:
    dialect: Dialect = Dialect.ADMIN
    stream_kind: StreamKind = StreamKind.SSE
    routes: tuple[Route, ...] = ()

    def stream_default(self, endpoint: Endpoint) -> bool:
        return False

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        return "model", payload.get("model")

    def error_body(self, err: TurnoutError) -> bytes:
        return openai.error_body(err, field=True)

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        return b"data: " + self.error_body(err) + b"\n\n"

    def error_in_dialect(self, body: JSON) -> bool:
        return openai.API.error_in_dialect(body)

    def translation(self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]) -> Translation | None:
        return None

    def prompt_parts(self, call: Call) -> list[str]:
        return []

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        return None


API = AdminShape()
