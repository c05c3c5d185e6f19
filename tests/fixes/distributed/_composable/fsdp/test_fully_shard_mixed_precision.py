# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)

from tests.fixes._torch_gates import skip_before


class _Towers(nn.Module):
    """A text tower that every micro-batch runs and a vision tower that only
    some micro-batches run, feeding one head."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Linear(8, 8)
        self.vision = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, use_vision: bool) -> torch.Tensor:
        h = self.text(x)
        if use_vision:
            h = h + self.vision(x)
        return self.head(h)


class FullyShardGradAccTestCase(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    def _run_grad_acc(
        self,
        model: nn.Module,
        shard_units: tuple[str, ...],
        uses_vision: tuple[bool, ...],
        *,
        reduce_scatter_unused_params: bool = False,
    ) -> None:
        """Accumulates over the micro-batches, reducing on the last one only,
        with bf16 compute and fp32 reduction, and compares each parameter's
        gradient with a bf16 replica whose gradients are accumulated in fp32
        and all-reduced."""
        param_dtype, reduce_dtype = torch.bfloat16, torch.float32
        ref_compute = copy.deepcopy(model).to(param_dtype)
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        mp_policy = MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=reduce_dtype
        )
        for name in shard_units:
            fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        if reduce_scatter_unused_params:
            model.set_reduce_scatter_unused_params(True)

        ref_grads: dict[str, torch.Tensor] = {}
        torch.manual_seed(1 + self.rank)
        for step, use_vision in enumerate(uses_vision):
            is_last_microbatch = step == len(uses_vision) - 1
            model.set_requires_gradient_sync(is_last_microbatch)
            x = torch.randn(4, 8, device=self.device_type)
            model(x, use_vision).sum().backward()
            ref_compute(x.to(param_dtype), use_vision).sum().backward()
            for name, param in ref_compute.named_parameters():
                if param.grad is not None:
                    grad = param.grad.to(reduce_dtype)
                    if name in ref_grads:
                        grad += ref_grads[name]
                    ref_grads[name] = grad
                    param.grad = None
        for grad in ref_grads.values():
            dist.all_reduce(grad)
            grad.div_(self.world_size)

        for name, param in model.named_parameters():
            if name in ref_grads:
                self.assertIsNotNone(param.grad, name)
                self.assertEqual(param.grad.dtype, torch.float32)
                self.assertEqual(param.grad.full_tensor(), ref_grads[name], msg=name)
            elif param.grad is not None:
                # Only a parameter reduced as unused may get a (zero) gradient
                self.assertTrue(reduce_scatter_unused_params, name)
                self.assertEqual(
                    param.grad.full_tensor(),
                    torch.zeros(param.shape, device=self.device_type),
                )


class TestFsdpAccumulatedGradDtype(FullyShardGradAccTestCase):
    """
    Gradient accumulation with ``reduce_dtype`` different from ``param_dtype``:
    parameters of one group that accumulated fp32 gradients in earlier
    micro-batches and parameters whose gradient comes only from the reducing
    micro-batch are reduce-scattered together in ``reduce_dtype``.
    """

    @with_comms
    def test_param_first_used_on_last_microbatch(self) -> None:
        torch.manual_seed(0)
        self._run_grad_acc(
            _Towers().to(self.device_type), (), uses_vision=(False, False, True)
        )

    @skip_before("2.13", "set_reduce_scatter_unused_params is new in 2.13")
    @with_comms
    def test_unused_param_reduced_as_zeros(self) -> None:
        torch.manual_seed(0)
        self._run_grad_acc(
            _Towers().to(self.device_type),
            (),
            uses_vision=(False, False),
            reduce_scatter_unused_params=True,
        )


class TestFsdpAccumulatedGradUnusedUnit(FullyShardGradAccTestCase):
    """
    Gradient accumulation with ``reduce_dtype`` different from ``param_dtype``
    and a module sharded on its own that runs no forward in the step (a vision
    tower under text-only batches): its parameters were never all-gathered,
    they have no gradient, and the other modules' gradients are unaffected.
    """

    @with_comms
    def test_unit_never_run(self) -> None:
        torch.manual_seed(0)
        self._run_grad_acc(
            _Towers().to(self.device_type),
            ("text", "vision", "head"),
            uses_vision=(False, False, False),
        )

    @with_comms
    def test_unit_run_on_last_microbatch_only(self) -> None:
        torch.manual_seed(0)
        self._run_grad_acc(
            _Towers().to(self.device_type),
            ("text", "vision", "head"),
            uses_vision=(False, False, True),
        )


if __name__ == "__main__":
    run_tests()
