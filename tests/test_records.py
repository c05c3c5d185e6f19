"""The plain classes that replaced dataclasses and enums on the import path behave as those did:
fields, equality, hashing, immutability, repr (``_state``'s docstrings say why they are plain)."""

import copy
import enum
import json
import marshal
import pickle
from pathlib import Path

import pytest

from torch_overlay._config import Config
from torch_overlay._state import Mode, PatchState, PatchStatus, Target
from torch_overlay.engine.components import Outcome


def test_target_is_a_frozen_value():
    a, b = Target("torch/x.py", "torch.x"), Target.from_path("torch/x.py")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert Target.from_path("torch/pkg/__init__.py") == Target("torch/pkg/__init__.py", "torch.pkg")
    assert Target.from_path("torch/csrc/a.cpp").module == ""
    assert a != Target("torch/y.py", "torch.y") and a != ("torch/x.py", "torch.x")
    with pytest.raises(AttributeError):
        a.path = "other"
    assert repr(a) == "Target(path='torch/x.py', module='torch.x')"
    assert pickle.loads(pickle.dumps(a)) == a


def test_patch_status_row():
    row = PatchStatus("fix", "title", "bug", (Target.from_path("torch/x.py"),), PatchState.APPLIED, "why")
    assert (row.variant, row.mode, row.late) == ("", "", "")
    other = row.replace(state=PatchState.DISABLED)
    assert other.state == "disabled" and row.state == "applied" and other != row
    assert other.replace(state=PatchState.APPLIED) == row
    assert row.as_dict() == {
        "id": "fix", "title": "title", "bug": "bug", "targets": ["torch/x.py"], "state": "applied",
        "reason": "why", "variant": "", "mode": "", "late": "",
    }  # fmt: skip
    assert repr(row).startswith("PatchStatus(id='fix', title='title'")
    with pytest.raises(TypeError):
        hash(row)


def test_config_is_a_frozen_value(tmp_path):
    base = dict(enabled=True, disabled_ids=frozenset({"a"}), strict=False, patches_dir=tmp_path)
    one, two = Config(**base), Config(**base)
    assert one == two and hash(one) == hash(two)
    assert (one.code_cache, one.children, one.check_ranks, one.quiet, one.problems) == (True, True, "off", False, ())
    assert isinstance(one.cache_dir, Path)
    assert one.replace(strict=True).strict and not one.strict and one.replace(strict=True) != one
    with pytest.raises(AttributeError):
        one.strict = True
    assert repr(one).startswith("Config(enabled=True, disabled_ids=frozenset({'a'}), strict=False")


def test_outcome_compares_by_value():
    assert Outcome(PatchState.APPLIED, "r", None) == Outcome(PatchState.APPLIED, "r", None, set())
    assert Outcome(PatchState.APPLIED, "r", None, {"a"}) != Outcome(PatchState.APPLIED, "r", None)
    assert Outcome(PatchState.FAILED, "r", None, late="torch.x") != Outcome(PatchState.FAILED, "r", None)


@pytest.mark.parametrize("words", [PatchState, Mode])
def test_states_and_modes_behave_as_the_str_enums_they_replace(words):
    # The StrEnum each replaces, made here (tests may pay for enum's class machinery).
    reference = enum.StrEnum(words.__name__, [(m.name, m.value) for m in words])
    assert [(m.name, m.value) for m in words] == [(m.name, m.value) for m in reference]
    assert len(words) == len(reference)
    for member, ref in zip(words, reference):
        assert member == ref == ref.value and hash(member) == hash(ref.value)
        assert str(member) == str(ref) and f"{member}" == f"{ref}" and type(str(member)) is str
        assert repr(member) == repr(ref)
        assert isinstance(member, str) and isinstance(member, words)
        assert words(ref.value) is member is getattr(words, ref.name)
        assert pickle.loads(pickle.dumps(member)) is member and copy.deepcopy(member) is member
        assert json.dumps([member]) == json.dumps([ref])
        assert marshal.loads(marshal.dumps(str(member))) == member
    with pytest.raises(ValueError, match="is not a valid"):
        words("no such value")
    with pytest.raises(AttributeError):
        words.APPLIED = "other"  # type: ignore[misc]
