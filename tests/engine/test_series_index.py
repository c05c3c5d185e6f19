"""The series index: a warm ``import torch_overlay, torch`` reads no patch file, and an index that
does not describe the folder as it is now (a patch edited, a file truncated or poisoned) is
never believed: the series is read again."""

from __future__ import annotations

import importlib
import json
import marshal
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_overlay.engine.caches import record, series_index
from torch_overlay.engine.caches.folder import CacheFolder
from torch_overlay.engine.caches.series_index import read_indexed_series, series_key
from torch_overlay.series.patchfile import INDEXED_FIELDS, parse_patch, PatchParseError
from torch_overlay.series.series import read_series

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

REPO = Path(__file__).resolve().parents[2]

# Records every file the process opens, printed last (atexit runs the first registered last).
AUDITED = """
import atexit, json, os, sys
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.path.abspath(os.fsdecode(args[0])))
sys.addaudithook(hook)
atexit.register(lambda: print("OPENED " + json.dumps(opened)))
import torch_overlay, torch
"""


def _age(folder: Path) -> None:
    """Date the folder's files back: a file written just now is not indexed (racily clean)."""
    past = time.time() - 60
    for file in folder.iterdir():
        os.utime(file, (past, past))


def _opened(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", AUDITED], env=env, capture_output=True, text=True, check=True, timeout=300
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("OPENED "))
    return json.loads(line.removeprefix("OPENED "))


def test_a_warm_import_opens_no_patch_file(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)  # the real series, its files' times kept
    # Not this process's PYTHONPATH: its bootstrap would import the overlay before the audit hook.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")},
        "PYTHONPATH": str(REPO),
        "TORCH_OVERLAY_PATCHES": str(patches),
        "TORCH_OVERLAY_CACHE_DIR": str(tmp_path / "cache"),
        "TORCH_OVERLAY_QUIET": "1",
    }
    cold = _opened(env)  # fills the index, the decisions and the code cache
    assert any(p.startswith(str(patches)) for p in cold)  # the audit hook sees the series read
    warm = _opened(env)
    assert [p for p in warm if p.startswith(str(patches))] == []
    assert any(p.startswith(str(tmp_path / "cache")) for p in warm)  # the index came from the cache


def test_a_damaged_index_is_rebuilt_while_the_memo_holds(tmp_path: Path) -> None:
    """The activation memo is recalled, the index it reads is damaged: one process reads the
    series from its files and indexes it again; the next one opens no patch file."""
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")},
        "PYTHONPATH": str(REPO),
        "TORCH_OVERLAY_PATCHES": str(patches),
        "TORCH_OVERLAY_CACHE_DIR": str(tmp_path / "cache"),
        "TORCH_OVERLAY_QUIET": "1",
    }
    _opened(env)  # fills the index and the memo
    entry, _ = CacheFolder(tmp_path / "cache" / "code")._entry(series_key(patches)[0])
    assert entry.is_file()
    entry.write_bytes(entry.read_bytes()[:-7] + b"damaged")
    damaged = _opened(env)
    assert [p for p in damaged if p.startswith(str(patches))] != []  # the series read from its files
    assert entry.is_file()  # and indexed again
    assert [p for p in _opened(env) if p.startswith(str(patches))] == []


