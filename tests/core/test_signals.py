import pytest

from turnout.core.signals import (
    Reported,
    Sample,
    Speeds,
    gpu_from_samples,
    reported,
    smooth,
    speeds,
    tokens_per_second,
    vram_pressure_from_ps,
)


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


@pytest.mark.parametrize(
    ("sample", "known", "expected"),
    [
        # a stream: the first token splits prefill from decode
        (Sample(1000, 0, 11, first_s=2.0, total_s=3.0), (None, None), Speeds(500.0, 10.0, 3.0)),
        # ... the first token's own decode step taken out of the prefill when the decode rate is known
        (Sample(1000, 0, 11, first_s=2.1, total_s=3.1), (None, 10.0), Speeds(500.0, 10.0, 3.1)),
        # only the uncached part of the prompt was evaluated
        (Sample(1000, 900, 11, first_s=0.5, total_s=1.5), (None, None), Speeds(200.0, 10.0, 1.5)),
        # too little uncached to say anything about prefill
        (Sample(1000, 990, 11, first_s=0.1, total_s=1.1), (None, None), Speeds(None, 10.0, 1.1)),
        # one completion token: nothing after the first to time
        (Sample(1000, 0, 1, first_s=2.0, total_s=2.0), (None, None), Speeds(500.0, None, 2.0)),
        # no prompt count at all (nothing reported, nothing estimated): no prefill
        (Sample(None, 0, 11, first_s=2.0, total_s=3.0), (None, None), Speeds(None, 10.0, 3.0)),
        # queued behind another request: the gateway's clock says nothing about the engine's speed
        (Sample(1000, 0, 11, first_s=5.0, total_s=6.0, queued=True), (None, None), Speeds(None, None, None)),
        # ... its own stats still do (Ollama's, llama.cpp's timings exclude the wait)
        (
            Sample(
                1000, 0, 11, total_s=9.0, queued=True, prefill_tokens=600, prefill_s=1.2, decode_tokens=50, decode_s=2.5
            ),
            (None, None),
            Speeds(500.0, 20.0, None),
        ),
        # an unstreamed answer: one duration, split with the rate known for the other half
        (Sample(1000, 0, 10, total_s=3.0), (500.0, None), Speeds(None, 10.0, 3.0)),
        (Sample(1000, 0, 10, total_s=3.0), (None, 10.0), Speeds(500.0, None, 3.0)),
        (Sample(1000, 0, 10, total_s=3.0), (500.0, 10.0), Speeds(500.0, 10.0, 3.0)),
        # ... nothing known: nothing learned but how long it held the worker
        (Sample(1000, 0, 10, total_s=3.0), (None, None), Speeds(None, None, 3.0)),
        # ... a fully cached prompt: all of it was decode
        (Sample(1000, 1000, 10, total_s=0.5), (None, None), Speeds(None, 20.0, 0.5)),
        # ... a split that leaves the learned half under a quarter of the time is not trusted
        (Sample(1000, 0, 10, total_s=2.2), (500.0, None), Speeds(None, None, 2.2)),
        # engine stats below the prefill floor are ignored, the rest is learned from the clock
        (
            Sample(100, 0, 11, first_s=0.4, total_s=1.4, prefill_tokens=20, prefill_s=0.1),
            (None, None),
            Speeds(250.0, 10.0, 1.4),
        ),
    ],
)
def test_speeds(sample: Sample, known: tuple[float | None, float | None], expected: Speeds) -> None:
    got = speeds(sample, *known)
    assert got == pytest.approx(expected)


