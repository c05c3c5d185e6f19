# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import os

import torch
import torch.distributed.checkpoint as dist_cp
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner_helpers import (
    _create_chunk_from_dtensor,
    _create_write_items_for_dtensor,
)
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    init_device_mesh,
    Replicate,
    Shard,
)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir

from tests.fixes._torch_gates import skip_before


# (global shape, split factor) of a 1-D _StridedShard(0) on 4 ranks: even, and uneven
# sizes that leave a rank short or empty in some of the split_factor pieces.
ONE_D_STRIDED_CASES = [((8, 2), 2), ((10, 3), 2), ((7, 2), 3), ((5, 3), 2)]

# Placements on a (2, 2) mesh that combine _StridedShard with another placement.
TWO_D_STRIDED_PLACEMENTS = [
    [_StridedShard(0, split_factor=2), Replicate()],
    [Shard(1), _StridedShard(0, split_factor=2)],
    [Shard(0), _StridedShard(0, split_factor=2)],
    [Replicate(), _StridedShard(1, split_factor=2)],
]


def _distribute(tensor: torch.Tensor, mesh, placements) -> DTensor:
    # Every rank holds the same tensor: split it locally (scattering a _StridedShard
    # takes only sizes that its pieces divide evenly).
    return distribute_tensor(tensor, mesh, placements, src_data_rank=None)


def _arange(shape: tuple[int, int]) -> torch.Tensor:
    return torch.arange(shape[0] * shape[1], dtype=torch.float).view(shape)


@skip_before("2.12", "2.11 cannot build a _StridedShard DTensor (no shard order for it)")
class TestDcpStridedShardDisjointRegions(DTensorTestBase):
    """A ``_StridedShard`` local shard can be several disjoint regions of the global
    tensor: DCP saves and loads each of them."""

    @property
    def world_size(self) -> int:
        return 4

    def _save(self, dtensor: DTensor, name: str) -> str:
        checkpoint_dir = os.path.join(self.temp_dir, name)
        dist_cp.save({"w": dtensor}, checkpoint_id=checkpoint_dir)
        return checkpoint_dir

    def _load(self, checkpoint_dir: str, like: DTensor, placements) -> DTensor:
        dtensor = _distribute(torch.zeros(like.shape), like.device_mesh, placements)
        dist_cp.load({"w": dtensor}, checkpoint_id=checkpoint_dir)
        return dtensor

    def _cases(self):
        mesh_1d = init_device_mesh(self.device_type, (self.world_size,))
        for shape, split_factor in ONE_D_STRIDED_CASES:
            yield mesh_1d, shape, [_StridedShard(0, split_factor=split_factor)]
        mesh_2d = init_device_mesh(self.device_type, (2, self.world_size // 2))
        for placements in TWO_D_STRIDED_PLACEMENTS:
            yield mesh_2d, (8, 6), placements

    @with_comms
    @with_temp_dir
    def test_save_strided_shard_load_other_placements(self) -> None:
        for i, (mesh, shape, placements) in enumerate(self._cases()):
            global_tensor = _arange(shape)
            src = _distribute(global_tensor, mesh, placements)
            checkpoint_dir = self._save(src, f"strided_{i}")
            for load_placements in (
                placements,
                [Shard(0)] * mesh.ndim,
                [Replicate()] * mesh.ndim,
            ):
                dst = self._load(checkpoint_dir, src, load_placements)
                self.assertEqual(dst.full_tensor(), src.full_tensor(), msg=f"{placements} -> {load_placements}")

    @with_comms
    @with_temp_dir
    def test_load_shard_checkpoint_into_strided_shard(self) -> None:
        for i, (mesh, shape, placements) in enumerate(self._cases()):
            global_tensor = _arange(shape)
            src = _distribute(global_tensor, mesh, [Shard(0)] * mesh.ndim)
            checkpoint_dir = self._save(src, f"shard_{i}")
            dst = self._load(checkpoint_dir, src, placements)
            self.assertEqual(dst.full_tensor(), src.full_tensor(), msg=f"{placements} {shape}")
            # Each chunk names the region of the local shard that holds it.
            chunks = dst.__create_chunk_list__()
            self.assertEqual(sum(c.sizes.numel() for c in chunks), dst.to_local().numel())
            for chunk in chunks:
                region = dst.__get_tensor_shard__(MetadataIndex("w", chunk.offsets))
                expected = global_tensor
                for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
                    expected = expected.narrow(dim, offset, size)
                self.assertEqual(region, expected, msg=f"{placements} {shape}")


@skip_before("2.12", "2.11 cannot build a _StridedShard DTensor (no shard order for it)")
class TestDcpStridedShardDisjointRegionsGuard(DTensorTestBase):
    """DTensors whose local shard is one region keep their one chunk and write item."""

    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_one_region_keeps_one_chunk(self) -> None:
        mesh_1d = init_device_mesh(self.device_type, (self.world_size,))
        mesh_2d = init_device_mesh(self.device_type, (2, self.world_size // 2))
        cases = [
            (mesh_1d, [Shard(0)]),
            (mesh_1d, [Shard(1)]),
            (mesh_1d, [Replicate()]),
            (mesh_2d, [Shard(0), Shard(1)]),
            (mesh_2d, [Replicate(), Shard(0)]),
            # FSDP2 over TP on the same dim: each rank holds one block of rows.
            (mesh_2d, [_StridedShard(0, split_factor=2), Shard(0)]),
        ]
        for mesh, placements in cases:
            for shape in ((8, 6), (7, 5)):
                global_tensor = _arange(shape)
                dtensor = _distribute(global_tensor, mesh, placements)
                chunk = _create_chunk_from_dtensor(dtensor)
                self.assertEqual(dtensor.__create_chunk_list__(), [chunk])
                self.assertEqual(
                    dtensor.__create_write_items__("w", dtensor),
                    [_create_write_items_for_dtensor("w", dtensor)],
                )
                shard = dtensor.__get_tensor_shard__(MetadataIndex("w", chunk.offsets))
                self.assertEqual(shard.data_ptr(), dtensor.to_local().data_ptr())
                self.assertEqual(shard.shape, dtensor.to_local().shape)


if __name__ == "__main__":
    run_tests()
