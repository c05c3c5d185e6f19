"""A pytest plugin for ``verify``: one line per test when it ends, with the outcome that counts.

pytest's ``-v`` word for a test is its own call's outcome: a test whose subtests failed still reads
``PASSED`` there, while its report (and the run's exit code) counts the failures. This plugin prints
``::torch_overlay-test:: <word> <node id>`` after a test's teardown, failing it if any of its
reports failed, subtests included, so that the progress and the verdict say the same.
"""

from __future__ import annotations

from typing import Any

MARK = "::torch_overlay-test::"

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: Any) -> None:
    node = report.nodeid
    own = type(report).__name__ == "TestReport"  # not a subtest's report
    if report.failed:
        _outcomes[node] = "FAILED" if report.when == "call" or not own else "ERROR"
    elif own and report.skipped:
        _outcomes.setdefault(node, "SKIPPED")
    if own and report.when == "teardown":
        print(f"\n{MARK} {_outcomes.pop(node, 'PASSED')} {node}", flush=True)
