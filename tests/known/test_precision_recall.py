"""The known-bug signatures over the whole series: each fix's reproducer (its ``Error-Test``, by
default its ``Quick-Test``), run without the overlay,
raises an error that ``explain`` attributes to that fix and to no other fix (precision over every
fix, recall over those with ``Error:`` lines); each looked-at report's quoted error is explained
as that report; the ids are unique and every signature parses.

The reproducers are each fix's ``Error-Test`` (or ``Quick-Test``) that the installed torch needs, in one pytest process
with ``TORCH_OVERLAY=0`` (as ``verify --quick`` runs them), their exceptions captured as Python
prints an uncaught one. CI runs them on its 2.11.0 leg, where most bugs exist (tests/_legs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._legs import one_leg
from torch_overlay._state import PatchState
from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.explain import explain_log
from torch_overlay.series.decide import decide_by_header

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue(REPO / "patches")
TORCH = torch.__version__


def _needed(bug) -> bool:
    decision = decide_by_header(bug.patch, TORCH)
    return decision is None or decision.state not in (PatchState.UPSTREAM, PatchState.NOT_NEEDED)


# Fixes whose bugs raise the same error text: explain names each of them (the series fixes both).
SHARED_ERRORS = [
    # The partitioner's "Node X was invalid, but is output", from two different wrong counts.
    {"aot-subclass-outputs-intermediate-bases", "aot-subclass-outputs-symint-slots"},
]


def _allowed(pid: str) -> set[str]:
    return set().union({pid}, *(group for group in SHARED_ERRORS if pid in group))


def _error_test(bug) -> str:
    fields = bug.patch.main.fields
    return fields.get("Error-Test") or fields["Quick-Test"]


FIXES = [b for b in CATALOGUE.fixes() if b.patch.main.fields.get("Quick-Test") and _needed(b)]


@pytest.fixture(scope="module")
def without_overlay(tmp_path_factory) -> dict[str, str]:
    """Quick-Test node id -> the exception it raised without the overlay (absent: it passed)."""
    out = tmp_path_factory.mktemp("capture") / "captured.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.update(
        TORCH_OVERLAY="0",
        CAPTURE_EXCEPTIONS_JSON=str(out),
        TORCH_OVERLAY_CACHE_DIR=os.environ["TORCH_OVERLAY_CACHE_DIR"],
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path_factory.mktemp("inductor")),
        PYTHONPATH=str(REPO),
    )
    nodes = sorted({_error_test(b) for b in FIXES})
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-p", "tests.known._capture", *nodes],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )
    return json.loads(out.read_text(encoding="utf-8"))


def test_signatures_parse_and_ids_are_unique():
    assert not CATALOGUE.problems
    ids = [b.id for b in CATALOGUE.bugs]
    assert len(ids) == len(set(ids))


@one_leg
@pytest.mark.parametrize("fix", FIXES, ids=lambda b: b.id)
def test_reproducer_error_is_explained_as_its_fix_and_no_other(fix, without_overlay):
    node = _error_test(fix)
    text = without_overlay.get(node)
    if text is None:
        pytest.skip(f"{node} passed without the overlay on torch {TORCH}")
    found = {m.bug.id for ex in explain_log(text, CATALOGUE, TORCH) for m in ex.matches}
    others = found - _allowed(fix.id)
    assert not others, f"{fix.id}'s reproducer error is also explained as {others}:\n{text[-3000:]}"
    if fix.signatures:
        assert fix.id in found, f"no Error: line of {fix.id} matches its reproducer's error:\n{text[-3000:]}"


@pytest.mark.parametrize("report", [b for b in CATALOGUE.looked_at() if b.entry.get("examples")], ids=lambda b: b.id)
def test_looked_at_example_is_explained_as_that_report(report):
    for example in report.entry["examples"]:
        explained = explain_log(example + "\n", CATALOGUE, TORCH)
        assert [[m.bug.id for m in ex.matches] for ex in explained] == [[report.id]], example
