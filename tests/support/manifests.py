"""The manifests in deploy/ as a kubelet would see them: objects by kind, pod templates, the command each container
runs (its image's ENTRYPOINT from the Dockerfile that builds it, then the manifest's args, with ``$(VAR)``
expanded from the container's env as the kubelet does), and label selectors. Used by tests/deploy."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Which Dockerfile builds which image name used in the manifests (docs/runtime-pools.md and the Dockerfiles'
# headers say the same).
IMAGES = {"turnout": DEPLOY / "Dockerfile", "turnout-runtime": DEPLOY / "runtime.Dockerfile"}


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc.get("kind") == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects(kind) if o["metadata"]["name"] == name]
    return found


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if (
            (op == "In" and not (present and labels[key] in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def image_name(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return name.split("@", 1)[0].split(":", 1)[0]


def dockerfile_exec(path: Path, instruction: str) -> list[str]:
    """The exec form (a JSON list) of the last ENTRYPOINT or CMD in a Dockerfile; the shell form is refused."""
    found: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith(instruction + " "):
            value = json.loads(line[len(instruction) + 1 :])
            assert isinstance(value, list), f"{path.name}: {instruction} must use the exec form"
            found = [str(v) for v in value]
    return found


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args: a defined variable is replaced, an undefined one stays."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


@dataclass(frozen=True)
class Container:
    workload: str
    namespace: str
    spec: dict[str, Any]
    pod: dict[str, Any]  # the pod template spec
    labels: dict[str, str]

    @property
    def image(self) -> str:
        return image_name(self.spec["image"])

    def env(self, pod_ip: str) -> dict[str, str]:
        """The container's env as the kubelet sets it; status.podIP from the downward API is ``pod_ip``."""
        out: dict[str, str] = {}
        for item in self.spec.get("env") or []:
            if "value" in item:
                out[item["name"]] = expand(str(item["value"]), out)
            else:
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                assert field == "status.podIP", f"{self.workload}: downward API field {field} not simulated"
                out[item["name"]] = pod_ip
        return out

    def argv(self, pod_ip: str) -> list[str]:
        """What the container runs: ENTRYPOINT (or the manifest's command) + args (or the image's CMD)."""
        dockerfile = IMAGES[self.image]
        env = self.env(pod_ip)
        command = self.spec.get("command") or dockerfile_exec(dockerfile, "ENTRYPOINT")
        args = self.spec["args"] if "args" in self.spec else dockerfile_exec(dockerfile, "CMD")
        return [expand(str(a), env) for a in [*command, *args]]

    def port(self, ref: int | str) -> int:
        if isinstance(ref, int):
            return ref
        for p in self.spec.get("ports") or []:
            if p.get("name") == ref:
                return int(p["containerPort"])
        raise AssertionError(f"{self.workload}/{self.spec['name']}: no container port named {ref!r}")

    def probes(self) -> dict[str, dict[str, Any]]:
        return {k: self.spec[k] for k in ("readinessProbe", "livenessProbe", "startupProbe") if k in self.spec}

    def mounts(self) -> dict[str, dict[str, Any]]:
        """mountPath -> the volume behind it."""
        volumes = {v["name"]: v for v in self.pod.get("volumes") or []}
        return {m["mountPath"]: volumes[m["name"]] for m in self.spec.get("volumeMounts") or []}


def containers() -> list[Container]:
    out = []
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        for obj in objects(kind):
            template = obj["spec"]["template"]
            for spec in template["spec"]["containers"]:
                out.append(
                    Container(
                        workload=obj["metadata"]["name"],
                        namespace=obj["metadata"].get("namespace", "default"),
                        spec=spec,
                        pod=template["spec"],
                        labels=template["metadata"].get("labels") or {},
                    )
                )
    return out


def container(workload: str) -> Container:
    (found,) = [c for c in containers() if c.workload == workload]
    return found
