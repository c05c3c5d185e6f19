# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

from datetime import timedelta

import torch
import torch.distributed as c10d
from torch.distributed.distributed_c10d import _get_process_group_name
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    requires_gloo,
)
from torch.testing._internal.common_utils import run_tests


# Ranks that name a group differently rendezvous under different store
# prefixes and wait for each other until this timeout
_GROUP_TIMEOUT = timedelta(seconds=5)


class TestC10DGroupNameSalt(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _init_gloo(self) -> None:
        store = c10d.FileStore(self.file_name, self.world_size)
        c10d.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def _check_group(self, group) -> str:
        name = _get_process_group_name(group)
        names = [None] * self.world_size
        c10d.all_gather_object(names, name)
        self.assertEqual(names, [name] * self.world_size)
        t = torch.ones(2)
        c10d.all_reduce(t, group=group)
        self.assertEqual(t, torch.full((2,), float(self.world_size)))
        return name

    @requires_gloo()
    def test_local_groups_created_by_members_only(self) -> None:
        self._init_gloo()
        # Each group is created by its members only, as
        # use_local_synchronization=True allows
        if self.rank == 0:
            c10d.new_group([0], use_local_synchronization=True)
        group = c10d.new_group([0, 1], use_local_synchronization=True, timeout=_GROUP_TIMEOUT)
        name = self._check_group(group)
        # A second group of the same ranks gets a name of its own
        other = c10d.new_group([0, 1], use_local_synchronization=True, timeout=_GROUP_TIMEOUT)
        self.assertNotEqual(self._check_group(other), name)
        c10d.destroy_process_group(other)
        c10d.destroy_process_group(group)
        c10d.destroy_process_group()

    @requires_gloo()
    def test_local_group_after_asymmetric_group(self) -> None:
        self._init_gloo()
        # Only rank 0 is a member (and registers it)
        c10d.new_group([0])
        group = c10d.new_group([0, 1], use_local_synchronization=True, timeout=_GROUP_TIMEOUT)
        self._check_group(group)
        c10d.destroy_process_group(group)
        c10d.destroy_process_group()

    @requires_gloo()
    def test_group_after_local_group_of_one_rank(self) -> None:
        self._init_gloo()
        if self.rank == 0:
            c10d.new_group([0], use_local_synchronization=True)
        group = c10d.new_group([0, 1], timeout=_GROUP_TIMEOUT)
        self._check_group(group)
        c10d.destroy_process_group(group)
        c10d.destroy_process_group()


if __name__ == "__main__":
    run_tests()
