"""Turning raw worker observations into scoring inputs: tokens/s, VRAM pressure, GPU utilisation.

All inputs are plain values the fleet adapter extracted from HTTP responses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "EWMA_ALPHA",
    "gpu_from_samples",
    "smooth",
    "tokens_per_second",
    "vram_pressure_from_ps",
]

EWMA_ALPHA = 0.3

# Prometheus metric names understood for GPU signals, with the scale that brings them to 0..1.
_UTIL_METRICS = {"DCGM_FI_DEV_GPU_UTIL": 0.01, "nvidia_smi_utilization_gpu_ratio": 1.0}
_USED_METRICS = {"DCGM_FI_DEV_FB_USED", "nvidia_smi_memory_used_bytes"}
_FREE_METRICS = {"DCGM_FI_DEV_FB_FREE", "nvidia_smi_memory_free_bytes"}
_TOTAL_METRICS = {"nvidia_smi_memory_total_bytes"}


def smooth(previous: float | None, sample: float, alpha: float = EWMA_ALPHA) -> float:
    return sample if previous is None else previous + alpha * (sample - previous)


def tokens_per_second(tokens: int | None, seconds: float | None) -> float | None:
    """A rate, or None when it cannot be measured (no tokens, no time)."""
    if not tokens or not seconds or tokens <= 0 or seconds <= 0:
        return None
    return tokens / seconds


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
