"""Pure rules of the runtime agent: activation requests, IPC names, ports, restart backoff, phases."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from turnout.core.engine_args import InvalidEngineArgs, flag_names, judge_engine_args

__all__ = [
    "ENGINES",
    "MAX_RESTARTS",
    "ActivateRequest",
    "EnginePhase",
    "InvalidRequest",
    "NoCapacity",
    "backoff_s",
    "engine_args",
    "ipc_name",
    "pick_port",
    "sleeps_in_place",
]

ENGINES = ("vllm", "sglang", "llamacpp")
MAX_RESTARTS = 5
_IPC_BAD = re.compile(r"[^A-Za-z0-9_-]")
_ARTIFACT_SCHEMES = ("huggingface://", "hf://", "s3://", "gcs://", "file://")


NO_SLEEP_MODE = "--no-enable-sleep-mode"


def sleeps_in_place(engine: str, args: Mapping[str, str]) -> bool:
    """Whether the engine has a sleep API (vLLM with sleep mode, SGLang's memory saver); the others (llama.cpp,
    vLLM with ``--no-enable-sleep-mode``) sleep by stopping and start again on wake."""
    if engine == "vllm":
        return NO_SLEEP_MODE not in flag_names(engine, args)  # --no_enable_sleep_mode too (vLLM's spellings)
    return engine == "sglang"


class InvalidRequest(ValueError):
    """A request the agent refuses (HTTP 400); the message says which field and why. A claim whose activation
    is refused this way is Failed for good (until its spec changes), so capacity problems are not this."""


class NoCapacity(ValueError):
    """A valid request the agent cannot place now: no free port or IPC name (HTTP 409; the controller retries)."""


class EnginePhase(StrEnum):
    BOOTING = "booting"
    ACTIVE = "active"
    SLEEPING = "sleeping"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class ActivateRequest:
    model_name: str
    artifact_url: str
    engine: str = "vllm"
    port: int = 0
    ipc_name: str = ""
    args: Mapping[str, str] = field(default_factory=dict)
    claim_ref: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, body: Any) -> ActivateRequest:
        if not isinstance(body, dict):
            raise InvalidRequest("body must be a JSON object")
        unknown = set(body) - {
            "model_name",
            "artifact_url",
            "engine",
            "port",
            "ipc_name",
            "engine_config",
            "claim_ref",
            "operation_id",
            "credentials",  # AIBrix's ActivateRuntimeModelRequest fields
            "additional_config",
        }
        if unknown:
            raise InvalidRequest(f"unknown field(s) {sorted(unknown)}")
        name = body.get("model_name")
        if not isinstance(name, str) or not name or len(name) > 253:
            raise InvalidRequest("model_name is required (1 to 253 characters)")
        artifact = body.get("artifact_url")
        if not isinstance(artifact, str) or not artifact.startswith(_ARTIFACT_SCHEMES):
            raise InvalidRequest(f"artifact_url must start with one of {', '.join(_ARTIFACT_SCHEMES)}")
        engine = body.get("engine", "vllm")
        if engine not in ENGINES:
            raise InvalidRequest(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        port = body.get("port", 0)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise InvalidRequest("port must be 0 (automatic) or a TCP port")
        ipc = body.get("ipc_name") or ""
        if not isinstance(ipc, str):
            raise InvalidRequest("ipc_name must be a string")
        if body.get("credentials"):
            raise InvalidRequest(
                "credentials are not taken by the Turnout agent (engines fetch their own weights): give the pod "
                "the engine's credentials in its environment (HF_TOKEN, AWS_ACCESS_KEY_ID, ...)"
            )
        config = body.get("engine_config") or {}
        args = (config.get("args") or {}) if isinstance(config, dict) else None
        if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
            raise InvalidRequest('engine_config.args must be a map of strings ("" for a boolean flag)')
        legacy = body.get("additional_config") or {}
        if not isinstance(legacy, dict) or not all(isinstance(v, str) for v in legacy.values()):
            raise InvalidRequest("additional_config must be a map of strings")
        # AIBrix's legacy spelling of engine flags ("engine-arg:<flag>"; model_runtime.py, _engine_args)
        args = {**args, **{k.removeprefix("engine-arg:"): v for k, v in legacy.items() if k.startswith("engine-arg:")}}
        try:
            judge_engine_args(engine, args)  # the claim's rules, in every spelling the engine takes
        except InvalidEngineArgs as exc:
            raise InvalidRequest(f"engine_config.args: {exc}") from None
        ref = body.get("claim_ref") or {}
        if not isinstance(ref, dict):
            raise InvalidRequest("claim_ref must be an object {namespace, name, uid}")
        return cls(name, artifact, engine, port, ipc, dict(args), {k: str(v) for k, v in ref.items()})


def ipc_name(wanted: str, model: str, taken: Iterable[str]) -> str:
    """A kvcached IPC name: ``[A-Za-z0-9_-]``, at most 64 characters, unique among ``taken``."""
    base = _IPC_BAD.sub("_", wanted or f"kv_{model}")[:64] or "kv"
    used = set(taken)
    if base not in used:
        return base
    for n in range(1, 10_000):
        suffix = f"_{n}"
        candidate = base[: 64 - len(suffix)] + suffix
        if candidate not in used:
            return candidate
    raise NoCapacity("no free IPC name")


def pick_port(wanted: int, low: int, high: int, taken: Iterable[int]) -> int:
    used = set(taken)
    if wanted:
        if wanted in used:
            raise NoCapacity(f"port {wanted} is already used by another engine")
        return wanted
    for port in range(low, high + 1):
        if port not in used:
            return port
    raise NoCapacity(f"no free port in {low}-{high}")


def backoff_s(restarts: int, base_s: float = 2.0, cap_s: float = 60.0) -> float:
    """Delay before restart number ``restarts`` (1-based): base * 2^(n-1), capped."""
    return float(min(base_s * 2 ** max(restarts - 1, 0), cap_s))


def engine_args(args: Mapping[str, str]) -> list[str]:
    """``{"--flag": "", "--k": "v"}`` -> ``["--flag", "--k", "v"]`` (``""`` is a boolean flag)."""
    out: list[str] = []
    for key, value in args.items():
        out.append(key)
        if value != "":
            out.append(value)
    return out
