# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.optim.optimizer import Optimizer
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)


_SHAPES = [(4, 3), (6,), (2, 2), (4, 4), (5,)]


def _make_params(layouts, device_type: str) -> list[nn.Parameter]:
    """One parameter per (mesh, placements) layout, None for a plain tensor, each with
    a gradient of the same layout; the same values on every call."""
    torch.manual_seed(0)
    params = []
    for (mesh, placements), shape in zip(layouts, _SHAPES):
        weight = torch.randn(shape, device=device_type)
        grad = torch.randn(shape, device=device_type)
        if mesh is not None:
            weight = distribute_tensor(weight, mesh, placements)
            grad = distribute_tensor(grad, mesh, placements)
        param = nn.Parameter(weight)
        param.grad = grad
        params.append(param)
    return params


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


class TestOptimizerForeachMixedDtensor(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _layouts(self):
        mesh = self.build_device_mesh()
        return [(mesh, [Shard(0)]), (None, None), (mesh, [Replicate()]), (None, None)]

    def _assert_same_steps(self, layouts, optim_cls, kwargs, ref_kwargs, split_groups=False):
        # Two steps each; params and every state tensor must match bit for bit.
        params = _make_params(layouts, self.device_type)
        ref_params = _make_params(layouts, self.device_type)
        opt = optim_cls(params, lr=0.1, **kwargs)
        if split_groups:
            # What users do today: the DTensors and the plain tensors in groups of their own.
            ref_opt = optim_cls(
                [
                    {"params": [p for p in ref_params if isinstance(p, DTensor)]},
                    {"params": [p for p in ref_params if not isinstance(p, DTensor)]},
                ],
                lr=0.1,
                **ref_kwargs,
            )
        else:
            ref_opt = optim_cls(ref_params, lr=0.1, **ref_kwargs)
        for _ in range(2):
            opt.step()
            ref_opt.step()
        for param, ref_param in zip(params, ref_params):
            self.assertEqual(type(param), type(ref_param))
            self.assertEqual(_full(param), _full(ref_param), atol=0, rtol=0)
            state, ref_state = opt.state[param], ref_opt.state[ref_param]
            self.assertEqual(sorted(state), sorted(ref_state))
            for name, value in state.items():
                self.assertEqual(_full(value), _full(ref_state[name]), atol=0, rtol=0)

    @with_comms
    def test_adamw_mixed_dtensor_and_plain(self):
        self._assert_same_steps(self._layouts(), torch.optim.AdamW, {"foreach": True}, {"foreach": False})

    @with_comms
    def test_adam_amsgrad_mixed_dtensor_and_plain(self):
        self._assert_same_steps(
            self._layouts(),
            torch.optim.Adam,
            {"foreach": True, "amsgrad": True, "weight_decay": 0.01},
            {"foreach": False, "amsgrad": True, "weight_decay": 0.01},
        )

    @with_comms
    def test_sgd_momentum_mixed_dtensor_and_plain(self):
        # SGD creates the momentum buffers in its first step, through the group's indices.
        self._assert_same_steps(
            self._layouts(),
            torch.optim.SGD,
            {"foreach": True, "momentum": 0.9},
            {"foreach": False, "momentum": 0.9},
        )

    @with_comms
    def test_fused_mixed_dtensor_and_plain(self):
        # The fused kernels round differently from the for-loop: compare with the same
        # fused step over the DTensors and the plain tensors in separate param groups.
        for optim_cls in (torch.optim.AdamW, torch.optim.Adam):
            self._assert_same_steps(
                self._layouts(),
                optim_cls,
                {"fused": True},
                {"fused": True},
                split_groups=True,
            )

    @with_comms
    def test_foreach_two_meshes_and_plain(self):
        mesh = self.build_device_mesh()
        mesh_2d = init_device_mesh(self.device_type, (self.world_size, 1), mesh_dim_names=("dp", "ep"))
        layouts = [
            (mesh, [Shard(0)]),
            (mesh_2d, [Shard(0), Replicate()]),
            (None, None),
            (mesh_2d, [Replicate(), Replicate()]),
            (mesh, [Replicate()]),
        ]
        self._assert_same_steps(layouts, torch.optim.AdamW, {"foreach": True}, {"foreach": False})

    @with_comms
    def test_grouping_keeps_unmixed_groups(self):
        # Groups of DTensors only or plain tensors only come back as the base grouping gives them.
        mesh = self.build_device_mesh()
        for layouts in ([(mesh, [Shard(0)])] * 3, [(None, None)] * 3):
            params = _make_params(layouts, self.device_type)
            grouped = Optimizer._group_tensors_by_device_and_dtype(
                [params, [p.grad for p in params]], with_indices=True
            )
            self.assertEqual(len(grouped), 1)
            (device, dtype), ((group_params, _), indices) = next(iter(grouped.items()))
            self.assertEqual((device.type, dtype), (self.device_type, torch.float32))
            self.assertEqual(indices, [0, 1, 2])
            for param, group_param in zip(params, group_params):
                self.assertIs(param, group_param)


TestOptimizerForeachMixedDtensorWithLocalTensor = create_local_tensor_test_class(TestOptimizerForeachMixedDtensor)


if __name__ == "__main__":
    run_tests()
