"""A module whose patched code raises: the patch's fault, or torch's own import failing?

The overlay runs the module's own code after its patched code raised. If that runs, the patch is
at fault: it fails, with a warning. If torch's own code fails too (torch 2.13's circular import of
``torch._functorch._aot_autograd.runtime_wrappers`` imported first on its own), the patch is not
blamed: it stays pending and applies when the module is imported again.
"""

import importlib
import sys
import warnings

import pytest

from ._fixtures import make_diff, make_patch
from .test_apply import _state, overlays  # noqa: F401  (overlays is a fixture)

MODULE = """\
import os

if os.environ.get("OVT_BROKEN_IMPORT"):
    raise ImportError("cannot import name 'X' from partially initialized module 'torch.y' (circular import)")


def answer():
    return 41
"""
PATCHED = MODULE.replace("return 41", "return 42")


def _overlay_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "torch_overlay" in str(w.message)]


def test_torchs_own_import_failure_is_not_blamed_on_the_patch(sandbox, config, overlays, monkeypatch):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    monkeypatch.setenv("OVT_BROKEN_IMPORT", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImportError, match="partially initialized"):
            importlib.import_module(name)
    assert _overlay_warnings(caught) == []
    st = _state(overlay, "fix")
    assert st.state == "pending"
    assert st.reason.startswith(f"torch's own import of {name} failed (ImportError: cannot import name 'X'")
    assert name not in sys.modules

    monkeypatch.delenv("OVT_BROKEN_IMPORT")
    assert importlib.import_module(name).answer() == 42
    assert _state(overlay, "fix").state == "applied"


def test_a_patch_whose_code_raises_fails_and_the_module_runs_its_own(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    broken = PATCHED.replace("def answer", "raise RuntimeError('the patched code is wrong')\n\n\ndef answer")
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, broken)])))
    overlay = overlays(config())
    overlay.activate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert importlib.import_module(name).answer() == 41
    (message,) = _overlay_warnings(caught)
    assert "patch fix failed: the patched module raised RuntimeError: the patched code is wrong" in message
    st = _state(overlay, "fix")
    assert st.state == "failed" and "the patched code is wrong" in st.reason
