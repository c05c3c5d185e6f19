# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch._dynamo import config as dynamo_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU


def split_item_slice_padded(x, num_tokens_per_expert, num_tokens, w):
    # num_tokens is a 0-d CPU tensor. The expert output is padded back to the
    # routed rows, so the gradient flowing into the backward is sized
    # sum(sizes) + x.shape[0] - num_tokens.item().
    n = num_tokens.item()
    xs = torch.split(x[:n], num_tokens_per_expert.tolist(), dim=0)
    out = torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)
    return torch.vstack((out, out.new_zeros((x.shape[0] - n, out.shape[-1]))))


class TestUnbackedSplitPaddedBackward(InductorTestCase):
    def _check(self, device, cases, mark=None):
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
        self._check(device, [([3, 0, 5, 4], 16), ([1, 2, 0, 9], 20)])

    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_then_split_padded_backward_mark_dynamic(self, device):
        cnt = self._check(
            device,
            [([3, 0, 5, 4], 16), ([0, 0, 2, 1], 7)],
            mark=torch._dynamo.mark_dynamic,
        )
        self.assertEqual(cnt.frame_count, 1)


instantiate_device_type_tests(
    TestUnbackedSplitPaddedBackward,
    globals(),
    only_for=("cpu", "cuda"),
    allow_xpu=False,
)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
