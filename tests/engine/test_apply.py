import importlib
import inspect
import linecache
import traceback
from importlib.machinery import SourceFileLoader

import pytest

import torch.compiler.config as compiler_config

from torch_overlay.engine.overlay import Overlay, OverlayError

from ._fixtures import make_diff, make_patch

MODULE = """\
import functools

REGISTRY = {}


def register(fn):
    REGISTRY[fn.__name__] = fn
    return fn


@register
def answer():
    return 41


def make_adder(k):
    def add(x):
        return x + k + 0

    return add


ADD_TWO = make_adder(2)


class Widget:
    def size(self):
        return 1

    @property
    def label(self):
        return "old"


@functools.lru_cache(maxsize=None)
def cached():
    return "old"
"""

PATCHED = (
    MODULE.replace("return 41", "return 42")
    .replace("return x + k + 0", "return x + k + 100")
    .replace("        return 1\n", "        return 2\n")
    .replace('return "old"\n\n\n@functools', 'return "new"\n\n\n@functools')
    .replace('def cached():\n    return "old"', "def cached():\n    return helper()")
    + '\n\ndef helper():\n    return "new"\n'
)


@pytest.fixture
def overlays():
    made = []

    def make(config):
        overlay = Overlay(config)
        made.append(overlay)
        return overlay

    yield make
    for overlay in made:
        overlay.revert()


def _state(overlay, pid):
    return {s.id: s for s in overlay.status()}[pid]


def test_applies_at_import_and_runs_the_patched_source(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    assert _state(overlay, "fix").state == "pending"
    assert name in _state(overlay, "fix").reason

    mod = importlib.import_module(name)
    st = _state(overlay, "fix")
    assert (st.state, st.mode) == ("applied", "at import"), st.reason
    assert mod.REGISTRY["answer"]() == 42 and mod.answer() == 42
    assert mod.ADD_TWO(1) == 103 and mod.make_adder(1)(1) == 102
    assert mod.Widget().size() == 2 and mod.Widget().label == "new"
    assert mod.helper() == "new" and mod.cached() == "new"
    # The module is the installed file, running the patched text; inspect shows that text.
    assert mod.__file__ == str(sandbox.pkg / path.split("/")[-1])
    # The patched code carries the installed file's name: torch compares frames' file names with its
    # modules' __file__ (symbolic_shapes.uninteresting_files: export's user frames).
    assert mod.answer.__code__.co_filename == mod.__file__
    assert "return 42" in inspect.getsource(mod.answer)
    assert "return x + k + 100" in inspect.getsource(mod.ADD_TWO)
    assert "def helper" in inspect.getsource(mod)
    assert "return 41" in inspect.getsource(overlay.get_original(mod.answer))
    assert st.reason == "0001-fix.patch: answer, make_adder.<locals>.add, Widget.size, Widget.label, cached, helper"
    # The spec keeps a file loader (importlib.resources and pkgutil use it).
    assert isinstance(mod.__spec__.loader, SourceFileLoader)
    assert mod.__spec__.loader.get_resource_reader(name) is not None
    # After linecache is cleared (inductor does it), the module's loader gives the patched text:
    # Python 3.11 asks __loader__, 3.13 and 3.12.3+ ask __spec__.loader.
    linecache.clearcache()
    assert "return 42" in inspect.getsource(mod.answer)
    for loader in (mod.__loader__, mod.__spec__.loader):
        assert "return 42" in loader.get_source(name)
    # The original is what torch ships, in inspect too, before and after linecache is cleared.
    original = overlay.get_original(mod.answer)
    assert original() == 41
    assert "return 41" in inspect.getsource(original)
    linecache.clearcache()
    assert "return 41" in inspect.getsource(original)


def test_offsets_are_allowed(sandbox, config, overlays):
    shifted = "# a comment the patch did not see\n" * 5 + MODULE
    name, path = sandbox.module(shifted)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlays(config()).activate()
    assert importlib.import_module(name).answer() == 42


def test_upstream_when_reverse_applies(sandbox, config, overlays):
    name, path = sandbox.module(PATCHED)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(name)
    st = _state(overlay, "fix")
    assert st.state == "upstream" and "reverse-applies" in st.reason
    assert not overlay.is_patched(mod.answer)


def test_drift_warns_and_leaves_torch_untouched(sandbox, config, overlays):
    drifted = MODULE.replace("def make_adder(k):", "def make_adder(k: int):").replace("return 41", "return 40")
    name, path = sandbox.module(drifted)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config())
    overlay.activate()
    with pytest.warns(UserWarning, match="patch fix drift"):
        mod = importlib.import_module(name)
    assert _state(overlay, "fix").state == "drift"
    assert mod.answer() == 40 and mod.ADD_TWO(1) == 3


