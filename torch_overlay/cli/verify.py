"""Run each fix's reproducer without and with the overlay, in pytest subprocesses, in parallel.

A run is one pytest process (``pytest_runner``), with ``TORCH_OVERLAY=0`` or with the overlay, over one
fix's test file (full mode) or over the one ``Quick-Test`` of several fixes (quick mode: importing torch
and the test modules costs more than the small tests themselves, so they share a process). Each test's
outcome is read from pytest's JUnit XML report; the progress comes from its ``-v`` lines.
"""

from __future__ import annotations

import re
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from . import pytest_outcomes
from .failure_line import failure_line
from .pytest_outcomes import MARK
from .pytest_runner import CaseResult, PytestRunner
from ..series.series import Patch
from .timings import Timings

__all__ = [
    "RunOutcome",
    "Reproducer",
    "Verdict",
    "format_verdicts",
    "judge",
    "Kind",
    "needed_ids",
    "reproducer",
    "selected_classes",
    "verify",
]


class Kind:
    """A verdict's kind (``Verdict.kind``, ``kind`` in ``verify --json``): what ``verify``'s exit
    status, its closing count and the matrix act on; the verdict's text is for people."""

    FIXED = "fixed"
    NOT_NEEDED = "not-needed"
    NOT_FIXED = "not-fixed"
    REGRESSION = "regression"
    NOT_RUN = "not-run"  # the reproducer's run broke
    ALL_SKIPPED = "all-skipped"
    NO_TEST = "no-test"
    FAILING = frozenset({NOT_FIXED, REGRESSION, NOT_RUN})  # what makes `verify` exit 1
    # Each kind in a few words, for the closing count.
    LABELS = {
        NOT_NEEDED: "not needed on this torch",
        NOT_FIXED: "NOT FIXED",
        REGRESSION: "REGRESSION",
        NOT_RUN: "could not run the reproducer",
        ALL_SKIPPED: "could not run here",
        NO_TEST: "no reproducer test found",
    }


# (passes without the overlay, passes with it) -> the verdict's kind and its text.
VERDICTS = {
    (False, True): (Kind.FIXED, "bug present without, fixed with the overlay"),
    (True, True): (Kind.NOT_NEEDED, "not needed on this torch (passes without the overlay)"),
    (False, False): (Kind.NOT_FIXED, "NOT FIXED: the reproducer fails with the overlay"),
    (True, False): (Kind.REGRESSION, "REGRESSION: passes without the overlay, fails with it"),
}
SIDES = ("without", "with")
# The line our pytest plugin prints when a test ends (its subtests counted), and its words as
# RunOutcome states: what a test's line says before the JUnit report is written.
_RESULT_LINE = re.compile(rf"^{re.escape(MARK)} (PASSED|FAILED|ERROR|SKIPPED) (\S+::\S+)")
_WORDS = {"PASSED": "pass", "FAILED": "fail", "ERROR": "error", "SKIPPED": "skipped"}
_HEARTBEAT_S = 30.0


@dataclass(frozen=True)
class Reproducer:
    id: str
    args: tuple[str, ...]  # pytest arguments: the test file (and ``-k``), or the one node id
    symptom: str  # one line: what goes wrong without the fix
    node: str | None = None  # the one test (quick mode): such reproducers share a process

    @property
    def label(self) -> str:
        return " ".join(self.args)


@dataclass(frozen=True)
class RunOutcome:
    """What one pytest run of a reproducer gave, on one side (without or with the overlay)."""

    state: str  # "pass", "fail", "skipped" (every test skipped) or "error" (the run broke)
    detail: str = ""  # the first failure or skip message, or why the run broke
    seconds: float = 0.0


@dataclass
class Verdict:
    id: str
    test: str
    without: str  # a RunOutcome state, or "-" when there is no reproducer
    with_: str
    kind: str  # a Kind
    verdict: str
    seconds: float
    symptom: str = ""
    details: dict[str, str] = field(default_factory=dict)  # side -> failure/skip message

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "test": self.test,
            "without_overlay": self.without,
            "with_overlay": self.with_,
            "kind": self.kind,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 1),
            "symptom": self.symptom,
            "details": self.details,
        }


