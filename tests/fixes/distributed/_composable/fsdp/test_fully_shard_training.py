# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import warnings
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

from tests.fixes._torch_gates import skip_before


class _TwoOutputs(nn.Module):
    """``a`` feeds ``b``; both outputs are returned, so a rank may drop ``b``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(self.inp(x))
        return h, self.b(h)


class _TwoBranches(nn.Module):
    """``a`` and ``b`` read the input side by side, ``a`` first; the root's own
    parameter scales ``b``'s output, so its gradients are reduced last, in the
    final callback."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(6, 8)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x) * self.scale


# The text of the warning a rank gets when its backward skips a module whose
# param group does not reduce-scatter unused parameters
_UNUSED_WARNING = r".*set_reduce_scatter_unused_params\(True\)"


def _unused_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "set_reduce_scatter_unused_params(True)" in str(w.message)]


def _loss(outputs: tuple[torch.Tensor, ...], uses: tuple[bool, ...], reference: bool) -> torch.Tensor:
    # The reference adds each output this rank does not use times zero: its
    # gradients are what the unused output must contribute, nothing
    terms = []
    for output, used in zip(outputs, uses):
        if used:
            terms.append((output * output).sum())
        elif reference:
            terms.append(0 * output.sum())
    return torch.stack(terms).sum()


