"""A pytest plugin for ``compare``'s run with the overlay: which tests ran each fix's changed code.

Loaded with ``-p torch_overlay.tools.reach_plugin --overlay-reach=FILE`` under
``TORCH_OVERLAY_REACH=1``. Around each test it reads the overlay's reach counters (engine/reach.py)
before and after; a test's ranks and other Python children write their counters at exit into a
folder of the test's own (``TORCH_OVERLAY_REACH_DIR``), read after the test. Ranks that outlive the
test that started them (``MultiProcContinuousTest``: a class's ranks run all its tests) write theirs
after each test they run, named by the test, into that first test's folder (engine/reach_ranks.py):
a folder that got such a dump is read again after each later test. FILE gets, as JSON,
per applied fix the tests that ran at least one of its changed functions.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

import torch_overlay
from torch_overlay.engine.reach import DUMP_DIR, read_dumps
from torch_overlay.tools.compare import REACH_OPTION


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(REACH_OPTION, metavar="FILE", help="write which tests ran each fix's changed code to FILE (JSON)")


class _Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.tests: dict[str, set[str]] = {}  # fix id -> node ids of the tests that ran its changed code
        self.calls: dict[str, int] = {}
        self.ran = 0
        self._folder = Path(tempfile.mkdtemp(prefix="torch_overlay-reach-"))
        self._folders: dict[Path, str] = {}  # the folders of persistent ranks -> the test that made each
        self._read: set[Path] = set()  # the dumps read
        self._by_unittest_id: dict[str, str] = {}  # "Class.method" -> node id, of the tests run

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
        children = self._folder / str(self.ran)
        children.mkdir()
        cls = getattr(item, "cls", None)
        if cls is not None:
            self._by_unittest_id[f"{cls.__name__}.{item.name}"] = item.nodeid
        before = _counts()
        os.environ[DUMP_DIR] = str(children)
        try:
            yield
        finally:
            os.environ.pop(DUMP_DIR, None)
        self.ran += 1
        after = _counts()
        self._add(item.nodeid, {fix: after[fix] - before.get(fix, 0) for fix in after})
        self._folders[children] = item.nodeid
        for folder, nodeid in list(self._folders.items()):
            named = False
            for test, counts in read_dumps(folder, self._read):
                # A dump named by a test: a rank that ran it, which may have started in an earlier test.
                named = named or test is not None
                unittest_id = ".".join((test or "").split(".")[-2:])
                self._add(self._by_unittest_id.get(unittest_id, nodeid), counts)
            if folder == children and not named:
                del self._folders[folder]  # this test's processes have ended: none will dump later

    def _add(self, nodeid: str, ran: dict[str, int]) -> None:
        for fix, n in ran.items():
            if n > 0:
                self.tests.setdefault(fix, set()).add(nodeid)
                self.calls[fix] = self.calls.get(fix, 0) + n

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        rows = {row["id"]: row for row in torch_overlay.reach() or []}
        # A fix applied only in a test's children is known from their counts alone.
        fixes = {
            fix: {
                "tests": len(self.tests.get(fix, ())),
                "calls": None if fix in rows and rows[fix]["calls"] is None else self.calls.get(fix, 0),
                "silent": rows[fix]["silent"] if fix in rows else "",
            }
            for fix in [*rows, *(f for f in self.calls if f not in rows)]
        }
        self.out.write_text(json.dumps({"tests": self.ran, "fixes": fixes}, indent=2) + "\n", encoding="utf-8")


def _counts() -> dict[str, int]:
    return {row["id"]: row["calls"] or 0 for row in torch_overlay.reach() or []}


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption(REACH_OPTION)
    if out:
        config.pluginmanager.register(_Recorder(Path(out)), "torch_overlay_reach_recorder")
