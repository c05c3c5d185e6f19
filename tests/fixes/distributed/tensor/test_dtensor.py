# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn as nn
from hypothesis import given, settings, strategies as st
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    parallelize_module,
    RowwiseParallel,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    LocalDTensorTestBase,
    with_comms,
)


class TestDtensorDataSetter(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _full(self) -> torch.Tensor:
        return torch.arange(8, dtype=torch.float32, device=self.device_type).reshape(4, 2)

    @with_comms
    def test_data_setter_dtype(self):
        mesh = self.build_device_mesh()
        p = nn.Parameter(distribute_tensor(self._full().bfloat16(), mesh, [Shard(0)]))
        p.data = p.data.to(torch.float32)
        self.assertEqual(p.dtype, torch.float32)
        self.assertEqual(p.to_local().dtype, torch.float32)
        out = p * 1.5
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(out.to_local().dtype, torch.float32)
        self.assertEqual(p.placements, (Shard(0),))
        self.assertEqual(p.full_tensor(), self._full())

    @with_comms
    def test_data_setter_values_and_placements(self):
        mesh = self.build_device_mesh()
        q = nn.Parameter(distribute_tensor(self._full(), mesh, [Shard(0)]))
        new = self._full() * 10
        q.data = distribute_tensor(new, mesh, [Replicate()])
        self.assertTrue(q.requires_grad)
        self.assertTrue(q.is_leaf)
        self.assertEqual(q.placements, (Replicate(),))
        self.assertEqual(q.to_local(), new)
        self.assertEqual(q.full_tensor(), new)

    @with_comms
    def test_data_setter_plain_tensor_warns(self):
        # A plain tensor does not say whether it is the full tensor or this rank's
        # shard: the assignment does what it did (code that frees a parameter with
        # ``p.data = torch.empty(0)``), and says that the shard and spec are kept.
        mesh = self.build_device_mesh()
        q = nn.Parameter(distribute_tensor(self._full(), mesh, [Shard(0)]))
        local = q._local_tensor
        with self.assertWarnsRegex(UserWarning, "local shard and placements stay"):
            q.data = torch.empty(0, device=self.device_type)
        self.assertEqual(q.shape, (0,))
        self.assertIs(q._local_tensor, local)
        self.assertEqual(q.placements, (Shard(0),))

    @with_comms
    def test_data_getter_aliases_local_shard(self):
        mesh = self.build_device_mesh()
        p = nn.Parameter(distribute_tensor(self._full(), mesh, [Shard(0)]))
        data = p.data
        self.assertIsInstance(data, DTensor)
        self.assertFalse(data.requires_grad)
        data.mul_(2)
        self.assertEqual(p.full_tensor(), self._full() * 2)

    @with_comms
    def test_grad_after_data_setter(self):
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        old_full = torch.randn(4, 6, device=self.device_type)
        new_full = torch.randn(4, 6, device=self.device_type)
        x_full = torch.randn(4, 6, device=self.device_type)
        w = nn.Parameter(distribute_tensor(old_full.bfloat16(), mesh, [Replicate()]))
        w.data = distribute_tensor(new_full, mesh, [Shard(0)])
        x = distribute_tensor(x_full, mesh, [Shard(0)])
        (w * w * x).sum().backward()
        self.assertEqual(w.grad.dtype, torch.float32)
        self.assertEqual(w.grad.placements, (Shard(0),))
        self.assertEqual(w.grad.full_tensor(), 2 * new_full * x_full)

    @with_comms
    def test_tp_module_upcast_by_data(self):
        # Weights upcast by hand after module.to(bfloat16), as adapters do for training.
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)).to(self.device_type)
        ref = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)).to(self.device_type)
        ref.load_state_dict(model.state_dict())
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        model.to(torch.bfloat16)
        ref.to(torch.bfloat16)
        for (name, param), ref_param in zip(model.named_parameters(), ref.parameters()):
            self.assertEqual(param.dtype, torch.bfloat16)
            self.assertEqual(param.to_local().dtype, torch.bfloat16)
            self.assertEqual(param.full_tensor(), ref_param, msg=name)
        for param, ref_param in zip(model.parameters(), ref.parameters()):
            param.data = param.data.to(torch.float32)
            ref_param.data = ref_param.data.to(torch.float32)
        x = torch.randn(4, 8, device=self.device_type)
        out = model(x)
        ref_out = ref(x)
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(out, ref_out)
        out.sum().backward()
        ref_out.sum().backward()
        for (name, param), ref_param in zip(model.named_parameters(), ref.parameters()):
            self.assertEqual(param.grad.dtype, ref_param.dtype, msg=name)
            self.assertEqual(param.grad.full_tensor(), ref_param.grad, msg=name)


# The plain reference module of the TP test would run under LocalTensorMode too.
TestDtensorDataSetterWithLocalTensor = create_local_tensor_test_class(
    TestDtensorDataSetter, skipped_tests=["test_tp_module_upcast_by_data"]
)


_DATA_PLACEMENTS = [Replicate(), Shard(0), Shard(1)]
_DATA_DTYPES = [torch.float32, torch.bfloat16, torch.float64]


class TestDtensorDataSetterProperty(LocalDTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_data_setter_property(self):
        meshes = {
            (4,): self.build_device_mesh(),
            (2, 2): init_device_mesh(self.device_type, (2, 2)),
        }

        @settings(max_examples=40, deadline=None, derandomize=True)
        @given(
            st.sampled_from(sorted(meshes)),
            st.data(),
            st.sampled_from(_DATA_DTYPES),
            st.sampled_from(_DATA_DTYPES),
        )
        def check(mesh_shape, data, old_dtype, new_dtype) -> None:
            mesh = meshes[mesh_shape]
            placements = st.lists(
                st.sampled_from(_DATA_PLACEMENTS),
                min_size=mesh.ndim,
                max_size=mesh.ndim,
            ).map(tuple)
            old_placements = data.draw(placements)
            new_placements = data.draw(placements)
            old_full = torch.arange(64.0, device=self.device_type).reshape(8, 8)
            new_full = -old_full.t().contiguous()
            with self._get_local_tensor_mode():
                p = nn.Parameter(distribute_tensor(old_full.to(old_dtype), mesh, old_placements))
                new = distribute_tensor(new_full.to(new_dtype), mesh, new_placements)
                p.data = new
                local_shape = new.to_local().shape
                p_local = p.to_local()
                doubled = (p * 2).full_tensor()
                p_full = p.full_tensor()
            # Assert outside LocalTensorMode, which would treat the checks as per-rank code.
            self.assertEqual(p.placements, new_placements)
            self.assertEqual(p.dtype, new_dtype)
            self.assertEqual(p_local.dtype, new_dtype)
            self.assertEqual(p_local.shape, local_shape)
            self.assertTrue(p.requires_grad)
            self.assertEqual(p_full, new_full.to(new_dtype))
            self.assertEqual(doubled, new_full.to(new_dtype) * 2)

        check()


if __name__ == "__main__":
    run_tests()
