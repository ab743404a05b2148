"""llama.cpp's own server (llama-server's HTTP API, from the ``xllamacpp`` wheel) in a process of its own, for
tests that read what it says of itself (``/props``):

    python -m tests.support.xllamacpp_server MODEL PORT [--embedding] [--template FILE]

``--template``: a Jinja chat template (llama.cpp then reads its capabilities: tools, reasoning). The server
listens on 127.0.0.1:PORT until the process is terminated.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("port", type=int)
    parser.add_argument("--embedding", action="store_true")
    parser.add_argument("--template")
    args = parser.parse_args()
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = 512
    params.n_parallel = 1
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.port = args.port
    params.embedding = args.embedding
    if args.template:
        params.use_jinja = True
        params.chat_template = Path(args.template).read_text()
    server = xllamacpp.Server(params)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    main()
