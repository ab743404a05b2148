"""Artifacts the agent stages before it starts an engine: ``s3://BUCKET/KEY`` downloads.

vLLM, SGLang and llama.cpp read a local path or a Hugging Face id, not ``s3://`` (vLLM only through its Run:ai
streamer load format), so the agent downloads the artifact first, as AIBrix's runtime does (vllm-project/aibrix
``python/aibrix/aibrix/runtime/model_runtime.py``, ``_resolve_model_path``: remote stores are "staged locally"
before the engine starts), and starts the engine on the local copy. ``s3://BUCKET/KEY`` is the object ``KEY``
when there is one, else every object under ``KEY/`` (a model directory: config, tokenizer, safetensors).

With boto3 (``pip install 'turnout[s3]'``; the runtime image has it), whose default chain finds the credentials
in the environment: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
a web identity (IRSA, EKS Pod Identity), the instance's role; ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``)
for an S3-compatible server (MinIO, Ceph, Cloud Storage's XML API), ``AWS_REGION`` for the region.

Each download goes into a new directory beside its destination and is renamed into place when every byte has
arrived (a partial download is never taken for a complete one, and an agent that dies midway leaves only that
directory, removed by the next try); a destination that exists is complete and is used as it is (delete it to
fetch the artifact again). :class:`Progress` counts the bytes as they arrive, for the agent's snapshot and the
claim's status; setting ``cancelled`` stops a download at its next chunk.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["ArtifactError", "Progress", "boto3_missing", "fetch_s3", "s3_destination"]


class ArtifactError(Exception):
    """The artifact could not be staged; the message says what to change."""


@dataclass
class Progress:
    """A download as it goes (updated from boto3's transfer threads; read by the event loop)."""

    url: str
    done: int = 0  # bytes arrived
    total: int | None = None  # bytes in all, once the listing is read
    files: int = 0  # objects complete
    files_total: int | None = None
    cancelled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, amount: int) -> None:
        if self.cancelled:
            raise ArtifactError(f"the download of {self.url} was stopped")
        with self._lock:
            self.done += amount

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "bytes_done": self.done,
            "bytes_total": self.total,
            "files_done": self.files,
            "files_total": self.files_total,
        }


def boto3_missing() -> str | None:
    """Why this agent cannot download ``s3://`` (boto3 is not installed), or None."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        return (
            "s3:// artifacts are downloaded by the agent with boto3, which its Python does not have: "
            "pip install 'turnout[s3]' (the runtime image has it)"
        )
    return None


def s3_destination(root: Path, url: str) -> Path:
    """Where ``s3://BUCKET/KEY`` is staged under ``root``: ``root/s3/BUCKET/<KEY, percent-encoded>`` (one name
    per key, so that the artifacts ``s3://b/models`` and ``s3://b/models/m`` never lie inside each other; the
    whole bucket is ``%2F``). The URL is valid: :func:`turnout.core.runtime.artifact_problem` refused bucket
    names that could leave ``root``."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return root / "s3" / bucket / (quote(key.strip("/"), safe="") or "%2F")


def fetch_s3(url: str, root: Path, progress: Progress, client: S3Client | None = None) -> Path:
    """Download ``s3://BUCKET/KEY`` under ``root`` (:func:`s3_destination`) unless it is there already; the local
    path (a file for one object, a directory for a prefix). Blocking: run it in a thread. Raises
    :class:`ArtifactError` naming what failed and what to change."""
    dest = s3_destination(root, url)
    if dest.exists():
        progress.files_total = progress.files = 0
        progress.total = progress.done
        return dest
    if client is not None:
        return _fetch(url, dest, progress, client)
    s3 = _client()
    try:
        return _fetch(url, dest, progress, s3)
    finally:
        s3.close()  # its connections, now: not whenever the garbage collector gets to them


