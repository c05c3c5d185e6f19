"""Each fix's ``Error:`` lines against what torch really prints, on every release it fixes.

``patches/captured/<release>.json`` holds what each fix's reproducer (its ``Error-Test``, by
default its ``Quick-Test``) raised without the overlay on that release (``./build.sh matrix``
writes it, ``torch_overlay/tools/capture.py``). Here, on every CI leg:

- every release a fix lists in ``Affects`` (and still needs) has a capture of its reproducer: a
  new fix cannot land without one, and a silent bug (wrong values, nothing raised) says so;
- ``explain`` names the fix for each captured error of every release, and names no other fix as
  known (torch rewords messages between releases: a signature that knows one wording fails here);
- the installed torch still raises what its file says (the reproducers run once, without the
  overlay, in one pytest process): a capture that no longer describes torch fails.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch

from torch_overlay._state import PatchState
from torch_overlay.known.catalogue import load_catalogue
from torch_overlay.known.verdicts import explain_log
from torch_overlay.known.signatures import KNOWN
from torch_overlay.series.decide import decide_by_header
from torch_overlay.tools.capture import capture, headline, release_of

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue(REPO / "patches")
CAPTURED_DIR = REPO / "patches" / "captured"
RELEASES = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
TORCH = torch.__version__

# Fixes whose bugs raise the same error text: explain names each of them (the series fixes both).
SHARED_ERRORS = [
    # The partitioner's "Node X was invalid, but is output", from two different wrong counts.
    {"aot-subclass-outputs-intermediate-bases", "aot-subclass-outputs-symint-slots"},
]


def allowed(pid: str) -> set[str]:
    return set().union({pid}, *(group for group in SHARED_ERRORS if pid in group))


@cache
def stored(release: str) -> dict[str, dict]:
    path = CAPTURED_DIR / f"{release}.json"
    return json.loads(path.read_text(encoding="utf-8"))["fixes"] if path.is_file() else {}


def needs(bug, release: str) -> bool:
    decision = decide_by_header(bug.patch, release)
    return decision is None or decision.state not in (PatchState.UPSTREAM, PatchState.NOT_NEEDED)


FIXES = [b for b in CATALOGUE.fixes() if b.patch.main.fields.get("Quick-Test")]


def named(text: str, release: str) -> tuple[set[str], set[str]]:
    """The fixes ``explain`` names for ``text`` on ``release``: (known, possibly)."""
    known: set[str] = set()
    possibly: set[str] = set()
    for ex in explain_log(text, CATALOGUE, release, env={}):
        for match in ex.matches:
            if match.bug.kind == "fix":
                (known if match.confidence == KNOWN else possibly).add(match.bug.id)
    return known, possibly


def check_named(pid: str, text: str, release: str) -> None:
    known, possibly = named(text, release)
    others = known - allowed(pid)
    assert not others, f"{pid}'s error on torch {release} is also explained as {others}:\n{text[-3000:]}"
    assert pid in known | possibly, (
        f"no Error: line of {pid} matches what its reproducer raises on torch {release}: add one "
        f"(docs/reference/patch-format.md, 'Error signatures'):\n{text[-3000:]}"
    )


@pytest.mark.parametrize("fix", FIXES, ids=lambda b: b.id)
def test_every_affected_release_has_a_capture(fix):
    affects = [a.strip() for a in fix.patch.main.fields.get("Affects", "").split(",") if a.strip()]
    missing = [r for r in affects if r in RELEASES and needs(fix, r) and fix.id not in stored(r)]
    assert not missing, (
        f"{fix.id}: no capture of its reproducer on torch {', '.join(missing)}: run "
        f"`./build.sh matrix --ids {fix.id} {' '.join(missing)}` (writes patches/captured/)"
    )


@pytest.mark.parametrize("release", RELEASES)
def test_explain_names_each_fix_for_its_captured_error(release):
    for pid, entry in stored(release).items():
        fix = next((b for b in FIXES if b.id == pid), None)
        assert fix is not None, f"patches/captured/{release}.json names {pid}, which the series lacks"
        if entry["outcome"] == "error":
            check_named(pid, entry["text"], release)
        elif entry["outcome"] == "silent":
            # Wrong values, nothing raised: no error of torch's to recognise, and none may be
            # taken for another fix's.
            known, _ = named(entry["text"], release)
            assert not known - allowed(pid), f"{pid}'s assertion on {release} is explained as {known}"


@pytest.fixture(scope="module")
def live() -> dict[str, dict]:
    needed = [b.patch for b in FIXES if needs(b, TORCH)]
    return capture(needed, REPO, TORCH)


@pytest.mark.parametrize("fix", FIXES, ids=lambda b: b.id)
def test_installed_torch_raises_what_is_stored(fix, live):
    release = release_of(TORCH)
    if release not in RELEASES or not needs(fix, TORCH):
        pytest.skip(f"torch {TORCH} does not need {fix.id}")
    now = live.get(fix.id)
    assert now is not None, f"{fix.id}: no Error-Test/Quick-Test to run"
    entry = stored(release).get(fix.id)
    if now["outcome"] == "passes":
        assert entry is None, (
            f"{fix.id}'s reproducer passes without the overlay on {TORCH}, but the capture says it fails"
        )
        pytest.skip(f"{fix.id}'s reproducer passes without the overlay on torch {TORCH}")
    refresh = f"refresh with `./build.sh matrix --ids {fix.id} {release}`"
    assert entry is not None, (
        f"{fix.id} fails without the overlay on {TORCH}, but patches/captured/{release}.json has no entry: {refresh}"
    )
    if now["outcome"] == "timeout":
        pytest.skip(f"{fix.id}: the reproducer's processes ran out of time on this machine; nothing to compare")
    if "peer" in (now["outcome"], entry["outcome"]):
        pytest.skip(f"{fix.id}: the rank reported lost its peer; the rank that raised is not in the text")
    assert now["outcome"] == entry["outcome"], (
        f"{fix.id} on {TORCH}: {now['outcome']} now, {entry['outcome']} stored: {refresh}"
    )
    if now["outcome"] == "error":
        assert headline(now["text"]) == headline(entry["text"]), (
            f"{fix.id}: torch {TORCH} raises another error than stored: {refresh}"
        )
        check_named(fix.id, now["text"], release)
