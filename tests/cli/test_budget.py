"""``verify --budget`` (the demo): the slowest reproducers are left out to fit, never-measured ones kept."""

from types import SimpleNamespace

from hypothesis import given, strategies as st

from torch_overlay.cli.budget import STARTUP_S, within_budget
from torch_overlay.cli.timings import Timings


def _timings(tmp_path, seconds):
    timings = Timings("2.13.0", "quick", tmp_path / "times.json")
    timings.save(
        {
            f"{pid} {side}": s
            for pid, (without, with_) in seconds.items()
            for side, s in (("without", without), ("with", with_))
        }
    )
    return Timings("2.13.0", "quick", tmp_path / "times.json")


def _patches(*ids):
    return [SimpleNamespace(id=i) for i in ids]


def test_slowest_left_out_in_series_order(tmp_path):
    timings = _timings(tmp_path, {"a": (5, 6), "b": (30, 31), "c": (4, 3), "d": (10, 9)})
    kept, left = within_budget(_patches("a", "b", "c", "d", "new"), timings, STARTUP_S + 20)
    assert [p.id for p in kept] == ["a", "c", "d", "new"]  # 6 + 3 + 9 = 18 with, 19 without
    assert [p.id for p in left] == ["b"]


def test_everything_fits_or_nothing_measured(tmp_path):
    timings = _timings(tmp_path, {"a": (5, 6)})
    assert [p.id for p in within_budget(_patches("a", "b"), timings, 100)[0]] == ["a", "b"]
    empty = Timings("2.13.0", "quick", tmp_path / "none.json")
    kept, left = within_budget(_patches("a", "b"), empty, 1)
    assert [p.id for p in kept] == ["a", "b"] and left == []


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.tuples(st.floats(0, 60), st.floats(0, 60))), st.floats(0, 200))
def test_kept_fits_the_budget(tmp_path_factory, seconds, budget):
    timings = _timings(tmp_path_factory.mktemp("t"), seconds)
    kept, left = within_budget(_patches(*sorted(seconds)), timings, budget)
    known = {k: (round(a, 1), round(b, 1)) for k, (a, b) in seconds.items()}
    assert sorted(p.id for p in kept + left) == sorted(seconds)
    if kept:
        assert STARTUP_S + max(sum(known[p.id][i] for p in kept) for i in (0, 1)) <= budget + 1e-6
    if kept and left:  # only slower ones are left out
        assert max(max(known[p.id]) for p in kept) <= min(max(known[p.id]) for p in left)
