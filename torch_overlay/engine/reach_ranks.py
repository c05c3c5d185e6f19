"""Reach under compare, in a rank that runs test after test: its counts, test by test.

torch's ``MultiProcContinuousTest`` starts its ranks in a class's first test and ends them at the
class's teardown; in between, each rank runs every test of the class (``_run_test_given_id``). A rank
that wrote its counts only at exit would give the whole class's counts to the first test, and too
late: compare's reach plugin reads a test's folder when the test ends. So, in a process that compare
started for a test (``TORCH_OVERLAY_REACH_DIR`` set), each test such a rank runs ends with a dump of
the counts since the previous one, named by the test's id, before the rank reports the test done.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from .reach import Reach

__all__ = ["HARNESS", "install"]

HARNESS = "torch.testing._internal.common_distributed"


def install(reach: Reach, on_import: Callable[[str, Callable[[str], object]], None]) -> None:
    """Dump ``reach``'s counts after each test a persistent rank runs, once torch's harness is imported."""
    if HARNESS in sys.modules:
        _wrap(sys.modules[HARNESS], reach)
    else:
        on_import(HARNESS, lambda name: _wrap(sys.modules[name], reach))


def _wrap(module: Any, reach: Reach) -> None:
    harness = getattr(module, "MultiProcContinuousTest", None)
    run = getattr(harness, "__dict__", {}).get("_run_test_given_id")
    if not isinstance(run, classmethod) or getattr(run.__func__, "_torch_overlay_reach", False):
        return  # another harness: its ranks write their counts at exit only
    original = run.__func__

    @functools.wraps(original)
    def run_test_given_id(cls: type, test_id: str, **kwargs: Any) -> None:
        try:
            original(cls, test_id, **kwargs)
        finally:
            reach.dump_test(test_id)

    run_test_given_id._torch_overlay_reach = True  # type: ignore[attr-defined]
    harness._run_test_given_id = classmethod(run_test_given_id)  # type: ignore[union-attr]
