"""A component decided in one process is recalled by the next: its files are not read again,
and anything that could change the decision (a file, a patch, the code cache) decides afresh."""

import importlib
import os
import sys
from pathlib import Path

import pytest

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

OTHER = "def value():\n    return 1\n"


@pytest.fixture
def two_modules(sandbox):
    """One patch changes two modules: a component; the first import decides both."""
    first, first_path = sandbox.module(MODULE)
    second, second_path = sandbox.module(OTHER)
    diffs = [make_diff(first_path, MODULE, PATCHED), make_diff(second_path, OTHER, OTHER.replace("return 1", "return 2"))]
    sandbox.series(("0001-fix.patch", make_patch("fix", diffs)))
    return first, second, sandbox.pkg / f"{second.split('.')[-1]}.py"


def _new_process(overlays, config, cache, previous, names):
    """A second overlay in this process stands in for a new process."""
    if previous is not None:
        previous._hook.uninstall()
    for name in names:
        sys.modules.pop(name, None)
    overlay = overlays(config(cache_dir=cache))
    overlay.activate()
    return overlay


def _reads(monkeypatch):
    """The files whose text is read from now on."""
    seen: list[str] = []
    original = Path.read_text

    def read_text(self, *args, **kwargs):
        seen.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    return seen


def _component(overlay, name):
    return overlay._by_module[name]


def test_the_next_process_reads_no_file_it_does_not_import(two_modules, config, overlays, tmp_path, monkeypatch):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    assert importlib.import_module(first).answer() == 42
    assert not _component(one, first).remembered
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    reads = _reads(monkeypatch)
    assert importlib.import_module(first).answer() == 42
    assert _component(two, first).remembered
    assert reads == []  # neither module's text: the code came from the cache
    assert _state(two, "fix").state == "pending"  # the second module has not run its patch yet
    assert importlib.import_module(second).value() == 2
    assert _state(two, "fix").state == "applied"
    assert reads == []
    assert two.module_text(second) == OTHER.replace("return 1", "return 2")  # worked out on demand


def test_a_changed_file_is_decided_again(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    second_file.write_text(OTHER.replace("return 1", "return 3"))  # the patch no longer fits
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    assert importlib.import_module(first).answer() == 41  # all or nothing: the component drifted
    assert not _component(two, first).remembered
    assert _state(two, "fix").state == "drift"


def test_a_changed_patch_is_decided_again(two_modules, sandbox, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    first_path = f"torch/{first.split('.')[-1]}.py"
    other_path = f"torch/{second.split('.')[-1]}.py"
    diffs = [make_diff(first_path, MODULE, PATCHED), make_diff(other_path, OTHER, OTHER.replace("return 1", "return 5"))]
    sandbox.series(("0001-fix.patch", make_patch("fix", diffs)))
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    importlib.import_module(first)
    assert not _component(two, first).remembered
    assert importlib.import_module(second).value() == 5


def test_a_recalled_plan_whose_code_is_gone_is_built_from_the_files(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    importlib.import_module(second)
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    importlib.import_module(first)  # recalled: the second module's code is loaded at its import
    assert _component(two, first).remembered
    for entry in (tmp_path / "code").iterdir():
        entry.unlink()
    assert importlib.import_module(second).value() == 2
    assert _state(two, "fix").state == "applied"


def test_a_file_changed_after_a_recalled_decision_runs_unpatched_and_says_so(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    importlib.import_module(first)
    assert _component(two, first).remembered
    second_file.write_text(OTHER + "\n# edited\n")
    os.utime(second_file, ns=(1, 1))
    importlib.invalidate_caches()
    with pytest.warns(UserWarning, match="changed on disk since the patch was decided"):
        assert importlib.import_module(second).value() == 1
    assert _state(two, "fix").state == "failed"


def test_a_decision_with_swapped_code_is_not_kept(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    importlib.import_module(second)  # imported before the overlay: its function is swapped
    one = _new_process(overlays, config, tmp_path, None, [first])
    assert importlib.import_module(first).answer() == 42
    two = _new_process(overlays, config, tmp_path, one, [first])
    importlib.import_module(first)
    assert not _component(two, first).remembered
