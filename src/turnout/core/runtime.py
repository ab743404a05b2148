"""Pure rules of the runtime agent: activation requests, IPC names, ports, restart backoff, phases."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from turnout.core.engine_args import InvalidEngineArgs, flag_names, judge_engine_args

__all__ = [
    "ARTIFACT_SCHEMES",
    "ENGINES",
    "KVCACHED_ENGINES",
    "MAX_RESTARTS",
    "ActivateRequest",
    "EnginePhase",
    "InvalidRequest",
    "NoCapacity",
    "artifact_problem",
    "backoff_s",
    "engine_args",
    "gpu_neighbours",
    "gpu_sharing_refusal",
    "ipc_name",
    "pick_port",
    "sleeps_in_place",
]

ENGINES = ("vllm", "sglang", "llamacpp")
MAX_RESTARTS = 5
_IPC_BAD = re.compile(r"[^A-Za-z0-9_-]")
_ARTIFACT_SCHEMES = ("huggingface://", "hf://", "file://", "s3://")
# S3 bucket names (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html): 3 to 63 lower-case
# letters, digits, dots and hyphens, beginning and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


NO_SLEEP_MODE = "--no-enable-sleep-mode"
# The engines kvcached lets share one GPU's memory (it patches vLLM and SGLang: ovg-project/kvcached
# kvcached/integration/{vllm,sglang}/autopatch.py, loaded at interpreter start by its kvcached_autopatch.pth
# when KVCACHED_AUTOPATCH=1, which the agent sets for every engine).
KVCACHED_ENGINES = frozenset({"vllm", "sglang"})


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
        if not isinstance(artifact, str):
            raise InvalidRequest(f"artifact_url must be a string starting with one of {', '.join(ARTIFACT_SCHEMES)}")
        problem = artifact_problem(artifact)
        if problem is not None:
            raise InvalidRequest(f"artifact_url {problem}")
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


ARTIFACT_SCHEMES = _ARTIFACT_SCHEMES


def artifact_problem(url: str) -> str | None:
    """What is wrong with an artifact URL (the words after "artifact_url " or "spec.artifactURL "), or None.

    Taken: ``hf://ORG/NAME`` and ``huggingface://ORG/NAME`` (the engine fetches them from the Hugging Face Hub),
    ``file:///PATH`` (on the pod) and ``s3://BUCKET[/KEY]`` (the agent downloads the object, or every object
    under ``KEY/``, before it starts the engine: :mod:`turnout.runtime.artifacts`). ``gcs://`` and ``gs://`` are
    refused: neither vLLM nor SGLang reads them, AIBrix's runtime downloads neither, and no Google Cloud Storage
    server can be run here to test a download against; a bucket is reached through its S3-compatible XML API
    as ``s3://`` instead."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return f"must start with one of {', '.join(ARTIFACT_SCHEMES)}, got {url[:80]!r}"
    if scheme.lower() != scheme and f"{scheme.lower()}://" in ARTIFACT_SCHEMES:
        return f"must spell its scheme in lower case ({scheme.lower()}://), got {scheme}://"
    if scheme.lower() in ("gcs", "gs"):
        return (
            f"{scheme}:// is not taken: no engine reads it and the agent downloads only s3://. Reach the bucket "
            "through Cloud Storage's S3-compatible XML API (s3://BUCKET/PATH with AWS_ENDPOINT_URL="
            "https://storage.googleapis.com and an HMAC key as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the "
            "pod's environment), or copy the weights to the pod and use file://PATH"
        )
    if f"{scheme}://" not in ARTIFACT_SCHEMES:
        return f"must start with one of {', '.join(ARTIFACT_SCHEMES)}, got {scheme}://"
    if not rest.strip("/") or any(c in rest for c in "\x00\n\r"):
        return f"names nothing after {scheme}://"
    if scheme == "s3":
        return _s3_problem(rest)
    return None


def _s3_problem(rest: str) -> str | None:
    bucket, _, key = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        return "s3://BUCKET/KEY takes no credentials or port: give them in the pod's environment (AWS_*)"
    if not _BUCKET.match(bucket) or ".." in bucket:
        return f"s3://{bucket}/...: {bucket!r} is not an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-')"
    if "?" in key or "#" in key:
        return "s3://BUCKET/KEY takes no query or fragment"
    if any(part in (".", "..") for part in key.split("/")):
        return "s3://BUCKET/KEY: the key may not have '.' or '..' segments"
    return None


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


def gpu_neighbours(engine: str, others: Iterable[tuple[str, str, str]], gpus: int) -> list[tuple[str, str]]:
    """The engines a new ``engine`` would share this pod's ``gpus`` GPUs with, as (model, engine), from the pod's
    other engines (``others``: (model, engine, phase) each): vLLM and SGLang engines that are not failed (a failed
    one holds nothing). Empty on a pod without GPUs, and for an engine kvcached does not concern (llama.cpp)."""
    if gpus <= 0 or engine not in KVCACHED_ENGINES:
        return []
    return sorted(
        (name, kind) for name, kind, phase in others if kind in KVCACHED_ENGINES and phase != EnginePhase.FAILED
    )


def gpu_sharing_refusal(
    model: str, neighbours: Iterable[tuple[str, str]], gpus: int, missing_kvcached: Iterable[str]
) -> str | None:
    """Why ``model`` must not start beside its ``neighbours`` (:func:`gpu_neighbours`) on a pod with ``gpus``
    GPUs, given the interpreters among theirs and its own that cannot import kvcached (``missing_kvcached``);
    None: it may start. Without kvcached each vLLM or SGLang engine takes its fixed share of the GPU's memory at
    start, so a second one on the same GPU fails to start, is restarted, and fails again until it gives up: it
    is refused before it starts instead."""
    beside = sorted(name for name, _ in neighbours)
    missing = sorted(set(missing_kvcached))
    if not beside or not missing:
        return None
    where = "this pod's GPU" if gpus == 1 else f"this pod's {gpus} GPUs"
    return (
        f"not started: {model} would be a second engine on {where} (beside {', '.join(beside)}), and kvcached, "
        f"which lets engines share a GPU's memory, cannot be imported by {' or '.join(missing)} (the interpreter "
        "that runs the engines): without it the engine would fail to start for want of memory, again at every "
        "restart. Run the pool on the kvcached runtime image (deploy/runtime.Dockerfile, based on "
        "ghcr.io/ovg-project/kvcached-vllm) or install kvcached into that interpreter, then deactivate and "
        "activate the model again"
    )
