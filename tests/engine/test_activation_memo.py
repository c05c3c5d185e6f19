"""engine/caches/activation_memo.py: a warm activation replays what the first one worked out, exactly,
and only for the series, torch and switches it was worked out for."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_overlay.engine.caches import activation_memo, series_index
from torch_overlay.engine.caches.folder import CacheFolder
from torch_overlay import OverlayWarning
from torch_overlay.engine.components import Entry
from torch_overlay.series.series import read_series

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

REPO = Path(__file__).resolve().parents[2]
OTHER = "def answer():\n    return 7\n"


def _age(folder: Path) -> None:
    past = time.time() - 60
    for file in folder.iterdir():
        os.utime(file, (past, past))


def _rows(overlay) -> list[tuple[str, str, str, tuple]]:
    return [(s.id, str(s.state), s.reason, s.targets) for s in overlay.status()]


@pytest.fixture
def series(sandbox):
    """Two patches of one module, one of another, one settled by its fields; dated back (indexed)."""
    name, path = sandbox.module(MODULE)
    other, other_path = sandbox.module(OTHER)
    diff = make_diff(path, MODULE, PATCHED)
    sandbox.series(
        ("0001-fix.patch", make_patch("fix", [diff])),
        ("0002-later.patch", make_patch("later", [diff], Introduced="99.0")),
        ("0003-other.patch", make_patch("other", [make_diff(other_path, OTHER, OTHER.replace("7", "8"))])),
    )
    _age(sandbox.patches)
    return name, other, sandbox


def _activated_once(overlays, cfg):
    """An overlay activated with ``cfg`` (which stores the memo), its import hook taken off."""
    first = overlays(cfg)
    first.activate()
    first._hook.uninstall()
    return first


def _memo_stores(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    stored: list[str] = []
    original = CacheFolder.store

    def store(self: CacheFolder, key: str, value: object) -> None:
        if activation_memo.ACTIVATION_MEMO.owns(key):
            stored.append(key)
        original(self, key, value)

    monkeypatch.setattr(CacheFolder, "store", store)
    return stored


def test_a_warm_activation_replays_the_first_one_exactly(series, config, overlays, monkeypatch) -> None:
    name, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    stored = _memo_stores(monkeypatch)
    first = overlays(cfg)
    first.activate()
    assert len(stored) == 1
    first._hook.uninstall()
    # The second one neither decides a header nor looks a file up: it replays.
    monkeypatch.setattr(activation_memo, "_settled_without_files", lambda *a: pytest.fail("decided again"))
    second = overlays(cfg)
    second.activate()
    assert len(stored) == 1
    assert _rows(second) == _rows(first)
    assert [s.state for s in second.status()] == ["pending", "not needed", "pending"]
    # Replayed components work: the module runs the patched source.
    assert importlib.import_module(name).answer() == 42
    assert (_state(second, "fix").state, _state(second, "fix").mode) == ("applied", "at import")
    assert importlib.import_module(other).answer() == 8


def test_the_memo_is_per_switches(series, config, overlays) -> None:
    _, _, sandbox = series
    cache = sandbox.root / "cache"
    overlays(config(cache_dir=cache)).activate()
    off = overlays(config(cache_dir=cache, disabled_ids=frozenset({"fix"})))
    off.activate()
    assert _state(off, "fix").state == "disabled"
    assert _state(off, "other").state == "pending"
    again = overlays(config(cache_dir=cache))
    again.activate()
    assert _state(again, "fix").state == "pending"


def test_the_memo_is_per_torch_release(series, config, monkeypatch) -> None:
    _, _, sandbox = series
    cache = CacheFolder(sandbox.root / "cache" / "code")
    patches, key = series_index.indexed_series_and_key(sandbox.patches, cache)
    assert key is not None
    cfg = config()
    entries = [Entry.of(p) for p in patches]
    activation_memo.settle_and_group(entries, key, cfg, cache, _settle)
    monkeypatch.setattr(activation_memo, "torch_version", lambda: "99.1.0")
    later = [Entry.of(p) for p in patches]
    activation_memo.settle_and_group(later, key, cfg, cache, _settle)
    assert [str(e.state) for e in later] == ["pending", "pending", "pending"]  # 0002's bug exists in 99.1


def _settle(entry: Entry, state, reason: str) -> None:
    entry.state, entry.reason = state, reason


def test_a_memo_that_does_not_fit_is_not_replayed(series, config) -> None:
    _, _, sandbox = series
    patches = read_series(sandbox.patches, lazy=True)
    entries = [Entry.of(p) for p in patches]
    components = activation_memo.settle_and_group(entries, None, config(), CacheFolder(None), _settle)
    memo = activation_memo.record(entries, components, set())
    by_id = {p.id: p for p in patches}
    settled: list[tuple] = []
    roster = activation_memo.replay(memo, by_id.__getitem__, lambda *s: settled.append(s))
    assert roster is not None  # the control: the memo as recorded fits
    assert [e.id for e in roster.every()] == ["fix", "later", "other"]
    assert [(e.id, str(state)) for e, state, _ in settled] == [("later", "not needed")]
    ids, settled_rows, grouped, missing = memo
    first, second = grouped  # ((0,), (("torch/a.py",),), files), ((2,), ...)
    x = (("torch/x.py", "torch.x", str(sandbox.patches / "series")),)  # a file that exists
    first_name = sandbox.modules[0].split(".")[1]
    control = (ids, settled_rows, (((0,), (("torch/x.py",),), x), second), missing)
    assert activation_memo.replay(control, by_id.__getitem__, lambda *s: None) is not None
    broken = [
        (ids, ((1, "no such state", "x"),), grouped, missing),
        (ids, settled_rows, ((((0, 7), ((),), ()),), second), missing),  # a member out of range
        (ids, settled_rows, (((0,), ((), ()), x), second), missing),
        (ids, settled_rows, (((0,), (("torch/y.py",),), x), second), missing),  # not its files
        (ids, settled_rows, (((0,), ((),), x), second), missing),  # a member that changes nothing
        (
            ids,
            settled_rows,
            (((0,), ("torch/x.py",), x), second),
            missing,
        ),  # not a tuple of paths
        (ids, ((1, "upstream", 3),), grouped, missing),
        (ids, ((-2, "upstream", "x"),), grouped, missing),  # a list takes -2 too
        (ids, ((True, "upstream", "x"),), grouped, missing),  # True == 1
        (
            ids,
            settled_rows,
            (((0,), (("torch/x.py",),), (("torch/x.py", "torch.x", 3),)), second),
            missing,
        ),
        (ids, settled_rows, (((-3,), (("torch/x.py",),), x), second), missing),
        (ids, settled_rows, (first,), missing),  # a position in no component
        (ids, settled_rows, (first, first, second), missing),  # one in two
        (ids, ((0, "upstream", "x"),) + settled_rows, grouped, missing),  # settled and grouped
        (("fix", 2, "other"), settled_rows, grouped, missing),  # an id not a string
        (ids, ((1, "applied", "x"),), grouped, missing),  # activation applies nothing
        (ids, ((1, "pending", "x"),), grouped, missing),
        (ids, settled_rows, grouped, (("torch/x.py",),)),  # a lookup not (path, module)
        (ids, settled_rows, grouped, ((1, "torch.x"),)),
        # A file not found then that is found now: activation runs again.
        (ids, settled_rows, grouped, ((f"torch/{first_name}.py", sandbox.modules[0]),)),
    ]
    for poison in broken:
        assert activation_memo.replay(poison, by_id.__getitem__, lambda *s: pytest.fail("settled")) is None, poison


def test_a_poisoned_memo_is_ignored_and_rewritten(series, config, overlays) -> None:
    _, _, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first = _activated_once(overlays, cfg)
    cache = first._cache
    _, key = series_index.indexed_series_and_key(sandbox.patches, cache)
    from torch_overlay.series.versions import torch_root, torch_version

    memo_key = activation_memo.memo_key(key, torch_version(), str(torch_root()), cfg)
    cache.store(memo_key, (("x",), (), ()))
    second = overlays(cfg)
    second.activate()
    assert _rows(second) == _rows(first)
    assert activation_memo.ACTIVATION_MEMO.load(cache, memo_key)[0][0] == ("fix", "later", "other")


def test_a_target_file_gone_since_the_memo_fails_its_patch_not_the_import(series, config, overlays) -> None:
    name, other, sandbox = series
    _activated_once(overlays, config(cache_dir=sandbox.root / "cache"))
    (sandbox.pkg / f"{other.removeprefix('torch.')}.py").unlink()
    importlib.invalidate_caches()
    second = overlays(config(cache_dir=sandbox.root / "cache"))
    second.activate()
    assert _state(second, "other").state == "failed"
    assert "not found in the installed torch" in _state(second, "other").reason
    assert _state(second, "fix").state == "pending"
    assert importlib.import_module(name).answer() == 42
    sys.modules.pop(other, None)


def test_a_warm_activation_makes_only_the_patches_it_decides(series, config, overlays) -> None:
    name, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    _activated_once(overlays, cfg)
    second = overlays(cfg)
    second.activate()
    entries = lambda: [e.id for e in second._roster.made()]  # noqa: E731
    made = lambda: [e.id for e in second._roster.made() if e._patch is not None]  # noqa: E731
    # Only the settled patch has an entry, and no patch is made.
    assert (entries(), made()) == (["later"], [])
    assert importlib.import_module(name).answer() == 42
    # The component of "fix" was decided: it has an entry and its patch; "later" and "other" were not needed.
    assert (entries(), made()) == (["fix", "later"], ["fix"])
    assert [s.id for s in second.status()] == ["fix", "later", "other"]
    assert made() == ["fix", "later", "other"]


def _spoil_index_rows(cache: CacheFolder, patches: Path, pid: str) -> None:
    """The index as stored, but with the rows of ``pid`` not what the index makes."""
    key = series_index.series_key(patches)[0]
    rows = series_index.SERIES_INDEX.load(cache, key)[0]
    cache.store(key, {**rows, pid: b"not rows"})


def _recalled_with_rows_spoiled(overlays, cfg, sandbox, pid: str):
    """(the first overlay, a second one recalled from its memo) after the index rows of ``pid`` were spoiled."""
    first = _activated_once(overlays, cfg)
    _spoil_index_rows(first._cache, sandbox.patches, pid)
    second = overlays(cfg)
    second.activate()  # the memo names the index's patches: recalled
    return first, second


def test_rows_not_believed_are_read_from_the_files(series, config, overlays) -> None:
    _, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first, second = _recalled_with_rows_spoiled(overlays, cfg, sandbox, "other")
    assert [e.id for e in second._roster.made() if e._patch is not None] == []
    assert importlib.import_module(other).answer() == 8
    assert (_state(second, "other").state, _state(second, "other").mode) == ("applied", "at import")
    assert _rows(second)[:2] == _rows(first)[:2]


def test_a_patch_gone_from_the_files_when_first_needed_fails_alone(series, config, overlays) -> None:
    name, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first, second = _recalled_with_rows_spoiled(overlays, cfg, sandbox, "other")
    (sandbox.patches / "series").write_text("0001-fix.patch\n0002-later.patch\n")  # after the recall
    with pytest.warns(OverlayWarning, match="patch other failed: .*no longer in"):
        assert importlib.import_module(other).answer() == 7  # left unpatched; the import works
    assert _state(second, "other").state == "failed"
    assert importlib.import_module(name).answer() == 42


def test_a_memo_and_index_that_agree_on_ids_that_are_not_strings_are_ignored(series, config, overlays) -> None:
    _, _, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first = _activated_once(overlays, cfg)
    cache = first._cache
    key = series_index.series_key(sandbox.patches)[0]
    from torch_overlay.series.versions import torch_root, torch_version

    cache.store(key, {1: b"", 2: b"", 3: b""})
    memo_key = activation_memo.memo_key(key, torch_version(), str(torch_root()), cfg)
    memo = activation_memo.ACTIVATION_MEMO.load(cache, memo_key)[0]
    cache.store(memo_key, ((1, 2, 3), *memo[1:]))
    second = overlays(cfg)
    second.activate()  # neither is believed: the series is read from its files
    assert _rows(second) == _rows(first)


def test_rows_not_believed_for_one_patch_leave_the_others_to_the_index(series, config, overlays) -> None:
    name, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first, second = _recalled_with_rows_spoiled(overlays, cfg, sandbox, "fix")
    assert importlib.import_module(name).answer() == 42  # "fix" read from the files
    assert importlib.import_module(other).answer() == 8
    assert _state(second, "other").state == "applied"
    made = {e.id: e.patch.variants[0] for e in second._roster.every()}
    # An indexed variant knows its folder and reads its file only when needed; a parsed one has read it.
    assert (made["fix"]._folder, made["other"]._folder) == (None, sandbox.patches)


def test_an_index_that_does_not_name_the_memos_patches_in_order_is_not_believed(series, config, overlays) -> None:
    name, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first = _activated_once(overlays, cfg)
    key = series_index.series_key(sandbox.patches)[0]
    rows = series_index.SERIES_INDEX.load(first._cache, key)[0]
    first._cache.store(key, dict(reversed(rows.items())))  # rows as made, another order
    second = overlays(cfg)
    second.activate()  # the memo is recalled; the index is not read yet
    assert importlib.import_module(name).answer() == 42
    assert importlib.import_module(other).answer() == 8
    made = {e.id: e.patch.variants[0] for e in second._roster.every()}
    # Every patch was read from its file (a parsed variant has no folder of an index).
    assert {pid: v._folder for pid, v in made.items()} == {"fix": None, "later": None, "other": None}
    assert [s.state for s in second.status()] == ["applied", "not needed", "applied"]


def test_rows_not_believed_and_a_series_edited_since_fail_the_patch(series, config, overlays) -> None:
    """The files are read instead of the rows only while they are the series activation recalled."""
    _, other, sandbox = series
    cfg = config(cache_dir=sandbox.root / "cache")
    first, second = _recalled_with_rows_spoiled(overlays, cfg, sandbox, "other")
    edited = sandbox.patches / "0003-other.patch"
    edited.write_text(edited.read_text().replace("Test fixture.", "Edited since."))
    with pytest.warns(OverlayWarning, match="patch other failed: .*as this process read it"):
        assert importlib.import_module(other).answer() == 7


def _status(env: dict[str, str], before: str = "") -> tuple[dict[str, tuple[str, str]], int]:
    """Each patch's (state, reason) and the exit status of ``status --lazy --json``, in a new process
    (``before``: code it runs first)."""
    code = (
        f"{before}\nimport sys\nfrom torch_overlay.cli.main import main\nsys.exit(main(['status', '--lazy', '--json']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.stdout.startswith("{"), proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["patches"]
    return {r["id"]: (r["state"], r["reason"]) for r in rows}, proc.returncode


def test_a_file_one_process_did_not_find_is_looked_up_again_by_the_next(tmp_path) -> None:
    """A process that stubs a torch package in sys.modules before the overlay finds no file of its
    patches; a later process on the same cache finds them, and says what it finds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_")}
    env["PYTHONPATH"] = str(REPO)
    control, control_rc = _status({**env, "TORCH_OVERLAY_CACHE_DIR": str(tmp_path / "control")})
    targets = {p.id: p.targets[0].module for p in read_series(REPO / "patches", lazy=True)}
    pid = next(p for p, (state, _) in control.items() if state == "pending" and targets[p].count(".") >= 2)
    state, package = control[pid][0], targets[pid].rpartition(".")[0]  # torch.distributed.nn, say
    env["TORCH_OVERLAY_CACHE_DIR"] = str(tmp_path / "cache")
    stub = f"import sys, types\nsys.modules[{package!r}] = stub = types.ModuleType({package!r})\nstub.__path__ = []"
    stubbed, _ = _status(env, stub)
    assert stubbed[pid][0] == "failed" and "not found in the installed torch" in stubbed[pid][1]  # true of that process
    later, later_rc = _status(env)
    assert (later[pid][0], later_rc) == (state, control_rc), later[pid]
    assert later == control
