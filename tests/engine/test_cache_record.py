"""engine/caches/record.py: every kind of cache entry is keyed, versioned and checked one way."""

from __future__ import annotations

import ast
from pathlib import Path

from torch_overlay.engine.caches import activation_memo, compiled_code, decision_record, series_index
from torch_overlay.engine.caches.folder import CacheFolder
from torch_overlay.engine.caches.record import Record

ENGINE = Path(__file__).resolve().parents[2] / "torch_overlay" / "engine"
KINDS = [
    series_index.SERIES_INDEX,
    activation_memo.ACTIVATION_MEMO,
    decision_record.DECISION,
    compiled_code.MODULE_CODE,
    compiled_code.MODULE_LINES,
    compiled_code.SWAP_CODE,
    compiled_code.COUNTED_MODULE_CODE,
    compiled_code.COUNTED_SWAP_CODE,
]


def _is_pair(value: object) -> bool:
    return type(value) is tuple and len(value) == 2


def test_a_kind_reads_only_its_own_entries(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path / "cache" / "code")
    mine, other = Record("mine", 1, _is_pair), Record("other", 1, _is_pair)
    mine.store(folder, mine.key("a", "b"), (1, 2))
    assert mine.load(folder, mine.key("a", "b")) == ((1, 2),)
    assert other.load(folder, other.key("a", "b")) is None  # the same parts, another kind
    assert other.load(folder, mine.key("a", "b")) is None  # a key of another kind is not looked up


def test_a_new_version_of_a_kind_does_not_read_the_old_ones_entries(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path / "cache" / "code")
    old, new = Record("kind", 1, _is_pair), Record("kind", 2, _is_pair)
    old.store(folder, old.key("x"), (1, 2))
    assert new.load(folder, new.key("x")) is None
    assert new.load_or_build(folder, new.key("x"), lambda: (3, 4)) == (3, 4)
    assert old.load(folder, old.key("x")) == ((1, 2),)


def test_a_value_not_of_the_kinds_shape_is_not_kept_nor_believed(tmp_path: Path) -> None:
    folder = CacheFolder(tmp_path / "cache" / "code")
    kind = Record("kind", 1, _is_pair)
    kind.store(folder, kind.key("x"), (1, 2, 3))
    assert folder.folder is not None and not folder.folder.exists()
    folder.store(kind.key("x"), [1, 2])  # written past the record: what a damaged file could hold
    assert kind.load(folder, kind.key("x")) is None
    assert kind.load(folder, kind.key("x"), check=lambda v: True) is None
    kind.store(folder, kind.key("y"), (1, 2))
    assert kind.load(folder, kind.key("y"), check=lambda v: v[0] == 2) is None  # the caller's check too
    assert kind.parts(kind.key("y", "z")) == ["y", "z"] and kind.parts("another\0y") is None


def test_every_kind_has_its_own_tag() -> None:
    assert len({k.tag for k in KINDS}) == len(KINDS)


def test_only_a_record_reads_or_writes_the_cache_folder() -> None:
    """A ``.load``/``.store``/``.load_or_build`` call in the engine goes through one of the kinds
    (a module-level ``Record``, named in capitals, or a local ``record`` chosen among them), never
    to the folder directly."""
    direct = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name in ("record.py", "folder.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("load", "store", "load_or_build"):
                    receiver = node.func.value
                    if not (isinstance(receiver, ast.Name) and (receiver.id.isupper() or receiver.id == "record")):
                        direct.append(f"{path.relative_to(ENGINE)}:{node.lineno}")
    assert direct == []
