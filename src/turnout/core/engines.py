"""What an OpenAI-style engine says of itself: which engine it is, how many requests it runs at once, its queue.

Read from answers the poller already has or fetches where the engine is known to serve them:

- the family, from its model listing's ``owned_by`` (``GET /v1/models``): ``llamacpp`` for llama.cpp's server
  (``tools/server/server-context.cpp``, its models route), ``vllm`` (vLLM's ``ModelCard``), ``sglang``
  (SGLang's ``ModelCard``). Other servers (llama-cpp-python says ``me``, LM Studio its organisation, Ollama's
  ``/v1`` ``library``) are not named: what they run at once is learned (:mod:`turnout.core.parallelism`);
- llama.cpp's ``GET /props``: ``total_slots`` (its ``--parallel``);
- the queue gauges of ``GET /metrics``: vLLM's ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``,
  SGLang's ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``, llama.cpp's ``llamacpp:requests_processing`` /
  ``llamacpp:requests_deferred`` (summed over their model labels).

Pure: the poller hands the decoded bodies and the parsed samples in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from turnout.core.parallelism import Parallelism, Source, engine_capacity

__all__ = ["BATCHING", "FAMILIES", "family_of", "queue_gauges", "read_gauges", "slots_from_props"]

FAMILIES = {"llamacpp": "llama.cpp", "vllm": "vLLM", "sglang": "SGLang"}  # owned_by -> the engine's own name
BATCHING = frozenset({"vllm", "sglang"})  # batching engines with a shared (paged) prefix cache
_RUNNING = {"vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"}
_WAITING = {"vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"}


def family_of(models: Iterable[Mapping[str, Any]]) -> str | None:
    """The engine family its listing names (every entry the same), or None."""
    owners = {owner if isinstance(owner := m.get("owned_by"), str) else None for m in models}
    if len(owners) == 1:
        owner = owners.pop()
        if owner in FAMILIES:
            return owner
    return None


def slots_from_props(props: Any) -> int | None:
    """llama.cpp's ``/props`` ``total_slots``, when it is a positive integer."""
    if not isinstance(props, Mapping):
        return None
    slots = props.get("total_slots")
    if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
        return slots
    return None


def queue_gauges(samples: Iterable[tuple[str, float]]) -> tuple[int | None, int | None]:
    """(running, waiting) from an engine's metrics samples; None where the engine has no such gauge."""
    running = waiting = None
    for name, value in samples:
        if name in _RUNNING:
            running = (running or 0) + max(int(value), 0)
        elif name in _WAITING:
            waiting = (waiting or 0) + max(int(value), 0)
    return running, waiting


def read_gauges(
    family: str, previous: Parallelism | None, running: int | None, waiting: int | None, seen_running: int
) -> Parallelism:
    """A batching engine's parallelism after one reading of its gauges: a capacity once shown (requests waiting
    while some ran) is kept, raised when a later reading shows more running (until the engine restarts)."""
    name = FAMILIES.get(family, family)
    now = engine_capacity(name, running, waiting, seen_running)
    if previous is None or previous.source is not Source.ENGINE or previous.slots is None:
        return now
    return previous if now.slots is None or now.slots < previous.slots else now
