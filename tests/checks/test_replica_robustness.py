# Owner(s): ["oncall: distributed"]
"""check_replicas when ranks disagree on what they hold, with inf/nan/huge values, on strided tensors."""

from collections import OrderedDict

import torch
import torch.nn as nn
from torch.distributed.tensor import distribute_module, DTensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms

from torch_overlay.checks.replicas import check_replicas, guard_replicas, ReplicaDivergenceError


class ReplicaRobustnessTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _module(self, specs: dict) -> nn.ParameterDict:
        """Parameters ``name -> (local shape, placements[, dtype])`` as this rank holds them."""
        mesh = self.build_device_mesh()
        params = {}
        for name, (shape, placements, *dtype) in specs.items():
            local = torch.arange(torch.Size(shape).numel(), dtype=dtype[0] if dtype else torch.float32)
            params[name] = nn.Parameter(DTensor.from_local(local.view(shape), mesh, placements, run_check=False))
        return nn.ParameterDict(OrderedDict(params))  # a plain dict would be sorted by name

    def _assert_named(self, module: nn.Module, name: str, *texts: str) -> None:
        report = check_replicas(module)
        self.assertEqual(report.diverged, (name,), str(report))
        for text in texts:
            self.assertIn(text, str(report))
        with self.assertRaisesRegex(ReplicaDivergenceError, f"'{name}'"):
            check_replicas(module, raise_on_divergence=True)

    @with_comms
    def test_ranks_holding_different_parameters(self) -> None:
        rep, first = [Replicate()], self.rank == 0
        extra = {"b": ((2,), rep)} if first else {}
        self._assert_named(self._module({"a": ((3, 5), rep), **extra}), "b", "absent on ranks [1]")
        self._assert_named(self._module({"a": ((3, 5) if first else (5, 3), rep)}), "a", "(3, 5)", "(5, 3)")
        # The only parameter on the group, Shard on one rank: that rank still joins the check.
        self._assert_named(self._module({"a": ((4, 4), rep if first else [Shard(0)])}), "a", "Shard(dim=0)")
        self._assert_named(
            self._module({"a": ((4,), rep, torch.float32 if first else torch.bfloat16)}), "a", "torch.bfloat16"
        )
        specs = {"a": ((4,), rep), "b": ((4,), rep)}
        order = self._module(dict(reversed(specs.items())) if first else specs)
        self.assertIn("different orders", str(check_replicas(order)))
        same = self._module(specs)
        self.assertIn("different atol", str(check_replicas(same, atol=0.1 * self.rank)))
        with guard_replicas(self._module({"a": ((3, 5) if first else (5, 3), rep)}), action="raise") as guard:
            with self.assertRaisesRegex(ReplicaDivergenceError, "'a'"):
                sum(p.to_local().sum() for p in guard.module.parameters()).backward()
        # The group is still usable: nothing was left half-gathered.
        self.assertTrue(check_replicas(same).ok)

    @with_comms
    def test_nonfinite_and_huge_values_hide_nothing(self) -> None:
        mesh = self.build_device_mesh()
        model = distribute_module(nn.Linear(8, 8), mesh)
        weight = model.weight.to_local()
        original = weight.detach().clone()
        with torch.no_grad():
            for special in (float("inf"), float("nan"), 1e20):
                weight.copy_(original)
                weight[0, 0] = special
                self.assertTrue(check_replicas(model).ok, special)
                if self.rank == 1:
                    weight[3, 3] += 1000.0
                for atol in (0.0, 1e-3):
                    self.assertEqual(check_replicas(model, atol=atol).diverged, ("weight",), (special, atol))
                if self.rank == 1:
                    weight[3, 3] = original[3, 3] + 1e-4
                self.assertTrue(check_replicas(model, atol=1e-3).ok, special)

            weight.copy_(original)
            weight[0, self.rank] = float("nan")  # NaN at another position on each rank
            self.assertEqual(check_replicas(model).diverged, ("weight",))
            weight.copy_(original)
            weight[0, 0] = float("inf") if self.rank == 0 else float("-inf")
            self.assertEqual(check_replicas(model, atol=1.0).diverged, ("weight",))
            weight.copy_(original)
            # Swapped elements, and a sign flip of zero: caught exactly at atol=0.
            if self.rank == 1:
                weight[[1, 2]] = weight[[2, 1]]
            self.assertEqual(check_replicas(model).diverged, ("weight",))
            weight.copy_(original)
            weight[5, 5] = 0.0 if self.rank == 0 else -0.0
            self.assertEqual(check_replicas(model).diverged, ("weight",))
            self.assertTrue(check_replicas(model, atol=1e-6).ok)

    @with_comms
    def test_strided_replicas(self) -> None:
        mesh = self.build_device_mesh()
        local = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
        # Same values, different memory layouts on the two ranks: replicas agree.
        layout = local.t() if self.rank == 0 else local.t().contiguous()
        module = nn.ParameterDict({"w": nn.Parameter(DTensor.from_local(layout, mesh, [Replicate()]))})
        self.assertTrue(check_replicas(module).ok)
        with torch.no_grad():
            if self.rank == 0:
                module["w"].to_local()[7, 2] += 1.0
        self.assertEqual(check_replicas(module).diverged, ("w",))


if __name__ == "__main__":
    run_tests()
