from hypothesis import given, settings, strategies as st

import pytest

from torch_overlay.series.hunks import apply_file_diff, HunkMismatch
from torch_overlay.series.patchfile import parse_patch

from tests.engine._fixtures import make_diff, make_patch

BASE = "".join(f"line {i}\n" for i in range(40))


def _diff(old: str, new: str):
    return parse_patch("x.patch", make_patch("t", [make_diff("torch/t.py", old, new)])).files[0]


def test_applies_with_offset_but_no_fuzz():
    new = BASE.replace("line 20\n", "line 20 changed\n")
    diff = _diff(BASE, new)
    shifted = "extra\n" * 7 + BASE
    assert apply_file_diff(shifted, diff) == "extra\n" * 7 + new
    # One context line differs: no fuzz, so it must not apply.
    with pytest.raises(HunkMismatch, match="hunk #1"):
        apply_file_diff(BASE.replace("line 18\n", "line eighteen\n"), diff)


def test_reverse_restores_and_detects_applied():
    new = BASE.replace("line 3\n", "line 3\ninserted\n").replace("line 30\n", "")
    diff = _diff(BASE, new)
    assert apply_file_diff(apply_file_diff(BASE, diff), diff, reverse=True) == BASE
    with pytest.raises(HunkMismatch):
        apply_file_diff(new, diff)  # already applied: the forward diff no longer fits


def test_nearest_match_wins():
    text = "a\nb\nc\nX\na\nb\nc\n"
    diff = _diff("a\nb\nc\n", "a\nB\nc\n")
    assert apply_file_diff(text, diff) == "a\nB\nc\nX\na\nb\nc\n"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", "d", ""]), min_size=1, max_size=30),
    st.lists(st.sampled_from(["a", "b", "x", "y", ""]), min_size=0, max_size=30),
    st.integers(0, 5),
)
def test_round_trip_property(old_lines, new_lines, pad):
    # Fixed context around the change: a hunk without context has no position to match.
    head, tail = "<head>\n", "<tail>\n"
    old = head + "".join(s + "\n" for s in old_lines) + tail
    new = head + "".join(s + "\n" for s in new_lines) + tail
    if old == new:
        return
    diff = _diff(old, new)
    prefix = "pad\n" * pad
    assert apply_file_diff(prefix + old, diff) == prefix + new
    assert apply_file_diff(prefix + new, diff, reverse=True) == prefix + old


def _find_by_scan(lines, block, expected, lo):
    """The search as a plain scan: the block's positions at or after ``lo``, nearest to ``expected``."""
    hi = len(lines) - len(block)
    if not block:
        return min(max(expected, lo), len(lines))
    if hi < lo:
        return None
    expected = min(max(expected, lo), hi)
    found = [p for p in range(lo, hi + 1) if lines[p : p + len(block)] == block]
    return min(found, key=lambda p: (abs(p - expected), p)) if found else None


@given(
    st.lists(st.sampled_from(["a", "b", "", "ab", "a b"]), max_size=30),
    st.lists(st.sampled_from(["a", "b", "", "ab"]), max_size=3),
    st.integers(0, 35),
    st.integers(0, 35),
)
def test_find_is_the_nearest_match_at_line_boundaries(lines, block, expected, lo):
    from torch_overlay.series.hunks import _find

    text = "\n".join(lines)
    if text.split("\n") != lines:
        return  # [] and [""] are the same text
    assert _find(text, lines, block, expected, lo) == _find_by_scan(lines, block, expected, lo)
