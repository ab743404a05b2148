"""A claim's engine args, judged as the engine itself reads them: every rule on them, in one function.

``engineConfig.args`` is a map of flag to value (``""`` for a switch) that the runtime agent puts on the engine's
command line. A rule on a flag holds for every spelling of it that the engine takes, so each engine's parser is
followed, from its source:

- vLLM: ``FlexibleArgumentParser`` (vllm/utils/argparse_utils.py, ``parse_args``) turns underscores into dashes
  in the name of a ``--`` flag and keeps ``--flag=value``; argparse then takes the long names, the short forms
  that vllm/engine/arg_utils.py gives (``-tp``, ``-pp``, ``-dp``, ``-dpl``...), ``-x=value`` and any unambiguous
  prefix of an option (argparse's ``allow_abbrev``).
- SGLang: plain argparse (python/sglang/srt/server_args.py, ``prepare_server_args``): dashes only, ``=value``,
  ``--tp-size`` / ``--tensor-parallel-size``, ``--pp-size`` / ``--pipeline-parallel-size``, ``--dp-size`` /
  ``--data-parallel-size``, and prefixes: its own docs write ``--tp 2`` and ``--dp 2``.
- llama.cpp: ``common_params_parse_ex`` (common/arg.cpp): underscores become dashes in ``--`` flags; exact names
  only, short forms included; no ``=value``. Every flag must be one Turnout's llama.cpp engine takes
  (:mod:`turnout.core.llamacpp_flags`); the others are refused here, not by a crash loop.

The rules (the ModelClaim design): ``--gpu-memory-utilization`` is refused (the pool shares GPU memory through
kvcached); data parallelism is 1 (one claim per replica); tensor x pipeline parallel size is the GPUs one engine
takes, which must be the pod's. The flags Turnout writes itself (model, served name, host, port) and a config
file that could hide any of the above (``--config``) are refused too.

vLLM's ``--scheduling-policy`` (``fcfs`` or ``priority``, vllm/config/scheduler.py) is read in every spelling:
an engine started with ``priority`` schedules by each request's own priority, which the gateway then sends
(:attr:`EngineArgs.priority`, :func:`schedules_by_priority`); another value is refused here, as vLLM
would refuse it at start. SGLang's are two switches (python/sglang/srt/server_args.py): ``--enable-priority-scheduling``
("requests with higher priority integer values will be scheduled first by default") and
``--schedule-low-priority-values-first`` (lower first, as vLLM); a value given to either is refused, as argparse
would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from turnout.core.llamacpp_flags import InvalidLlamaArgs, LlamaSettings, llama_name, settings
from turnout.core.priority import Ordering

__all__ = ["EngineArgs", "InvalidEngineArgs", "flag_names", "judge_engine_args", "schedules_by_priority"]


class InvalidEngineArgs(ValueError):
    """Args the engine would refuse, or Turnout does not allow; the message names the flag and what to write."""


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """The judged args: the canonical names of the flags a rule knows, the parallel sizes, and for llama.cpp
    what its server is set to."""

    engine: str
    names: frozenset[str]
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    llama: LlamaSettings | None = None
    # how it orders requests by their own priority (vLLM's --scheduling-policy priority: lower first; SGLang's
    # --enable-priority-scheduling: higher first, unless --schedule-low-priority-values-first); None: it does not
    priority: Ordering | None = None

    @property
    def gpus(self) -> int:
        """GPUs one engine takes: tensor x pipeline parallel size."""
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True, slots=True)
class _Option:
    """An argparse option of vLLM or SGLang: its option strings (the first canonical) and the rule about it
    (None: an option that only matters because it shares a prefix with one that has a rule)."""

    strings: tuple[str, ...]
    rule: str | None = None


_MANAGED = "managed"
_VLLM = (
    _Option(("--tensor-parallel-size", "-tp"), "tp"),
    _Option(("--pipeline-parallel-size", "-pp"), "pp"),
    _Option(("--data-parallel-size", "-dp"), "dp"),
    _Option(("--data-parallel-size-local", "-dpl"), "dp"),
    _Option(("--gpu-memory-utilization",), "gpu-memory"),
    _Option(("--model",), _MANAGED),
    _Option(("--served-model-name",), _MANAGED),
    _Option(("--host",), _MANAGED),
    _Option(("--port",), _MANAGED),
    _Option(("--config",), "config"),
    _Option(("--enable-sleep-mode",)),
    _Option(("--no-enable-sleep-mode",)),
    _Option(("--scheduling-policy",), "policy"),
    # neighbours (vllm/engine/arg_utils.py): they make some prefixes ambiguous, which vLLM refuses
    _Option(("--data-parallel-rank", "-dpn")),
    _Option(("--data-parallel-start-rank", "-dpr")),
    _Option(("--data-parallel-address", "-dpa")),
    _Option(("--data-parallel-rpc-port", "-dpp")),
    _Option(("--data-parallel-backend", "-dpb")),
    _Option(("--data-parallel-hybrid-lb", "-dph")),
    _Option(("--data-parallel-external-lb", "-dpe")),
    _Option(("--decode-context-parallel-size", "-dcp")),
    _Option(("--prefill-context-parallel-size", "-pcp")),
    _Option(("--enable-expert-parallel", "-ep")),
    _Option(("--scheduler-cls",)),
    _Option(("--scheduler-reserve-full-isl",)),
)
_POLICIES = ("fcfs", "priority")  # vllm/config/scheduler.py: SchedulerPolicy
_SGLANG = (
    _Option(("--tp-size", "--tensor-parallel-size"), "tp"),
    _Option(("--pp-size", "--pipeline-parallel-size"), "pp"),
    _Option(("--dp-size", "--data-parallel-size"), "dp"),
    _Option(("--gpu-memory-utilization",), "gpu-memory"),  # not SGLang's; refused on every engine
    _Option(("--model-path", "--model"), _MANAGED),
    _Option(("--served-model-name",), _MANAGED),
    _Option(("--host",), _MANAGED),
    _Option(("--port",), _MANAGED),
    _Option(("--config",), "config"),
    _Option(("--enable-priority-scheduling",), "priority-switch"),
    _Option(("--schedule-low-priority-values-first",), "low-first-switch"),
    # neighbours (python/sglang/srt/server_args.py)
    _Option(("--schedule-policy",)),
    _Option(("--schedule-conservativeness",)),
    _Option(("--enable-p2p-check",)),
    _Option(("--pp-max-micro-batch-size",)),
    _Option(("--pp-async-batch-depth",)),
    _Option(("--dcp-size", "--decode-context-parallel-size")),
)
_OPTIONS = {"vllm": _VLLM, "sglang": _SGLANG}
_ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def _spelled(engine: str, name: str) -> str:
    """The name as the engine's parser looks it up (vLLM: a ``--`` name's underscores are dashes, up to a dot)."""
    if engine == "vllm" and name.startswith("--"):
        head, dot, rest = name[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + rest
    return name


def _resolve(engine: str, written: str) -> _Option | None:
    """The option argparse takes ``written`` (a name, no value) for: exact, else the one option it is a prefix
    of. None: an option no rule is about. :class:`InvalidEngineArgs` for an ambiguous prefix of one that is."""
    name = _spelled(engine, written)
    options = _OPTIONS[engine]
    for option in options:
        if name in option.strings:
            return option
    dashes = "--" if name.startswith("--") else "-"
    found = {o.strings[0]: o for o in options for s in o.strings if s.startswith(name) and s.startswith(dashes)}
    if len(name) <= len(dashes) or not found:
        return None
    if len(found) > 1:
        if any(o.rule for o in found.values()):
            raise InvalidEngineArgs(
                f"{written} is an abbreviation {_ENGINE_NAMES[engine]} cannot resolve (it could be "
                f"{' or '.join(sorted(found))}): write the whole name"
            )
        return None
    return next(iter(found.values()))


def _split(written: str, value: str) -> tuple[str, str]:
    """``--flag=value`` (argparse takes it for long and short options) as name and value."""
    if written.startswith("-") and "=" in written:
        name, inline = written.split("=", 1)
        if value != "":
            raise InvalidEngineArgs(f"{written} carries its value and has another ({value!r}): give one")
        return name, inline
    return written, value


def _size(written: str, value: str, rule: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise InvalidEngineArgs(f"engineConfig.args[{written}] must be an integer, got {value!r}") from None
    if size < 1:
        raise InvalidEngineArgs(f"engineConfig.args[{written}] must be at least 1")
    if rule == "dp" and size != 1:
        raise InvalidEngineArgs(f"{written}: the data parallel size must be 1 (got {size}); use one claim per replica")
    return size


def flag_names(engine: str, args: Mapping[str, str]) -> frozenset[str]:
    """The canonical names of the flags in ``args`` that a rule knows (``--no-enable-sleep-mode`` in any vLLM
    spelling, say), without judging values: for args that were judged when they were accepted."""
    if engine not in _OPTIONS:
        return frozenset()
    names = set()
    for written in args:
        try:
            option = _resolve(engine, written.split("=", 1)[0])
        except InvalidEngineArgs:
            continue
        if option is not None:
            names.add(option.strings[0])
    return frozenset(names)


def _judge_llama(args: Mapping[str, str]) -> EngineArgs:
    if "--gpu-memory-utilization" in (llama_name(k.split("=", 1)[0]) for k in args):
        raise InvalidEngineArgs("--gpu-memory-utilization is not allowed: the pool shares GPU memory through kvcached")
    try:
        judged = settings(args.items(), claim=True)
    except InvalidLlamaArgs as exc:
        raise InvalidEngineArgs(str(exc)) from None
    return EngineArgs("llamacpp", judged.flags, llama=judged)


def judge_engine_args(engine: str, args: Mapping[str, str]) -> EngineArgs:
    """Judge a claim's ``engineConfig.args`` for ``engine`` (one of vllm, sglang, llamacpp) in every spelling the
    engine takes; :class:`InvalidEngineArgs` names the first flag that breaks a rule and what to write."""
    if engine == "llamacpp":
        return _judge_llama(args)
    label = _ENGINE_NAMES[engine]
    seen: dict[str, str] = {}
    sizes = {"tp": 1, "pp": 1}
    policy = "fcfs"
    switches: set[str] = set()
    for key, raw in args.items():
        written, value = _split(key, raw)
        option = _resolve(engine, written)
        if option is None:
            if engine == "sglang" and written.startswith("--") and "_" in written:
                dashed = _resolve(engine, "--" + written[2:].replace("_", "-"))
                if dashed is not None and dashed.rule:
                    raise InvalidEngineArgs(f"{written}: SGLang reads dashes only: write {dashed.strings[0]}")
            continue
        canonical = option.strings[0]
        if canonical in seen:
            raise InvalidEngineArgs(f"{seen[canonical]} and {key} are the same {label} flag ({canonical}): give one")
        seen[canonical] = key
        said = key if written == canonical else f"{key} ({label}'s {canonical})"
        if option.rule == "gpu-memory":
            raise InvalidEngineArgs(f"{said} is not allowed: the pool shares GPU memory through kvcached")
        if option.rule == _MANAGED:
            raise InvalidEngineArgs(
                f"{said} is set by Turnout (the model from spec.artifactURL, the served name from spec.modelName, "
                "host and port from the runtime agent); remove it from the args"
            )
        if option.rule == "config":
            raise InvalidEngineArgs(f"{said}: a config file's flags cannot be checked; put them in engineConfig.args")
        if option.rule in ("tp", "pp", "dp"):
            size = _size(said, value, option.rule)
            if option.rule != "dp":
                sizes[option.rule] = size
        if option.rule == "policy":
            if value not in _POLICIES:
                raise InvalidEngineArgs(f"{said} must be fcfs or priority, got {value!r}")
            policy = value
        if option.rule in ("priority-switch", "low-first-switch"):
            if value != "":
                raise InvalidEngineArgs(f'{said} is a switch: give it "" (no value), got {value!r}')
            switches.add(option.rule)
    ordering = None
    if policy == "priority":
        ordering = Ordering.LOW_FIRST
    elif "priority-switch" in switches:
        ordering = Ordering.LOW_FIRST if "low-first-switch" in switches else Ordering.HIGH_FIRST
    return EngineArgs(engine, frozenset(seen), sizes["tp"], sizes["pp"], priority=ordering)


def schedules_by_priority(engine: str, args: Mapping[str, str]) -> Ordering | None:
    """How an engine started with ``args`` (judged when its claim was accepted) orders requests by their own
    priority: vLLM's ``--scheduling-policy priority`` in any spelling, SGLang's ``--enable-priority-scheduling``
    (higher values first, unless ``--schedule-low-priority-values-first``). None: it does not (or args it would
    refuse)."""
    if engine not in _OPTIONS:
        return None
    try:
        return judge_engine_args(engine, args).priority
    except InvalidEngineArgs:
        return None
