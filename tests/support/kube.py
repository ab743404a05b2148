"""A real Kubernetes API server (v1.20, built once by scripts/kube-apiserver) and etcd on loopback.

Nothing runs pods (no scheduler, controller-manager or kubelet): tests create Pod objects and set their
status themselves, as envtest does.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.services import _free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class KubeServer:
    url: str
    token: str
    kubeconfig: Path


def _binary() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "kube-apiserver")], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kube-apiserver is not available: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def _wait_ready(url: str, token: str, proc: subprocess.Popen[bytes], log: Path, limit_s: float = 90) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kube-apiserver exited: {log.read_text()[-2000:]}")
        req = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"})
        with contextlib.suppress(OSError), urllib.request.urlopen(req, context=ctx, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"kube-apiserver not ready in {limit_s}s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def kube_apiserver() -> Iterator[KubeServer]:
    etcd = shutil.which("etcd")
    if etcd is None:
        raise RuntimeError("etcd not found: install etcd-server (scripts/test does)")
    binary = _binary()
    base = Path(tempfile.mkdtemp(prefix="turnout-kube-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs = contextlib.ExitStack()
    try:
        client_port, peer_port, secure_port = _free_port(), _free_port(), _free_port()
        etcd_log = logs.enter_context((base / "etcd.log").open("wb"))
        procs.append(
            subprocess.Popen(
                [
                    etcd,
                    "--name=turnout-test",
                    f"--data-dir={base / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{client_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{client_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster=turnout-test=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync",
                ],
                stdout=etcd_log,
                stderr=subprocess.STDOUT,
            )
        )
        token = secrets.token_hex(16)
        (base / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (base / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            )
        )
        (base / "sa.pub").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        log = base / "apiserver.log"
        procs.append(
            subprocess.Popen(
                [
                    binary,
                    f"--etcd-servers=http://127.0.0.1:{client_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={secure_port}",
                    f"--cert-dir={base / 'certs'}",
                    f"--token-auth-file={base / 'tokens.csv'}",
                    "--authorization-mode=RBAC",  # the operator's own ClusterRole is what its tests run with
                    "--disable-admission-plugins=ServiceAccount",  # no token controller runs here
                    f"--service-account-key-file={base / 'sa.pub'}",
                    f"--service-account-signing-key-file={base / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    "--enable-priority-and-fairness=false",
                ],
                stdout=logs.enter_context(log.open("wb")),
                stderr=subprocess.STDOUT,
            )
        )
        url = f"https://127.0.0.1:{secure_port}"
        _wait_ready(url, token, procs[-1], log)
        ca = base / "certs" / "apiserver.crt"  # self-signed by the server for 127.0.0.1 and localhost
        kubeconfig = base / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {{server: '{url}', certificate-authority: '{ca}'}}}}]\n"
            f"users: [{{name: admin, user: {{token: '{token}'}}}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: admin, namespace: default}}]\n"
            "current-context: test\n"
        )
        yield KubeServer(url, token, kubeconfig)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        logs.close()
        shutil.rmtree(base, ignore_errors=True)