def test_applied_upstream_field_retires_a_drifted_backport(sandbox, config, overlays):
    name, path = sandbox.module(MODULE.replace("return 41", "return 40"))
    patch = make_patch("fix", [make_diff(path, MODULE, PATCHED)], Applied_Upstream="2.0.0")
    sandbox.series(("0001-fix.patch", patch))
    overlay = overlays(config())
    overlay.activate()
    importlib.import_module(name)
    st = _state(overlay, "fix")
    assert st.state == "upstream" and "fixed upstream in torch 2.0.0" in st.reason


def test_strict_mode_raises(sandbox, config, overlays):
    name, path = sandbox.module(MODULE.replace("return 41", "return 40"))
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlays(config(strict=True)).activate()
    with pytest.raises(OverlayError, match="drift"):
        importlib.import_module(name)


def test_disabled_by_id_and_globally(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])))
    overlay = overlays(config(disabled_ids=frozenset({"fix"})))
    overlay.activate()
    assert importlib.import_module(name).answer() == 41
    assert _state(overlay, "fix").state == "disabled"
    overlay2 = overlays(config(enabled=False))
    overlay2.activate()
    assert _state(overlay2, "fix").reason == "TORCH_OVERLAY=0"


def test_variant_for_the_installed_torch_is_chosen(sandbox, config, overlays):
    other = MODULE.replace("return 41", "return 41  # other torch")
    name, path = sandbox.module(MODULE)
    v1 = make_patch("fix", [make_diff(path, other, other.replace("return 41", "return 42"))], Torch_Versions="<2.0")
    v2 = make_patch("fix", [make_diff(path, MODULE, MODULE.replace("return 41", "return 42"))], Torch_Versions=">=2.0")
    sandbox.series(("0001-fix.patch", v1), ("0001-fix@2.0.patch", v2))
    overlay = overlays(config())
    overlay.activate()
    assert importlib.import_module(name).answer() == 42
    assert _state(overlay, "fix").variant == "0001-fix@2.0.patch"


def test_multi_file_patch_is_all_or_nothing_at_import(sandbox, config, overlays):
    other = "def g():\n    return 1\n"
    name_a, path_a = sandbox.module(MODULE)
    name_b, path_b = sandbox.module(other)
    broken = "def g():\n    return (1\n"  # does not compile
    patch = make_patch("two-files", [make_diff(path_a, MODULE, PATCHED), make_diff(path_b, other, broken)])
    sandbox.series(("0001-two-files.patch", patch))
    overlay = overlays(config())
    overlay.activate()
    with pytest.warns(UserWarning, match="failed"):
        mod_a = importlib.import_module(name_a)
    st = _state(overlay, "two-files")
    assert st.state == "failed" and "does not compile" in st.reason
    assert mod_a.answer() == 41 and importlib.import_module(name_b).g() == 1  # nothing half applied


def test_multi_file_patch_is_decided_once_and_applies_to_each_module_at_its_import(sandbox, config, overlays):
    other = "def g():\n    return 1\n"
    name_a, path_a = sandbox.module(MODULE)
    name_b, path_b = sandbox.module(other)
    patch = make_patch(
        "two-files", [make_diff(path_a, MODULE, PATCHED), make_diff(path_b, other, other.replace("1", "2"))]
    )
    sandbox.series(("0001-two-files.patch", patch))
    overlay = overlays(config())
    overlay.activate()
    assert importlib.import_module(name_a).answer() == 42
    st = _state(overlay, "two-files")
    assert st.state == "pending" and st.reason == f"applies at import of {name_b}"
    assert importlib.import_module(name_b).g() == 2
    assert _state(overlay, "two-files").state == "applied"


