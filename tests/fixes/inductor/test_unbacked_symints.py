# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import functools
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable

import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, Phase, settings, strategies as st
from torch._dynamo import config as dynamo_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor import config as inductor_config
from torch._inductor.sizevars import SizeVarAllocator
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU
from torch.utils.checkpoint import checkpoint


# How inductor's runtime asserts print the sum of four unbacked split sizes
SUM_OF_SPLIT_SIZES = r"u\d+ \+ u\d+ \+ u\d+ \+ u\d+"
NUM_EXPERTS = 4
DIM = 8
HIDDEN = 16


def experts_for_loop(w1, w2, w3, x, num_tokens_per_expert, pad=True):
    # torchtitan's MoE for-loop path: the rows of x past sum(num_tokens_per_expert)
    # are padding, and each expert runs on its own split of the routed tokens.
    sizes = num_tokens_per_expert.tolist()
    num_tokens = sum(sizes)
    outs = []
    for i, x_expert in enumerate(torch.split(x[:num_tokens], sizes, dim=0)):
        h = F.silu(x_expert @ w1[i].transpose(-2, -1))
        h = h * (x_expert @ w3[i].transpose(-2, -1))
        outs.append(h @ w2[i].transpose(-2, -1))
    out = torch.cat(outs, dim=0)
    if pad:
        out = torch.vstack((out, out.new_zeros((x.shape[0] - num_tokens, out.shape[-1]))))
    return out


def moe(w1, w2, w3, x, num_tokens_per_expert, scores, pad=True, ac=False):
    # Without padding the expert output meets the router scores row for row, which
    # tells inductor that the slice x[:num_tokens] keeps every row.
    if ac:
        out = checkpoint(
            experts_for_loop,
            w1,
            w2,
            w3,
            x,
            num_tokens_per_expert,
            pad,
            use_reentrant=False,
        )
    else:
        out = experts_for_loop(w1, w2, w3, x, num_tokens_per_expert, pad)
    return out * scores.unsqueeze(-1)


def split_item_slice(x, num_tokens_per_expert, num_tokens, w):
    # num_tokens is a 0-d CPU tensor: dynamo gives its item() a backed symbol.
    sizes = num_tokens_per_expert.tolist()
    xs = torch.split(x[: num_tokens.item()], sizes, dim=0)
    return torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)


def split_routed_tokens(x, num_tokens_per_expert, w):
    # Nothing bounds the sign of item(), so the backward's slice_scatter end is
    # a data-dependent bound of unknown sign.
    sizes = num_tokens_per_expert.tolist()
    xs = torch.split(x[: num_tokens_per_expert.sum().item()], sizes, dim=0)
    return torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)


def split_item_slice_padded(x, num_tokens_per_expert, num_tokens, w):
    # num_tokens is a 0-d CPU tensor. The expert output is padded back to the
    # routed rows, so the gradient flowing into the backward is sized
    # sum(sizes) + x.shape[0] - num_tokens.item().
    n = num_tokens.item()
    xs = torch.split(x[:n], num_tokens_per_expert.tolist(), dim=0)
    out = torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)
    return torch.vstack((out, out.new_zeros((x.shape[0] - n, out.shape[-1]))))


class MoESplitTestCase(InductorTestCase):
    """Compiled-vs-eager forward and backward of the MoE split loop (`moe`)."""

    def _weights(self, device):
        torch.manual_seed(0)
        return [
            torch.randn(NUM_EXPERTS, *shape, device=device, requires_grad=True)
            for shape in ((HIDDEN, DIM), (DIM, HIDDEN), (HIDDEN, DIM))
        ]

    def _inputs(self, device, counts, num_rows):
        counts = torch.tensor(counts, device=device)
        x = torch.randn(num_rows, DIM, device=device, requires_grad=True)
        scores = torch.rand(num_rows, device=device)
        return counts, x, scores

    def _check_fwd_bwd(self, fn, compiled, weights, counts, x, scores, mark=None, mark_scores=True):
        args = [*weights, x, counts, scores]
        ref = fn(*args)
        ref_grads = torch.autograd.grad(ref.sum(), [*weights, x])

        x_c = x.detach().clone().requires_grad_()
        weights_c = [w.detach().clone().requires_grad_() for w in weights]
        scores_c = scores.clone()
        if mark is not None:
            mark(x_c, 0)
            if mark_scores:
                mark(scores_c, 0)
        out = compiled(*weights_c, x_c, counts, scores_c)
        grads = torch.autograd.grad(out.sum(), [*weights_c, x_c])
        self.assertEqual(out, ref)
        self.assertEqual(grads, ref_grads)


