# Owner(s): ["oncall: cpu inductor"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import config
from torch._inductor.test_case import run_tests, TestCase
from torch.testing._internal.inductor_utils import HAS_CPU


def pad_to_input_rows(x, num_tokens):
    # The routed rows of x, padded back to x's length with zeros: the padding
    # has x.shape[0] - num_tokens.item() rows, an unbacked size that is 0 when
    # the item() takes its largest possible value.
    n = num_tokens.item()
    routed = x[:n] * 2
    return torch.cat([routed, routed.new_zeros(x.shape[0] - n, x.shape[1])])


class TestInductorCppUnbackedParallelDepth(TestCase):
    # decide_parallel_depth only splits a loop when every thread gets at least
    # cpp.min_chunk_size elements; pin the thread count so that the padding
    # kernel (256 * 16 elements) is big enough on any machine.
    @config.patch({"cpp.threads": 4})
    @dynamo_config.patch(capture_scalar_outputs=True)
    def test_pad_to_unbacked_rows(self):
        x = torch.randn(256, 16)
        compiled = torch.compile(pad_to_input_rows, backend="inductor", fullgraph=True)
        for num_tokens in (100, 0, 256):
            num_tokens = torch.tensor(num_tokens)
            self.assertEqual(compiled(x, num_tokens), pad_to_input_rows(x, num_tokens))


if __name__ == "__main__":
    if HAS_CPU:
        run_tests()