def test_patch_series_stacks_on_one_module(sandbox, config, overlays):
    name, path = sandbox.module(MODULE)
    step1 = MODULE.replace("return 41", "return 42")
    step2 = step1.replace("        return 1\n", "        return 2\n")
    sandbox.series(
        ("0001-one.patch", make_patch("one", [make_diff(path, MODULE, step1)])),
        ("0002-two.patch", make_patch("two", [make_diff(path, step1, step2)])),
    )
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(name)
    assert [s.state for s in overlay.status()] == ["applied", "applied"]
    assert mod.answer() == 42 and mod.Widget().size() == 2
    assert [s.reason for s in overlay.status()] == ["0001-one.patch: answer", "0002-two.patch: Widget.size"]


def test_traceback_shows_patched_line(sandbox, config, overlays):
    src = "def boom():\n    x = 1\n    raise ValueError(x)\n"
    new = "def boom():\n    x = 2\n    raise ValueError('patched', x)\n"
    name, path = sandbox.module(src)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, src, new)])))
    overlays(config()).activate()
    mod = importlib.import_module(name)
    try:
        mod.boom()
    except ValueError:
        text = traceback.format_exc()
    assert "raise ValueError('patched', x)" in text and mod.__file__ in text


@pytest.fixture
def user_tag():
    # Not monkeypatch: on torch 2.11 its undo deletes the config entry.
    before = compiler_config.cache_key_tag
    compiler_config.cache_key_tag = "mine"
    yield
    compiler_config.cache_key_tag = before


def test_compile_cache_key_is_salted_and_keeps_the_users_tag(sandbox, config, user_tag, overlays):
    name, path = sandbox.module(MODULE)
    other = "def g():\n    return 1\n"
    name_b, path_b = sandbox.module(other)
    sandbox.series(
        ("0001-fix.patch", make_patch("fix", [make_diff(path, MODULE, PATCHED)])),
        ("0002-two.patch", make_patch("two", [make_diff(path_b, other, other.replace("1", "2"))])),
    )
    overlay = overlays(config())
    overlay.activate()
    importlib.import_module(name)
    first = compiler_config.cache_key_tag
    assert first.startswith("mine|") and "torch_overlay:fix@" in first
    compiler_config.cache_key_tag = "theirs"  # the user sets a new tag after a patch applied
    importlib.import_module(name_b)  # a later patch applies: the user's tag stays, with the salt
    tag = compiler_config.cache_key_tag
    assert tag.startswith("theirs|") and "torch_overlay:fix@" in tag and "torch_overlay:two@" in tag
    assert "mine" not in tag


def test_new_definitions_keep_the_modules_future_imports(sandbox, config, overlays):
    src = "from __future__ import annotations\n\n\ndef f():\n    return 1\n"
    new = src + "\n\ndef g(x: NotDefinedAnywhere) -> int:\n    return 2\n"
    name, path = sandbox.module(src)
    sandbox.series(("0001-fix.patch", make_patch("fix", [make_diff(path, src, new)])))
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(name)
    assert _state(overlay, "fix").state == "applied", _state(overlay, "fix").reason
    assert mod.g(0) == 2 and mod.g.__annotations__["x"] == "NotDefinedAnywhere"


def test_a_later_patch_does_not_report_an_earlier_patchs_new_definition(sandbox, config, overlays):
    # CPython compiles `os.fspath(...)` differently when `os` is a name the module imports;
    # a new def must be compiled as it is in the whole module, or the next patch of the same
    # module sees it as changed.
    src = "import os\n\n\ndef f():\n    return 1\n"
    first = src + "\n\ndef helper(x):\n    return os.fspath(x) + 'a'\n"
    second = first.replace("return 1", "return helper('b')")
    name, path = sandbox.module(src)
    sandbox.series(
        ("0001-add.patch", make_patch("add", [make_diff(path, src, first)])),
        ("0002-use.patch", make_patch("use", [make_diff(path, first, second)])),
    )
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(name)
    assert _state(overlay, "add").state == "applied", _state(overlay, "add").reason
    assert _state(overlay, "use").reason.endswith(": f"), _state(overlay, "use").reason
    assert mod.f() == "ba"
