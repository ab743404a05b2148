"""llama.cpp's own HTTP server (llama-server) from the ``xllamacpp`` wheel, as one process the agent supervises.

    python -m turnout.runtime.llamacpp_server --model FILE --host H --port P --alias NAME [llama-server flags]

The command line is llama-server's (:mod:`turnout.core.llamacpp_flags` reads it, as the claim's args were read at
validation); the flags fill an ``xllamacpp.CommonParams``, and ``xllamacpp.Server`` then runs llama.cpp's C++
server (its HTTP routes, slots, continuous batching, prompt cache) inside this process, listening on ``--host``
and ``--port``, until SIGTERM or SIGINT: then the server stops (its main loop ends, the model is freed) and the
process exits 0. A flag it does not take exits 2 before anything loads, a model that does not load exits 1.

No compiler: the wheel is llama.cpp built for the common x86-64 and ARM CPUs (no ``-march=native``), so small
models run as they do with a source build, big ones somewhat slower than a native build would.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from turnout.core.llamacpp_flags import EnumValue, InvalidLlamaArgs, LlamaSettings, parse_argv

__all__ = ["build_params", "main"]

PROG = "turnout.runtime.llamacpp_server"


def _value(xllamacpp: Any, field: str, value: Any) -> Any:
    if isinstance(value, EnumValue):
        return getattr(getattr(xllamacpp, value.enum), value.member)
    if field.endswith("n_threads") and value <= 0:  # llama.cpp: 0 or less is every core (common/arg.cpp)
        return os.cpu_count() or 1
    if field == "lora_adapters":
        return [xllamacpp.CommonAdapterLoraInfo(path, scale) for path, scale in value]
    return value


def build_params(xllamacpp: Any, settings: LlamaSettings) -> Any:
    """An ``xllamacpp.CommonParams`` set as the command line says (llama-server's defaults for the rest; its
    slots are automatic, ``-1``, unless ``--parallel`` says otherwise)."""
    params = xllamacpp.CommonParams()
    params.n_parallel = -1  # llama-server's own default (server: 4 slots sharing one KV cache)
    for field, value in settings.assignments:
        *path, last = field.split(".")
        target = params
        for part in path:
            target = getattr(target, part)
        new = _value(xllamacpp, field, value)
        if field == "sampling.user_sampling_config":  # a bit per sampling default the command line set
            new = int(target.user_sampling_config) | int(new)
        elif field == "default_template_kwargs":
            new = {**params.default_template_kwargs, **new}
        setattr(target, last, new)
        if path:  # nested objects are copies: write the changed one back
            setattr(params, path[0], target)
    for field, file in settings.files:
        setattr(params, field, Path(file).read_text())
    return params


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_argv(sys.argv[1:] if argv is None else argv)
    except InvalidLlamaArgs as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if not settings.value("model.path"):
        print(f"{PROG}: --model FILE is required", file=sys.stderr)
        return 2
    import xllamacpp  # the C++ library: loaded only for a command line that will run

    params = build_params(xllamacpp, settings)
    try:
        server = xllamacpp.Server(params)  # returns once the model is loaded and the server listens
    except (RuntimeError, OSError) as exc:
        print(f"{PROG}: llama.cpp did not start: {exc}", file=sys.stderr)
        return 1
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    # llama.cpp installed its own SIGINT/SIGTERM handlers while starting (they end the main loop but leave this
    # process waiting): Python's take over again, so a signal stops the server and then ends the process.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"{PROG}: llama.cpp's server is listening on {server.listening_address}", file=sys.stderr, flush=True)
    stopping.wait()
    del server  # terminates llama.cpp's main loop, waits for it, frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())
