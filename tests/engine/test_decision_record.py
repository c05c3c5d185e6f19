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
    diffs = [
        make_diff(first_path, MODULE, PATCHED),
        make_diff(second_path, OTHER, OTHER.replace("return 1", "return 2")),
    ]
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
    diffs = [
        make_diff(first_path, MODULE, PATCHED),
        make_diff(other_path, OTHER, OTHER.replace("return 1", "return 5")),
    ]
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


def _record(overlay, name):
    """The decision record stored for the component of ``name`` and its key."""
    from torch_overlay.engine.caches.decision_record import _is_record, decision_key
    from torch_overlay.series.versions import torch_version

    component = _component(overlay, name)
    key = decision_key(component, torch_version())
    return key, overlay._cache.load(key, _is_record)[0]


def test_a_record_that_says_what_no_decision_can_is_not_believed(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    key, (entries, modules) = _record(one, first)
    ((pid, state, reason, variant, paths),) = entries
    (module_a, module_b) = sorted(modules)
    lies = [
        ([(pid, state, reason, variant, [])], []),  # applied, changing nothing: "applied" with no code
        ([(pid, state, reason, variant, paths)], [module_a]),  # a module it changes runs its own code
        ([(pid, state, reason, "", paths)], modules),  # applied with no variant
        ([(pid, "pending", reason, variant, paths)], modules),
        ([], modules),  # the patch left undecided
        ([(pid, state, reason, variant, paths)], [(module_a[0], *module_b[1:])]),  # another file's code
        ([(pid, state, reason, variant, paths)], [(*module_a[:2], module_b[2], module_a[3]), module_b]),
        ([(pid, state, reason, variant, paths)], [(*module_a[:3], []), module_b]),  # code of no patch
    ]
    previous = one
    for entries_, modules_ in lies:
        one._cache.store(key, (entries_, modules_))
        two = _new_process(overlays, config, tmp_path, previous, [first, second])
        assert importlib.import_module(first).answer() == 42, (entries_, modules_)
        assert not _component(two, first).remembered, (entries_, modules_)  # decided from the files
        assert importlib.import_module(second).value() == 2
        assert _state(two, "fix").state == "applied"
        previous = two


def test_code_compiled_for_another_file_is_not_run(two_modules, config, overlays, tmp_path):
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    _, (_, modules) = _record(one, first)
    keys = {name: code_key for name, _, code_key, _ in modules}
    # The entry of the second module's code holds the first module's: right shape, wrong file.
    from torch_overlay.engine.caches.compiled_code import MODULE_CODE

    first_code = MODULE_CODE.load(one._cache, keys[first])[0]
    one._cache.store(keys[second], first_code)
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    importlib.import_module(first)
    assert _component(two, first).remembered
    assert importlib.import_module(second).value() == 2  # built again from its own file
    assert _state(two, "fix").state == "applied"


def test_a_memo_that_names_another_file_is_checked_when_decided(two_modules, sandbox, config, overlays, tmp_path):
    """The activation memo says which file a component changes: the decision changes the file this
    process finds, whatever the memo names."""
    from torch_overlay.engine.caches import activation_memo, series_index
    from torch_overlay.series.versions import torch_root, torch_version

    first, second, second_file = two_modules
    for file in sandbox.patches.iterdir():
        os.utime(file, (1, 1))  # indexed: the memo is kept
    one = _new_process(overlays, config, tmp_path, None, [])
    cfg = one.config
    key = activation_memo.memo_key(series_index.series_key(sandbox.patches)[0], torch_version(), str(torch_root()), cfg)
    ids, settled_rows, grouped, missing = activation_memo.ACTIVATION_MEMO.load(one._cache, key)[0]
    ((members, paths, files),) = grouped
    decoy = tmp_path / "decoy.py"
    decoy.write_text(OTHER)  # what the second module's patch fits, elsewhere
    files = tuple((p, m, str(decoy) if m == second else f) for p, m, f in files)
    one._cache.store(key, (ids, settled_rows, ((members, paths, files),), missing))
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    assert _component(two, first).files[f"torch/{second.split('.')[-1]}.py"] == decoy  # as recalled
    assert importlib.import_module(first).answer() == 42
    assert _component(two, first).files[f"torch/{second.split('.')[-1]}.py"] == second_file
    assert importlib.import_module(second).value() == 2
    assert _state(two, "fix").state == "applied"


def test_an_edit_in_place_that_keeps_size_and_mtime_is_decided_again(two_modules, config, overlays, tmp_path):
    """``__pycache__`` would trust such a file; the decision's key holds the ctime, which
    ``os.utime`` cannot set back."""
    first, second, second_file = two_modules
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    before = os.stat(second_file)
    with open(second_file, "r+") as f:  # same inode, same size
        f.write(OTHER.replace("return 1", "return 3"))
    os.utime(second_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(second_file)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    importlib.invalidate_caches()
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    assert importlib.import_module(first).answer() == 41  # the patch no longer fits: all or nothing
    assert not _component(two, first).remembered
    assert _state(two, "fix").state == "drift"
    assert importlib.import_module(second).value() == 3


def test_a_decision_over_a_file_written_just_now_is_not_kept(two_modules, config, overlays, tmp_path, monkeypatch):
    """On a file system with coarse timestamps, a file written within the same tick as the decision
    could change again with the same signature: as git's racily clean entries, it is not kept."""
    from torch_overlay.engine.caches import record

    monkeypatch.setattr(record, "RACY_NS", 2_000_000_000)
    first, second, second_file = two_modules  # written just now
    one = _new_process(overlays, config, tmp_path, None, [first, second])
    importlib.import_module(first)
    two = _new_process(overlays, config, tmp_path, one, [first, second])
    assert importlib.import_module(first).answer() == 42
    assert not _component(two, first).remembered
    now = 10 * record.RACY_NS
    monkeypatch.setattr(record.time, "time_ns", lambda: now)
    assert record.settled([(1, 1, 1, 1), (1, 7, 1, 9)])
    assert not record.settled([(1, 1, 1, 1), (1, 1, 1, now - 1)])  # a ctime just now: chmod, link, utime
    assert not record.settled([(1, now - record.RACY_NS + 1, 1, 1)])
