"""W3C Trace Context (https://www.w3.org/TR/trace-context/) passed on to workers while the gateway's own tracing
is off: a client's ``traceparent`` (and its ``tracestate``) go to the worker as they came, so that an engine that
traces joins the client's trace (vLLM reads them from the request's headers: ``vllm/tracing/utils.py``,
``extract_trace_headers``, and SGLang likewise). With tracing on (``telemetry.otlp_endpoint``), the worker gets
the gateway's own span as its parent instead (:mod:`turnout.gateway.tracing`).

A ``traceparent`` that is not one (the header's grammar, section 3.2: ``version-traceid-parentid-flags`` in lower-case
hex, version ``ff`` and all-zero ids invalid; a later version may add fields after a dash) is not passed on, and
neither is its ``tracestate`` (section 3.3: ignored without a valid ``traceparent``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["TRACEPARENT", "TRACESTATE", "passed_on", "valid_traceparent"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?")
_MAX_STATE = 512  # section 3.3.1.1: a tracestate longer than this may be dropped


def valid_traceparent(value: str) -> bool:
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, more = match.groups()
    if version == "ff" or (version == "00" and more is not None):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


def passed_on(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The trace context headers to send a worker for a client request with ``headers``; None: none to send."""
    parent = headers.get(TRACEPARENT)
    if parent is None or not valid_traceparent(parent):
        return None
    state = headers.get(TRACESTATE)
    if state is None or len(state) > _MAX_STATE:
        return {TRACEPARENT: parent}
    return {TRACEPARENT: parent, TRACESTATE: state}
