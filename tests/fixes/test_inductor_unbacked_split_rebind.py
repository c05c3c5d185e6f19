# Owner(s): ["module: inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn.functional as F
from torch._dynamo import config as dynamo_config
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.test_case import run_tests, TestCase as InductorTestCase
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.inductor_utils import HAS_CPU, HAS_GPU
from torch.utils.checkpoint import checkpoint


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
        out = torch.vstack(
            (out, out.new_zeros((x.shape[0] - num_tokens, out.shape[-1])))
        )
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


class TestUnbackedSplitRebind(InductorTestCase):
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


instantiate_device_type_tests(
    TestUnbackedSplitRebind, globals(), only_for=("cpu", "cuda"), allow_xpu=False
)

if __name__ == "__main__":
    if HAS_CPU or HAS_GPU:
        run_tests()
