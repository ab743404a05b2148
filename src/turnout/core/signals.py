"""Turning raw worker observations into scoring inputs: prefill and decode rates, VRAM pressure, GPU utilisation.

All inputs are plain values the adapters extracted from HTTP responses (times are parameters: no clock here).

Learned speeds (:func:`speeds`) are two rates that each mean one thing, learned per model and worker:

- **prefill**: prompt tokens the engine evaluated (not served from its cache) per second of prompt evaluation;
- **decode**: completion tokens after the first per second after the first.

They come from the engine's own stats where it reports them (they exclude any time the request waited in the
engine's queue), else from the gateway's clock: a stream's time to its first token is prefill, the rest decode;
an unstreamed answer's one duration is split with the rate already known for the other half (neither is learned
from it when none is). A request that waited in the engine's queue teaches nothing from the gateway's clock. A
whole request's time over its completion tokens, what was learned before, mixed the two: an engine that had just
served warm requests looked ten times faster than one that had served a cold one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

__all__ = [
    "EWMA_ALPHA",
    "MIN_PREFILL_TOKENS",
    "NOTHING_REPORTED",
    "Reported",
    "Sample",
    "Speeds",
    "gpu_from_samples",
    "input_counts",
    "pool",
    "reported",
    "smooth",
    "speeds",
    "tokens_per_second",
    "vram_pressure_from_ps",
]

EWMA_ALPHA = 0.3
# Fewer uncached prompt tokens than this say more about the engine's fixed costs than about its prefill rate.
MIN_PREFILL_TOKENS = 32
# An unstreamed answer's duration is split only when the half being learned is at least this share of it (when
# it is smaller, the other half's estimate decides it and its own rate means little).
MIN_SPLIT_SHARE = 0.25


class Sample(NamedTuple):
    """What one answer says about a worker's speed. Token counts and times are None when not known."""

    prompt_tokens: int | None = None  # the whole prompt: the worker's usage, else the gateway's estimate
    cached_tokens: int = 0  # of it served from the engine's cache: the engine's count, else the prefix index's
    completion_tokens: int | None = None
    first_s: float | None = None  # from sending to the first token (streams only)
    total_s: float | None = None  # from sending to the end of the answer
    queued: bool = False  # sent while the worker's slots were all busy: the gateway's times include a wait
    # the engine's own stats: Ollama's prompt_eval_* / eval_*, llama.cpp's timings (never include a wait)
    prefill_tokens: int | None = None  # prompt tokens it evaluated (its cache's tokens not included)
    prefill_s: float | None = None
    decode_tokens: int | None = None
    decode_s: float | None = None


class Reported(NamedTuple):
    """What a worker's answer (or a stream's last object) says it did, in its own fields."""

    prompt_tokens: int | None = None  # the whole prompt: OpenAI usage.prompt_tokens, Ollama prompt_eval_count
    completion_tokens: int | None = None  # usage.completion_tokens, eval_count
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, llama.cpp timings.cache_n
    prefill_tokens: int | None = None  # evaluated: llama.cpp timings.prompt_n; Ollama's count includes its cache
    prefill_s: float | None = None
    decode_tokens: int | None = None  # generated in decode_s: llama.cpp's predicted_n - 1, Ollama's eval_count - 1
    decode_s: float | None = None
    prefill_counts_cache: bool = False  # prefill_tokens is Ollama's prompt_eval_count (the whole prompt)


NOTHING_REPORTED = Reported()


