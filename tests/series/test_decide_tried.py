"""``carried_stack`` and ``decide`` share what reverse-applying a variant gave: over one tree, each
variant's reverse diff is tried once on the same texts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from torch_overlay.series import decide as decide_module
from torch_overlay.series.plan import load_series, plan_series

REPO = Path(__file__).resolve().parents[2]
TORCH_ROOT = Path(torch.__file__).resolve().parent.parent
VERSION = torch.__version__.split("+")[0]


def _read(path: str) -> str | None:
    file = TORCH_ROOT / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def test_each_reverse_diff_is_tried_once_per_text(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: Counter[tuple[object, ...]] = Counter()
    original = decide_module.apply_variant

    def apply_variant(variant, texts, reverse=False, *, python_only=False):  # type: ignore[no-untyped-def]
        if reverse:
            tries[(variant.path.name, *sorted(texts.items()))] += 1
        return original(variant, texts, reverse, python_only=python_only)

    monkeypatch.setattr(decide_module, "apply_variant", apply_variant)
    plan = plan_series(load_series(REPO / "patches"), VERSION, _read, python_only=True)
    assert plan.steps
    assert tries, f"no patch was decided on its files on torch {VERSION}"
    assert [key[0] for key, n in tries.items() if n > 1] == []
