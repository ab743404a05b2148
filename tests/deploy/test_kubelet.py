"""The containers of deploy/ run as a kubelet would run them (tests/support/podsim.py: own network, PID and
mount namespaces, the pod IP, volumes at their mount paths, the image's ENTRYPOINT + the manifest's args, the
image's user), and are probed at the pod IP:

- the warm pool (deploy/warm-pool.yaml + deploy/runtime.Dockerfile): tini is PID 1, the readiness probe answers
  at the pod IP, an engine the agent starts answers at the pod IP, a SIGKILLed agent is restarted by the loop and
  re-adopts the engine (same PID), and the pod's SIGTERM ends the loop;
- the gateway (deploy/gateway.yaml + deploy/Dockerfile): with its ConfigMap and volume, it
  answers its readiness probe at the pod IP."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runtime.test_agent import activate_body
from tests.support.manifests import IMAGES, ROOT, container, named
from tests.support.podsim import Pod, running

POD_IP = "10.244.0.5"  # inside the pod's own network namespace only


def _image_env() -> dict[str, str]:
    """What the image's own ENV gives a container here: turnout on PATH (this checkout's, on PYTHONPATH)."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": "/root"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _host_path(image: str, path: str) -> str:
    """A path inside the image -> the file on this machine that the Dockerfile puts there."""
    if Path(path).name == "tini":
        found = shutil.which("tini")
        assert found, "tini is not installed (scripts/test installs it)"
        return found
    copied = re.search(rf"^COPY (\S+) {re.escape(path)}$", IMAGES[image].read_text(), re.M)
    if copied:
        return str(ROOT / copied.group(1))
    return path


def _usable() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the kubelet tests need root and unshare (util-linux): run them as CI does")


def _pod_for(workload: str, tmp: Path, files: dict[str, dict[str, str]] | None = None, **kw: Any) -> Pod:
    c = container(workload)
    argv = [_host_path(c.image, a) for a in c.argv(POD_IP)]
    mounts = {path: (files or {}).get(path, {}) for path in c.mounts()}
    return Pod(argv=argv, env={**_image_env(), **c.env(POD_IP)}, pod_ip=POD_IP, mounts=mounts, **kw)


def _probe_url(workload: str, kind: str = "readinessProbe") -> str:
    c = container(workload)
    get = c.probes()[kind]["httpGet"]
    return f"http://{POD_IP}:{c.port(get['port'])}{get['path']}"


def test_warm_pool_pod_serves_at_its_ip_and_survives_an_agent_crash(tmp_path: Path, tiny_model: Path) -> None:
    _usable()
    spec = _pod_for("warm-runtime-pool", tmp_path)
    assert Path(spec.argv[0]).name == "tini", spec.argv
    with running(spec, tmp_path) as p:
        p.until("GET", _probe_url("warm-runtime-pool"), lambda status, _: status == 200)
        assert "tini" in p.descendants()[p.init_pid], "tini is PID 1"

        agent = f"http://{POD_IP}:{container('warm-runtime-pool').port('runtime')}"
        body = activate_body("alpha", tiny_model, operation_id="kubelet-1")
        status, answer = p.http("POST", f"{agent}/v1/runtime/models/activate", body)
        assert status == 200, answer
        engine = p.until(
            "GET",
            f"{agent}/v1/runtime/models",
            lambda s, b: s == 200 and any(m.get("phase") == "active" for m in b["models"]),
            limit_s=180,
        )["models"][0]
        chat = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, _ = p.http("POST", f"http://{POD_IP}:{engine['port']}/v1/chat/completions", chat, timeout_s=30)
        assert status == 200, "the engine answers at the pod IP, where the gateway reaches it"

        agents = [pid for pid, cmd in p.descendants().items() if re.search(r"turnout agent|-m turnout agent", cmd)]
        assert len(agents) == 1, p.descendants()
        os.kill(agents[0], signal.SIGKILL)
        status, _ = p.http("POST", f"http://{POD_IP}:{engine['port']}/v1/chat/completions", chat, timeout_s=30)
        assert status == 200, "the engine keeps serving while no agent runs"

        def readopted(status: int, b: Any) -> bool:
            return status == 200 and any(m.get("phase") == "active" for m in b["models"])

        after = p.until("GET", f"{agent}/v1/runtime/models", readopted, limit_s=120)["models"][0]
        assert after["pid"] == engine["pid"] and after["port"] == engine["port"], "re-adopted, not restarted"
        restarted = [pid for pid, cmd in p.descendants().items() if "turnout agent" in cmd]
        assert restarted and restarted != agents
        assert "restarting it in 1s" in p.log_text()

        os.kill(p.init_pid, signal.SIGTERM)  # the kubelet stopping the pod: tini -> the loop -> the agent
        assert p.process is not None
        p.process.wait(60)


def test_gateway_pod_answers_its_probe_at_its_ip(tmp_path: Path) -> None:
    _usable()
    config_map = named("ConfigMap", "turnout-gateway-config")
    c = container("turnout-gateway")
    (config_mount,) = [
        p for p, v in c.mounts().items() if v.get("configMap", {}).get("name") == "turnout-gateway-config"
    ]
    settings = dict(config_map["data"])
    # No API server reaches this pod: the gateway reads claims through a kubeconfig that points nowhere (in a
    # cluster it uses its service account); its own probes must not depend on the cluster answering.
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    settings["kubeconfig"] = yaml.safe_dump(kubeconfig)
    spec = _pod_for("turnout-gateway", tmp_path, files={config_mount: settings})
    spec.env["KUBECONFIG"] = f"{config_mount}/kubeconfig"
    with running(spec, tmp_path) as p:
        p.until("GET", _probe_url("turnout-gateway"), lambda status, _: status == 200, limit_s=60)
        started = time.monotonic()
        status, _ = p.http("GET", f"http://{POD_IP}:{c.port('http')}/v1/models")
        assert status == 401 and time.monotonic() - started < 30, "client routes need a key off loopback"