def reproducer(patch: Patch, repo: Path, quick: bool) -> Reproducer | None:
    """The tests that show ``patch``'s bug: its ``Quick-Test`` when ``quick`` and set, else ``Test``."""
    main = patch.main
    if main is None:
        return None
    symptom = main.fields.get("Symptom", "") or main.title
    quick_test = main.fields.get("Quick-Test", "")
    if quick and quick_test and (repo / quick_test.split("::", 1)[0]).is_file():
        return Reproducer(patch.id, (quick_test,), symptom, node=quick_test)
    test = main.fields.get("Test", "")
    if not test or not (repo / test).is_file():
        return None
    select = " or ".join(selected_classes(main.fields.get("Test-Select", "")))
    return Reproducer(patch.id, (test, "-k", select) if select else (test,), symptom)


def selected_classes(select: str) -> list[str]:
    """The test classes a ``Test-Select`` field names (separated by spaces or commas).

    pytest's ``-k`` matches them as substrings, so the classes made from them
    (``instantiate_device_type_tests``' ``<Class>CPU``, ``<Class>WithLocalTensor``) run too.
    """
    return select.replace(",", " ").split()


def needed_ids(patches: list[Patch]) -> set[str]:
    """Ids of the patches the installed torch needs, decided on its source files, without importing it."""
    from ..series.versions import torch_root, torch_version
    from .._state import PatchState
    from ..series.plan import plan_series

    root = torch_root()

    def read(path: str) -> str | None:
        file = root / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    plan = plan_series([p for p in patches if not p.error], torch_version(), read, python_only=True)
    return {step.patch.id for step in plan.steps if step.state == PatchState.APPLIED}


def judge(without: RunOutcome, with_: RunOutcome) -> tuple[str, str]:
    """The verdict for one fix, its kind and its text; a run that broke or skipped everything proves
    nothing either way."""
    broken = next((o for o in (without, with_) if o.state == "error"), None)
    if broken:
        return Kind.NOT_RUN, f"could not run the reproducer ({broken.detail})"
    skipped = next((o for o in (without, with_) if o.state == "skipped"), None)
    if skipped:
        return Kind.ALL_SKIPPED, f"could not run here: every test was skipped ({skipped.detail})"
    return VERDICTS[(without.state == "pass", with_.state == "pass")]


def _case_outcome(case: CaseResult) -> RunOutcome:
    detail = failure_line(case.message, case.text) if case.state != "pass" else ""
    return RunOutcome(case.state, detail, case.seconds)


def _merge(outcomes: list[RunOutcome], why_none: str) -> RunOutcome:
    """One outcome for a file's tests: any failure fails it; it passes if something passed."""
    seconds = sum(o.seconds for o in outcomes)
    for state in ("fail", "error", "pass", "skipped"):
        first = next((o for o in outcomes if o.state == state), None)
        if first is not None:
            return RunOutcome(state, first.detail, seconds)
    return RunOutcome("error", why_none, seconds)


def _junit_key(node: str) -> str:
    """``a/test_b.py::C::test_d`` -> ``a.test_b.C::test_d``, its key in pytest's JUnit report."""
    path, *scopes, name = node.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return f"{'.'.join([module, *scopes])}::{name}"


@dataclass
class _Run:
    """One pytest process over ``reproducers``, with or without the overlay."""

    reproducers: list[Reproducer]
    side: str  # "without" or "with"
    estimate: float | None = None
    started: float | None = None
    finished: bool = False
    tests_done: int = 0

    @property
    def args(self) -> list[str]:
        if len(self.reproducers) == 1:
            # One fix: stop at its first failing test, the rest cannot change the verdict.
            return ["-x", *self.reproducers[0].args]
        return [str(r.node) for r in self.reproducers]

    def outcomes(self, cases: dict[str, CaseResult], why_none: str) -> dict[str, RunOutcome]:
        if len(self.reproducers) == 1:
            return {self.reproducers[0].id: _merge([_case_outcome(c) for c in cases.values()], why_none)}
        out = {}
        for rep in self.reproducers:
            case = cases.get(_junit_key(str(rep.node)))
            out[rep.id] = _case_outcome(case) if case is not None else RunOutcome("error", why_none)
        return out


