import os
import shutil
import tempfile

# Keep the overlay's compiled-code cache of test runs out of the user's cache, and remove the one
# made here when the run ends (a run of `verify` or `demo` is a pytest process too).
_MADE_CACHE = None if "TORCH_OVERLAY_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="torch_overlay_cache_")
if _MADE_CACHE is not None:
    os.environ["TORCH_OVERLAY_CACHE_DIR"] = _MADE_CACHE
_OWNER = os.getpid()

# The overlay first, as a training job imports it: a test module that imports torch's internals
# before torch_overlay would otherwise leave every later module's patches on the late path.
import torch_overlay  # noqa: E402, F401


def pytest_unconfigure(config: object) -> None:
    if _MADE_CACHE is not None and os.getpid() == _OWNER:  # not in a forked worker
        shutil.rmtree(_MADE_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config: object, items: list) -> None:
    """On CI's light legs (tests/_legs.py), a multi-process class whose one-process twin
    (``<Class>WithLocalTensor``) exists runs on the full leg only: the twin covers the same tests
    on every torch, in one process."""
    if os.environ.get("TORCH_OVERLAY_TEST_LEG") != "light":
        return
    import pytest

    skip = pytest.mark.skip(reason="multi-process twin of a LocalTensor class: CI's full leg runs it")
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and hasattr(item.module, f"{cls.__name__}WithLocalTensor"):
            item.add_marker(skip)
