"""llama-server's command-line flags, as Turnout's llama.cpp engine takes them (pure: names, values, what they set).

Turnout runs llama.cpp's own HTTP server in-process from the ``xllamacpp`` wheel
(:mod:`turnout.runtime.llamacpp_server`): a ``CommonParams`` object is filled in, then ``xllamacpp.Server`` serves
llama-server's API. This module is the table between the two: llama-server's flag names, read from upstream's
``common/arg.cpp`` (``common_params_parser_init``: every ``add_opt(common_arg({...}))`` that llama-server takes),
each with the ``CommonParams`` field it sets, and the parse that both ends use: a claim's
``engineConfig.args`` is judged with it at validation (:func:`turnout.core.engine_args.judge_engine_args`), and
the engine process reads its own command line with it. So a flag is refused before anything starts, never by a
crash loop.

Spellings, as llama.cpp's ``common_params_parse_ex`` reads them: a name that starts with ``--`` has its
underscores turned into dashes (``--ctx_size`` is ``--ctx-size``); otherwise names are exact (short forms such as
``-c``, ``-np``, ``-t`` included; no abbreviations, no ``--flag=value``). Switches take no value, toggles have a
negative form (``--slots`` / ``--no-slots``).

Some llama-server flags cannot be reached through the binding (:data:`UNREACHABLE`, with the reason: no
``CommonParams`` field for them, or a process-wide setting that is not a parameter); they are refused with that
reason. Flags that exist but are not in :data:`FLAGS` yet are refused too, naming the ones that are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FLAGS",
    "MANAGED",
    "UNREACHABLE",
    "EnumValue",
    "InvalidLlamaArgs",
    "LlamaFlag",
    "LlamaSettings",
    "llama_name",
    "lookup",
    "parse_argv",
    "settings",
]


class InvalidLlamaArgs(ValueError):
    """A flag llama-server does not take, cannot take through the binding, or a value it would refuse."""


@dataclass(frozen=True, slots=True)
class EnumValue:
    """A member of one of xllamacpp's enums, by name (``xllamacpp.<enum>.<member>``): core names it, the runtime
    looks it up."""

    enum: str
    member: str


@dataclass(frozen=True, slots=True)
class LlamaFlag:
    """One llama-server flag. ``names``: its spellings (the first is the one Turnout writes); ``negatives``: the
    ``--no-...`` forms of a toggle; ``fields``: the ``CommonParams`` attributes it sets (dotted for nested ones);
    ``kind``: how its value reads (see :func:`_value`); ``choices``: for ``choice``, written value -> field value."""

    names: tuple[str, ...]
    fields: tuple[str, ...]
    kind: str
    negatives: tuple[str, ...] = ()
    choices: Mapping[str, Any] | None = None
    at_least: int | None = None  # the smallest number llama-server takes

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def takes_value(self) -> bool:
        return self.kind not in _NO_VALUE


_NO_VALUE = ("switch", "toggle", "toggle-inverted", "verbose", "rerank")


def _enum(enum: str, prefix: str, members: Mapping[str, str]) -> dict[str, EnumValue]:
    return {written: EnumValue(enum, prefix + member) for written, member in members.items()}


# common/arg.cpp is_truthy / is_falsey / is_autoy
_TRUTHY, _FALSEY, _AUTO = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), ("auto", "-1")
_CACHE_TYPES = _enum(
    "ggml_type",
    "GGML_TYPE_",
    {t: t.upper() for t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")},
)
_POOLING = _enum("llama_pooling_type", "LLAMA_POOLING_TYPE_", {p: p.upper() for p in ("none", "mean", "cls", "last")})
_POOLING["rank"] = EnumValue("llama_pooling_type", "LLAMA_POOLING_TYPE_RANK")
_SPLIT = _enum("llama_split_mode", "LLAMA_SPLIT_MODE_", {m: m.upper() for m in ("none", "layer", "row", "tensor")})
_REASONING_FORMAT = _enum(
    "common_reasoning_format",
    "COMMON_REASONING_FORMAT_",
    {"none": "NONE", "auto": "AUTO", "deepseek": "DEEPSEEK", "deepseek-legacy": "DEEPSEEK_LEGACY"},
)
_SAMPLING_SET = "sampling.user_sampling_config"  # which sampling defaults the user set (the model's own are kept else)


def _flag(names: str, fields: str, kind: str, **kw: Any) -> LlamaFlag:
    return LlamaFlag(tuple(names.split()), tuple(fields.split()), kind, **kw)


def _toggle(names: str, negatives: str, fields: str, *, inverted: bool = False) -> LlamaFlag:
    kind = "toggle-inverted" if inverted else "toggle"
    return LlamaFlag(tuple(names.split()), tuple(fields.split()), kind, tuple(negatives.split()))


# Turnout writes these from the claim (model file, served name) and the agent (host, port).
MANAGED: dict[str, str] = {
    "--model": "the model file is the claim's spec.artifactURL",
    "--alias": "the served name is the claim's spec.modelName",
    "--host": "the engine listens where the runtime agent does",
    "--port": "the runtime agent gives each engine its port",
}

FLAGS: tuple[LlamaFlag, ...] = (
    # what Turnout writes itself (refused in a claim's args: MANAGED)
    _flag("--model -m", "model.path", "str"),
    _flag("--alias -a", "model_alias", "names"),
    _flag("--host", "hostnames", "host"),
    _flag("--port", "port", "int", at_least=0),
    # context, slots, batching, KV cache
    _flag("--ctx-size -c", "n_ctx", "int", at_least=0),
    _flag("--parallel -np", "n_parallel", "slots"),
    _flag("--batch-size -b", "n_batch", "int", at_least=1),
    _flag("--ubatch-size -ub", "n_ubatch", "int", at_least=1),
    _flag("--predict -n --n-predict", "n_predict", "int", at_least=-2),
    _flag("--keep", "n_keep", "int", at_least=-1),
    _toggle("--cont-batching -cb", "--no-cont-batching -nocb", "cont_batching"),
    _toggle("--kv-unified -kvu", "--no-kv-unified -no-kvu", "kv_unified"),
    _toggle("--context-shift", "--no-context-shift", "ctx_shift"),
    _flag("--swa-full", "swa_full", "switch"),
    _flag("--cache-type-k -ctk", "cache_type_k", "choice", choices=_CACHE_TYPES),
    _flag("--cache-type-v -ctv", "cache_type_v", "choice", choices=_CACHE_TYPES),
    _flag("--flash-attn -fa", "flash_attn_type", "flash-attn"),
    _flag("--ctx-checkpoints -ctxcp --swa-checkpoints", "n_ctx_checkpoints", "int", at_least=0),
    _flag("--cache-ram -cram", "cache_ram_mib", "int", at_least=-1),
    _toggle("--cache-prompt", "--no-cache-prompt", "cache_prompt"),
    _flag("--cache-reuse", "n_cache_reuse", "int", at_least=0),
    _toggle("--cache-idle-slots", "--no-cache-idle-slots", "cache_idle_slots"),
    _flag("--slot-prompt-similarity -sps", "slot_prompt_similarity", "float"),
    _flag("--sleep-idle-seconds", "sleep_idle_seconds", "idle-seconds"),
    _flag("--rope-freq-base", "rope_freq_base", "float"),
    _flag("--rope-freq-scale", "rope_freq_scale", "float"),
    # threads
    _flag("--threads -t", "cpuparams.n_threads", "threads"),
    _flag("--threads-batch -tb", "cpuparams_batch.n_threads", "threads"),
    _flag("--threads-http", "n_threads_http", "int", at_least=-1),
    # devices
    _flag("--gpu-layers -ngl --n-gpu-layers", "n_gpu_layers", "gpu-layers"),
    _flag("--main-gpu -mg", "main_gpu", "int", at_least=0),
    _flag("--split-mode -sm", "split_mode", "choice", choices=_SPLIT),
    _toggle("--kv-offload -kvo", "--no-kv-offload -nkvo", "no_kv_offload", inverted=True),
    _flag("--fit -fit", "fit_params", "on-off"),
    _flag("--fit-ctx -fitc", "fit_params_min_ctx", "int", at_least=0),
    # embeddings and reranking
    _flag("--embedding --embeddings", "embedding", "switch"),
    _flag("--rerank --reranking", "embedding pooling_type", "rerank"),
    _flag("--pooling", "pooling_type", "choice", choices=_POOLING),
    _flag("--embd-normalize", "embd_normalize", "int", at_least=-1),
    # the HTTP server
    _flag("--metrics", "endpoint_metrics", "switch"),
    _flag("--props", "endpoint_props", "switch"),
    _toggle("--slots", "--no-slots", "endpoint_slots"),
    _flag("--api-key", "api_keys", "list"),
    _flag("--api-prefix", "api_prefix", "str"),
    _flag("--timeout -to", "timeout_read timeout_write", "int", at_least=0),
    _flag("--sse-ping-interval", "sse_ping_interval", "int", at_least=-1),
    _toggle("--ui --webui", "--no-ui --no-webui", "ui"),
    _toggle("--warmup", "--no-warmup", "warmup"),
    _flag("--slot-save-path", "slot_save_path", "str"),
    _flag("--media-path", "media_path", "str"),
    # chat templates and reasoning
    _toggle("--jinja", "--no-jinja", "use_jinja"),
    _flag("--chat-template", "chat_template", "str"),
    _flag("--chat-template-file", "chat_template", "file"),
    _flag("--reasoning-format", "reasoning_format", "choice", choices=_REASONING_FORMAT),
    _flag("--reasoning -rea", "enable_reasoning default_template_kwargs", "reasoning"),
    _flag("--reasoning-budget", "sampling.reasoning_budget_tokens", "int", at_least=-1),
    _toggle("--prefill-assistant", "--no-prefill-assistant", "prefill_assistant"),
    _toggle("--skip-chat-parsing", "--no-skip-chat-parsing", "force_pure_content_parser"),
    _flag("--special -sp", "special", "switch"),
    _flag("--reverse-prompt -r", "antiprompt", "one-list"),
    # sampling defaults (a request's own fields win)
    _flag("--seed -s", "sampling.seed", "int", at_least=0),
    _flag("--temp --temperature", f"sampling.temp {_SAMPLING_SET}", "sampling"),
    _flag("--top-k", f"sampling.top_k {_SAMPLING_SET}", "sampling"),
    _flag("--top-p", f"sampling.top_p {_SAMPLING_SET}", "sampling"),
    _flag("--min-p", f"sampling.min_p {_SAMPLING_SET}", "sampling"),
    # more of the model
    _flag("--mmproj -mm", "mmproj.path", "str"),
    _toggle("--mmproj-auto", "--no-mmproj --no-mmproj-auto", "no_mmproj", inverted=True),
    _flag("--lora", "lora_adapters", "lora"),
    _flag("--lora-scaled", "lora_adapters", "lora-scaled"),
    # logs
    _flag("--verbosity -lv --log-verbosity", "verbosity", "int"),
    _flag("--verbose -v --log-verbose", "verbosity", "verbose"),
)

# The bit of common_params_sampling_config each sampling flag sets (common/arg.cpp: user_sampling_config |= ...).
_SAMPLING_BITS = {"--temp": "TEMP", "--top-k": "TOP_K", "--top-p": "TOP_P", "--min-p": "MIN_P"}

_NO_FIELD = "xllamacpp's CommonParams has no field for it"
_DOWNLOAD = "the engine loads the claim's spec.artifactURL; download the model there instead"
_LOGS = "a process-wide log setting, not a parameter of the server; the agent keeps the engine's output in its logs"
_ROUTER = "llama-server's router mode (many models in one server); a claim is one model"
UNREACHABLE: dict[str, str] = {
    **dict.fromkeys(("--mlock", "--mmap", "--no-mmap", "--direct-io", "-dio", "--no-direct-io", "-ndio"), _NO_FIELD),
    **dict.fromkeys(("--override-kv", "--spm-infill", "--device", "-dev", "--list-devices"), _NO_FIELD),
    **dict.fromkeys(("--override-tensor", "-ot", "--cpu-moe", "-cmoe", "--n-cpu-moe", "-ncmoe"), _NO_FIELD),
    "--rpc": "it registers RPC backends for the whole process before any server exists",
    **dict.fromkeys(("--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--hf-token", "-hft"), _DOWNLOAD),
    **dict.fromkeys(("--model-url", "-mu", "--docker-repo", "-dr"), _DOWNLOAD),
    **dict.fromkeys(("--log-file", "--log-disable", "--log-colors", "--log-prefix", "--no-log-prefix"), _LOGS),
    **dict.fromkeys(("--log-timestamps", "--no-log-timestamps"), _LOGS),
    **dict.fromkeys(("--models-dir", "--models-preset", "--models-max", "--models-autoload"), _ROUTER),
    "--no-models-autoload": _ROUTER,
}

# llama-cpp-python's server names (llama_cpp/server/settings.py) for what llama-server calls otherwise: Turnout's
# llama.cpp engine was llama-cpp-python's server before, and claims written for it name these.
_PYTHON_SERVER = {
    "--n-ctx": "--ctx-size",
    "--n-threads": "--threads",
    "--n-threads-batch": "--threads-batch",
    "--n-batch": "--batch-size",
    "--n-ubatch": "--ubatch-size",
    "--model-alias": "--alias",
    "--chat-format": "--chat-template (a template name or text) or --jinja (the model's own template, the default)",
    "--kv-overrides": "--override-kv, which this engine cannot take (for pooling: --pooling mean)",
    "--interrupt-requests": "none: llama-server queues a request no slot is free for, it never interrupts a stream",
}

_BY_NAME: dict[str, tuple[LlamaFlag, bool]] = {
    **{n: (f, True) for f in FLAGS for n in f.names},
    **{n: (f, False) for f in FLAGS for n in f.negatives},
}


def llama_name(written: str) -> str:
    """The name llama.cpp looks up: a ``--`` flag's underscores are dashes (common/arg.cpp,
    ``common_params_parse_ex``); anything else as written."""
    return "--" + written[2:].replace("_", "-") if written.startswith("--") else written


def lookup(written: str) -> tuple[LlamaFlag, bool]:
    """The flag ``written`` names and whether it is its positive form; :class:`InvalidLlamaArgs` when llama-server
    has no such flag or Turnout's engine cannot take it."""
    name = llama_name(written)
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    if "=" in name:
        head = name.split("=", 1)[0]
        raise InvalidLlamaArgs(
            f"{written}: llama-server takes no --flag=value; give the value separately ({head}: value)"
        )
    if name in UNREACHABLE:
        raise InvalidLlamaArgs(
            f"{written}: a llama-server flag that Turnout's llama.cpp engine cannot take: {UNREACHABLE[name]}"
        )
    if name in _PYTHON_SERVER:
        raise InvalidLlamaArgs(f"{written}: llama-cpp-python's name; llama-server's is {_PYTHON_SERVER[name]}")
    known = ", ".join(f.name for f in FLAGS if f.name not in MANAGED)
    raise InvalidLlamaArgs(f"{written}: not a llama-server flag Turnout's llama.cpp engine takes; it takes {known}")


