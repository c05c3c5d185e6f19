"""A pytest plugin: write each failed test's exception, formatted as Python prints an uncaught
one, to the JSON file named by ``CAPTURE_EXCEPTIONS_JSON`` (node id -> text)."""

from __future__ import annotations

import json
import os
import traceback

import pytest

_captured: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        _captured[item.nodeid] = "".join(traceback.format_exception(call.excinfo.value))


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("CAPTURE_EXCEPTIONS_JSON")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_captured, f)
