"""The node's weight cache as the agent sees it: which artifacts are cached there, and AIBrix's served markers.

Two kinds of entry count as cached: Hugging Face hub directories (``models--ORG--NAME``), and AIBrix's served
markers, ``<cache>/.aibrix/served/<served-name>.json`` holding ``{"model_name", "artifact_url"}``. AIBrix's
runtime writes a marker on every activation and reads the markers back into its snapshot's
``cached_artifacts`` (vllm-project/aibrix ``python/aibrix/aibrix/runtime/model_runtime.py``:
``write_cache_marker``, ``cached_artifacts``); the Turnout agent does both too, so AIBrix and Turnout pods that
share a node cache see each other's weights. A marker is only a locality hint: a missing, unreadable or
malformed one is skipped, and writing one never fails an activation.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from turnout.atomic import write_atomic

__all__ = ["SERVED_MARKERS", "cached_artifacts", "write_served_marker"]

log = logging.getLogger("turnout.agent")

SERVED_MARKERS = Path(".aibrix") / "served"


def cached_artifacts(cache_dir: Path) -> list[str]:
    """Artifact URLs cached under ``cache_dir``: each served marker's ``artifact_url`` as written, and each hub
    entry ``models--ORG--NAME`` (in ``cache_dir`` or its ``hub/``) as ``hf://ORG/NAME`` and
    ``huggingface://ORG/NAME`` (AIBrix's controller compares a claim's ``artifactURL`` with these as plain
    strings)."""
    found: set[str] = set()
    for hub in (cache_dir, cache_dir / "hub"):  # HF_HUB_CACHE itself, or HF_HOME (AIBrix's default) above it
        try:
            entries = list(hub.iterdir())
        except OSError:  # absent (yet), or not readable by this agent
            continue
        for entry in entries:
            if entry.name.startswith("models--") and entry.is_dir():
                ident = entry.name.removeprefix("models--").replace("--", "/")
                found.update((f"hf://{ident}", f"huggingface://{ident}"))
    try:
        markers = sorted((cache_dir / SERVED_MARKERS).glob("*.json"))
    except OSError:
        return sorted(found)
    for marker in markers:
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        url = data.get("artifact_url") if isinstance(data, dict) else None
        if isinstance(url, str) and url:
            found.add(url)
    return sorted(found)


def write_served_marker(cache_dir: Path, model_name: str, artifact_url: str) -> Path | None:
    """Record that ``model_name``'s weights live in this cache (AIBrix's marker format); None when it cannot."""
    directory = (cache_dir / SERVED_MARKERS).resolve()
    path = (directory / f"{model_name}.json").resolve()
    if path.parent != directory:  # a served name with a path in it must not write elsewhere
        log.warning("not writing a cache marker for %r: not a plain file name", model_name)
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"model_name": model_name, "artifact_url": artifact_url}).encode())
    except OSError as exc:  # a read-only or absent cache never blocks an activation
        log.warning("could not write the cache marker for %s: %s", model_name, exc)
        return None
    return path