def test_a_warm_answer_does_not_make_a_worker_look_faster() -> None:
    """The defect this replaces: completion tokens over the whole request made an engine that had just served a
    warm request (its prompt cached) look many times faster than one that served the same answer cold."""
    decode_s = 1.0  # 20 tokens at 20/s on both
    cold = Sample(2000, 0, 20, total_s=2000 / 400 + decode_s)
    warm = Sample(2000, 1900, 20, total_s=100 / 400 + decode_s)
    assert tokens_per_second(20, cold.total_s) == pytest.approx(3.33, abs=0.01)  # what was learned before
    assert tokens_per_second(20, warm.total_s) == pytest.approx(16.0)
    assert speeds(cold, 400.0, None).decode is None  # a sixth of the time: too little to split off reliably
    assert speeds(warm, 400.0, None).decode == pytest.approx(20.0)
    cold_stream = Sample(2000, 0, 21, first_s=5.0, total_s=6.0)
    warm_stream = Sample(2000, 1900, 21, first_s=0.25, total_s=1.25)
    assert speeds(cold_stream, None, None) == pytest.approx(Speeds(400.0, 20.0, 6.0))
    assert speeds(warm_stream, None, None) == pytest.approx(Speeds(400.0, 20.0, 1.25))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({}, Reported()),
        ({"usage": "x"}, Reported()),
        # OpenAI chat usage, with vLLM's / SGLang's cached count
        (
            {"usage": {"prompt_tokens": 120, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 96}}},
            Reported(120, 9, 96),
        ),
        ({"usage": {"prompt_tokens": True, "completion_tokens": -1}}, Reported()),
        # llama.cpp's server: timings say what it evaluated, what its cache served, and how long each part took
        (
            {
                "usage": {"prompt_tokens": 100, "completion_tokens": 8},
                "timings": {"prompt_n": 20, "cache_n": 80, "prompt_ms": 400.0, "predicted_n": 8, "predicted_ms": 200},
            },
            Reported(100, 8, 80, 20, 0.4, 7, 0.2),
        ),
        # ... and a stream sent without usage (no stream_options.include_usage): the timings count it
        (
            {"usage": None, "timings": {"prompt_n": 12, "cache_n": 307, "predicted_n": 6, "predicted_ms": 3.0}},
            Reported(319, 6, 307, 12, None, 5, 0.003),
        ),
        ({"timings": {"prompt_n": 12, "predicted_n": 6}}, Reported(None, 6, None, 12, None, 5, None)),
        # Ollama: prompt_eval_count is the whole prompt, its duration only what was evaluated
        (
            {"prompt_eval_count": 50, "prompt_eval_duration": 2_000_000_000, "eval_count": 10, "eval_duration": 10**9},
            Reported(50, 10, None, 50, 2.0, 9, 1.0, prefill_counts_cache=True),
        ),
        # the Responses API's usage names
        (
            {"usage": {"input_tokens": 70, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 64}}},
            Reported(70, 5, 64),
        ),
        # Anthropic's: input_tokens leaves out what the cache wrote and served
        (
            {
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 4,
                    "cache_creation_input_tokens": 30,
                    "cache_read_input_tokens": 200,
                }
            },
            Reported(240, 4, 200),
        ),
        ({"usage": {"input_tokens": 12, "output_tokens": 3}}, Reported(12, 3, None)),
    ],
)
def test_reported_reads_each_engines_counts(answer: dict[str, object], expected: Reported) -> None:
    assert reported(answer) == expected


@pytest.mark.parametrize(
    ("predicted_n", "predicted_ms", "decode"),
    [
        (1, 0.004, None),  # the first token is the prompt's last step: no generation time, no rate (was 250,000/s)
        (2, 25.15, 1 / 0.02515),  # llama.cpp's own log: "25.15 ms / 2 tokens (25.15 ms per token, 39.76 tokens/s)"
        (16, 329.17, 15 / 0.32917),
    ],
)
def test_a_llama_cpp_answer_teaches_the_decode_rate_of_its_tokens_after_the_first(
    predicted_n: int, predicted_ms: float, decode: float | None
) -> None:
    """A stopped Batch API line continued with a token left to make answers one token: its timings teach no rate. A
    single one had made an engine look 10,000 times faster for minutes (EWMA), and interactive requests queued on
    it behind one another rather than stopping a batch line elsewhere (bench/batch_fleet.py, continued lines)."""
    rep = reported(
        {"timings": {"prompt_n": 40, "prompt_ms": 400.0, "predicted_n": predicted_n, "predicted_ms": predicted_ms}}
    )
    sample = Sample(
        40, 0, predicted_n, None, 1.0, False, rep.prefill_tokens, rep.prefill_s, rep.decode_tokens, rep.decode_s
    )
    learned = speeds(sample, None, None).decode
    assert learned == (None if decode is None else pytest.approx(decode))
