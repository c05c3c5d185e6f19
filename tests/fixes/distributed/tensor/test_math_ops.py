# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch.distributed.tensor import DeviceMesh, distribute_tensor, DTensor, Partial, Replicate, Shard
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


TestDtensorForeachNormDtypeWithLocalTensor = create_local_tensor_test_class(TestDtensorForeachNormDtype)


class TestDtensorIsAnyTrueStrategy(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_is_any_true_placements(self):
        mesh = self.build_device_mesh()
        for placement in (Shard(0), Shard(1), Replicate()):
            for hot in (None, (0, 1), (7, 3)):  # none, in rank 0's shard, in rank 1's
                full = torch.zeros(8, 4, dtype=torch.bool, device=self.device_type)
                if hot is not None:
                    full[hot] = True
                out = torch._is_any_true(distribute_tensor(full, mesh, [placement]))
                self.assertEqual(out.full_tensor(), torch._is_any_true(full))

    @with_comms
    def test_detect_anomaly_backward(self):
        mesh = self.build_device_mesh()
        weight = torch.randn(8, 4, device=self.device_type)
        dist_weight = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
        with torch.autograd.detect_anomaly(check_nan=True):
            (dist_weight * 2).sum().backward()
        self.assertEqual(dist_weight.grad.full_tensor(), torch.full_like(weight, 2.0))

    @with_comms
    def test_detect_anomaly_finds_nan_in_its_shard(self):
        # As without DTensor, each rank checks the gradients it holds: the rank
        # whose shard has the NaN raises, the others go on.
        mesh = self.build_device_mesh()
        weight = torch.randn(8, 4, device=self.device_type)
        scale = torch.ones(8, 4, device=self.device_type)
        scale[7, 0] = float("nan")  # in the last rank's shard
        dist_weight = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
        dist_scale = distribute_tensor(scale, mesh, [Shard(0)])
        with torch.autograd.detect_anomaly(check_nan=True):
            loss = (dist_weight * dist_scale).sum()
            if self.rank == self.world_size - 1:
                with self.assertRaisesRegex(RuntimeError, "returned nan values"):
                    loss.backward()
            else:
                loss.backward()
                self.assertFalse(dist_weight.grad.to_local().isnan().any())


# One process holds every rank: a NaN in one rank's shard cannot raise in that rank alone.
TestDtensorIsAnyTrueStrategyWithLocalTensor = create_local_tensor_test_class(
    TestDtensorIsAnyTrueStrategy,
    skipped_tests=["test_detect_anomaly_finds_nan_in_its_shard"],
)


def _partial_of(full: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    # each rank holds an equal part (exact for a power-of-two world size)
    return DTensor.from_local(full / mesh.size(), mesh, [Partial()], run_check=False)


class TestDtensorNormPartialBackward(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_vector_norm_partial_backward(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        full = torch.randn(4, 6, device=self.device_type)
        full[1] = 0  # a zero norm along dim 1 takes the masked branch of the backward
        for ord, dim in [(2, None), (2, 1), (3, None), (3, 1), (0.5, 1), (1, None)]:
            x = full.clone().requires_grad_()
            torch.linalg.vector_norm(x, ord, dim).sum().backward()
            dx = _partial_of(full, mesh)
            dx = dx.detach().requires_grad_()
            out = torch.linalg.vector_norm(dx, ord, dim)
            self.assertEqual(out.full_tensor(), torch.linalg.vector_norm(full, ord, dim))
            out.sum().backward()
            self.assertEqual(dx.grad.full_tensor(), x.grad)

    @with_comms
    def test_masked_fill_zero_keeps_partial(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        full = torch.randn(4, 6, device=self.device_type)
        mask = full > 0.5
        dmask = distribute_tensor(mask, mesh, [Replicate()])
        dx = _partial_of(full, mesh)
        for value, placement in [(0, Partial()), (1.5, Replicate())]:
            out = dx.masked_fill(dmask, value)
            self.assertEqual(out.placements, (placement,))
            self.assertEqual(out.full_tensor(), full.masked_fill(mask, value))
        # in place, which a Partial self allows only when it stays Partial
        dx.masked_fill_(dmask, 0)
        self.assertEqual(dx.placements, (Partial(),))
        self.assertEqual(dx.full_tensor(), full.masked_fill(mask, 0))


TestDtensorNormPartialBackwardWithLocalTensor = create_local_tensor_test_class(TestDtensorNormPartialBackward)


class TestDtensorRmsNormShardedDim(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_rms_norm_sharded_normalized_dim(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        full = torch.randn(2, 3, 8, device=self.device_type)
        weight = torch.randn(8, device=self.device_type)
        x = full.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        ref = torch.nn.functional.rms_norm(x, (8,), w, eps=1e-6)
        ref.pow(2).sum().backward()
        for shard_dim in (1, 2):
            dx = distribute_tensor(full, mesh, [Shard(shard_dim)]).requires_grad_()
            dw = distribute_tensor(weight, mesh, [Replicate()]).requires_grad_()
            out = torch.nn.functional.rms_norm(dx, (8,), dw, eps=1e-6)
            self.assertEqual(out.full_tensor(), ref)
            out.pow(2).sum().backward()
            self.assertEqual(dx.grad.full_tensor(), x.grad)
            self.assertEqual(dw.grad.full_tensor(), w.grad)

    @with_comms
    def test_add_scalar_keeps_partial_avg(self):
        mesh = self.build_device_mesh()
        full = torch.randn(4, 6, device=self.device_type)
        for reduce_op, placement in [("avg", Partial("avg")), ("sum", Replicate())]:
            dx = DTensor.from_local(full, mesh, [Partial(reduce_op)], run_check=False)
            expected = dx.full_tensor()
            out = torch.ops.aten.add.Scalar(dx, 0.5)
            self.assertEqual(out.placements, (placement,))
            self.assertEqual(out.full_tensor(), expected + 0.5)
            out = torch.ops.aten.sub.Scalar(dx, 0.5)
            self.assertEqual(out.full_tensor(), expected - 0.5)
        dx = DTensor.from_local(full, mesh, [Partial("avg")], run_check=False)
        torch.ops.aten.add_.Scalar(dx, 1e-6)
        self.assertEqual(dx.placements, (Partial("avg"),))
        self.assertEqual(dx.full_tensor(), full + 1e-6)


TestDtensorRmsNormShardedDimWithLocalTensor = create_local_tensor_test_class(TestDtensorRmsNormShardedDim)


if __name__ == "__main__":
    run_tests()
