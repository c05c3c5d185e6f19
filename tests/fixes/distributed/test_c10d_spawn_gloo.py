# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.distributed as c10d
import torch.distributed.nn
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    requires_gloo,
)
from torch.testing._internal.common_utils import run_tests


class TestDistNnBroadcastSubgroupGrad(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    @requires_gloo()
    def test_broadcast_subgroup_source_grad(self) -> None:
        store = c10d.FileStore(self.file_name, self.world_size)
        c10d.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        # Rank 0 takes no part after this: without a collective on the default
        # group it could exit while rank 1 is still connecting its gloo pairs
        # ("Connection closed by peer" in connectFullMesh)
        c10d.barrier()
        # Global rank 1 is rank 0 of this subgroup: the source's global rank
        # and its rank within the group differ
        subgroup = c10d.new_group([1])
        if self.rank == 1:
            x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
            x.requires_grad_(True)
            y = torch.distributed.nn.broadcast(x, src=1, group=subgroup)
            self.assertEqual(y, x)
            (y * 3).sum().backward()
            # The source is the group's only rank: its gradient is the reduced
            # gradient, not zeros
            self.assertEqual(x.grad, torch.full_like(x, 3.0))
        c10d.destroy_process_group()


if __name__ == "__main__":
    run_tests()
