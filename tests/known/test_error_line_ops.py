"""``Error:`` lines that name the ops of one torch code path name the ops of that path, read from torch.

A *got mixed torch.Tensor and DTensor* error names the op that met the mixed lists, and several
code paths print it: an optimizer's foreach or fused step (``optimizer-foreach-mixed-dtensor``),
``clip_grad_norm_`` (``clip-grad-norm-mixed-meshes``), user code. Each fix's line lists the ops of
its own path, so that another path's op is not taken for it (an optimizer never runs
``_foreach_norm``; model code's ``aten.mul`` is not clipping's). These tests read the installed
torch: the optimizers' code, and what ``clip_grad_norm_`` dispatches as it runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torch_overlay.known.catalogue import load_catalogue

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = load_catalogue(REPO / "patches")
TORCH = Path(torch.__file__).resolve().parent


def _got_mixed_patterns(bug_id: str) -> list[re.Pattern[str]]:
    (bug,) = [b for b in CATALOGUE.bugs if b.id == bug_id]
    sources = [s.source.split(" | ")[0] for s in bug.signatures if "got mixed" in s.source and "_foreach_" in s.source]
    assert sources, f"{bug_id} has no got-mixed line that names ops"
    return [re.compile(s.removeprefix("re:")) for s in sources]


def _named(patterns: list[re.Pattern[str]], op: str) -> bool:
    text = f"RuntimeError: aten.{op}.default: got mixed torch.Tensor and DTensor, need to convert all"
    return any(p.search(text) for p in patterns)


def _aten_ops_called(source: str) -> set[str]:
    """The ``torch._foreach_<op>`` and ``torch._fused_<op>`` aten ops that ``source`` uses."""
    ops = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            if node.attr.startswith(("_foreach_", "_fused_")) and hasattr(torch.ops.aten, node.attr):
                ops.add(node.attr)
    return ops


def test_optimizer_line_names_every_foreach_and_fused_op_of_torch_optim():
    ops = set()
    for path in sorted((TORCH / "optim").glob("*.py")):
        ops |= _aten_ops_called(path.read_text(encoding="utf-8"))
    assert len(ops) >= 10, ops
    patterns = _got_mixed_patterns("optimizer-foreach-mixed-dtensor")
    assert not sorted(op for op in ops if not _named(patterns, op)), "ops of torch/optim that the line lacks"
    # The norm is clip_grad_norm_'s op, not an optimizer's.
    assert "_foreach_norm" not in ops and not _named(patterns, "_foreach_norm")


class _MixingOps(TorchDispatchMode):
    """The ops dispatched with a tensor of more than one element next to another tensor.

    DTensor treats a plain tensor of one element as replicated (``_dispatch.py``), so *got mixed*
    can only come from an op that gets a plain tensor of more elements beside a DTensor.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        tensors = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        if len(tensors) >= 2 and any(t.numel() > 1 for t in tensors):
            self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_clip_grad_line_names_the_ops_of_clip_grad_norm_that_can_mix():
    # What clip_grad_norm_ dispatches, foreach or not, for a finite and the infinite norm. Its other
    # ops (stack of the norms, clamp, the coefficient's mul) see one-element tensors only: a *got
    # mixed* of those ops comes from other code (model code's aten.mul, aten.div).
    mixing: set[str] = set()
    for foreach in (True, False):
        for norm_type in (2.0, float("inf")):
            params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
            for param in params:
                param.grad = torch.randn(4, 4) * 10
            with _MixingOps() as log:
                torch.nn.utils.clip_grad_norm_(params, 1.0, norm_type=norm_type, foreach=foreach)
            mixing |= log.ops
    assert {"_foreach_norm", "_foreach_mul_", "mul_"} <= mixing, mixing
    (pattern,) = _got_mixed_patterns("clip-grad-norm-mixed-meshes")
    assert sorted(op for op in mixing if not _named([pattern], op)) == []
    for op in ("stack", "mul", "div", "clamp", "linalg_vector_norm", "_foreach_mul"):
        assert op in mixing or not _named([pattern], op), f"the line names {op}, which cannot mix there"
    # The optimizer's ops are not clip_grad_norm_'s.
    assert not _named([pattern], "_foreach_add_") and not _named([pattern], "_foreach_lerp_")
