"""The catalogue as a whole: every signature parses, the ids are unique, and each looked-at
report's quoted error is explained as that report and as nothing else.

Each fix's signatures are checked against what its reproducer raises on every release in
test_captured_errors.py, and the whole matcher against real posted errors in test_real_posts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.verdicts import explain_log
from torch_overlay.known.logparse import find_errors
from torch_overlay.known.signatures import KNOWN

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue(REPO / "patches")
TORCH = torch.__version__


def test_signatures_parse_and_ids_are_unique():
    assert not CATALOGUE.problems
    ids = [b.id for b in CATALOGUE.bugs]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("report", [b for b in CATALOGUE.looked_at() if b.entry.get("examples")], ids=lambda b: b.id)
def test_looked_at_example_is_explained_as_that_report(report):
    for example in report.entry["examples"]:
        explained = explain_log(example + "\n", CATALOGUE, TORCH)
        named = [[m.bug.id for m in ex.matches] for ex in explained]
        if named == [[]]:  # a guess, withheld where the text does not point at the report's part of torch
            errors = [e.as_error_text() for e in find_errors(example + "\n")]
            assert not any(sig.match(e) == KNOWN for sig in report.signatures for e in errors), example
        else:
            assert named == [[report.id]], example
