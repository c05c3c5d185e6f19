"""The runtime overlay and C++ hunks: it cannot apply them, so it applies what it can and says so."""

import importlib
import warnings

from ._fixtures import make_diff, make_patch
from .test_apply import _state, MODULE, overlays, PATCHED  # noqa: F401  (overlays is a fixture)

CPP_BEFORE = "return PyTuple_Pack(1, t.release().ptr());\n"
CPP_AFTER = "return PyTuple_Pack(1, t.ptr());\n"
CPP = "torch/csrc/overlay_fixture.cpp"


def test_a_cpp_only_patch_says_a_source_build_carries_it_without_a_warning(sandbox, config, overlays):
    sandbox.series(("0001-cpp-fix.patch", make_patch("cpp-fix", [make_diff(CPP, CPP_BEFORE, CPP_AFTER)])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        overlay = overlays(config())
        overlay.activate()
    status = _state(overlay, "cpp-fix")
    assert status.state == "source only"
    assert CPP in status.reason and "./build.sh apply" in status.reason
    assert status.as_dict()["state"] == "source only"
    assert overlay.problems == []


def test_a_patch_with_a_cpp_hunk_applies_its_python_hunks(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    diffs = [make_diff(CPP, CPP_BEFORE, CPP_AFTER), make_diff(path, MODULE, PATCHED)]
    sandbox.series(("0001-both.patch", make_patch("both", diffs)))
    overlay = overlays(config())
    overlay.activate()
    assert importlib.import_module(name).answer() == 42
    status = _state(overlay, "both")
    assert status.state == "applied"
    assert [t.path for t in status.targets] == [path]
