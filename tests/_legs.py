"""CI runs the suite on three torch releases; tests that cost minutes and need only one torch (the
benchmarks' smoke run, the known-bug signatures against every reproducer) run on one of them.

``.ci/run`` sets ``TORCH_OVERLAY_TEST_LEG=light`` on the other legs; a local ``./build.sh test``
runs everything. On light legs ``tests/conftest.py`` also leaves out each multi-process fix class
that has a one-process twin (``<Class>WithLocalTensor``): the twin runs there instead.
"""

from __future__ import annotations

import os

import pytest

one_leg = pytest.mark.skipif(
    os.environ.get("TORCH_OVERLAY_TEST_LEG") == "light",
    reason="runs on CI's full leg only (TORCH_OVERLAY_TEST_LEG=light)",
)
