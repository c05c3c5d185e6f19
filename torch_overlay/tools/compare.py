"""``build.sh compare TEST_FILE [PYTEST ARGS]``: does the overlay change anything else?

Runs a test file, typically one of PyTorch's own for a module a patch touches (fetched into a scratch
folder, never into this repository), twice with ``cli/pytest_runner``: without the overlay and with it,
every process importing torch_overlay first, each side with its own compile caches. Every test whose
outcome differs is listed. A test that passes without the overlay and fails (or errors)
with it is a regression: the exit status is then 1. Each test's time on both sides is listed too, with
its ratio, and a test that passes both ways but takes much longer with the overlay is flagged as a
slowdown (a finding to look into, not a failure: one run of each side on a shared machine is noisy).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..cli.pytest_runner import STATES, PytestRun, PytestRunner

__all__ = ["Difference", "Slowdown", "compare", "run_compare", "slowdowns"]

# A test is flagged as slower with the overlay when both of these are exceeded: the ratio alone
# flags noise in tests of a few milliseconds, the seconds alone flag noise in long tests.
SLOWDOWN_RATIO = 1.2
SLOWDOWN_SECONDS = 5.0
# Tests shorter than this either way are left out of the table of times.
_LIST_SECONDS = 1.0
# What the run with the overlay says about reach (tools/reach_plugin.py), in compare's folder.
REACH_FILE = "reach.json"
REACH_OPTION = "--overlay-reach"  # the plugin's option: where it writes that file


@dataclass(frozen=True)
class Difference:
    test: str
    without: str
    with_: str

    @property
    def regression(self) -> bool:
        return self.without == "pass" and self.with_ in ("fail", "error", "absent")


@dataclass(frozen=True)
class Slowdown:
    test: str
    without: float
    with_: float

    @property
    def ratio(self) -> float:
        return self.with_ / self.without if self.without > 0 else float("inf")


def slowdowns(
    without: dict[str, float],
    with_: dict[str, float],
    *,
    ratio: float = SLOWDOWN_RATIO,
    seconds: float = SLOWDOWN_SECONDS,
) -> list[Slowdown]:
    """Tests that take more than ``ratio`` times as long, and ``seconds`` more, with the overlay."""
    found = [Slowdown(t, without[t], with_[t]) for t in sorted(without.keys() & with_.keys())]
    return [s for s in found if s.with_ - s.without > seconds and s.with_ > ratio * s.without]


def compare(without: dict[str, str], with_: dict[str, str]) -> list[Difference]:
    """Tests whose outcome differs; a test that ran on one side only counts as ``absent`` on the other."""
    names = sorted(without.keys() | with_.keys())
    return [
        Difference(name, without.get(name, "absent"), with_.get(name, "absent"))
        for name in names
        if without.get(name, "absent") != with_.get(name, "absent")
    ]


def _run(
    test_file: Path, pytest_args: list[str], overlay: bool, folder: Path, timeout: float | None, reach: bool = True
) -> tuple[str, PytestRun]:
    """One side's run (``without``, ``with`` or ``with-reach``) in a scratch folder of its own in ``folder``."""
    side = ("with-reach" if reach else "with") if overlay else "without"
    args, plugins, extra = ["-q", test_file.name, *pytest_args], [], {}
    if overlay and reach:  # which tests ran each fix's changed code (tools/reach_plugin.py)
        extra["TORCH_OVERLAY_REACH"] = "1"
        plugins.append("torch_overlay.tools.reach_plugin")
        args.insert(0, f"{REACH_OPTION}={folder / REACH_FILE}")
    run = PytestRunner().run(
        args,
        overlay=overlay,
        scratch=folder / side,
        cwd=test_file.parent,
        plugins=plugins,
        timeout=timeout,
        extra_env=extra,
    )
    return side, run


def _tail(run: PytestRun, timeout: float | None, lines: int = 15) -> str:
    tail = run.tail[-lines:] + ([f"[compare] killed after {timeout:g} s"] if run.timed_out else [])
    return "".join(f"    {line}\n" for line in tail)