def _fetch(url: str, dest: Path, progress: Progress, s3: S3Client) -> Path:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    key = key.strip("/")
    objects = _objects(s3, url, bucket, key)
    progress.total = sum(size for _, size in objects)
    progress.files_total = len(objects)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for left in dest.parent.glob(f".{dest.name}.partial-*"):  # an earlier try that did not finish
        shutil.rmtree(left, ignore_errors=True)
    staging = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    single = objects[0][0] == key  # one object: the staged file is the artifact
    try:
        for name, _ in objects:
            target = (staging / ("object" if single else name[len(key) :].lstrip("/"))).resolve()
            if staging.resolve() not in target.parents:
                raise ArtifactError(f"{url}: the object {name!r} would be written outside {dest}")
            target.parent.mkdir(parents=True, exist_ok=True)
            _download(s3, url, bucket, name, target, progress)
            progress.files += 1
        (staging / "object" if single else staging).replace(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _client() -> S3Client:
    try:
        import boto3
    except ImportError:
        raise ArtifactError(boto3_missing() or "boto3 is missing") from None
    try:  # a session of its own: the credential chain is read afresh for each download (not boto3's default)
        return boto3.session.Session().client("s3")
    except Exception as exc:  # botocore raises several kinds for a bad profile or region
        raise ArtifactError(f"cannot make an S3 client from the environment: {exc}") from None


def _objects(s3: S3Client, url: str, bucket: str, key: str) -> list[tuple[str, int]]:
    """The objects to fetch, (key, size) each: ``key`` itself when it is an object, else everything under it."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if key:
            try:
                head = s3.head_object(Bucket=bucket, Key=key)
                return [(key, int(head["ContentLength"]))]
            except ClientError as exc:
                if _status(exc) != 404:
                    raise
        found: list[tuple[str, int]] = []
        prefix = f"{key}/" if key else ""
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found += [(o["Key"], int(o["Size"])) for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except (ClientError, BotoCoreError) as exc:
        raise ArtifactError(_explain(url, exc)) from None
    if not found:
        raise ArtifactError(f"{url}: there is no object {key!r} and nothing under {prefix!r} in bucket {bucket!r}")
    return sorted(found)


def _download(s3: S3Client, url: str, bucket: str, key: str, target: Path, progress: Progress) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    bodies: list[Any] = []  # the answers' streams, each closed at the end: a stopped one's connection with it

    def keep(parsed: dict[str, Any], **_: Any) -> None:
        if (body := parsed.get("Body")) is not None:
            bodies.append(body)

    s3.meta.events.register("after-call.s3.GetObject", keep)
    try:
        s3.download_file(bucket, key, str(target), Callback=progress.add)
    except (ClientError, BotoCoreError) as exc:
        raise ArtifactError(_explain(url, exc)) from None
    except ArtifactError:
        raise
    except OSError as exc:
        raise ArtifactError(f"{url}: cannot write {target}: {exc.strerror or exc}") from None
    finally:
        s3.meta.events.unregister("after-call.s3.GetObject", keep)
        for body in bodies:  # a download stopped midway leaves its answer half read, its connection out of
            body.close()  # the pool (s3.close() never sees it): closed now, not when the collector finds it


def _status(exc: Any) -> int | None:
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return None


def _explain(url: str, exc: Exception) -> str:
    """A botocore failure in a sentence, with what to change."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return (
            f"cannot download {url}: no AWS credentials in the agent's environment (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or give the pod a role)"
        )
    if isinstance(exc, EndpointConnectionError):
        return f"cannot download {url}: cannot reach the S3 endpoint ({exc}); check AWS_ENDPOINT_URL and the network"
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = _status(exc)
        if code == "NoSuchBucket" or (status == 404 and not code.startswith("NoSuchKey")):
            return f"cannot download {url}: there is no such bucket ({code or status})"
        if status in (401, 403):
            return (
                f"cannot download {url}: access denied ({code or status}): check the credentials and the bucket policy"
            )
        return f"cannot download {url}: {code or status}: {exc}"
    return f"cannot download {url}: {exc}"
