# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import itertools

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    with_comms,
)


class TestClipGradNormMixedMeshes(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check_clip_grad_norm(self, layouts, norm_type, foreach):
        # layouts: (mesh or None, placements) per parameter; None is a plain tensor
        torch.manual_seed(0)
        shapes = [(12, 8), (8, 4), (6,), (3, 3)]
        ref_params, params = [], []
        for (mesh, placements), shape in zip(layouts, shapes):
            full = torch.randn(shape, device=self.device_type)
            ref_param = nn.Parameter(torch.zeros(shape, device=self.device_type))
            ref_param.grad = full.clone()
            ref_params.append(ref_param)
            if mesh is None:
                param = nn.Parameter(torch.zeros(shape, device=self.device_type))
                param.grad = full.clone()
            else:
                param = nn.Parameter(
                    distribute_tensor(ref_param.detach(), mesh, placements)
                )
                param.grad = distribute_tensor(full, mesh, placements)
            params.append(param)

        max_norm = 1.0
        ref_total_norm = nn.utils.clip_grad_norm_(ref_params, max_norm, norm_type)
        total_norm = nn.utils.clip_grad_norm_(
            params, max_norm, norm_type, foreach=foreach
        )
        # no single mesh holds the total norm of gradients on several meshes
        self.assertNotIsInstance(total_norm, DTensor)
        self.assertEqual(total_norm, ref_total_norm)
        for param, ref_param in zip(params, ref_params):
            grad = param.grad
            if isinstance(grad, DTensor):
                grad = grad.full_tensor()
            self.assertEqual(grad, ref_param.grad)

    @with_comms
    def test_clip_grad_norm_two_meshes(self):
        # e.g. dense parameters sharded on one mesh and experts on another
        mesh_a = init_device_mesh(
            self.device_type, (self.world_size,), mesh_dim_names=("dp",)
        )
        mesh_b = init_device_mesh(
            self.device_type, (self.world_size,), mesh_dim_names=("ep",)
        )
        layouts = [
            (mesh_a, [Shard(0)]),
            (mesh_b, [Shard(0)]),
            (mesh_a, [Replicate()]),
            (mesh_b, [Shard(1)]),
        ]
        for norm_type, foreach in itertools.product((2.0, float("inf")), (None, True)):
            self._check_clip_grad_norm(layouts, norm_type, foreach)

    @with_comms
    def test_clip_grad_norm_dtensor_and_plain(self):
        # e.g. a model with parallelized layers and a few plain parameters
        mesh = self.build_device_mesh()
        layouts = [
            (mesh, [Shard(0)]),
            (None, None),
            (mesh, [Replicate()]),
            (None, None),
        ]
        for norm_type, foreach in itertools.product((2.0, float("inf")), (None, True)):
            self._check_clip_grad_norm(layouts, norm_type, foreach)


TestClipGradNormMixedMeshesWithLocalTensor = create_local_tensor_test_class(
    TestClipGradNormMixedMeshes
)


if __name__ == "__main__":
    run_tests()
