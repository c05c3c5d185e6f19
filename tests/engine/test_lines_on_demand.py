"""A patched module's text is read from the code cache when a traceback or ``inspect`` first asks
for it, not at every import (engine/modcode.py, ``_LinesOnDemand``)."""

from __future__ import annotations

import inspect
import linecache
import traceback
import types
from pathlib import Path

from torch_overlay.engine.caches.compiled_code import MODULE_LINES
from torch_overlay.engine.caches.folder import CacheFolder
from torch_overlay.engine.modcode import _lines_key, compile_module, load_module_code

BASE = """
def scale(x):
    return x * 2


def check(x):
    if x > 2:
        raise ValueError(x)
    return x
"""
# The fix moves check's raise two lines down: a traceback read from the installed text would show
# another line than the one that ran.
FIXED = BASE.replace("return x * 2", "return x * 3").replace(
    "    if x > 2:\n", "    # a comment the fix adds\n    # and another\n    if x > 3:\n"
)


def _compiled(tmp_path: Path) -> tuple[CacheFolder, Path, str]:
    file = tmp_path / "m.py"
    file.write_text(BASE)
    cache = CacheFolder(tmp_path / "cache" / "code")
    built = compile_module(cache, "torch._m", file, BASE, [("fix-m", FIXED)])
    return cache, file, built.key


def _run(code: types.CodeType, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(code, module.__dict__)
    return module


def test_loaded_code_reads_its_lines_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    cache, file, key = _compiled(tmp_path)
    loaded = load_module_code(cache, key, file)
    assert loaded is not None
    reads: list[str] = []
    load = cache.load
    monkeypatch.setattr(cache, "load", lambda k, check: reads.append(k.split("\0")[0]) or load(k, check))
    try:
        loaded.register_source()
        module = _run(loaded.code, "torch._m")
        assert module.scale(1) == 3
        assert reads == []  # running the patched code reads no line
        assert linecache.getline(str(file), 8) == "    # and another\n"
        assert reads == [MODULE_LINES.tag]
        assert "x > 3" in inspect.getsource(module.check)
        try:
            module.check(4)
        except ValueError as exc:
            shown = "".join(traceback.format_exception(exc))
        assert "raise ValueError(x)" in shown
        assert reads == [MODULE_LINES.tag]  # read once
    finally:
        linecache.cache.pop(str(file), None)


def test_lines_on_demand_behave_as_the_text_split(tmp_path: Path) -> None:
    cache, file, key = _compiled(tmp_path)
    expected = FIXED.splitlines(True)
    for use in (
        lambda lines: lines == expected,
        lambda lines: len(lines) == len(expected),
        lambda lines: lines[2:4] == expected[2:4],
        lambda lines: "".join(lines) == FIXED,
        lambda lines: list(lines) == expected,
        lambda lines: repr(lines) == repr(expected),
        lambda lines: bool(lines),
        lambda lines: "    # and another\n" in lines,
    ):
        loaded = load_module_code(cache, key, file)
        assert loaded is not None and use(loaded.lines)  # each use as the first one
    assert load_module_code(cache, key, file).text == FIXED  # type: ignore[union-attr]


def test_code_whose_lines_are_gone_is_built_again(tmp_path: Path) -> None:
    cache, file, key = _compiled(tmp_path)
    assert cache.has(_lines_key(key))
    cache._entry(_lines_key(key))[0].unlink()
    assert load_module_code(cache, key, file) is None
    rebuilt = compile_module(cache, "torch._m", file, BASE, [("fix-m", FIXED)])
    assert rebuilt.text == FIXED and cache.has(_lines_key(key))


def test_lines_deleted_after_the_import_show_no_text_rather_than_the_installed_one(tmp_path: Path) -> None:
    cache, file, key = _compiled(tmp_path)
    loaded = load_module_code(cache, key, file)
    assert loaded is not None
    cache._entry(_lines_key(key))[0].unlink()
    assert list(loaded.lines) == []
