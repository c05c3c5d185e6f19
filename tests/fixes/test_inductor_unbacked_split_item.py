# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch._dynamo import config as dynamo_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU


# How inductor's runtime asserts print the sum of four unbacked split sizes
SUM_OF_SPLIT_SIZES = r"u\d+ \+ u\d+ \+ u\d+ \+ u\d+"


def split_item_slice(x, num_tokens_per_expert, num_tokens, w):
    # num_tokens is a 0-d CPU tensor: dynamo gives its item() a backed symbol.
    sizes = num_tokens_per_expert.tolist()
    xs = torch.split(x[: num_tokens.item()], sizes, dim=0)
    return torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)


class TestUnbackedSplitItem(InductorTestCase):
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
        cnt = self._check(
            device, [([3, 0, 5, 4], 20), ([6, 6, 0, 0], 20)], backward=False
        )
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


instantiate_device_type_tests(
    TestUnbackedSplitItem, globals(), only_for=("cpu", "cuda"), allow_xpu=False
)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
