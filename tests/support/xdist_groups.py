"""pytest-xdist scheduling for this suite: each test file whole to one process (as ``--dist loadfile``), and the
files named in one group to the same process, so that they never run at the same time.

xdist's own ``--dist loadgroup`` groups by appending ``@group`` to each item's ``_nodeid``; pytest 9.2 reads an
item's nodeid from elsewhere (``Node._id``), so the suffix is lost and every test is spread as under
``--dist load``: the files that use the same fixed host ports ran at once (a CI run's docs tests found the local
Ollama's port taken by the README's run in the other process). This scheduler decides a test's group from its
file alone, through xdist's scheduler hook (``pytest_xdist_make_scheduler``), and needs nothing of the item."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

__all__ = ["FileGroupScheduling", "scope_of"]


def scope_of(nodeid: str, groups: Mapping[str, str]) -> str:
    """The unit a test goes in: its file's group, or its file (``path::name[params]`` -> ``path``)."""
    path = nodeid.split("::", 1)[0]
    return groups.get(path, path)


class FileGroupScheduling(LoadScopeScheduling):
    """Load scheduling by unit: a file, or a group of files (``groups``: file path, as in nodeids -> group name)."""

    def __init__(self, config: pytest.Config, log: Producer | None, groups: Mapping[str, str]) -> None:
        super().__init__(config, log)
        self.groups = dict(groups)

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid, self.groups)