def run_compare(
    test_file: Path | str,
    pytest_args: list[str] | None = None,
    *,
    timeout: float | None = None,
    out: TextIO | None = None,
    reach: bool = True,
    json_out: Path | None = None,
) -> int:
    """Compare; with ``json_out``, also write the result as data there (what the conformance record keeps)."""
    out = out or sys.stdout
    test_file = Path(test_file).resolve()
    if not test_file.is_file():
        out.write(f"error: {test_file} is not a file\n")
        return 2
    # On Python 3.11 reach compiles a counter into the changed functions (engine/reach_counter.py): there it
    # counts in a third run of its own, so that the outcomes and times compared are those of the code a job
    # runs; on 3.12+ sys.monitoring leaves the code as it is.
    apart = reach and sys.version_info < (3, 12)
    arms = [(False, False), (True, reach and not apart)] + ([(True, True)] if apart else [])
    with tempfile.TemporaryDirectory(prefix="torch_overlay-compare-") as tmp:
        sides, times = {}, {}
        for overlay, counting in arms:
            side, run = _run(test_file, pytest_args or [], overlay, Path(tmp), timeout, counting)
            if not run.reported:
                out.write(f"error: the run {side} the overlay wrote no report (timed out or crashed)")
                out.write("; pytest's output ends:\n")
                out.write(_tail(run, timeout))
                return 2
            if side == "with-reach" and apart:
                continue  # counts only: its outcomes are those of the run with the overlay, slower
            sides[overlay] = {test: case.state for test, case in run.cases.items()}
            times[overlay] = {test: case.seconds for test, case in run.cases.items()}
        counted = _read_reach(Path(tmp) / REACH_FILE) if reach else None
    without, with_ = sides[False], sides[True]
    diffs = compare(without, with_)
    # Only tests that pass both ways are timed against each other: a failure can end a test early.
    both_pass = {t for t, v in without.items() if v == "pass" and with_.get(t) == "pass"}
    t_without = {t: s for t, s in times[False].items() if t in both_pass}
    t_with = {t: s for t, s in times[True].items() if t in both_pass}
    slow = slowdowns(t_without, t_with, ratio=SLOWDOWN_RATIO, seconds=SLOWDOWN_SECONDS)
    counts = {
        name: {s: sum(1 for v in side.values() if v == s) for s in STATES}
        for name, side in (("without", without), ("with", with_))
    }
    for name, c in counts.items():
        out.write(f"{name} the overlay: " + ", ".join(f"{n} {s}" for s, n in c.items()) + "\n")
    # Tests that fail either way say something about the test file and this torch, not the overlay
    both = sorted(t for t, v in without.items() if v in ("fail", "error") and with_.get(t) == v)
    if both:
        out.write(f"failing without and with the overlay ({len(both)}):\n")
        out.writelines(f"  {test}: {without[test]}\n" for test in both)
    _write_times(out, t_without, t_with, slow)
    if reach:
        _write_reach(out, counted)
    if json_out is not None:
        _write_json(json_out, counts, diffs, slow, t_without, t_with, counted)
    if not diffs:
        out.write(f"no test of {test_file.name} changes outcome with the overlay ({len(without)} tests)\n")
        return 0
    out.write(f"{len(diffs)} test(s) change outcome (without -> with):\n")
    for d in diffs:
        out.write(f"  {'REGRESSION ' if d.regression else ''}{d.test}: {d.without} -> {d.with_}\n")
    return 1 if any(d.regression for d in diffs) else 0


def _write_json(
    path: Path,
    counts: dict[str, dict[str, int]],
    diffs: list[Difference],
    slow: list[Slowdown],
    t_without: dict[str, float],
    t_with: dict[str, float],
    reach: dict | None,
) -> None:
    """The comparison as data: outcome counts, changed outcomes, the time ratio over the tests that pass
    both ways (total with / total without), slowdowns, per fix how many tests reached it, and the fixes
    applied whose reach cannot be counted."""
    total = sum(t_without.values())
    result = {
        "without": counts["without"],
        "with": counts["with"],
        "differences": [
            {"test": d.test, "without": d.without, "with": d.with_, "regression": d.regression} for d in diffs
        ],
        "time_ratio": round(sum(t_with.values()) / total, 3) if total > 0 else None,
        "slowdowns": [{"test": s.test, "without": s.without, "with": s.with_} for s in slow],
        "reach": None
        if reach is None
        else {f: r["tests"] for f, r in reach["fixes"].items() if r["calls"] is not None},
        # Applied, but changing definitions only (a table, a registration at import): reach cannot count them.
        "uncounted": None if reach is None else sorted(f for f, r in reach["fixes"].items() if r["calls"] is None),
    }
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def _read_reach(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_reach(out: TextIO, reach: dict | None) -> None:
    """Per fix, how many tests ran its changed functions: no changed outcome proves more than that."""
    if reach is None:
        out.write("reach: not recorded (the run with the overlay wrote no reach file)\n")
        return
    fixes = reach["fixes"]
    ran = sorted((f for f, r in fixes.items() if r["tests"]), key=lambda f: (-fixes[f]["tests"], f))
    idle = sorted(f for f, r in fixes.items() if not r["tests"] and r["calls"] is not None)
    unwatched = sorted(f for f, r in fixes.items() if r["calls"] is None)
    out.write(f"reach: tests (of {reach['tests']}) that ran a fix's changed functions, with the overlay:\n")
    out.writelines(f"  {f}: {fixes[f]['tests']} test(s), {fixes[f]['calls']} call(s)\n" for f in ran)
    if idle:
        out.write(f"  applied, reached by no test ({len(idle)}): {', '.join(idle)}\n")
    if unwatched:
        out.write(f"  changing definitions only, not counted ({len(unwatched)}): {', '.join(unwatched)}\n")


def _write_times(out: TextIO, without: dict[str, float], with_: dict[str, float], slow: list[Slowdown]) -> None:
    listed = sorted(t for t in without if max(without[t], with_[t]) >= _LIST_SECONDS)
    flagged = {s.test for s in slow}
    if listed:
        out.write("time of the tests that pass both ways (without -> with, ratio):\n")
        for t in listed:
            ratio = Slowdown(t, without[t], with_[t]).ratio
            mark = "SLOWDOWN " if t in flagged else ""
            out.write(f"  {mark}{t}: {without[t]:.1f} s -> {with_[t]:.1f} s (x{ratio:.2f})\n")
    if len(listed) < len(without):
        out.write(f"  ({len(without) - len(listed)} test(s) under {_LIST_SECONDS:g} s either way not listed)\n")
    if slow:
        out.write(
            f"{len(slow)} test(s) slower with the overlay (over x{SLOWDOWN_RATIO:g} and {SLOWDOWN_SECONDS:g} s more;"
            " one run each way: rerun, or count what the test does, before blaming a patch):\n"
        )
        out.writelines(f"  SLOWDOWN {s.test}: {s.without:.1f} s -> {s.with_:.1f} s (x{s.ratio:.2f})\n" for s in slow)
