"""One suite run shared by several pytest processes (``TORCH_OVERLAY_TEST_JOBS=N ./build.sh test``,
as CI runs it): each process collects every test, and runs a group of them (a test class, or the
module-level tests of a file) only if it claims the group first, by creating a file named after it
in the folder ``TORCH_OVERLAY_TEST_CLAIMS`` that all the processes share. A process takes the next
unclaimed group when it finishes one, so the work balances itself without recorded durations, and
a class's or a module's fixtures are set up by the one process that runs its tests (a module whose
classes went to different processes sets up its own fixtures in each).

pytest tears a module's or a class's fixtures down after an item according to the item that comes
next; here that is the next item *this* process runs, so the group after the current one is claimed
before the current group's last item runs. Without ``TORCH_OVERLAY_TEST_CLAIMS`` nothing changes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests._native_crashes import run_item

# Taken out of the environment: a pytest a test starts (verify, matrix, demo) runs all its own tests.
CLAIMS = os.environ.pop("TORCH_OVERLAY_TEST_CLAIMS", None)


def group_of(item: pytest.Item) -> str:
    """The unit of work one process takes: the test's class, or its file for a module-level test."""
    cls = getattr(item, "cls", None)
    path = item.nodeid.split("::", 1)[0]
    return f"{path}::{cls.__name__}" if cls is not None else path


class Claims:
    """Which groups this process runs: the first process to create a group's file in ``folder`` does."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._mine: dict[str, bool] = {}

    def take(self, group: str) -> bool:
        if group not in self._mine:
            name = hashlib.sha1(group.encode()).hexdigest()
            try:
                fd = os.open(self.folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                with os.fdopen(fd, "w") as f:  # which process ran which group, for a failure's reader
                    f.write(f"{os.getpid()} {group}\n")
                self._mine[group] = True
            except FileExistsError:
                self._mine[group] = False
        return self._mine[group]


class Shard:
    """The plugin: runs the claimed groups' items, each with the next item this process runs."""

    def __init__(self, claims: Claims) -> None:
        self.claims = claims
        self.items: list[pytest.Item] = []
        self.index: dict[int, int] = {}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)
        self.index = {id(item): i for i, item in enumerate(self.items)}

    def next_mine(self, item: pytest.Item) -> pytest.Item | None:
        """The item this process runs after ``item`` (claiming the next group if ``item`` ends its own)."""
        group = group_of(item)
        for later in self.items[self.index[id(item)] + 1 :]:
            other = group_of(later)
            if other == group or self.claims.take(other):
                return later
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        if self.claims.take(group_of(item)):
            run_item(item, self.next_mine(item))
        return True  # another process runs it: no report here


def pytest_configure(config: pytest.Config) -> None:
    if CLAIMS:
        config.pluginmanager.register(Shard(Claims(Path(CLAIMS))), "torch_overlay_shard")
