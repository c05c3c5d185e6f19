"""Reach (TORCH_OVERLAY_REACH=1): each fix's changed functions are watched, and nothing else."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_overlay.engine.caches.folder import CacheFolder
from torch_overlay.engine.modcode import compile_module
from torch_overlay.engine.reach import Reach
from torch_overlay.engine.reach_counter import counted_key

from ._fixtures import make_diff, make_patch
from .test_apply import _state, overlays  # noqa: F401  (overlays is a fixture)

REPO = Path(__file__).resolve().parents[2]

MODULE = """\
LIMIT = 1


def answer():
    return 41


def helper():
    return answer()


class Widget:
    def size(self):
        return 1

    def other(self):
        return 0
"""
# fix-a: answer's body; fix-b: Widget.size's body; fix-c: a module-level constant only.
FIX_A = MODULE.replace("return 41", "return 42")
FIX_B = FIX_A.replace("        return 1\n", "        return 2\n")
FIX_C = FIX_B.replace("LIMIT = 1", "LIMIT = 2")


@pytest.fixture
def module(sandbox):
    name, path = sandbox.module(MODULE)
    sandbox.series(
        ("0001-fix-a.patch", make_patch("fix-a", [make_diff(path, MODULE, FIX_A)])),
        ("0002-fix-b.patch", make_patch("fix-b", [make_diff(path, FIX_A, FIX_B)], Silent="sizes were off by one")),
        ("0003-fix-c.patch", make_patch("fix-c", [make_diff(path, FIX_B, FIX_C)])),
    )
    return name


@pytest.fixture
def stop_reach():
    made = []
    yield made.append
    for overlay in made:
        if overlay.reach is not None:
            overlay.reach.stop()
    assert sys.getprofile() is None


def start(overlay):
    """What ``import torch_overlay`` does under TORCH_OVERLAY_REACH=1."""
    overlay.reach = Reach(overlay._roster.made).watch_live(overlay._roster.components)


def _started(overlays, config, stop_reach):
    """An overlay activated with reach on, as ``import torch_overlay`` makes it."""
    overlay = overlays(config(reach=True))
    stop_reach(overlay)
    overlay.activate()
    start(overlay)
    return overlay


def _report(overlay):
    return {row["id"]: (row["calls"], row["silent"]) for row in overlay.reach.report()}


def test_counts_the_runs_of_the_changed_functions_only(module, config, overlays, stop_reach):
    overlay = _started(overlays, config, stop_reach)
    mod = importlib.import_module(module)
    assert _state(overlay, "fix-c").state == "applied"
    for _ in range(3):
        assert mod.helper() == 42  # helper is unchanged: only answer counts
    mod.Widget().other()
    assert _report(overlay) == {"fix-a": (3, ""), "fix-b": (0, "sizes were off by one"), "fix-c": (None, "")}
    mod.Widget().size()
    assert _report(overlay)["fix-b"] == (1, "sizes were off by one")
    # Python 3.11 counts with the statement compiled into answer and Widget.size: no profile function.
    assert sys.getprofile() is None


def test_counts_swapped_functions_of_a_module_imported_first(module, config, overlays, stop_reach):
    mod = importlib.import_module(module)
    overlay = overlays(config(reach=True))
    stop_reach(overlay)
    overlay.activate()
    start(overlay)
    assert (_state(overlay, "fix-a").state, _state(overlay, "fix-a").mode) == ("applied", "swapped")
    mod.answer()
    mod.Widget().size()
    mod.Widget().size()
    assert {k: v[0] for k, v in _report(overlay).items() if k != "fix-c"} == {"fix-a": 1, "fix-b": 2}
    assert sys.getprofile() is None
    if sys.version_info < (3, 12):  # the swapped code counts itself; helper, unchanged, is not swapped
        assert counted_key(mod.answer.__code__) and counted_key(mod.Widget.size.__code__)
        assert counted_key(mod.helper.__code__) is None and counted_key(mod.Widget.other.__code__) is None


@pytest.mark.parametrize("counter", ["compiled", "profile or monitoring"])
def test_runs_made_while_a_module_is_imported_are_not_counted(module, sandbox, config, overlays, stop_reach, counter):
    # A registration or a table built at import runs in every process that imports the module: not a use.
    if counter == "compiled":
        overlay = _started(overlays, config, stop_reach)
        mod = importlib.import_module(module)
    else:  # started after the code was compiled: no counter in it
        overlay = overlays(config())
        overlay.activate()
        mod = importlib.import_module(module)
        stop_reach(overlay)
        start(overlay)
    user, _ = sandbox.module(f"import {module}\n\nAT_IMPORT = {module}.helper()\n")
    assert importlib.import_module(user).AT_IMPORT == 42
    assert _report(overlay)["fix-a"] == (0, "")
    mod.helper()
    assert _report(overlay)["fix-a"] == (1, "")


def test_started_later_watches_what_already_applied(module, config, overlays, stop_reach):
    overlay = overlays(config())
    overlay.activate()
    mod = importlib.import_module(module)
    assert overlay.reach is None
    stop_reach(overlay)
    start(overlay)
    mod.answer()
    assert _report(overlay)["fix-a"] == (1, "")
    # Compiled before reach started, the code has no counter: Python 3.11 falls back to the profile function.
    assert (sys.getprofile() is not None) is (sys.version_info < (3, 12))


def test_a_fix_whose_other_modules_are_not_imported_yet_reports_the_runs_of_its_live_code(
    sandbox, config, overlays, stop_reach
):
    # A fix over two modules is pending until both are imported, but the code of the first runs
    # (the 2.11 variant of inductor-unbacked-split-slice: _meta_registrations at `import torch`,
    # lowering and ir with inductor): its runs count from the first import on.
    first, first_path = sandbox.module(MODULE)
    _, second_path = sandbox.module(MODULE)
    sandbox.series(
        (
            "0001-fix-two.patch",
            make_patch("fix-two", [make_diff(first_path, MODULE, FIX_A), make_diff(second_path, MODULE, FIX_A)]),
        )
    )
    overlay = _started(overlays, config, stop_reach)
    mod = importlib.import_module(first)
    assert _state(overlay, "fix-two").state == "pending"
    assert mod.answer() == 42
    assert _report(overlay) == {"fix-two": (1, "")}


def test_off_by_default_watches_nothing(module, config, overlays):
    overlay = overlays(config())
    overlay.activate()
    importlib.import_module(module).answer()
    assert overlay.reach is None and sys.getprofile() is None


# A DTensor op under a fake process group: its sharding propagation runs new_factory_strategy,
# which dtensor-new-factory-shard-partial changes (applied on torch < 2.14).
TINY = textwrap.dedent(
    """
    import json, sys
    import torch_overlay
    import torch
    import builtins  # Python 3.11's counted code asks Dynamo through this (set again once torch.compiler is in)
    counter_asks_dynamo = builtins.__dict__.get("__torch_overlay_compiling__") is torch.compiler.is_dynamo_compiling
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
    x.new_ones((4, 4))
    print(json.dumps({"reach": torch_overlay.reach(), "profile": sys.getprofile() is not None, "asks_dynamo": counter_asks_dynamo}))
    """
)
REACHED = "dtensor-new-factory-shard-partial"
UNREACHED = "clip-grad-norm-mixed-meshes"  # torch.nn.utils is imported by torch: applied, never called here


def _run(tmp_path, **switches):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY_") or k == "TORCH_OVERLAY_CACHE_DIR"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **switches)
    (tmp_path / "tiny.py").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "tiny.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_job_with_reach_on_says_which_fixes_ran(tmp_path):
    out, stderr = _run(tmp_path, TORCH_OVERLAY_REACH="1")
    rows = {row["id"]: row for row in out["reach"]}
    if REACHED not in rows:
        pytest.skip(f"{REACHED} does not apply to this torch")
    assert rows[REACHED]["calls"] > 0 and rows[UNREACHED]["calls"] == 0
    # 3.12+: sys.monitoring; 3.11: a counter compiled into each changed function. No profile function.
    assert out["profile"] is False
    assert out["asks_dynamo"] is (sys.version_info < (3, 12))
    (end,) = [line for line in stderr.splitlines() if " applied in " in line]
    ran = end.split("changed code run by ", 1)[1]
    assert f"{REACHED} (" in ran and UNREACHED not in ran


def test_a_job_with_reach_off_installs_no_hook(tmp_path):
    out, stderr = _run(tmp_path, TORCH_OVERLAY_REACH="0")
    assert out == {"reach": None, "profile": False, "asks_dynamo": False}
    (end,) = [line for line in stderr.splitlines() if " applied in " in line]
    assert "changed code run" not in end


def test_a_deletion_is_counted_for_the_function_that_held_it():
    """Deleted lines belong to the def around them, even where a blank line follows them
    (0020's hunk on 2.11 deletes a block inside a function, then comes a blank line)."""
    import ast

    from torch_overlay.engine.modcode import _changed_qualnames

    before = "def f(x):\n    y = x\n\n    if y:\n        raise ValueError\n\n    return y\n\n\ndef g():\n    return 1\n"
    after = before.replace("    if y:\n        raise ValueError\n\n", "")
    assert _changed_qualnames(before, after, ast.parse(after)) == ["f"]
    # The last lines of a function: what follows them is the next def, which did not change.
    after = before.replace("\n    return y\n", "\n")
    assert _changed_qualnames(before, after, ast.parse(after)) == ["f"]


needs_counter = pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12+ counts with sys.monitoring")

# A changed function with a docstring that raises on a later line, and one dynamo traces.
RAISES = """\
import torch


def check(x):
    \"\"\"Says why.\"\"\"
    y = x + 1
    if y > 2:
        raise ValueError(y)
    return y


def step(x):
    return torch.sin(x) * 2


def untouched(x):
    return x
"""
RAISES_FIXED = RAISES.replace("y > 2", "y > 3").replace("torch.sin(x) * 2", "torch.sin(x) * 3")


def _compiled(tmp_path, counting):
    steps = [("fix-r", RAISES_FIXED)]
    return compile_module(CacheFolder(tmp_path / "code", counting), "torch._r", tmp_path / "r.py", RAISES, steps)


def _functions(code):
    return {c.co_qualname: c for c in code.co_consts if hasattr(c, "co_qualname")}


def test_reach_off_compiles_the_patched_text_as_it_is(tmp_path):
    import marshal

    plain = _compiled(tmp_path, counting=False)
    expected = compile(RAISES_FIXED, str(tmp_path / "r.py"), "exec", dont_inherit=True)
    assert marshal.dumps(plain.code) == marshal.dumps(expected)


@needs_counter
def test_counted_code_is_cached_apart_and_moves_no_line(tmp_path):
    import traceback

    from torch_overlay.engine.codeswap import same_code

    plain, counted = _compiled(tmp_path, counting=False), _compiled(tmp_path, counting=True)
    assert plain.key == counted.key  # a recalled decision names either
    assert _compiled(tmp_path, counting=False).code.co_consts == plain.code.co_consts  # each read back as stored
    p, c = _functions(plain.code), _functions(counted.code)
    assert counted_key(c["check"]) == "torch_overlay reach:torch._r:check" and counted_key(p["check"]) is None
    assert same_code(p["untouched"], c["untouched"]) and counted_key(c["untouched"]) is None
    for name in ("check", "step"):
        assert {line for *_, line in p[name].co_lines()} == {line for *_, line in c[name].co_lines()}
        assert c[name].co_firstlineno == p[name].co_firstlineno
    plain.register_source()
    lines = []
    for code in (plain.code, counted.code):
        namespace: dict = {}
        exec(code, namespace)
        assert namespace["check"].__doc__ == "Says why."
        with pytest.raises(ValueError) as raised:
            namespace["check"](5)
        lines.append([(f.lineno, f.line) for f in traceback.extract_tb(raised.value.__traceback__)[1:]])
    assert lines[0] == lines[1] == [(8, "raise ValueError(y)")]


@needs_counter
def test_a_counted_function_compiles_whole_and_counts_eager_runs_only(sandbox, config, overlays, stop_reach):
    import torch
    from torch._dynamo.testing import CompileCounter

    name, path = sandbox.module(RAISES)
    sandbox.series(("0001-fix-r.patch", make_patch("fix-r", [make_diff(path, RAISES, RAISES_FIXED)])))
    overlay = _started(overlays, config, stop_reach)
    mod = importlib.import_module(name)
    assert counted_key(mod.step.__code__)
    x = torch.ones(3)
    mod.step(x)
    counter = CompileCounter()
    compiled = torch.compile(mod.step, backend=counter, fullgraph=True)  # a graph break would raise
    for _ in range(3):
        assert torch.equal(compiled(x), mod.step(x))  # an eager run between compiled ones recompiles nothing
    assert (counter.frame_count, counter.op_count) == (1, 2)
    assert _report(overlay)["fix-r"] == (4, "")  # the eager runs; the compiled graph counts nothing
    explained = torch._dynamo.explain(mod.step)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