class FullyShardUnusedTestCase(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _mesh(self, timeout: timedelta = timedelta(seconds=30)) -> DeviceMesh:
        # A collective that no other rank issues fails within seconds rather
        # than hanging until the test harness gives up
        group = dist.new_group(timeout=timeout)
        return DeviceMesh.from_group(group, self.device_type)

    def _train(
        self,
        model_cls: Callable[[], nn.Module],
        uses: Callable[[int], tuple[bool, bool]],
        *,
        reduce_scatter_unused_params: bool,
        reshard_after_forward: bool = True,
        steps: int = 2,
    ) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
        """Per step, the full gradients of the sharded model and of a replica
        trained with the all-reduced gradients of the reference loss."""
        torch.manual_seed(0)
        model = model_cls().to(self.device_type)
        ref = copy.deepcopy(model)
        mesh = self._mesh()
        for child in model.children():
            fully_shard(child, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        if reduce_scatter_unused_params:
            model.set_reduce_scatter_unused_params(True)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        ref_optim = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        grads, ref_grads = [], []
        for step in range(steps):
            torch.manual_seed(100 * step + self.rank)
            x = torch.randn(4, 6, device=self.device_type)
            _loss(model(x), uses(self.rank), reference=False).backward()
            _loss(ref(x), uses(self.rank), reference=True).backward()
            for param in ref.parameters():
                dist.all_reduce(param.grad, group=mesh.get_group())
                param.grad.div_(self.world_size)
            grads.append([p.grad.full_tensor() for p in model.parameters()])
            ref_grads.append([p.grad.clone() for p in ref.parameters()])
            for opt in (optim, ref_optim):
                opt.step()
                opt.zero_grad()
        return grads, ref_grads


class TestFsdpUnusedParamsBackwardOrder(FullyShardUnusedTestCase):
    """
    With ``set_reduce_scatter_unused_params(True)``, a module whose outputs get
    no gradient on some ranks takes part in their gradient reduction with zero
    gradients, in the same order as on the ranks that use it: no hang, no
    collective mismatch, and gradients equal to a reference in which those
    ranks add the output times zero to their loss.
    """

    @with_comms
    def test_rank_drops_later_output(self) -> None:
        # Rank 1 runs b's forward but its loss reads only a's output
        for reshard_after_forward in (True, False):
            grads, ref_grads = self._train(
                _TwoOutputs,
                lambda rank: (True, rank == 0),
                reduce_scatter_unused_params=True,
                reshard_after_forward=reshard_after_forward,
            )
            self.assertEqual(grads, ref_grads)

    @with_comms
    def test_rank_drops_branch_output(self) -> None:
        # Rank 1 never reaches a (which ran forward first), then b: neither
        # reads an input that requires gradient, so the ranks that use them
        # reduce their gradients in the final callback, in state order
        for uses in ((False, True), (True, False)):
            grads, ref_grads = self._train(
                _TwoBranches,
                lambda rank, uses=uses: uses if rank == 1 else (True, True),
                reduce_scatter_unused_params=True,
            )
            self.assertEqual(grads, ref_grads)

    @with_comms
    def test_ranks_drop_different_outputs(self) -> None:
        grads, ref_grads = self._train(
            _TwoOutputs,
            lambda rank: (rank == 0, rank == 1),
            reduce_scatter_unused_params=True,
        )
        self.assertEqual(grads, ref_grads)


class TestFsdpUnusedParamsBackwardOrderWarning(FullyShardUnusedTestCase):
    """
    Without ``set_reduce_scatter_unused_params(True)``, a rank whose backward
    does not reach the outputs of a module that ran forward skips that
    module's collectives, which hangs the step if another rank uses it: the
    rank is warned once, with the module's FQN and the option, before its
    next collective.
    """

    def _sharded(self, model_cls: Callable[[], nn.Module], mesh: DeviceMesh) -> nn.Module:
        torch.manual_seed(0)
        model = model_cls().to(self.device_type)
        for child in model.children():
            fully_shard(child, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    @with_comms
    def test_warns_before_the_collective(self) -> None:
        # Rank 1 drops b's output (the shape of the issue). It is warned in
        # a's pre-backward, before its first collective of the backward, which
        # would not match rank 0's. A filter that turns the warning into an
        # error stops it there; rank 0 waits for it until the group's timeout
        model = self._sharded(_TwoOutputs, self._mesh(timedelta(seconds=5)))
        x = torch.randn(4, 6, device=self.device_type)
        loss = _loss(model(x), (True, self.rank == 0), reference=False)
        with warnings.catch_warnings(record=True) as caught, CommDebugMode() as comm:
            warnings.simplefilter("always")
            warnings.filterwarnings("error", message=_UNUSED_WARNING)
            with self.assertRaises(Exception) as raised:
                loss.backward()
        if self.rank == 1:
            self.assertIsInstance(raised.exception, UserWarning)
            self.assertRegex(str(raised.exception), r"^FSDP module 'b' ")
            self.assertEqual(comm.get_total_counts(), 0)
        else:
            self.assertNotIsInstance(raised.exception, Warning)
            self.assertEqual(_unused_warnings(caught), [])

    @with_comms
    def test_warns_once_per_module(self) -> None:
        # Every rank drops the same output, so the ranks' collectives match
        # and the steps complete; the warning comes once, not every step. b
        # is found in a's pre-backward, a (which ran forward first) in the
        # final callback
        mesh = self._mesh()
        for model_cls, uses, fqn in (
            (_TwoOutputs, (True, False), "b"),
            (_TwoBranches, (False, True), "a"),
        ):
            model = self._sharded(model_cls, mesh)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(2):
                    x = torch.randn(4, 6, device=self.device_type)
                    _loss(model(x), uses, reference=False).backward()
            messages = _unused_warnings(caught)
            self.assertEqual(len(messages), 1, messages)
            self.assertRegex(messages[0], f"^FSDP module '{fqn}' ")


class TestFsdpUnusedParamsBackwardOrderGuard(FullyShardUnusedTestCase):
    """When every rank uses every output, nothing is warned about, and
    reducing unused parameters changes nothing: the gradients are bitwise
    those of the default configuration."""

    @with_comms
    def test_no_warning_when_every_output_is_used(self) -> None:
        for model_cls in (_TwoOutputs, _TwoBranches):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                grads, ref_grads = self._train(
                    model_cls,
                    lambda rank: (True, True),
                    reduce_scatter_unused_params=False,
                )
            self.assertEqual(_unused_warnings(caught), [])
            self.assertEqual(grads, ref_grads)

    @skip_before("2.13", "the option is new in 2.13 (the overlay brings it to older torch)")
    @with_comms
    def test_all_ranks_use_every_output(self) -> None:
        for model_cls in (_TwoOutputs, _TwoBranches):
            default, _ = self._train(model_cls, lambda rank: (True, True), reduce_scatter_unused_params=False)
            opted_in, _ = self._train(model_cls, lambda rank: (True, True), reduce_scatter_unused_params=True)
            for step_default, step_opted_in in zip(default, opted_in):
                for grad, other in zip(step_default, step_opted_in):
                    self.assertTrue(torch.equal(grad, other))


if __name__ == "__main__":
    run_tests()