def reported(answer: Mapping[str, object]) -> Reported:
    """The counts and timings in an answer: OpenAI's ``usage`` (with ``prompt_tokens_details.cached_tokens``, as
    vLLM, SGLang and recent llama.cpp servers send it), llama.cpp's ``timings`` (``prompt_n`` evaluated,
    ``cache_n`` from its cache, ``predicted_n``, and their ``_ms``), or Ollama's ``prompt_eval_count`` /
    ``prompt_eval_duration`` / ``eval_count`` / ``eval_duration`` (nanoseconds). Its ``prompt_eval_count`` is the
    whole prompt: the runner counts the inputs before loading its cache slot and times only what it then evaluates
    (``runner/ollamarunner/runner.go``). llama-cpp-python's server sends ``usage`` only (``llama_cpp/llama.py``).
    A llama.cpp stream sent without ``stream_options.include_usage`` has no usage, only the last frame's timings:
    its counts are then ``prompt_n + cache_n`` and ``predicted_n``, those the server's usage reports
    (``tools/server/server-task.cpp``: ``n_prompt_tokens``, ``n_decoded``). Fields of the wrong type are absent."""
    usage = _mapping(answer.get("usage"))
    timings = _mapping(answer.get("timings"))
    if "prompt_tokens" in usage or "input_tokens" not in usage:
        details = _mapping(usage.get("prompt_tokens_details"))
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        cached = _count(details.get("cached_tokens"))
    else:  # the Responses API's names, or Anthropic's (whose input_tokens leaves out what its cache served)
        prompt, completion, cached = input_counts(usage)
    if timings:
        cache_n, prompt_n, predicted_n = (_count(timings.get(k)) for k in ("cache_n", "prompt_n", "predicted_n"))
        if prompt is None and prompt_n is not None and cache_n is not None:  # a stream without usage: the
            prompt = prompt_n + cache_n  # engine's own counts (its usage's prompt_tokens is the same sum)
        return Reported(
            prompt,
            predicted_n if completion is None else completion,
            cached if cache_n is None else cache_n,
            prompt_n,
            _seconds(timings.get("prompt_ms"), 1e3),
            # (llama.cpp's log: "eval time = 0.00 ms / 1 tokens", "25.15 ms / 2 tokens (25.15 ms per token)")
            _after_first(predicted_n),
            _seconds(timings.get("predicted_ms"), 1e3),
        )
    eval_count = _count(answer.get("eval_count"))
    prompt_eval = _count(answer.get("prompt_eval_count"))
    if eval_count is None and prompt_eval is None:
        return Reported(prompt, completion, cached) if usage else NOTHING_REPORTED
    return Reported(
        prompt_eval if prompt is None else prompt,
        eval_count if completion is None else completion,
        cached,
        prompt_eval,
        _seconds(answer.get("prompt_eval_duration"), 1e9),
        # (runner/ollamarunner/runner.go: startGenerationTime is set at numPredicted == 1)
        _after_first(eval_count),
        _seconds(answer.get("eval_duration"), 1e9),
        prefill_counts_cache=True,
    )


def _after_first(generated: int | None) -> int | None:
    """The tokens an engine's generation time covers: llama.cpp and Ollama both start it at the first token, which
    the prompt's last step makes, so it times those after it (none for a one-token answer)."""
    return None if generated is None else max(generated - 1, 0)


