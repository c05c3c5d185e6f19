# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._context_parallel import _attention
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class TestContextParallelExitOnException(DTensorTestBase):
    """An exception inside ``context_parallel`` restores SDPA and the buffers."""

    @property
    def world_size(self) -> int:
        return 2

    def _fail_inside_context_parallel(self, buf: torch.Tensor) -> None:
        mesh = self.build_device_mesh()
        with self.assertRaisesRegex(RuntimeError, "step failed"):
            with context_parallel(mesh, buffers=[buf], buffer_seq_dims=[1]):
                self.assertEqual(buf.shape, (1, 8 // self.world_size))
                raise RuntimeError("step failed")

    @with_comms
    def test_sdpa_after_exception(self):
        # Inputs differ across ranks: attention left distributed would mix them
        torch.manual_seed(self.rank)
        q, k, v = (torch.randn(1, 2, 8, 4, device=self.device_type) for _ in range(3))
        expected = F.scaled_dot_product_attention(q, k, v)
        buf = torch.zeros(1, 8, device=self.device_type)
        self._fail_inside_context_parallel(buf)
        self.assertEqual(F.scaled_dot_product_attention(q, k, v), expected)

    @with_comms
    def test_buffers_and_sdpa_restored_after_exception(self):
        sdpa = F.scaled_dot_product_attention
        buf = torch.arange(8, device=self.device_type, dtype=torch.float32).view(1, 8)
        original = buf.clone()
        self._fail_inside_context_parallel(buf)
        self.assertIs(F.scaled_dot_product_attention, sdpa)
        self.assertEqual(buf, original)


class TestContextParallelReplacedFunctionsLeak(DTensorTestBase):
    """Leaving ``context_parallel`` drops the record of the SDPA it replaced."""

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_replaced_functions_bounded_over_steps(self):
        mesh = self.build_device_mesh()
        buf = torch.arange(16, device=self.device_type, dtype=torch.float32).view(2, 8)
        sdpa = F.scaled_dot_product_attention
        before = len(_attention._replaced_functions)
        for _ in range(5):
            with context_parallel(mesh, buffers=[buf], buffer_seq_dims=[1]):
                self.assertIsNot(F.scaled_dot_product_attention, sdpa)
            self.assertIs(F.scaled_dot_product_attention, sdpa)
        self.assertEqual(len(_attention._replaced_functions), before)


if __name__ == "__main__":
    run_tests()
