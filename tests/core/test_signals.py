import pytest

from turnout.core.signals import gpu_from_samples, smooth, tokens_per_second, vram_pressure_from_ps


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ([], None),
        ([{"size": 100, "size_vram": 100}], 0.0),
        ([{"size": 100, "size_vram": 25}], 0.75),
        ([{"size": 100, "size_vram": 100}, {"size": 100, "size_vram": 0}], 0.5),
        ([{"size": 100, "size_vram": 150}], 0.0),
        ([{"size": 0, "size_vram": 0}], None),
        ([{"size": "x", "size_vram": 1}], None),
    ],
)
def test_vram_pressure(models: list[dict[str, object]], expected: float | None) -> None:
    assert vram_pressure_from_ps(models) == expected


@pytest.mark.parametrize(
    ("samples", "util", "memory"),
    [
        ([], None, None),
        ([("DCGM_FI_DEV_GPU_UTIL", 50.0), ("DCGM_FI_DEV_GPU_UTIL", 100.0)], 0.75, None),
        ([("DCGM_FI_DEV_FB_USED", 30.0), ("DCGM_FI_DEV_FB_FREE", 10.0)], None, 0.75),
        (
            [
                ("nvidia_smi_utilization_gpu_ratio", 0.2),
                ("nvidia_smi_memory_used_bytes", 1.0),
                ("nvidia_smi_memory_total_bytes", 4.0),
            ],
            0.2,
            0.25,
        ),
        ([("DCGM_FI_DEV_GPU_UTIL", 250.0)], 1.0, None),
        ([("DCGM_FI_DEV_FB_USED", 30.0)], None, None),  # no capacity known: absent, not guessed
        ([("unrelated_metric", 5.0)], None, None),
    ],
)
def test_gpu_from_samples(samples: list[tuple[str, float]], util: float | None, memory: float | None) -> None:
    assert gpu_from_samples(samples) == (util, memory)


@pytest.mark.parametrize(
    ("tokens", "seconds", "rate"),
    [(10, 2.0, 5.0), (0, 1.0, None), (None, 1.0, None), (5, 0.0, None), (5, None, None), (-1, 1.0, None)],
)
def test_tokens_per_second(tokens: int | None, seconds: float | None, rate: float | None) -> None:
    assert tokens_per_second(tokens, seconds) == rate


def test_smooth() -> None:
    assert smooth(None, 10.0) == 10.0
    assert smooth(10.0, 20.0, alpha=0.5) == 15.0
