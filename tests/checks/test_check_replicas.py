# Owner(s): ["oncall: distributed"]
"""check_replicas / guard_replicas on a toy TP MoE block (torchtitan#2387)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import (
    distribute_module,
    distribute_tensor,
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

from torch_overlay.checks.replicas import (
    check_replicas,
    guard_replicas,
    ReplicaDivergenceError,
    ReplicaDivergenceWarning,
)


# Router grad placements passed to to_local() at the MoE boundary.
WRONG = "wrong"  # to_local(): the grad is taken as Replicate (the bug)
RIGHT = "right"  # to_local(grad_placements=(Partial(), ...)): the fix
WRONG_ON_TP = "wrong_on_tp"  # Partial on dp, Replicate on tp: diverges on tp only


class ToyTPMoE(nn.Module):
    """Soft-routed MoE block with tokens split across all ranks.

    The last mesh dim is TP (experts sharded on their hidden dim, tokens
    all-gathered for them and reduce-scattered back); leading dims are DP. The
    router gate is replicated everywhere and applied to the local tokens, like
    torchtitan's ``NoParallel`` router.
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        router: str,
        dim: int = 8,
        num_experts: int = 4,
        hidden: int = 16,
        num_extra: int = 0,
    ) -> None:
        super().__init__()
        self.mesh = mesh
        self.router = router
        dp = [Replicate()] * (mesh.ndim - 1)
        torch.manual_seed(0)
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.gate.weight = nn.Parameter(distribute_tensor(self.gate.weight.detach(), mesh, [Replicate()] * mesh.ndim))
        self.w1 = nn.Parameter(distribute_tensor(torch.randn(num_experts, dim, hidden) * 0.3, mesh, dp + [Shard(2)]))
        self.w2 = nn.Parameter(distribute_tensor(torch.randn(num_experts, hidden, dim) * 0.3, mesh, dp + [Shard(1)]))
        # Unused replicated parameters, to count collectives against model size.
        self.extra = nn.ParameterList(
            nn.Parameter(distribute_tensor(torch.randn(3, 5), mesh, [Replicate()] * mesh.ndim))
            for _ in range(num_extra)
        )

    def _router_grad_placements(self) -> list[Placement] | None:
        dp = [Partial()] * (self.mesh.ndim - 1)
        if self.router == RIGHT:
            return dp + [Partial()]
        if self.router == WRONG_ON_TP:
            return dp + [Replicate()]
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mesh = self.mesh
        dp_sum = [Partial()] * (mesh.ndim - 1)
        dp_shard = [Shard(0)] * (mesh.ndim - 1)
        # Each rank's tokens differ, yet they enter the router as Replicate:
        # the true gate grad is the sum over ranks, i.e. Partial.
        routed = DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, run_check=False)
        scores = F.linear(routed, self.gate.weight).to_local(grad_placements=self._router_grad_placements())
        probs = scores.softmax(-1)

        tokens = DTensor.from_local(x, mesh, dp_shard + [Shard(0)])
        tokens = tokens.redistribute(mesh, dp_shard + [Replicate()])
        tokens = tokens.to_local(grad_placements=dp_shard + [Partial()])
        w1 = self.w1.to_local(grad_placements=dp_sum + [Shard(2)])
        w2 = self.w2.to_local(grad_placements=dp_sum + [Shard(1)])
        hidden = torch.einsum("td,edh->teh", tokens, w1).relu()
        out = torch.einsum("teh,ehd->ted", hidden, w2)
        out = DTensor.from_local(out, mesh, dp_shard + [Partial()])
        out = out.redistribute(mesh, dp_shard + [Shard(0)]).to_local()
        return (probs.unsqueeze(-1) * out).sum(1)


