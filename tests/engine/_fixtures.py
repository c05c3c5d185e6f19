"""Build throw-away target modules under ``torch.`` and patches against them."""

from __future__ import annotations

import difflib
import importlib
import sys
import uuid
from pathlib import Path

import torch

HEADER = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: torch_overlay tests <tests@example.com>
Date: Sat, 21 Nov 2026 00:00:00 +0000
Subject: [PATCH] {subject}

Overlay-Id: {id}
Bug: https://github.com/pytorch/pytorch/issues/1
{extra}
Test fixture.
---
"""


def make_diff(path: str, old: str, new: str, context: int = 3) -> str:
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}", n=context)
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def make_patch(pid: str, diffs: list[str], subject: str = "fix", **fields: str) -> str:
    extra = "".join(f"{k.replace('_', '-')}: {v}\n" for k, v in fields.items())
    return HEADER.format(subject=subject, id=pid, extra=extra) + "".join(diffs) + "-- \n2.39.5\n"


class Sandbox:
    """A folder on ``torch.__path__`` holding fixture modules, and a patches folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pkg = root / "torch"
        self.pkg.mkdir(parents=True)
        self.patches = root / "patches"
        self.patches.mkdir()
        torch.__path__.append(str(self.pkg))
        self.modules: list[str] = []

    def module(self, source: str) -> tuple[str, str]:
        """Write a fixture module; return (dotted name, torch-relative path). Not imported."""
        name = f"_ovt_{uuid.uuid4().hex[:10]}"
        (self.pkg / f"{name}.py").write_text(source)
        self.modules.append(f"torch.{name}")
        importlib.invalidate_caches()
        return f"torch.{name}", f"torch/{name}.py"

    def series(self, *patches: tuple[str, str]) -> None:
        """Write (file name, text) patches and the series listing them in order."""
        for name, text in patches:
            (self.patches / name).write_text(text)
        (self.patches / "series").write_text("".join(f"{name}\n" for name, _ in patches))

    def close(self) -> None:
        torch.__path__.remove(str(self.pkg))
        for name in self.modules:
            sys.modules.pop(name, None)
