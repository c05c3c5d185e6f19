"""Torch-version gates for the fixes' tests: plumbing that never reaches a staged test.

The tests run here on every supported torch, while upstream only has the newest one. Where a test
must differ between releases it says so only through these three names, imported with
``from tests.fixes._torch_gates import ...``; ``build.sh stage`` drops that import and resolves
every use as the newest torch would (docs/reference/patch-format.md, "Torch-version gates"):

- ``before("2.12")``: true on torch older than 2.12. Allowed only as the test of an ``if``
  (alone or as an operand of ``and``/``or``/``not``) that it decides on its own; staged, the
  ``if`` becomes the branch the newest torch takes.
- ``skip_before("2.12", reason)``: a decorator skipping a test (or a class) on older torch;
  staged, the decorator is dropped.
- ``for_torch({"2.11": a, "2.14": b})``: the value for the newest release family not newer than
  the running torch; staged, the value of the newest family.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import TypeVar

import torch
from torch.torch_version import TorchVersion

__all__ = ["before", "for_torch", "skip_before"]

_T = TypeVar("_T")
TORCH = TorchVersion(torch.__version__)


def before(version: str) -> bool:
    """Whether the running torch is older than ``version``."""
    return TORCH < version


def skip_before(version: str, reason: str) -> Callable[[_T], _T]:
    """Skip the decorated test or class on torch older than ``version``."""
    return unittest.skipIf(before(version), f"torch < {version}: {reason}")


def for_torch(expected: dict[str, _T]) -> _T:
    """The value of the newest release family in ``expected`` not newer than the running torch."""
    return expected[max((k for k in expected if TORCH >= k), key=TorchVersion)]
