# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn.functional as F
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)

from tests.fixes._torch_gates import skip_before


class TestDtensorConvDepthwiseChannelShard(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check_depthwise(self, input_shape, kernel_size, padding, bias) -> None:
        mesh = self.build_device_mesh()
        channels = input_shape[1]
        conv = {3: F.conv1d, 4: F.conv2d}[len(input_shape)]
        torch.manual_seed(0)
        x = torch.randn(input_shape, device=self.device_type)
        w = torch.randn((channels, 1, *kernel_size), device=self.device_type)
        b = torch.randn(channels, device=self.device_type) if bias else None
        leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
        out = conv(x, w, b, padding=padding, groups=channels)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)

        # The channels of the input, and the output channels of the weight
        # and the bias, are sharded alike: each rank convolves its channels
        dx = distribute_tensor(x.detach(), mesh, [Shard(1)]).requires_grad_()
        dw = distribute_tensor(w.detach(), mesh, [Shard(0)]).requires_grad_()
        db = distribute_tensor(b.detach(), mesh, [Shard(0)]).requires_grad_() if bias else None
        d_grad_out = distribute_tensor(grad_out, mesh, [Shard(1)])
        comm_mode = CommDebugMode()
        with comm_mode:
            d_out = conv(dx, dw, db, padding=padding, groups=channels)
            d_out.backward(d_grad_out)
        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(d_out.placements, (Shard(1),))
        self.assertEqual(d_out.full_tensor(), out)
        self.assertEqual(dx.grad.placements, (Shard(1),))
        self.assertEqual(dw.grad.placements, (Shard(0),))
        d_leaves = [dx, dw] + ([db] if bias else [])
        for leaf, d_leaf in zip(leaves, d_leaves):
            self.assertEqual(d_leaf.grad.full_tensor(), leaf.grad)
        if bias:
            self.assertEqual(db.grad.placements, (Shard(0),))

    @with_comms
    def test_depthwise_conv1d_channel_shard(self) -> None:
        # A causal depthwise conv1d (GatedDeltaNet's short convolution)
        self._check_depthwise((2, 8, 10), (3,), padding=[2], bias=True)

    @with_comms
    def test_depthwise_conv2d_channel_shard(self) -> None:
        self._check_depthwise((2, 4, 6, 6), (3, 3), padding=[1, 1], bias=False)


TestDtensorConvDepthwiseChannelShardWithLocalTensor = create_local_tensor_test_class(
    TestDtensorConvDepthwiseChannelShard
)


class TestDtensorConvBackwardWidthShard(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check_last_dim_shard(self, input_shape, kernel_size) -> None:
        mesh = self.build_device_mesh()
        last_dim = len(input_shape) - 1
        conv = {3: F.conv1d, 4: F.conv2d}[len(input_shape)]
        torch.manual_seed(0)
        x = torch.randn(input_shape, device=self.device_type, requires_grad=True)
        w = torch.randn(
            (4, input_shape[1], *kernel_size),
            device=self.device_type,
            requires_grad=True,
        )
        b = torch.randn(4, device=self.device_type, requires_grad=True)
        # Windows that neither overlap nor leave gaps: each shard of the last
        # dimension holds whole windows
        out = conv(x, w, b, stride=kernel_size)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)

        dx = distribute_tensor(x.detach(), mesh, [Shard(last_dim)])
        dx.requires_grad_()
        dw = distribute_tensor(w.detach(), mesh, [Replicate()]).requires_grad_()
        db = distribute_tensor(b.detach(), mesh, [Replicate()]).requires_grad_()
        d_out = conv(dx, dw, db, stride=kernel_size)
        self.assertEqual(d_out.placements, (Shard(last_dim),))
        self.assertEqual(d_out.full_tensor(), out)
        d_out.backward(distribute_tensor(grad_out, mesh, [Shard(last_dim)]))
        self.assertEqual(dx.grad.placements, (Shard(last_dim),))
        self.assertEqual(dx.grad.full_tensor(), x.grad)
        self.assertEqual(dw.grad.full_tensor(), w.grad)
        self.assertEqual(db.grad.full_tensor(), b.grad)

    @with_comms
    def test_conv2d_width_shard(self) -> None:
        self._check_last_dim_shard((2, 3, 4, 8), (2, 2))

    @with_comms
    def test_conv1d_last_dim_shard(self) -> None:
        self._check_last_dim_shard((2, 3, 12), (3,))

    @skip_before("2.12", "convolution has no single-dim strategy")
    @with_comms
    def test_bare_strategy_function_expands_to_the_mesh(self) -> None:
        # Callers may expand a single-dim strategy function itself, not its registration: the
        # full-mesh filter is read from a registration only.
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
        from torch.distributed.tensor._ops._conv_ops import convolution_single_dim_strategy
        from torch.distributed.tensor._ops.single_dim_strategy import _expand_single_dim_strategy_to_mesh

        def meta(t: torch.Tensor) -> TensorMeta:
            return TensorMeta(t.shape, t.stride(), t.dtype)

        mesh = self.build_device_mesh()
        x, w, out = torch.empty(2, 3, 4, 8), torch.empty(2, 3, 2, 2), torch.empty(2, 2, 2, 4)
        inputs = [OpStrategy([OpSpec(DTensorSpec(mesh, (Replicate(),), meta(t)))]) for t in (x, w)]
        op = torch.ops.aten.convolution.default
        args = (*inputs, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
        op_schema = OpSchema(op, args, {}, schema_info=RuntimeSchemaInfo(2))
        expand = _expand_single_dim_strategy_to_mesh(mesh, op_schema, convolution_single_dim_strategy, meta(out))
        strategy = expand(op, op_schema.args_meta, op_schema.kwargs_meta)
        self.assertIsInstance(strategy, OpStrategy)
        self.assertIn(Shard(3), [spec.output_spec.placements[0] for spec in strategy.strategies])


TestDtensorConvBackwardWidthShardWithLocalTensor = create_local_tensor_test_class(TestDtensorConvBackwardWidthShard)


if __name__ == "__main__":
    run_tests()
