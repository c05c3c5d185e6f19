# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import os
import subprocess
import sys

import sympy

import torch
import torch.nn.functional as F
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config
from torch._inductor.sizevars import SizeVarAllocator
from torch._inductor.test_case import run_tests, TestCase
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.inductor_utils import HAS_CPU


# Without the fix these cases never finish, so each runs in a child process with a
# time limit of its own.
SUBSTITUTION_CYCLE_TIMEOUT_S = 300


def optimization_hint_substitution_cycle() -> None:
    # The runtime asserts of the MoE loop below, reduced: u5 and u6 equal the sum S
    # of the split sizes u0..u3, u11 rebinds u3, and S with u11 for u3 equals
    # u5 + Min(0, S). (u11 rather than u4: a tie between two symbols goes to the
    # first in sympy's order, which makes u11, not u3, the canonical one.)
    shape_env = ShapeEnv()
    u = [shape_env.create_unbacked_symint().node.expr for _ in range(12)]
    split_sum = u[0] + u[1] + u[2] + u[3]
    for expr in (
        sympy.Eq(u[5], split_sum),
        sympy.Eq(u[6], split_sum),
        sympy.Eq(u[3], u[11]),
        sympy.Eq(split_sum.subs(u[3], u[11]), u[5] + sympy.Min(0, split_sum)),
    ):
        shape_env.guard_or_defer_runtime_assert(expr, "test")
    # u6 is hinted as a sum of four sizes, consistently with u6 == S.
    hint = SizeVarAllocator(shape_env).optimization_hint(8 * u[6])
    assert hint == 8 * 4 * inductor_config.unbacked_symint_fallback, hint


def moe_weighted_by_scores(w1, w2, w3, x, num_tokens_per_expert, scores):
    # torchtitan's MoE for-loop path, unpadded: each expert runs on its own split
    # of the routed tokens, and the output meets the router scores row for row.
    sizes = num_tokens_per_expert.tolist()
    outs = []
    for i, x_expert in enumerate(torch.split(x[: sum(sizes)], sizes, dim=0)):
        h = F.silu(x_expert @ w1[i].transpose(-2, -1))
        h = h * (x_expert @ w3[i].transpose(-2, -1))
        outs.append(h @ w2[i].transpose(-2, -1))
    return torch.cat(outs, dim=0) * scores.unsqueeze(-1)


@dynamo_config.patch(capture_scalar_outputs=True)
def compile_moe_unbacked_tokens_and_scores() -> None:
    torch.manual_seed(0)
    num_experts, dim, hidden = 4, 8, 16
    weights = [
        torch.randn(num_experts, *shape, requires_grad=True)
        for shape in ((hidden, dim), (dim, hidden), (hidden, dim))
    ]
    counts = torch.tensor([3, 2, 7, 4])
    x = torch.randn(16, dim, requires_grad=True)
    scores = torch.rand(16)
    ref = moe_weighted_by_scores(*weights, x, counts, scores)
    ref_grads = torch.autograd.grad(ref.sum(), [*weights, x])

    weights_c = [w.detach().clone().requires_grad_() for w in weights]
    x_c = x.detach().clone().requires_grad_()
    scores_c = scores.clone()
    torch._dynamo.decorators.mark_unbacked(x_c, 0)
    torch._dynamo.decorators.mark_unbacked(scores_c, 0)
    compiled = torch.compile(moe_weighted_by_scores, backend="inductor", fullgraph=True)
    out = compiled(*weights_c, x_c, counts, scores_c)
    grads = torch.autograd.grad(out.sum(), [*weights_c, x_c])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grads, ref_grads)


class TestSizeHintUnbackedSubstitutionCycle(TestCase):
    def _run_in_subprocess(self, case: str) -> None:
        test_dir, test_file = os.path.split(os.path.abspath(__file__))
        module = os.path.splitext(test_file)[0]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                filter(None, [test_dir, os.environ.get("PYTHONPATH")])
            ),
            # A cached graph would skip the partitioner.
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", f"from {module} import {case}; {case}()"],
                env=env,
                capture_output=True,
                text=True,
                timeout=SUBSTITUTION_CYCLE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            self.fail(f"{case} did not finish in {SUBSTITUTION_CYCLE_TIMEOUT_S} s")
        self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])

    def test_optimization_hint_substitution_cycle(self):
        # The canonical expressions of the equalities lead back to each other:
        # substituting them never reaches a fixed point, and each round nests the
        # expression deeper.
        self._run_in_subprocess("optimization_hint_substitution_cycle")

    def test_moe_for_loop_unbacked_tokens_and_scores(self):
        # The min-cut partitioner sizes the saved activations with such hints.
        self._run_in_subprocess("compile_moe_unbacked_tokens_and_scores")


if __name__ == "__main__":
    if HAS_CPU:
        run_tests()
