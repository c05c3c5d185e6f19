# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU


def split_routed_tokens(x, num_tokens_per_expert, w):
    # Nothing bounds the sign of item(), so the backward's slice_scatter end is
    # a data-dependent bound of unknown sign.
    sizes = num_tokens_per_expert.tolist()
    xs = torch.split(x[: num_tokens_per_expert.sum().item()], sizes, dim=0)
    return torch.cat([x_expert @ w[i] for i, x_expert in enumerate(xs)], dim=0)


class TestUnbackedSplitScatter(InductorTestCase):
    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_item_slice_backward(self, device):
        torch.manual_seed(0)
        w = torch.randn(4, 8, 8, device=device, requires_grad=True)
        compiled = torch.compile(
            split_routed_tokens, backend="inductor", fullgraph=True
        )
        for counts in ([3, 0, 5, 4], [0, 9, 2, 1]):
            counts = torch.tensor(counts, device=device)
            x = torch.randn(20, 8, device=device, requires_grad=True)
            ref = split_routed_tokens(x, counts, w)
            ref_grads = torch.autograd.grad(ref.sum(), [x, w])
            out = compiled(x, counts, w)
            self.assertEqual(out, ref)
            self.assertEqual(torch.autograd.grad(out.sum(), [x, w]), ref_grads)


instantiate_device_type_tests(
    TestUnbackedSplitScatter, globals(), only_for=("cpu", "cuda"), allow_xpu=False
)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
