# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn.functional as F
from torch.distributed.tensor import distribute_tensor, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)

c10d_functional = torch.ops.c10d_functional


class TestDtensorLossParallelLogSoftmaxBackward(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_log_softmax_weighted_sum(self):
        # A log_softmax that is not fed to nll_loss, e.g. token log-probs weighted
        # by advantages or a KL term against a target distribution.
        mesh = self.build_device_mesh()
        comm_mode = CommDebugMode()
        torch.manual_seed(0)
        for shape, dim in (((4, 16), 1), ((2, 3, 16), -1)):
            x = torch.randn(*shape, device=self.device_type, requires_grad=True)
            w = torch.randn(*shape, device=self.device_type)
            (F.log_softmax(x, dim) * w).sum().backward()

            shard_dim = dim % x.ndim
            dist_x = distribute_tensor(x.detach(), mesh, [Shard(shard_dim)])
            dist_x.requires_grad_()
            dist_w = distribute_tensor(w, mesh, [Shard(shard_dim)])
            with loss_parallel():
                dist_y = (F.log_softmax(dist_x, dim) * dist_w).sum()
                with comm_mode:
                    dist_y.backward()
                # one all-reduce of the gradient's sum over the class dim
                self.assertEqual(comm_mode.get_comm_counts()[c10d_functional.all_reduce], 1)
            self.assertTrue(dist_x.grad.placements[0].is_shard(shard_dim))
            self.assertEqual(dist_x.grad.full_tensor(), x.grad)

    @with_comms
    def test_log_softmax_shared_with_nll_loss(self):
        mesh = self.build_device_mesh()
        comm_mode = CommDebugMode()
        torch.manual_seed(0)
        x = torch.randn(4, 16, device=self.device_type, requires_grad=True)
        w = torch.randn(4, 16, device=self.device_type)
        target = torch.randint(16, (4,), device=self.device_type)
        dist_x = distribute_tensor(x.detach(), mesh, [Shard(1)]).requires_grad_()
        dist_w = distribute_tensor(w, mesh, [Shard(1)])

        # cross_entropy keeps its backward free of communication
        F.cross_entropy(x, target).backward()
        with loss_parallel():
            dist_y = F.cross_entropy(dist_x, target)
            with comm_mode:
                dist_y.backward()
            self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(dist_x.grad.full_tensor(), x.grad)
        x.grad = None
        dist_x.grad = None

        # one log_softmax output consumed by nll_loss and by another term
        log_probs = F.log_softmax(x, 1)
        (F.nll_loss(log_probs, target) + (log_probs * w).sum()).backward()
        with loss_parallel():
            dist_log_probs = F.log_softmax(dist_x, 1)
            dist_y = F.nll_loss(dist_log_probs, target) + (dist_log_probs * dist_w).sum()
            dist_y.backward()
        self.assertEqual(dist_x.grad.full_tensor(), x.grad)


TestDtensorLossParallelLogSoftmaxBackwardWithLocalTensor = create_local_tensor_test_class(
    TestDtensorLossParallelLogSoftmaxBackward
)


if __name__ == "__main__":
    run_tests()