class TestInductorUnbackedSplitSlice(MoESplitTestCase):
    def _run(self, device, pad, ac=False, mark=None, counts_list=None, num_rows=16):
        fn = functools.partial(moe, pad=pad, ac=ac)
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        weights = self._weights(device)
        for counts in counts_list:
            counts, x, scores = self._inputs(device, counts, num_rows)
            self._check_fwd_bwd(fn, compiled, weights, counts, x, scores, mark)
        return cnt

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_padded(self, device):
        # Unbacked split sizes (zeros included) reuse one graph.
        cnt = self._run(device, pad=True, counts_list=[[3, 0, 5, 4], [0, 7, 1, 0]])
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_unpadded(self, device):
        cnt = self._run(device, pad=False, counts_list=[[3, 2, 7, 4], [0, 16, 0, 0]])
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_padded_checkpoint(self, device):
        self._run(device, pad=True, ac=True, counts_list=[[3, 0, 5, 4]])

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_unpadded_checkpoint(self, device):
        self._run(device, pad=False, ac=True, counts_list=[[3, 2, 7, 4]])

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_mark_unbacked(self, device):
        # Only the tokens are unbacked; the scores pin their count to 16, which
        # the unpadded split then has to match.
        fn = functools.partial(moe, pad=False)
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        weights = self._weights(device)
        for counts in ([3, 2, 7, 4], [5, 0, 0, 11]):
            counts, x, scores = self._inputs(device, counts, 16)
            self._check_fwd_bwd(
                fn,
                compiled,
                weights,
                counts,
                x,
                scores,
                torch._dynamo.decorators.mark_unbacked,
                mark_scores=False,
            )
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_counts_exceed_tokens(self, device):
        # More routed tokens than rows: split_with_sizes' sum check must fire at
        # runtime instead of reading past the slice.
        fn = functools.partial(moe, pad=True)
        compiled = torch.compile(fn, backend="inductor", fullgraph=True)
        weights = [w.detach() for w in self._weights(device)]
        counts, x, scores = self._inputs(device, [3, 0, 5, 4], 16)
        self.assertEqual(compiled(*weights, x, counts, scores), fn(*weights, x, counts, scores))
        bad, _, _ = self._inputs(device, [3, 9, 5, 4], 16)
        with self.assertRaisesRegex(RuntimeError, "split_with_sizes"):
            fn(*weights, x, bad, scores)
        # The compiled graph's runtime assert over the sum of the split sizes
        with self.assertRaisesRegex(RuntimeError, SUM_OF_SPLIT_SIZES):
            compiled(*weights, x, bad, scores)