def input_counts(usage: Mapping[str, object]) -> tuple[int | None, int | None, int | None]:
    """(prompt, completion, cached) from a Responses usage (``input_tokens``, ``output_tokens``,
    ``input_tokens_details.cached_tokens``) or an Anthropic one (``input_tokens`` plus
    ``cache_creation_input_tokens`` and ``cache_read_input_tokens``, the last served from cache)."""
    prompt = _count(usage.get("input_tokens"))
    completion = _count(usage.get("output_tokens"))
    cached = _count(_mapping(usage.get("input_tokens_details")).get("cached_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    if read is not None or "cache_creation_input_tokens" in usage:
        created = _count(usage.get("cache_creation_input_tokens")) or 0
        prompt = None if prompt is None else prompt + created + (read or 0)
        cached = read
    return prompt, completion, cached


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _seconds(value: object, per_second: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value) / per_second


class Speeds(NamedTuple):
    prefill: float | None = None  # uncached prompt tokens per second
    decode: float | None = None  # completion tokens per second after the first
    service_s: float | None = None  # how long the request held the worker (None: it waited in a queue first)


# Prometheus metric names understood for GPU signals, with the scale that brings them to 0..1.
_UTIL_METRICS = {"DCGM_FI_DEV_GPU_UTIL": 0.01, "nvidia_smi_utilization_gpu_ratio": 1.0}
_USED_METRICS = {"DCGM_FI_DEV_FB_USED", "nvidia_smi_memory_used_bytes"}
_FREE_METRICS = {"DCGM_FI_DEV_FB_FREE", "nvidia_smi_memory_free_bytes"}
_TOTAL_METRICS = {"nvidia_smi_memory_total_bytes"}


def pool(figures: Iterable[tuple[float | None, int]]) -> tuple[float | None, int]:
    """One rate from several replicas' figures for one worker and model, each (rate, answers that taught it): their
    times per token averaged, weighted by the answers (as the router adds times), and the answers summed; (None, 0)
    when none knows a rate."""
    weight = seconds = 0.0
    answers = 0
    for rate, n in figures:
        if rate and n > 0:
            weight += n
            seconds += n / rate
            answers += n
    return (weight / seconds, answers) if seconds else (None, 0)


def smooth(previous: float | None, sample: float, alpha: float = EWMA_ALPHA) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)


def tokens_per_second(tokens: int | None, seconds: float | None) -> float | None:
    """A rate, or None when it cannot be measured (no tokens, no time)."""
    if not tokens or not seconds or tokens <= 0 or seconds <= 0:
        return None
    return tokens / seconds


def speeds(sample: Sample, prefill_known: float | None, decode_known: float | None) -> Speeds:
    """The rates one answer teaches (see the module's docstring). ``prefill_known``, ``decode_known``: the rates
    learned so far for this model on this worker, used to split an unstreamed answer's duration."""
    prefill = _engine_prefill(sample)
    decode = tokens_per_second(sample.decode_tokens, sample.decode_s)
    total = sample.total_s
    if sample.queued or total is None or total <= 0:
        return Speeds(prefill, decode, None)
    uncached = None if sample.prompt_tokens is None else max(sample.prompt_tokens - sample.cached_tokens, 0)
    completion = sample.completion_tokens or 0
    first = sample.first_s
    if first is not None and 0 < first <= total:  # streamed: the first token splits the two
        if prefill is None and uncached is not None and uncached >= MIN_PREFILL_TOKENS:
            # the first token's own decode step is in that time too
            step = 1 / decode_known if decode_known else 0.0
            prefill = uncached / max(first - step, first / 2)
        if decode is None and completion >= 2 and total > first:
            decode = (completion - 1) / (total - first)
    else:  # one duration for both: split it with the rate known for the other half
        if decode is None and completion >= 1 and uncached is not None and (prefill_known or uncached == 0):
            decoding = total - (uncached / prefill_known if prefill_known else 0.0)
            if decoding >= MIN_SPLIT_SHARE * total:
                decode = completion / decoding
        if prefill is None and decode_known and uncached is not None and uncached >= MIN_PREFILL_TOKENS:
            prefilling = total - completion / decode_known
            if prefilling >= MIN_SPLIT_SHARE * total:
                prefill = uncached / prefilling
    return Speeds(prefill, decode, total)


def _engine_prefill(sample: Sample) -> float | None:
    """The prefill rate from the engine's own stats (``prefill_tokens``: what it evaluated, without its cache)."""
    if sample.prefill_tokens is None or not sample.prefill_s or sample.prefill_s <= 0:
        return None
    if sample.prefill_tokens < MIN_PREFILL_TOKENS:
        return None
    return sample.prefill_tokens / sample.prefill_s


def vram_pressure_from_ps(models: Iterable[Mapping[str, object]]) -> float | None:
    """Share of resident model bytes that did not fit in VRAM (Ollama ``/api/ps`` size vs size_vram)."""
    total = 0
    in_vram = 0
    for entry in models:
        size, vram = entry.get("size"), entry.get("size_vram")
        if isinstance(size, int) and isinstance(vram, int) and size > 0:
            total += size
            in_vram += min(vram, size)
    if total == 0:
        return None
    return 1.0 - in_vram / total


def gpu_from_samples(samples: Iterable[tuple[str, float]]) -> tuple[float | None, float | None]:
    """(mean GPU utilisation 0..1, memory used share 0..1) from Prometheus samples; None when absent."""
    utils: list[float] = []
    used = free = total = 0.0
    seen_used = seen_capacity = False
    for name, value in samples:
        if name in _UTIL_METRICS:
            utils.append(min(max(value * _UTIL_METRICS[name], 0.0), 1.0))
        elif name in _USED_METRICS:
            used += value
            seen_used = True
        elif name in _FREE_METRICS:
            free += value
            seen_capacity = True
        elif name in _TOTAL_METRICS:
            total += value
            seen_capacity = True
    util = sum(utils) / len(utils) if utils else None
    capacity = total if total > 0 else used + free
    memory = used / capacity if seen_used and seen_capacity and capacity > 0 else None
    return util, memory
