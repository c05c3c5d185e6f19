import os
import shutil
import tempfile

# Keep the overlay's compiled-code cache of test runs out of the user's cache, and remove the one
# made here when the run ends (a run of `verify` or `demo` is a pytest process too).
_MADE_CACHE = None if "TORCH_OVERLAY_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="torch_overlay_cache_")
if _MADE_CACHE is not None:
    os.environ["TORCH_OVERLAY_CACHE_DIR"] = _MADE_CACHE
_OWNER = os.getpid()
# The job's lines (which torch, which fixes) are for jobs; the tests that check them unset this.
os.environ.setdefault("TORCH_OVERLAY_QUIET", "1")

# The overlay first, as a training job imports it: a test module that imports torch's internals
# before torch_overlay would otherwise leave every later module's patches on the late path.
import torch_overlay  # noqa: E402, F401

pytest_plugins = ["tests._native_crashes", "tests._shards"]


def pytest_unconfigure(config: object) -> None:
    if _MADE_CACHE is not None and os.getpid() == _OWNER:  # not in a forked worker
        shutil.rmtree(_MADE_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config: object, items: list) -> None:
    """On CI's light legs (tests/_legs.py) only what can differ from one torch to another runs."""
    from tests._legs import LIGHT, light_leg_skip

    if not LIGHT:
        return
    import pytest

    for item in items:
        reason = light_leg_skip(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: object) -> None:
    """On a light leg, why the skipped tests were skipped: one line per reason, with its count."""
    from tests._legs import LIGHT

    if not LIGHT:
        return
    from collections import Counter

    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):  # type: ignore[attr-defined]
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons[str(longrepr[2]).removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    total = sum(reasons.values())
    write(f"light leg (TORCH_OVERLAY_TEST_LEG=light): {total} tests skipped; `./build.sh test` without it runs them")
    for reason, count in reasons.most_common():
        write(f"  {count} skipped: {reason}")