class TestInductorUnbackedSplitItem(InductorTestCase):
    def _check(self, device, cases, mark=None, backward=True):
        torch.manual_seed(0)
        w = torch.randn(4, 8, 8, device=device, requires_grad=True)
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(split_item_slice, backend=cnt, fullgraph=True)
        for counts, num_rows in cases:
            counts = torch.tensor(counts, device=device)
            num_tokens = counts.sum().cpu()
            x = torch.randn(num_rows, 8, device=device, requires_grad=backward)
            ref = split_item_slice(x, counts, num_tokens, w)
            x_c = x.detach().clone().requires_grad_(backward)
            if mark is not None:
                mark(x_c, 0)
            out = compiled(x_c, counts, num_tokens, w)
            self.assertEqual(out, ref)
            if backward:
                ref_grads = torch.autograd.grad(ref.sum(), [x, w])
                self.assertEqual(torch.autograd.grad(out.sum(), [x_c, w]), ref_grads)
        return cnt

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split(self, device):
        cnt = self._check(device, [([3, 0, 5, 4], 20), ([6, 6, 0, 0], 20)], backward=False)
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_backward(self, device):
        self._check(device, [([3, 0, 5, 4], 20), ([0, 2, 9, 1], 12)])

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_mark_dynamic(self, device):
        cnt = self._check(
            device,
            [([3, 0, 5, 4], 20), ([1, 1, 1, 1], 7)],
            mark=torch._dynamo.mark_dynamic,
        )
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_mark_unbacked(self, device):
        cnt = self._check(
            device,
            [([3, 0, 5, 4], 20), ([0, 0, 0, 5], 9)],
            mark=torch._dynamo.decorators.mark_unbacked,
        )
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_counts_do_not_sum_to_length(self, device):
        # The split check still runs: counts that do not add up to the sliced
        # length raise instead of reading the wrong rows.
        w = torch.randn(4, 8, 8, device=device)
        x = torch.randn(20, 8, device=device)
        counts = torch.tensor([3, 0, 5, 4], device=device)
        compiled = torch.compile(split_item_slice, backend="inductor", fullgraph=True)
        self.assertEqual(
            compiled(x, counts, torch.tensor(12), w),
            split_item_slice(x, counts, torch.tensor(12), w),
        )
        for num_tokens in (torch.tensor(10), torch.tensor(14)):
            with self.assertRaisesRegex(RuntimeError, "split_with_sizes"):
                split_item_slice(x, counts, num_tokens, w)
            # The compiled graph's runtime assert over the sum of the split sizes
            with self.assertRaisesRegex(RuntimeError, SUM_OF_SPLIT_SIZES):
                compiled(x, counts, num_tokens, w)

    # The expert output padded back to the routed rows: the backward's tangent is
    # sized over the item(), which the backward must bind too.
    def _check_padded(self, device, cases, mark=None):
        torch.manual_seed(0)
        w = torch.randn(4, 8, 8, device=device, requires_grad=True)
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(split_item_slice_padded, backend=cnt, fullgraph=True)
        for counts, num_rows in cases:
            counts = torch.tensor(counts, device=device)
            num_tokens = counts.sum().cpu()
            x = torch.randn(num_rows, 8, device=device, requires_grad=True)
            ref = split_item_slice_padded(x, counts, num_tokens, w)
            ref_grads = torch.autograd.grad(ref.sum(), [x, w])

            x_c = x.detach().clone().requires_grad_()
            if mark is not None:
                mark(x_c, 0)
            out = compiled(x_c, counts, num_tokens, w)
            self.assertEqual(out, ref)
            self.assertEqual(torch.autograd.grad(out.sum(), [x_c, w]), ref_grads)
        return cnt

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_padded_backward(self, device):
        self._check_padded(device, [([3, 0, 5, 4], 16), ([1, 2, 0, 9], 20)])

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_padded_backward_mark_dynamic(self, device):
        cnt = self._check_padded(
            device,
            [([3, 0, 5, 4], 16), ([0, 0, 2, 1], 7)],
            mark=torch._dynamo.mark_dynamic,
        )
        self.assertEqual(cnt.frame_count, 1)


class TestInductorUnbackedSplitRebind(MoESplitTestCase):
    def _check(self, device, mark_dynamic):
        torch.manual_seed(0)
        weights = [
            torch.randn(NUM_EXPERTS, *shape, device=device, requires_grad=True)
            for shape in ((HIDDEN, DIM), (DIM, HIDDEN), (HIDDEN, DIM))
        ]
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(moe, backend=cnt, fullgraph=True)
        for counts, num_rows in (([3, 0, 5, 4], 16), ([1, 2, 0, 9], 20)):
            counts = torch.tensor(counts, device=device)
            x = torch.randn(num_rows, DIM, device=device, requires_grad=True)
            scores = torch.rand(num_rows, device=device)
            ref = moe(*weights, x, counts, scores)
            ref_grads = torch.autograd.grad(ref.sum(), [*weights, x])

            x_c = x.detach().clone().requires_grad_()
            if mark_dynamic:
                torch._dynamo.mark_dynamic(x_c, 0)
                torch._dynamo.mark_dynamic(scores, 0)
            out = compiled(*weights, x_c, counts, scores)
            self.assertEqual(out, ref)
            self.assertEqual(torch.autograd.grad(out.sum(), [*weights, x_c]), ref_grads)
        return cnt

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_mark_dynamic(self, device):
        cnt = self._check(device, mark_dynamic=True)
        self.assertEqual(cnt.frame_count, 1)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_automatic_dynamic(self, device):
        # The second token count recompiles with a dynamic token dimension.
        cnt = self._check(device, mark_dynamic=False)
        self.assertEqual(cnt.frame_count, 2)

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_moe_for_loop_split_sizes_property(self, device):
        # Split sizes and padding drawn at random over a dynamic token dimension
        fn = functools.partial(moe, pad=True)
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(fn, backend=cnt, fullgraph=True)
        weights = self._weights(device)

        # One compiled graph serves every example; shrinking would only recompile.
        @settings(
            max_examples=12,
            deadline=None,
            derandomize=True,
            phases=(Phase.explicit, Phase.generate),
        )
        @given(
            counts=st.lists(
                st.integers(min_value=0, max_value=6),
                min_size=NUM_EXPERTS,
                max_size=NUM_EXPERTS,
            ),
            num_padding=st.integers(min_value=0, max_value=5),
        )
        def check(counts, num_padding):
            # At least two rows, so x's dynamic length is never specialized to 0 or 1.
            num_rows = max(sum(counts) + num_padding, 2)
            counts, x, scores = self._inputs(device, counts, num_rows)
            self._check_fwd_bwd(fn, compiled, weights, counts, x, scores, torch._dynamo.mark_dynamic)

        check()
        self.assertEqual(cnt.frame_count, 1)


