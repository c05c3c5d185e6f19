# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import itertools

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    LocalDTensorTestBase,
    with_comms,
)


def _clip_grad_norm_per_mesh_(
    parameters: list[nn.Parameter], max_norm: float, norm_type: float, foreach
) -> torch.Tensor:
    """What trainers run instead of ``clip_grad_norm_`` for gradients on several
    meshes: one group per mesh, in the order the meshes first appear, and the plain
    tensors as the last group; the norm of the groups' norms; each group scaled by it.
    """
    mesh_groups: dict[object, list[nn.Parameter]] = {}
    plain: list[nn.Parameter] = []
    for param in parameters:
        if isinstance(param.grad, DTensor):
            mesh_groups.setdefault(param.grad.device_mesh, []).append(param)
        elif param.grad is not None:
            plain.append(param)
    groups = [*mesh_groups.values(), *([plain] if plain else [])]
    norms = []
    for group in groups:
        norm = nn.utils.get_total_norm([p.grad for p in group], norm_type, foreach=foreach)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total_norm = nn.utils.get_total_norm(norms, norm_type, foreach=foreach)
    for group in groups:
        nn.utils.clip_grads_with_norm_(group, max_norm, total_norm, foreach=foreach)
    return total_norm


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
                param = nn.Parameter(distribute_tensor(ref_param.detach(), mesh, placements))
                param.grad = distribute_tensor(full, mesh, placements)
            params.append(param)

        max_norm = 1.0
        ref_total_norm = nn.utils.clip_grad_norm_(ref_params, max_norm, norm_type)
        total_norm = nn.utils.clip_grad_norm_(params, max_norm, norm_type, foreach=foreach)
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
        mesh_a = init_device_mesh(self.device_type, (self.world_size,), mesh_dim_names=("dp",))
        mesh_b = init_device_mesh(self.device_type, (self.world_size,), mesh_dim_names=("ep",))
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


TestClipGradNormMixedMeshesWithLocalTensor = create_local_tensor_test_class(TestClipGradNormMixedMeshes)


class TestClipGradNormMixedMeshesGuard(LocalDTensorTestBase):
    """Under ``implicit_replication()`` DTensors of one mesh and plain tensors
    already mix: ``clip_grad_norm_`` returns the total norm as a DTensor of
    that mesh, as for DTensors alone."""

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_clip_grad_norm_dtensor_and_plain_under_implicit_replication(self):
        shapes = [(12, 8), (6,), (8, 4), (3, 3)]
        # foreach=True, as on CUDA by default: without it the CPU loop of
        # in-place ops fails for a plain gradient times a DTensor coefficient.
        foreach = True
        for norm_type in (1.0, 2.0, float("inf")):
            with self._get_local_tensor_mode():
                mesh = init_device_mesh(self.device_type, (self.world_size,))
                torch.manual_seed(0)
                params, ref_params = [], []
                for index, shape in enumerate(shapes):
                    full = torch.randn(shape)
                    ref_param = nn.Parameter(torch.zeros(shape))
                    ref_param.grad = full.clone()
                    ref_params.append(ref_param)
                    if index % 2 == 0:
                        param = nn.Parameter(distribute_tensor(torch.zeros(shape), mesh, [Shard(0)]))
                        param.grad = distribute_tensor(full.clone(), mesh, [Shard(0)])
                    else:
                        param = nn.Parameter(torch.zeros(shape))
                        param.grad = full.clone()
                    params.append(param)
                ref_total_norm = nn.utils.clip_grad_norm_(ref_params, 1.0, norm_type)
                with implicit_replication():
                    total_norm = nn.utils.clip_grad_norm_(params, 1.0, norm_type, foreach=foreach)
                self.assertIsInstance(total_norm, DTensor)
                self.assertEqual(total_norm.device_mesh, mesh)
                total_norm = total_norm.full_tensor()
                grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]
            msg = f"norm_type={norm_type}"
            self.assertEqual(total_norm, ref_total_norm, msg=msg)
            for grad, ref_param in zip(grads, ref_params):
                self.assertEqual(grad, ref_param.grad, msg=msg)


class TestClipGradNormMixedMeshesOrder(LocalDTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_clip_grad_norm_bitwise_as_split_per_mesh(self):
        # Deleting a trainer's own per-mesh split must change no bit: the groups are
        # ordered as trainers order them (plain tensors last), whatever the order of
        # the parameters, e.g. plain tensors first among three groups.
        mesh_a = init_device_mesh(self.device_type, (self.world_size,), mesh_dim_names=("dp",))
        mesh_b = init_device_mesh(self.device_type, (self.world_size,), mesh_dim_names=("ep",))
        kinds = {"plain": None, "a": mesh_a, "b": mesh_b}
        shapes = [(16, 8), (8, 6), (12,), (10, 2)]
        # Gradients of very different sizes, as in a model: the groups' norms then
        # round differently when summed in another order.
        scales = [1.0, 3e-3, 7.0, 1e2]
        for order in sorted(set(itertools.permutations(["plain", "a", "b", "a"]))):
            for norm_type, foreach in ((2.0, None), (3.0, False)):
                with self._get_local_tensor_mode():
                    torch.manual_seed(0)
                    params, ref_params = [], []
                    for kind, shape, scale in zip(order, shapes, scales):
                        full = torch.randn(shape) * scale
                        for out in (params, ref_params):
                            param = nn.Parameter(torch.zeros(shape))
                            param.grad = full.clone()
                            mesh = kinds[kind]
                            if mesh is not None:
                                param = nn.Parameter(distribute_tensor(param.detach(), mesh, [Shard(0)]))
                                param.grad = distribute_tensor(full.clone(), mesh, [Shard(0)])
                            out.append(param)
                    ref_total_norm = _clip_grad_norm_per_mesh_(ref_params, 0.5, norm_type, foreach)
                    total_norm = nn.utils.clip_grad_norm_(params, 0.5, norm_type, foreach=foreach)
                    grads, ref_grads = (
                        [g.full_tensor() if isinstance(g, DTensor) else g for g in (p.grad for p in ps)]
                        for ps in (params, ref_params)
                    )
                # Assert outside LocalTensorMode, which would treat the checks as
                # per-rank code.
                msg = f"order={order}, norm_type={norm_type}, foreach={foreach}"
                self.assertEqual(total_norm, ref_total_norm, atol=0, rtol=0, msg=msg)
                for grad, ref_grad in zip(grads, ref_grads):
                    self.assertEqual(grad, ref_grad, atol=0, rtol=0, msg=msg)


if __name__ == "__main__":
    run_tests()
