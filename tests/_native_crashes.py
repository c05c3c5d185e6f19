"""One more try for a multi-process test whose worker a signal killed, said in the summary.

A gloo worker of torch's ``MultiProcessTestCase`` sometimes dies in native code as it exits
(``terminate called without an active exception``, SIGABRT, seen once on 2.11.0 CI after the test's
own checks), which is torch's and gloo's, not the fix's. Such a failure runs again once; a test
that fails again, or fails any other way, fails. Every rerun is listed in the terminal summary
with the head of what the dead worker printed, so a crash that keeps coming is seen.
"""

from __future__ import annotations

import re

import pytest
from _pytest.runner import runtestprotocol

# MultiProcessTestCase._check_return_codes: a worker's exit code is minus the signal that killed it.
_KILLED_BY = re.compile(r"Expected exit code 0 but got -(6|7|11)\b")
_SIGNALS = {"6": "SIGABRT", "7": "SIGBUS", "11": "SIGSEGV"}

_reruns: list[tuple[str, str, str]] = []  # (nodeid, signal, head of the worker's output)


def killed_by_signal(report: pytest.TestReport) -> str | None:
    """The signal that killed a worker of this failed call, or None for any other outcome."""
    if report.when != "call" or not report.failed:
        return None
    match = _KILLED_BY.search(str(report.longrepr))
    return _SIGNALS[match.group(1)] if match else None


def _crash_head(report: pytest.TestReport) -> str:
    for _, text in report.sections:
        for marker in ("terminate called", "Fatal Python error", "SIGSEGV", "SIGABRT", "SIGBUS"):
            if marker in text:
                return text[text.find(marker) :][:300]
    return ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    run_item(item, nextitem)
    return True


def run_item(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """pytest's protocol for one item (``nextitem``: what runs next, for the fixtures' teardown),
    run a second time after a worker's death by a signal."""
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    signal = next((s for s in map(killed_by_signal, reports) if s is not None), None)
    if signal is not None:
        crashed = next(r for r in reports if r.when == "call")
        _reruns.append((item.nodeid, signal, _crash_head(crashed)))
        item._initrequest()  # type: ignore[attr-defined]
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _reruns:
        return
    terminalreporter.section("native crashes run again", sep="!", yellow=True)
    for nodeid, signal, head in _reruns:
        terminalreporter.write_line(f"{nodeid}: a worker died of {signal}; its second run is the result above")
        for line in head.splitlines()[:4]:
            terminalreporter.write_line(f"    {line}")