def _run_pytest(
    runner: PytestRunner, run: _Run, repo: Path, timeout: float, on_test: Callable[[_Run, str, str], None]
) -> tuple[dict[str, RunOutcome], float]:
    """Run ``run``'s pytest process; each reproducer's outcome, and the process's seconds."""

    def line(text: str) -> None:
        m = _RESULT_LINE.match(text)
        if m:
            on_test(run, m.group(2), m.group(1))

    run.started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torch_overlay-verify-") as tmp:
        result = runner.run(
            ["-v", *run.args],
            overlay=run.side == "with",
            scratch=Path(tmp),
            cwd=repo,
            plugins=[pytest_outcomes.__name__],
            timeout=timeout,
            on_line=line,
        )
    if result.timed_out:
        why = f"timed out after {timeout:.0f}s"
    else:
        why = f"pytest exited with {result.returncode} before this test ran: {result.last_line}"
    return run.outcomes(result.cases, why), result.seconds


def _plan_runs(reproducers: list[Reproducer], quick: bool, jobs: int) -> list[_Run]:
    """Quick tests share processes, one group per pair of jobs; any other reproducer gets its own."""
    shared = [r for r in reproducers if quick and r.node]
    groups: list[list[Reproducer]] = [shared[i :: max(1, jobs // 2)] for i in range(max(1, jobs // 2))]
    groups = [g for g in groups if g] + [[r] for r in reproducers if not (quick and r.node)]
    return [_Run(group, side) for group in groups for side in SIDES]


def _describe(run: _Run) -> str:
    if len(run.reproducers) > 1:
        return f"{run.side} the overlay {run.tests_done}/{len(run.reproducers)} tests done"
    return f"{run.reproducers[0].id} {run.side} the overlay, {run.tests_done} tests done"


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


def verify(
    patches: list[Patch],
    repo: Path,
    *,
    quick: bool = False,
    jobs: int = 1,
    timeout: float = 900.0,
    torch_version: str = "",
    progress: Callable[[str], None] | None = None,
) -> list[Verdict]:
    """Each patch's verdict, in series order; ``progress`` gets one line per event."""
    say = progress or (lambda line: None)
    timings = Timings(torch_version, "quick" if quick else "full")
    runner = PytestRunner()
    began = time.monotonic()
    reps = {p.id: reproducer(p, repo, quick) for p in patches}
    found = [r for r in reps.values() if r is not None]
    runs = _plan_runs(found, quick, jobs)
    for run in runs:
        known = [timings.get(f"{r.id} {run.side}") for r in run.reproducers]
        run.estimate = sum(k for k in known if k is not None) if None not in known else None
    results: dict[str, dict[str, RunOutcome]] = {r.id: {} for r in found}
    seconds: dict[str, float] = {}
    measured: dict[str, float] = {}
    lock = threading.Lock()

    def stamp(line: str) -> None:
        say(f"[{time.monotonic() - began:4.0f}s] {line}")

    def left() -> str:
        pending = [r for r in runs if not r.finished]
        estimates = [r.estimate for r in pending]
        if not pending or None in estimates:
            return ""
        now = time.monotonic()
        ran = [now - r.started if r.started else 0.0 for r in pending]
        work = sum(max(0.0, (e or 0.0) - t) for e, t in zip(estimates, ran))
        if work < 1.0:  # running past the last run's time: no estimate to give
            return ""
        return f"; ~{_fmt_s(work / min(jobs, len(pending)))} left (from the last run)"

    announced: set[str] = set()

    def record(rid: str, side: str, outcome: RunOutcome) -> None:
        """Keep the latest outcome (the JUnit report's over the -v line's); announce a verdict once."""
        with lock:
            results[rid][side] = outcome
            if len(results[rid]) == 2 and rid not in announced:
                announced.add(rid)
                done = len(announced)
                _, verdict = judge(results[rid]["without"], results[rid]["with"])
                stamp(f"{rid}: {verdict} ({done}/{len(found)} done{left()})")

    def on_test(run: _Run, node: str, word: str) -> None:
        run.tests_done += 1
        if len(run.reproducers) > 1:
            rep = next((r for r in run.reproducers if r.node == node), None)
            if rep is not None:
                stamp(f"{rep.id} {run.side} the overlay: {_WORDS[word]}")
                record(rep.id, run.side, RunOutcome(_WORDS[word]))

    def execute(run: _Run) -> None:
        names = ", ".join(r.id for r in run.reproducers)
        if len(run.reproducers) > 1:
            what = f"{len(run.reproducers)} quick tests"
        else:
            what = f"{names}, {run.reproducers[0].label}"
        last = f" (last time {_fmt_s(run.estimate)})" if run.estimate is not None else ""
        stamp(f"start {run.side} the overlay: {what}{last}")
        outcomes, wall = _run_pytest(runner, run, repo, timeout, on_test)
        run.finished = True
        tested = sum(o.seconds for o in outcomes.values())
        for rid, outcome in outcomes.items():
            # Estimates: each test's own time plus its share of the process's start-up.
            share = outcome.seconds + max(0.0, wall - tested) / len(outcomes)
            seconds[rid] = seconds.get(rid, 0.0) + share
            measured[f"{rid} {run.side}"] = share
            if len(outcomes) == 1:
                stamp(f"{rid} {run.side} the overlay: {outcome.state} ({_fmt_s(wall)})")
            record(rid, run.side, outcome)

    total = sum(r.estimate or 0.0 for r in runs)
    if runs and all(r.estimate is not None for r in runs):
        est = f"; the last run took ~{_fmt_s(total / min(jobs, len(runs)))}"
    else:
        est = ""
    say(f"{len(runs)} pytest runs for {len(found)} fixes, {jobs} at a time{est}")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: set[Future[None]] = {pool.submit(execute, run) for run in runs}
        try:
            while futures:
                finished, futures = wait(futures, timeout=_HEARTBEAT_S, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()
                if not finished:
                    stamp(f"running: {'; '.join(_describe(r) for r in runs if r.started and not r.finished)}{left()}")
        except BaseException:
            runner.kill_all()
            raise
    timings.save(measured)

    verdicts = []
    for patch in patches:
        rep = reps[patch.id]
        if rep is None:
            verdicts.append(Verdict(patch.id, "", "-", "-", Kind.NO_TEST, "no reproducer test found", 0.0))
            continue
        without, with_ = results[rep.id]["without"], results[rep.id]["with"]
        details = {side: o.detail for side, o in (("without", without), ("with", with_)) if o.detail}
        verdicts.append(
            Verdict(
                rep.id,
                rep.label,
                without.state,
                with_.state,
                *judge(without, with_),
                seconds.get(rep.id, 0.0),
                rep.symptom,
                details,
            )
        )
    return verdicts


def format_verdicts(verdicts: list[Verdict], width: int = 100) -> str:
    """A row per fix (without | with | verdict), then the bug, the failure seen and the test, indented."""
    headers = ("ID", "WITHOUT", "WITH", "VERDICT")
    rows = [(v.id, v.without, v.with_, v.verdict) for v in verdicts]
    widths = [max([len(headers[i])] + [len(r[i]) for r in rows]) for i in range(3)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:3], widths)) + "  " + cells[3]

    out = [line(headers)]
    for v, row in zip(verdicts, rows):
        out.append(line(row))
        for label, text in (("bug", v.symptom), *v.details.items(), ("test", v.test)):
            if text:
                indent = f"    {label}: "
                out.extend(
                    textwrap.wrap(
                        text, width, initial_indent=indent, subsequent_indent=" " * len(indent), break_long_words=False
                    )
                )
    return "\n".join(out)
