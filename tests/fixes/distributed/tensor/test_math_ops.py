# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)


class TestDtensorForeachNormDtype(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_foreach_norm_dtype(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        grads = [
            torch.randn(12, 8, device=self.device_type, dtype=torch.bfloat16),
            torch.randn(8, 8, device=self.device_type, dtype=torch.bfloat16),
            torch.randn(6, device=self.device_type, dtype=torch.bfloat16),
        ]
        placements = ([Shard(0)], [Shard(1)], [Replicate()])
        dist_grads = [distribute_tensor(g, mesh, p) for g, p in zip(grads, placements)]
        for norm_type in (2, 1, float("inf")):
            out = torch._foreach_norm(dist_grads, norm_type, dtype=torch.float32)
            ref = torch._foreach_norm(grads, norm_type, dtype=torch.float32)
            for o, r in zip(out, ref):
                self.assertEqual(o.dtype, torch.float32)
                self.assertEqual(o.full_tensor(), r)


TestDtensorForeachNormDtypeWithLocalTensor = create_local_tensor_test_class(
    TestDtensorForeachNormDtype
)


if __name__ == "__main__":
    run_tests()