class CheckReplicasTestMixin:
    def _tokens(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(100 + self.rank)
        return torch.randn(4, 8, generator=generator)

    def _backward(self, model: nn.Module) -> None:
        model(self._tokens()).pow(2).sum().backward()

    def _step(self, model: nn.Module) -> None:
        self._backward(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def _assert_wrong_router_named(self, mesh: DeviceMesh) -> None:
        model = ToyTPMoE(mesh, WRONG)
        self.assertTrue(check_replicas(model).ok)

        self._backward(model)
        report = check_replicas(model, params=False)
        self.assertEqual(report.diverged, ("gate.weight",))
        (mismatch,) = report.mismatches
        self.assertEqual((mismatch.kind, mismatch.mesh_dim), ("grad", 0))
        # Every rank saw different tokens: no two grads agree.
        self.assertEqual(mismatch.rank_groups, tuple((r,) for r in range(self.world_size)))
        self.assertEqual(mismatch.disagreeing_ranks, tuple(range(1, self.world_size)))
        with self.assertRaisesRegex(ReplicaDivergenceError, "'gate.weight'"):
            check_replicas(model, raise_on_divergence=True)

        torch.optim.SGD(model.parameters(), lr=0.5).step()
        report = check_replicas(model, grads=False)
        self.assertEqual([(m.name, m.kind) for m in report.mismatches], [("gate.weight", "param")])

    def _assert_right_router_passes(self, mesh: DeviceMesh) -> None:
        model = ToyTPMoE(mesh, RIGHT)
        self._backward(model)
        # The gate grad is Partial (pending reduction): only its param is compared.
        self.assertEqual(model.gate.weight.grad.placements, (Partial(),) * mesh.ndim)
        report = check_replicas(model)
        self.assertTrue(report.ok, str(report))
        # gate on every mesh dim, w1 and w2 on the dp dims
        num_replicated = mesh.ndim + 2 * (mesh.ndim - 1)
        self.assertEqual(report.num_checked, num_replicated)

        for _ in range(2):
            self._step(model)
        report = check_replicas(model, raise_on_divergence=True)
        self.assertEqual(report.num_checked, num_replicated)


class CheckReplicasTest(CheckReplicasTestMixin, DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_wrong_router_grad_is_named(self) -> None:
        self._assert_wrong_router_named(self.build_device_mesh())

    @with_comms
    def test_right_router_grad_passes(self) -> None:
        self._assert_right_router_passes(self.build_device_mesh())

    @with_comms
    def test_checksum_sensitivity(self) -> None:
        mesh = self.build_device_mesh()
        model = distribute_module(nn.Sequential(*(nn.Linear(6, 6) for _ in range(10))), mesh)
        with CommDebugMode() as comm_mode:
            report = check_replicas(model)
        self.assertTrue(report.ok)
        self.assertEqual(report.num_checked, 20)
        # One header and one all-gather of checksums per mesh dim, one for check_ranks.
        self.assertEqual((report.num_collectives, comm_mode.get_total_counts()), (3, 3))

        weight = model[3].weight.to_local()
        original = weight.clone()
        with torch.no_grad():
            # Same sum and sum of absolute values, elements moved.
            if self.rank == 1:
                weight.copy_(weight.flip(0))
            self.assertEqual(check_replicas(model).diverged, ("3.weight",))

            weight.copy_(original)
            if self.rank == 1:
                weight[2, 3] += 1e-6
            self.assertEqual(check_replicas(model).diverged, ("3.weight",))
            self.assertTrue(check_replicas(model, atol=1e-5).ok)
            self.assertTrue(check_replicas(model, params=False).ok)
            weight.copy_(original)

        model[5].bias.grad = DTensor.from_local(torch.ones(6), mesh, [Replicate()])
        if self.rank == 1:
            model[5].bias.grad = None
        (mismatch,) = check_replicas(model).mismatches
        self.assertEqual((mismatch.name, mismatch.kind), ("5.bias", "grad"))
        self.assertIn("grad is None on ranks [1]", str(mismatch))
        self.assertTrue(check_replicas(model, grads=False).ok)

    @with_comms
    def test_guard_replicas(self) -> None:
        mesh = self.build_device_mesh()
        model = ToyTPMoE(mesh, WRONG)
        guard = guard_replicas(model, every=2, action="raise")
        self._backward(model)
        self.assertEqual((guard.num_backwards, guard.last_report), (1, None))
        with self.assertRaisesRegex(ReplicaDivergenceError, "gate.weight"):
            self._backward(model)
        guard.remove()
        self._backward(model)
        self.assertEqual(guard.num_backwards, 2)

        with guard_replicas(model, params=False) as guard:
            with self.assertWarnsRegex(ReplicaDivergenceWarning, "grad 'gate.weight'"):
                self._backward(model)
        self.assertEqual(guard.last_report.diverged, ("gate.weight",))

        model = ToyTPMoE(mesh, RIGHT)
        with guard_replicas(model, action="raise") as guard:
            for _ in range(2):
                self._step(model)
        self.assertEqual(guard.num_backwards, 2)
        self.assertTrue(guard.last_report.ok)


class CheckReplicasWorld4Test(CheckReplicasTestMixin, DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_tp_moe(self) -> None:
        mesh = self.build_device_mesh()
        self._assert_wrong_router_named(mesh)
        self._assert_right_router_passes(mesh)

    @with_comms
    def test_dp_tp_mesh(self) -> None:
        mesh = init_device_mesh(self.device_type, (2, 2), mesh_dim_names=("dp", "tp"))
        self._assert_right_router_passes(mesh)

        model = ToyTPMoE(mesh, WRONG_ON_TP, num_extra=30)
        self._backward(model)
        with CommDebugMode() as comm_mode:
            report = check_replicas(model)
        # Two all-gathers per mesh dim, whatever the number of parameters, and one for check_ranks.
        self.assertEqual((report.num_collectives, comm_mode.get_total_counts()), (5, 5))
        (mismatch,) = report.mismatches
        self.assertEqual((mismatch.name, mismatch.kind), ("gate.weight", "grad"))
        self.assertEqual((mismatch.mesh_dim, mismatch.mesh_dim_name), (1, "tp"))
        tp_peers = tuple((r,) for r in mesh["tp"].mesh.tolist())
        self.assertEqual(mismatch.rank_groups, tp_peers)

        torch.optim.SGD(model.parameters(), lr=0.5).step()
        report = check_replicas(model, grads=False)
        self.assertEqual([(m.name, m.mesh_dim_name) for m in report.mismatches], [("gate.weight", "tp")])

        # FSDP2 over dp: the guard sees the sharded grads after the reduce-scatter.
        model = fully_shard(ToyTPMoE(mesh["tp"], WRONG), mesh=mesh["dp"])
        self.assertEqual(model.gate.weight.placements, (Shard(0), Replicate()))
        with guard_replicas(model, action="raise"):
            with self.assertRaisesRegex(ReplicaDivergenceError, r"mesh dim 1 \('tp'\)"):
                self._backward(model)
        model = fully_shard(ToyTPMoE(mesh["tp"], RIGHT), mesh=mesh["dp"])
        with guard_replicas(model, action="raise") as guard:
            self._step(model)
        self.assertEqual(guard.last_report.num_checked, 2)


if __name__ == "__main__":
    run_tests()
