# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn.functional as F
from torch._dynamo import config as dynamo_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU


def padded_moe_for_loop(w1, w2, w3, x, num_tokens_per_expert, scores):
    # torchtitan's MoE for-loop path; rows of x past sum(num_tokens_per_expert) are
    # padding. The slice's length is only computable once the split's asserts exist.
    sizes = num_tokens_per_expert.tolist()
    num_tokens = sum(sizes)
    outs = []
    for i, x_expert in enumerate(torch.split(x[:num_tokens], sizes, dim=0)):
        h = F.silu(x_expert @ w1[i].transpose(-2, -1))
        h = h * (x_expert @ w3[i].transpose(-2, -1))
        outs.append(h @ w2[i].transpose(-2, -1))
    out = torch.cat(outs, dim=0)
    out = torch.vstack((out, out.new_zeros((x.shape[0] - num_tokens, out.shape[-1]))))
    return out * scores.unsqueeze(-1)


class TestUnbackedSplitRebind(InductorTestCase):
    def _check(self, device, mark_dynamic):
        torch.manual_seed(0)
        weights = [
            torch.randn(4, *shape, device=device, requires_grad=True)
            for shape in ((16, 8), (8, 16), (16, 8))
        ]
        cnt = CompileCounterWithBackend("inductor")
        compiled = torch.compile(padded_moe_for_loop, backend=cnt, fullgraph=True)
        for counts, num_rows in (([3, 0, 5, 4], 16), ([1, 2, 0, 9], 20)):
            counts = torch.tensor(counts, device=device)
            x = torch.randn(num_rows, 8, device=device, requires_grad=True)
            scores = torch.rand(num_rows, device=device)
            ref = padded_moe_for_loop(*weights, x, counts, scores)
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


instantiate_device_type_tests(
    TestUnbackedSplitRebind, globals(), only_for=("cpu", "cuda"), allow_xpu=False
)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