@pytest.fixture
def indexed(sandbox):
    """A one-patch series, dated back so that it is indexed, and a code cache."""
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    _age(sandbox.patches)
    return name, sandbox.patches, CacheFolder(sandbox.root / "cache" / "code")


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files of the series read from now on (by the parser or by read_series)."""
    seen: list[str] = []
    original = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        seen.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    return seen


def test_the_index_gives_the_series_without_reading_it(indexed, monkeypatch) -> None:
    _, patches, cache = indexed
    first = read_indexed_series(patches, cache)
    parsed = parse_patch(first[0].variants[0].path)
    reads = _reads(monkeypatch)
    again = read_indexed_series(patches, cache)
    assert reads == []
    assert [(p.id, p.error) for p in again] == [(p.id, p.error) for p in first]
    for old, new in zip(first[0].variants, again[0].variants):
        assert (new.path, new.subject, new.paths, new.digest) == (old.path, old.subject, old.paths, old.digest)
        assert [new.field(k) for k in INDEXED_FIELDS] == [old.field(k) for k in INDEXED_FIELDS]
    assert reads == []
    # What activation does not need is read from the file when asked for, as it was parsed.
    variant = again[0].variants[0]
    assert (variant.description, variant.text, variant.errors) == (parsed.description, parsed.text, parsed.errors)
    assert reads == ["0001-fix.patch"]
    assert variant.files[0].path == parsed.files[0].path
    # So are the other fields.
    assert [v.fields for v in again[0].variants] == [parse_patch(v.path).fields for v in first[0].variants]


def test_the_real_series_reads_the_same_from_its_index(tmp_path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    cache = CacheFolder(tmp_path / "cache")
    read_indexed_series(patches, cache)
    fresh = read_series(patches, lazy=True)
    again = read_indexed_series(patches, cache)
    assert [(p.id, p.error, [(v.path, v.subject, v.fields, v.paths, v.digest) for v in p.variants]) for p in again] == [
        (p.id, p.error, [(v.path, v.subject, v.fields, v.paths, v.digest) for v in p.variants]) for p in fresh
    ]


def test_an_edited_patch_takes_effect_in_the_next_process(indexed, config, overlays) -> None:
    name, patches, _ = indexed
    cfg = config(cache_dir=patches.parent / "cache")
    one = overlays(cfg)
    one.activate()
    assert _state(one, "fix").state == "pending"
    one._hook.uninstall()
    # Edited by hand in a checkout: the bug came later than this torch.
    file = patches / "0001-fix.patch"
    file.write_text(file.read_text().replace("Bug: ", "Introduced: 99.0\nBug: "))
    two = overlays(cfg)
    two.activate()
    assert _state(two, "fix").state == "not needed"
    two._hook.uninstall()
    # The same size as when it was indexed, another text: the time says it changed.
    file.write_text(file.read_text().replace("Introduced: 99.0\n", "").replace("return 42", "return 43"))
    _age(patches)
    three = overlays(cfg)
    three.activate()
    assert _state(three, "fix").state == "pending"
    assert importlib.import_module(name).answer() == 43


def test_a_series_written_just_now_is_read_not_indexed(sandbox, monkeypatch) -> None:
    monkeypatch.setattr(record, "RACY_NS", 2_000_000_000)  # the sandbox sets it to 0
    _, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    cache = CacheFolder(sandbox.root / "cache")
    stored: list[str] = []
    monkeypatch.setattr(cache, "store", lambda key, value: stored.append(key))
    read_indexed_series(sandbox.patches, cache)
    assert stored == []  # a rewrite within the clock's resolution would keep the signature


@pytest.mark.parametrize(
    "offset_s, storable",
    [(-60, True), (-1, False), (0, False), (1, False), (3600, True)],  # a file's mtime, from now
)
def test_a_series_is_racy_while_a_file_was_written_within_the_clock_resolution(tmp_path, offset_s, storable) -> None:
    (tmp_path / "a.patch").write_text("a")
    (tmp_path / "b.patch").write_text("b")
    _age(tmp_path)
    when = time.time() + offset_s
    os.utime(tmp_path / "b.patch", (when, when))
    assert series_key(tmp_path)[1] is storable


def test_the_series_key_changes_with_each_file_of_the_folder(tmp_path) -> None:
    for name in ("series", "0001-a.patch", "0002-b.patch"):
        (tmp_path / name).write_text(name)
    _age(tmp_path)
    keys = [series_key(tmp_path)[0]]
    file = tmp_path / "0002-b.patch"
    file.write_text("0002-b.patcX")  # same size
    os.utime(file, (time.time() - 60, time.time() - 60))
    keys.append(series_key(tmp_path)[0])
    file.rename(tmp_path / "0002-c.patch")
    keys.append(series_key(tmp_path)[0])
    (tmp_path / "0003-d.patch").write_text("")
    keys.append(series_key(tmp_path)[0])
    (tmp_path / "0001-a.patch").unlink()
    keys.append(series_key(tmp_path)[0])
    assert len(set(keys)) == len(keys)
    assert series_key(tmp_path)[0] == keys[-1]  # and only with them


def test_a_patch_edited_after_it_was_indexed_is_not_believed(indexed) -> None:
    _, patches, cache = indexed
    read_indexed_series(patches, cache)
    variant = read_indexed_series(patches, cache)[0].variants[0]
    file = patches / "0001-fix.patch"
    file.write_text(file.read_text().replace("Test fixture.", "Edited."))
    with pytest.raises(PatchParseError, match="changed on disk"):
        variant.files  # noqa: B018 - its hunks are read now, from a file that is not the one indexed


def _entry(cache: CacheFolder, patches: Path) -> Path:
    return cache._entry(series_key(patches)[0])[0]


def test_a_truncated_index_is_ignored_and_rebuilt(indexed) -> None:
    _, patches, cache = indexed
    read_indexed_series(patches, cache)
    entry = _entry(cache, patches)
    entry.write_bytes(entry.read_bytes()[:-7])
    again = read_indexed_series(patches, cache)
    assert [p.id for p in again] == ["fix"]
    assert series_index.SERIES_INDEX.load(cache, series_key(patches)[0]) is not None  # rebuilt


FIELDS = {"Overlay-Id": "fix"}


def _rows(*rows: object) -> dict[str, bytes]:
    """An index of one patch ``fix`` whose rows are ``rows``."""
    return {"fix": marshal.dumps(rows)}


@pytest.mark.parametrize(
    "poison",
    [
        "not an index",
        _rows(("../../outside.patch", "s", FIELDS, ("torch/x.py",), bytes(32))),
        _rows(("..", "s", FIELDS, ("torch/x.py",), bytes(32))),
        _rows(("0001-fix.patch", "s", {"Overlay-Id": 1}, ("torch/x.py",), bytes(32))),
        _rows(("0001-fix.patch", "s", {"Overlay-Id": "fix", "Symptom": "not indexed"}, ("torch/x.py",), bytes(32))),
        _rows(("0001-fix.patch", "s", {"Bug": "no id"}, ("torch/x.py",), bytes(32))),
        _rows(("0001-fix.patch", "s", {"Overlay-Id": "another"}, ("torch/x.py",), bytes(32))),  # not its id
        _rows(("0001-fix.patch", "s", FIELDS, ("/etc/passwd",), bytes(32))),
        _rows(("0001-fix.patch", "s", FIELDS, ("torch/x.py",), "0" * 64)),  # a str where the digest belongs
        _rows(("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(31))),
        _rows(["0001-fix.patch", "s", FIELDS, ["torch/x.py"], bytes(32)]),
        _rows(("an error row before a variant",), ("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32))),
        _rows(),
        {"fix": b"not marshal"},
        {"fix": marshal.dumps([("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32))])},
        {1: marshal.dumps((("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32)),))},
        {"fix": (("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32)),)},  # not marshalled apart
        ("another kind", {}),  # the format before
        [("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32))],
        [1, 2, 3],
    ],
)
def test_a_poisoned_index_is_not_believed(indexed, poison) -> None:
    _, patches, cache = indexed
    cache.store(series_key(patches)[0], poison)  # well formed for the code cache, wrong inside
    assert [(p.id, p.error) for p in read_indexed_series(patches, cache)] == [("fix", None)]
    assert [p.id for p in read_indexed_series(patches, cache)] == ["fix"]  # rebuilt


def test_an_index_holding_code_is_never_run(indexed, tmp_path) -> None:
    _, patches, cache = indexed
    witness = tmp_path / "ran"
    code = compile(f"open({str(witness)!r}, 'w').close()", "<poison>", "exec")
    cache.store(series_key(patches)[0], code)  # a code object where the index belongs
    assert marshal.loads(marshal.dumps(code)) is not None
    assert [p.id for p in read_indexed_series(patches, cache)] == ["fix"]
    assert not witness.exists()


def test_a_well_formed_row_is_believed(tmp_path: Path) -> None:
    """The control of the poisons above: the same row, well formed, makes the patch."""
    blob = _rows(("0001-fix.patch", "s", FIELDS, ("torch/x.py",), bytes(32)), ("its later file failed",))["fix"]
    patch = series_index._patch_from_index(tmp_path, "fix", blob)
    assert patch is not None
    assert (patch.id, [v.name for v in patch.variants], patch.error) == (
        "fix",
        ["0001-fix.patch"],
        "its later file failed",
    )
    assert patch.variants[0].path == tmp_path / "0001-fix.patch"
