"""A pytest plugin: write each failed test's exception, compacted as ``capture.compact_exception``
prints it (paths relative to ``CAPTURE_REPO`` or to site-packages), to the JSON file named by
``CAPTURE_EXCEPTIONS_JSON`` (node id -> text; null for a test that passed), rewritten after each
test so that a run cut short keeps what it learnt. ``tools/capture.py`` loads it with
``-p torch_overlay.tools.capture_plugin``."""

from __future__ import annotations

import json
import os

import pytest

from .capture import compact_exception

_captured: dict[str, str | None] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        _captured[item.nodeid] = compact_exception(call.excinfo.value, os.environ.get("CAPTURE_REPO", ""))
    elif report.when == "call" and report.passed:
        _captured.setdefault(item.nodeid, None)
    else:
        return
    path = os.environ.get("CAPTURE_EXCEPTIONS_JSON")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(_captured, f)
        os.replace(path + ".tmp", path)
