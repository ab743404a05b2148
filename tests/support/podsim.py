"""A container from deploy/ started the way a kubelet starts it, without a container runtime: in its own network,
PID and mount namespaces (``unshare``), with the pod IP on its loopback device, an empty tmpfs on each volume
mount path (configMap files written into it), the image's user, the manifest's env, and the image's ENTRYPOINT +
the manifest's args as PID 1. Probes and clients reach it at the pod IP from a thread that joined its network
namespace (``setns`` changes only the calling thread), as the kubelet reaches a pod.

Needs root (CAP_SYS_ADMIN), as CI and the developers' machines have. Run as a script, it is the in-namespace
half: ``python -m tests.support.podsim SPEC.json`` sets the namespace up and execs the container's command."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000


@dataclass
class Pod:
    argv: list[str]
    env: dict[str, str]
    pod_ip: str
    mounts: dict[str, dict[str, str]]  # mount path -> {file name: content} (empty: an emptyDir)
    user: tuple[int, int] | None = None
    log: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    _created: list[Path] = field(default_factory=list)
    _net: ThreadPoolExecutor | None = None

    def start(self, spec_file: Path) -> None:
        for path in self.mounts:  # a mount point must exist; make the missing ones (removed again in stop())
            p = Path(path)
            missing = [q for q in [p, *p.parents] if not q.exists()]
            p.mkdir(parents=True, exist_ok=True)
            self._created.extend(missing)  # deepest first
        spec = {
            "argv": self.argv,
            "env": self.env,
            "pod_ip": self.pod_ip,
            "mounts": self.mounts,
            "user": self.user,
        }
        spec_file.write_text(json.dumps(spec))
        out = (self.log or spec_file.with_suffix(".log")).open("wb")
        self.process = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--pid",
                "--fork",
                "--mount",
                "--mount-proc",
                sys.executable,
                __file__,
                str(spec_file),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        out.close()

    @property
    def init_pid(self) -> int:
        """The host PID of the pod's PID 1 (the process unshare forked)."""
        assert self.process is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            with contextlib.suppress(OSError):
                pids = children.read_text().split()
                if pids:
                    return int(pids[0])
            if self.process.poll() is not None:
                raise AssertionError(f"the pod exited with {self.process.returncode}")
            time.sleep(0.05)
        raise AssertionError("unshare forked no child")

    def descendants(self) -> dict[int, str]:
        """Host PID -> command line of every process in the pod."""
        out: dict[int, str] = {}
        todo = [self.init_pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo.extend(int(c) for c in (task / "children").read_text().split())
        return out

    def net(self) -> ThreadPoolExecutor:
        """A one-thread executor whose thread lives in the pod's network namespace."""
        if self._net is None:
            ns = f"/proc/{self.init_pid}/ns/net"

            def enter() -> None:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(ns, os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns into the pod's network namespace")
                finally:
                    os.close(fd)

            self._net = ThreadPoolExecutor(max_workers=1, initializer=enter)
        return self._net

    def http(self, method: str, url: str, body: Any = None, timeout_s: float = 5) -> tuple[int, Any]:
        """One HTTP call from inside the pod's network (status, decoded JSON or text); 0 when nothing answered."""

        def call() -> tuple[int, Any]:
            data = None if body is None else json.dumps(body).encode()
            request = urllib.request.Request(
                url, data=data, method=method, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as r:
                    raw = r.read()
                    status = r.status
            except urllib.error.HTTPError as exc:
                raw, status = exc.read(), exc.code
            except OSError:
                return 0, None
            try:
                return status, json.loads(raw)
            except ValueError:
                return status, raw.decode(errors="replace")

        return self.net().submit(call).result()

    def until(self, method: str, url: str, ok: Any, limit_s: float = 60, body: Any = None) -> Any:
        deadline = time.monotonic() + limit_s
        last: tuple[int, Any] = (0, None)
        while time.monotonic() < deadline:
            last = self.http(method, url, body)
            if ok(*last):
                return last[1]
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{method} {url}: last answer {last!r}; pod log:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log and self.log.exists() else ""

    def stop(self) -> None:
        if self._net is not None:
            self._net.shutdown(wait=False)
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(AssertionError, ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)  # PID 1 gone: the kernel ends the whole PID namespace
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for path in self._created:
            with contextlib.suppress(OSError):
                path.rmdir()


@contextlib.contextmanager
def running(p: Pod, spec_dir: Path) -> Iterator[Pod]:
    """Start ``p`` (its spec and log in ``spec_dir``) and stop it, with everything in it, on the way out."""
    p.log = spec_dir / "pod.log"
    try:
        p.start(spec_dir / "pod.json")
        yield p
    finally:
        p.stop()


def _inside(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    ip = shutil.which("ip") or "/usr/sbin/ip"
    subprocess.run([ip, "link", "set", "lo", "up"], check=True)
    subprocess.run([ip, "addr", "add", f"{spec['pod_ip']}/32", "dev", "lo"], check=True)
    user = spec["user"]
    for path, files in spec["mounts"].items():
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path], check=True)
        for name, content in files.items():
            (Path(path) / name).write_text(content)
        if user:
            os.chown(path, user[0], user[1])  # fsGroup/ownership: the image's user can write its volumes
    env = {**spec["env"]}
    if user:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
    sys.stdout.flush()
    os.execvpe(spec["argv"][0], spec["argv"], env)


if __name__ == "__main__":
    _inside(sys.argv[1])
