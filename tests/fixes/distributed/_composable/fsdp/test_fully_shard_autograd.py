# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import contextlib
import copy
import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._ops import OpOverload
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.profiler import record_function
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.utils.checkpoint import (
    checkpoint,
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
    SelectiveCheckpointContext,
)


def _save_mm_policy(ctx: SelectiveCheckpointContext, op: OpOverload, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_sac_context_fn = functools.partial(create_selective_checkpoint_contexts, _save_mm_policy)


class _ExpertBlock(nn.Module):
    """A block whose ``experts`` get their own FSDP unit; the output is gated
    by an activation, so the backward recomputes the block before it reaches
    the experts' pre-backward hook (as a MoE block's combine step does)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.experts = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.experts(h) * h


class _CheckpointedBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = _ExpertBlock(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False, context_fn=_sac_context_fn)


class TestSacIgnoreRuntimeOps(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _check_grads(self, backward_prefetch_experts: bool) -> None:
        torch.manual_seed(42)
        dim = 8
        model = nn.Sequential(nn.Linear(dim, dim), _CheckpointedBlock(dim), _CheckpointedBlock(dim))
        ref_model = copy.deepcopy(model)
        # On this test's device: fully_shard's default mesh is on the accelerator
        # whenever there is one, also where the test runs on the CPU
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        for layer in model[1:]:
            fully_shard(layer.block.experts, mesh=mesh)
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # Prefetch the next block and its experts in forward, so that the
        # experts' all-gather runs before their checkpointed region there
        model[1].set_modules_to_forward_prefetch([model[2], model[2].block.experts])
        if not backward_prefetch_experts:
            # Replaces the default backward prefetch of the block's experts
            model[2].set_modules_to_backward_prefetch([model[1]])

        torch.manual_seed(self.rank + 1)
        for _ in range(2):
            x = torch.randn(4, dim, device=self.device_type)
            model(x).sum().backward()
            ref_model(x).sum().backward()
            for param in ref_model.parameters():
                dist.all_reduce(param.grad)
                param.grad.div_(self.world_size)
            for (name, param), ref_param in zip(model.named_parameters(), ref_model.parameters()):
                self.assertEqual(param.grad.full_tensor(), ref_param.grad, msg=name)
            model.zero_grad()
            ref_model.zero_grad()

    @with_comms
    def test_experts_prefetched_in_forward(self) -> None:
        # The recomputation all-gathers the experts itself
        self._check_grads(backward_prefetch_experts=False)
        # The experts' all-gather is issued before the recomputation, which
        # only copies out (under fewer profiler ranges than the forward)
        self._check_grads(backward_prefetch_experts=True)


class TestSacIgnoreRuntimeOpsSingleProcess(TestCase):
    def test_record_function_only_in_recompute(self) -> None:
        calls = []

        def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            calls.append(None)
            # Annotate the recomputation only, as runtime hooks may do
            annotate = record_function("recompute") if len(calls) > 1 else contextlib.nullcontext()
            with annotate:
                y = torch.mm(x, w)
            return y.sin().cos()

        x = torch.randn(4, 4, requires_grad=True)
        w = torch.randn(4, 4, requires_grad=True)
        out = checkpoint(fn, x, w, use_reentrant=False, context_fn=_sac_context_fn)
        grads = torch.autograd.grad(out.sum(), (x, w))
        ref_grads = torch.autograd.grad(torch.mm(x, w).sin().cos().sum(), (x, w))
        self.assertEqual(len(calls), 2)
        self.assertEqual(grads, ref_grads)


class TestFsdpJvp(DTensorTestBase):
    """
    ``torch.func.jvp`` with input tangents through a ``fully_shard`` model,
    then a backward of a loss built from the output and the tangent
    (MeanFlow / consistency training).
    """

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_jvp_then_backward(self) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).to(self.device_type)
        ref_model = copy.deepcopy(model)
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)

        torch.manual_seed(1 + self.rank)
        x = torch.randn(3, 8, device=self.device_type)
        v = torch.randn(3, 8, device=self.device_type)
        for _ in range(2):
            out, tangent = torch.func.jvp(model, (x,), (v,))
            ref_out, ref_tangent = torch.func.jvp(ref_model, (x,), (v,))
            self.assertEqual(out, ref_out)
            self.assertEqual(tangent, ref_tangent)
            ((out - tangent.detach()) ** 2).sum().backward()
            ((ref_out - ref_tangent.detach()) ** 2).sum().backward()

        for name, ref_param in ref_model.named_parameters():
            grad = ref_param.grad.contiguous()
            dist.all_reduce(grad)
            grad.div_(self.world_size)
            self.assertEqual(model.get_parameter(name).grad.full_tensor(), grad, msg=name)


if __name__ == "__main__":
    run_tests()