@dataclass(frozen=True, slots=True)
class LlamaSettings:
    """What a command line sets: ``assignments`` in order (field, value; later ones win, as in llama.cpp),
    ``flags`` the canonical names given (``--no-x`` as its toggle's name), ``files`` the fields to fill from a
    file the runtime reads (``--chat-template-file``)."""

    assignments: tuple[tuple[str, Any], ...]
    flags: frozenset[str]
    files: tuple[tuple[str, str], ...] = ()

    def value(self, field: str, default: Any = None) -> Any:
        found = [v for f, v in self.assignments if f == field]
        return found[-1] if found else default


def _int(flag: LlamaFlag, written: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidLlamaArgs(f"{written} takes a whole number, got {raw!r}") from None
    if flag.at_least is not None and value < flag.at_least:
        raise InvalidLlamaArgs(f"{written} takes a number of at least {flag.at_least}, got {value}")
    return value


def _float(written: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise InvalidLlamaArgs(f"{written} takes a number, got {raw!r}") from None


def _csv(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def _value(flag: LlamaFlag, written: str, raw: str | None, positive: bool) -> list[tuple[str, Any]]:
    """The field assignments one flag makes (llama.cpp's handler for it in common/arg.cpp, value by value)."""
    field = flag.fields[0]
    kind = flag.kind
    if kind == "switch":
        return [(field, True)]
    if kind in ("toggle", "toggle-inverted"):
        return [(field, positive != (kind == "toggle-inverted"))]
    if kind == "verbose":
        return [(field, 2**31 - 1)]  # INT_MAX: every message
    if kind == "rerank":
        return [("embedding", True), ("pooling_type", _POOLING["rank"])]
    assert raw is not None
    if kind == "str":
        return [(field, raw)]
    if kind == "file":
        return []  # read by the runtime (LlamaSettings.files)
    if kind == "host":
        return [(field, [raw])]
    if kind == "names":  # --alias: comma-separated, stripped, a set (common/arg.cpp)
        return [(field, set(_csv(raw)))]
    if kind == "list":
        return [(field, _csv(raw))]
    if kind == "one-list":
        return [(field, [raw])]
    if kind == "int":
        return [(f, _int(flag, written, raw)) for f in flag.fields]
    if kind == "float":
        return [(field, _float(written, raw))]
    return _special(flag, written, raw)


def _special(flag: LlamaFlag, written: str, raw: str) -> list[tuple[str, Any]]:
    field, kind, low = flag.fields[0], flag.kind, raw.lower()
    if kind == "choice":
        assert flag.choices is not None
        if raw not in flag.choices:
            raise InvalidLlamaArgs(f"{written} takes one of {', '.join(flag.choices)}, got {raw!r}")
        return [(field, flag.choices[raw])]
    if kind in ("slots", "idle-seconds"):  # -1: automatic slots (4 sharing one KV cache) / never sleep; 0 refused
        count = _int(flag, written, raw)
        if count == 0 or count < -1:
            what = (
                "a number of slots (at least 1, or -1 for automatic)"
                if kind == "slots"
                else "seconds (at least 1, or -1 to never sleep)"
            )
            raise InvalidLlamaArgs(f"{written} takes {what}, got {count}")
        return [(field, count)]
    if kind == "threads":  # 0 or less: as many as the machine has (the runtime counts them)
        return [(field, _int(flag, written, raw))]
    if kind == "gpu-layers":
        if raw in ("auto", "all"):
            return [(field, -1 if raw == "auto" else -2)]
        return [(field, _int(flag, written, raw))]
    if kind == "flash-attn":
        for values, member in ((_TRUTHY, "ENABLED"), (_FALSEY, "DISABLED"), (_AUTO, "AUTO")):
            if low in values:
                return [(field, EnumValue("llama_flash_attn_type", "LLAMA_FLASH_ATTN_TYPE_" + member))]
        raise InvalidLlamaArgs(f"{written} takes on, off or auto, got {raw!r}")
    if kind == "on-off":
        if low in _TRUTHY or low in _FALSEY:
            return [(field, low in _TRUTHY)]
        raise InvalidLlamaArgs(f"{written} takes on or off, got {raw!r}")
    if kind == "reasoning":
        if low in _TRUTHY or low in _FALSEY:
            on = low in _TRUTHY
            return [(field, 1 if on else 0), ("default_template_kwargs", {"enable_thinking": str(on).lower()})]
        if low in _AUTO:
            return [(field, -1)]
        raise InvalidLlamaArgs(f"{written} takes on, off or auto, got {raw!r}")
    if kind == "sampling":
        number: float = _int(flag, written, raw) if flag.name == "--top-k" else _float(written, raw)
        return [(field, number), (flag.fields[1], EnumValue("common_params_sampling_config", _bit(flag)))]
    if kind in ("lora", "lora-scaled"):
        return [(field, _loras(written, raw, scaled=kind == "lora-scaled"))]
    raise AssertionError(f"no reading for {kind}")


def _bit(flag: LlamaFlag) -> str:
    return "COMMON_PARAMS_SAMPLING_CONFIG_" + _SAMPLING_BITS[flag.name]


def _loras(written: str, raw: str, *, scaled: bool) -> list[tuple[str, float]]:
    out = []
    for item in _csv(raw):
        if not scaled:
            out.append((item, 1.0))
            continue
        parts = item.split(":")
        if len(parts) != 2:
            raise InvalidLlamaArgs(f"{written} takes FILE:SCALE,..., got {item!r}")
        out.append((parts[0], _float(written, parts[1])))
    return out


def settings(pairs: Iterable[tuple[str, str | None]], *, claim: bool = False) -> LlamaSettings:
    """Judge ``(flag as written, value)`` pairs, in order: each must be a flag Turnout's llama.cpp engine takes,
    with a value it reads (None or ``""`` for a switch or a toggle). ``claim``: the pairs are a claim's
    ``engineConfig.args``, so the flags Turnout writes itself (:data:`MANAGED`) are refused."""
    assignments: list[tuple[str, Any]] = []
    files: list[tuple[str, str]] = []
    names: set[str] = set()
    for written, raw in pairs:
        flag, positive = lookup(written)
        if claim and flag.name in MANAGED:
            raise InvalidLlamaArgs(f"{written} is set by Turnout ({MANAGED[flag.name]}); remove it from the args")
        if flag.takes_value and (raw is None or raw == ""):
            raise InvalidLlamaArgs(f"{written} needs a value")
        if not flag.takes_value and raw not in (None, ""):
            raise InvalidLlamaArgs(f'{written} takes no value (a switch: give it as ""), got {raw!r}')
        assignments.extend(_value(flag, written, raw, positive))
        if flag.kind == "file" and raw:
            files.append((flag.fields[0], raw))
        names.add(flag.name)
    return LlamaSettings(tuple(assignments), frozenset(names), tuple(files))


def parse_argv(argv: Sequence[str]) -> LlamaSettings:
    """A llama-server command line (the engine process's own), read as llama.cpp reads it: a flag that takes a
    value takes the next argument."""
    pairs: list[tuple[str, str | None]] = []
    index = 0
    while index < len(argv):
        written = argv[index]
        flag, _ = lookup(written)
        if flag.takes_value:
            if index + 1 >= len(argv):
                raise InvalidLlamaArgs(f"{written} needs a value")
            pairs.append((written, argv[index + 1]))
            index += 2
        else:
            pairs.append((written, None))
            index += 1
    return settings(pairs)
