"""The cache folder executes nothing it cannot trust, and heals what it cannot read."""

import importlib
import marshal
import os
import stat

import pytest

from torch_overlay.engine.caches.folder import CacheFolder, checksum, FORMAT
from torch_overlay.engine.caches.record import Record

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)


def _build():
    return compile("VALUE = 1", "m.py", "exec")


def _is_code(value):
    return isinstance(value, type(_build()))


RECORD = Record("test code", 1, _is_code)
KEY = RECORD.key("some key")


def _entry(folder):
    (entry,) = [p for p in folder.iterdir() if p.suffix == ".marshal"]
    return entry


def _poison(folder):
    """Replace the entry's payload by other code, with digests that verify (as an attacker could)."""

    entry = _entry(folder)
    payload = marshal.dumps(compile("VALUE = 666", "m.py", "exec"))
    key_digest = entry.read_bytes()[len(FORMAT) : len(FORMAT) + 32]
    entry.write_bytes(FORMAT + key_digest + checksum(payload) + payload)
    return entry


def _value(code):
    ns: dict = {}
    exec(code, ns)
    return ns["VALUE"]


def test_folder_is_private_and_entries_are_reused(tmp_path):
    folder = tmp_path / "cache" / "code"
    RECORD.load_or_build(CacheFolder(folder), KEY, _build)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    calls = []
    value = RECORD.load_or_build(CacheFolder(folder), KEY, lambda: calls.append(1))
    assert _value(value) == 1 and calls == []


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "other-owner"])
def test_a_folder_others_can_write_is_never_read(tmp_path, how):
    folder = tmp_path / "code"
    RECORD.load_or_build(CacheFolder(folder), KEY, _build)
    _poison(folder)
    if how == "other-owner":
        if os.getuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(folder, 12345, -1)
    else:
        folder.chmod(0o770 if how == "group-writable" else 0o777)
    with pytest.warns(UserWarning, match="not used"):
        value = RECORD.load_or_build(CacheFolder(folder), KEY, _build)
    assert _value(value) == 1


def test_an_entry_owned_by_someone_else_is_never_read(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to chown")
    folder = tmp_path / "code"
    RECORD.load_or_build(CacheFolder(folder), KEY, _build)
    os.chown(_poison(folder), 12345, -1)
    assert _value(RECORD.load_or_build(CacheFolder(folder), KEY, _build)) == 1


@pytest.mark.parametrize("damage", ["bit-flip", "truncated", "wrong-shape", "other-key"])
def test_a_damaged_entry_is_deleted_and_rebuilt(tmp_path, damage):
    folder = tmp_path / "code"
    RECORD.load_or_build(CacheFolder(folder), KEY, _build)
    entry = _entry(folder)
    data = bytearray(entry.read_bytes())
    if damage == "bit-flip":
        data[-5] ^= 0x01
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "wrong-shape":
        payload = marshal.dumps(None)
        data = bytearray(data[: len(FORMAT) + 32] + checksum(payload) + payload)
    else:
        data[len(FORMAT)] ^= 0x01
    entry.write_bytes(bytes(data))
    assert _value(RECORD.load_or_build(CacheFolder(folder), KEY, _build)) == 1
    assert _entry(folder).read_bytes() != bytes(data)  # rewritten
    assert _value(RECORD.load_or_build(CacheFolder(folder), KEY, lambda: None)) == 1  # and reused


def test_a_planted_symlink_is_not_followed(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # The names a writer used to use, and the entry's own name: none may be written through.
    probe = CacheFolder(folder)
    RECORD.load_or_build(probe, KEY, _build)
    entry = _entry(folder)
    entry.unlink()
    entry.symlink_to(victim)
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        (folder / f"{entry.stem}.{pid}.tmp").symlink_to(victim)
    assert _value(RECORD.load_or_build(CacheFolder(folder), KEY, _build)) == 1
    assert victim.read_text() == "precious"


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    folder = tmp_path / "code"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    assert _value(RECORD.load_or_build(CacheFolder(folder), KEY, _build)) == 1
    assert list(folder.iterdir()) == []


def test_a_patch_still_applies_over_a_damaged_cache(sandbox, config, overlays, tmp_path):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    first = overlays(config(cache_dir=tmp_path))
    first.activate()
    importlib.import_module(name)
    for entry in (tmp_path / "code").iterdir():
        entry.write_bytes(b"garbage")
    import sys

    sys.modules.pop(name)
    first._hook.uninstall()  # a second overlay in the same process stands in for a new process
    second = overlays(config(cache_dir=tmp_path))
    second.activate()
    assert importlib.import_module(name).answer() == 42
    assert _state(second, "fix").state == "applied"


def test_code_cache_switch_turns_the_disk_cache_off(sandbox, config, overlays, tmp_path):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlays(config(cache_dir=tmp_path, code_cache=False)).activate()
    assert importlib.import_module(name).answer() == 42
    assert not (tmp_path / "code").exists()


def test_a_new_top_folder_is_private_too(tmp_path):
    top = tmp_path / "new" / "torch_overlay"
    RECORD.load_or_build(CacheFolder(top / "code"), KEY, _build)
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(top / "code").st_mode) == 0o700


def test_a_cache_dir_that_is_a_file_is_reported(tmp_path):
    top = tmp_path / "not-a-folder"
    top.write_text("")
    with pytest.warns(UserWarning, match="not-a-folder is not a folder; it is not used"):
        value = RECORD.load_or_build(CacheFolder(top / "code"), KEY, _build)
    assert _value(value) == 1


@pytest.mark.parametrize("how", ["world-writable", "other-owner"])
def test_nothing_is_created_in_a_refused_top_folder(tmp_path, how):
    top = tmp_path / "shared"
    top.mkdir()
    if how == "other-owner":
        if os.getuid() != 0:
            pytest.skip("needs root to chown")
        os.chown(top, 12345, -1)
    else:
        top.chmod(0o777)
    with pytest.warns(UserWarning, match="not owned by this user or is writable by others"):
        RECORD.load_or_build(CacheFolder(top / "code"), KEY, _build)
    assert list(top.iterdir()) == []
