"""The backup manifest and member rules, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.core.backup_manifest import BackupInvalid, Member, check_members, member_problem, parse_manifest

SHA = "a" * 64
KNOWN = {"0001", "0002"}


def doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "format": "turnout-backup",
        "format_version": 1,
        "turnout_version": "0.1.0",
        "created_at": "2026-12-03T12:00:00Z",
        "schema_revision": "0002",
        "store": "sqlite",
        "secret_key_included": False,
        "secret_key_fingerprint": None,
        "claims_included": True,
        "files": [
            {"path": "config.json", "size": 10, "sha256": SHA},
            {"path": "store/turnout.db", "size": 4096, "sha256": SHA},
            {"path": "claims/a.json", "size": 5, "sha256": SHA},
        ],
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("config.json", None),
        ("claims/qwen3-8b.json", None),
        ("store/usage_rollup.jsonl", None),
        ("../config.json", "escapes the data dir"),
        ("claims/../../etc/passwd", "escapes the data dir"),
        ("/etc/passwd", "absolute path"),
        ("C:/Windows/x", "absolute path"),
        ("claims\\x.json", "backslash"),
        ("claims//x.json", "empty or '.'"),
        ("./config.json", "empty or '.'"),
        ("claims/.hidden.json", "never writes"),
        ("", "empty member name"),
        ("a\x00b", "control character"),
    ],
)
def test_member_names(name: str, problem: str | None) -> None:
    found = member_problem(name)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_a_good_manifest() -> None:
    manifest = parse_manifest(doc(), KNOWN)
    assert manifest.claims == ["a"] and manifest.tables == [] and manifest.file("config.json") is not None
    assert parse_manifest(manifest.to_json(), KNOWN) == manifest


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "zip"}, "not a Turnout backup"),
        ({"format_version": 2}, "format version 2"),
        ({"schema_revision": "0003"}, "'0003' (Turnout 0.1.0) is unknown"),
        ({"schema_revision": 3}, "schema_revision"),
        ({"store": "mysql"}, "'store' must be one of"),
        ({"secret_key_included": "no"}, "secret_key_included"),
        ({"secret_key_included": True}, "does not match whether secret.key is listed"),
        ({"secret_key_fingerprint": "xyz"}, "16 hex digits"),
        ({"claims_included": False}, "claims are listed"),
        ({"files": "all"}, "'files' must be"),
        ({"files": [{"path": "store/turnout.db", "size": 1, "sha256": SHA}]}, "no config.json"),
        ({"files": [{"path": "config.json", "size": -1, "sha256": SHA}]}, "size must be a byte count"),
        ({"files": [{"path": "config.json", "size": True, "sha256": SHA}]}, "size must be a byte count"),
        ({"files": [{"path": "config.json", "size": 1, "sha256": "ABC"}]}, "64 lowercase hex"),
        ({"files": [{"path": "config.json", "size": 1}]}, "path, size and sha256"),
        ({"files": [{"path": "../x", "size": 1, "sha256": SHA}]}, "escapes the data dir"),
        ({"files": [{"path": "notes.txt", "size": 1, "sha256": SHA}]}, "not a file a Turnout backup holds"),
        ({"files": [{"path": "manifest.json", "size": 1, "sha256": SHA}]}, "not a file a Turnout backup holds"),
        (
            {
                "files": [
                    {"path": "config.json", "size": 1, "sha256": SHA},
                    {"path": "config.json", "size": 1, "sha256": SHA},
                ]
            },
            "listed twice",
        ),
        ({"files": [{"path": "config.json", "size": 1, "sha256": SHA}]}, "a SQLite backup holds"),
        ({"store": "postgresql"}, "a PostgreSQL backup holds"),
    ],
)
def test_bad_manifests(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(BackupInvalid, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_manifest(doc(**changes), KNOWN)


def test_not_an_object() -> None:
    with pytest.raises(BackupInvalid, match="not a JSON object"):
        parse_manifest([], KNOWN)


GOOD = [
    Member("manifest.json", 100),
    Member("config.json", 10),
    Member("store/turnout.db", 4096),
    Member("claims/a.json", 5),
]


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (GOOD, None),
        ([*GOOD, Member("claims/b.json", 5)], "not listed in the manifest"),
        (GOOD[:-1], "lacks files its manifest lists: claims/a.json"),
        ([*GOOD[:-1], Member("claims/a.json", 6)], "is 6 bytes, the manifest says 5"),
        ([*GOOD, Member("config.json", 10)], "twice"),
        ([*GOOD, Member("claims/", 0, is_dir=True)], "directory entry"),
        ([*GOOD[:-1], Member("claims/a.json", 5, is_symlink=True)], "symbolic link"),
        ([*GOOD, Member("../../x", 1)], "escapes the data dir"),
        ([*GOOD, Member("/abs", 1)], "absolute path"),
    ],
)
def test_members_against_the_manifest(members: list[Member], message: str | None) -> None:
    manifest = parse_manifest(doc(), KNOWN)
    if message is None:
        check_members(manifest, members)
        return
    with pytest.raises(BackupInvalid, match=message):
        check_members(manifest, members)