class TestInductorUnbackedSplitScatter(InductorTestCase):
    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_backward(self, device):
        torch.manual_seed(0)
        w = torch.randn(4, 8, 8, device=device, requires_grad=True)
        compiled = torch.compile(split_routed_tokens, backend="inductor", fullgraph=True)
        for counts in ([3, 0, 5, 4], [0, 9, 2, 1]):
            counts = torch.tensor(counts, device=device)
            x = torch.randn(20, 8, device=device, requires_grad=True)
            ref = split_routed_tokens(x, counts, w)
            ref_grads = torch.autograd.grad(ref.sum(), [x, w])
            out = compiled(x, counts, w)
            self.assertEqual(out, ref)
            self.assertEqual(torch.autograd.grad(out.sum(), [x, w]), ref_grads)


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
        torch.randn(num_experts, *shape, requires_grad=True) for shape in ((hidden, dim), (dim, hidden), (hidden, dim))
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


class TestSizeHintUnbackedSubstitutionCycle(InductorTestCase):
    # Without the fix these cases never finish, so each runs in a child process
    # with a time limit of its own.

    def _run_in_subprocess(self, case: Callable[[], None], timeout: float) -> None:
        test_dir, test_file = os.path.split(os.path.abspath(__file__))
        module = os.path.splitext(test_file)[0]
        name = case.__name__
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [test_dir, os.environ.get("PYTHONPATH")])),
            # A cached graph would skip the partitioner.
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", f"from {module} import {name}; {name}()"],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            self.fail(f"{name} did not finish in {timeout} s")
        self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])

    def _run_forked(self, case: Callable[[], None], timeout: float) -> None:
        # A fork of this process: torch is imported already, so the case's own time
        # is all the time limit has to cover.
        proc = multiprocessing.get_context("fork").Process(target=case)
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            self.fail(f"{case.__name__} did not finish in {timeout} s")
        self.assertEqual(proc.exitcode, 0)

    def test_optimization_hint_substitution_cycle(self):
        # The canonical expressions of the equalities lead back to each other:
        # substituting them never reaches a fixed point, and each round nests the
        # expression deeper.
        # With the fix it takes about 0.1 s.
        self._run_forked(optimization_hint_substitution_cycle, timeout=10)

    def test_moe_for_loop_unbacked_tokens_and_scores(self):
        # The min-cut partitioner sizes the saved activations with such hints.
        # With the fix the compile takes a few minutes on a loaded 2-core machine.
        self._run_in_subprocess(compile_moe_unbacked_tokens_and_scores, timeout=300)


instantiate_device_type_tests(
    TestInductorUnbackedSplitSlice,
    globals(),
    only_for=("cpu", "cuda"),
    allow_xpu=False,
)
instantiate_device_type_tests(
    TestInductorUnbackedSplitItem,
    globals(),
    only_for=("cpu", "cuda"),
    allow_xpu=False,
)
instantiate_device_type_tests(
    TestInductorUnbackedSplitRebind,
    globals(),
    only_for=("cpu", "cuda"),
    allow_xpu=False,
)
instantiate_device_type_tests(
    TestInductorUnbackedSplitScatter,
    globals(),
    only_for=("cpu", "cuda"),
    allow_xpu=False,
)


if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
