# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleavedZeroBubble
from torch.distributed.pipelining._backward import (
    stage_backward,
    stage_backward_input,
    stage_backward_weight,
)
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)


class _Mask:
    """A non-tensor stage input, as FlexAttention's ``BlockMask`` kwarg."""

    def __init__(self, scale: float) -> None:
        self.scale = scale


class _MaskedStage(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: _Mask | None = None) -> torch.Tensor:
        scale = 1.0 if mask is None else mask.scale
        return torch.tanh(self.lin(x)) * scale


class TestPipeliningBackwardNonTensorInputs(TestCase):
    """
    The split backward of a pipeline stage (``stage_backward_input`` then
    ``stage_backward_weight``, what zero-bubble schedules run) with stage
    inputs that are not tensors, or tensors that do not require grad.
    """

    def _check_split_backward(self, input_values: list, x: torch.Tensor) -> None:
        torch.manual_seed(0)
        mod = _MaskedStage(4)
        ref_mod = copy.deepcopy(mod)
        mask = _Mask(0.5)
        out = mod(x, mask)
        dinputs, param_groups = stage_backward_input([out], [torch.ones_like(out)], input_values, mod.parameters())
        stage_backward_weight(mod.parameters(), param_groups)

        ref_x = x.detach().clone().requires_grad_(True)
        ref_out = ref_mod(ref_x, mask)
        ref_out.backward(torch.ones_like(ref_out))
        # One gradient per stage input, at its position, as stage_backward
        # gives them: None for the inputs without a gradient
        self.assertEqual(len(dinputs), len(input_values))
        for inp, dinput in zip(input_values, dinputs):
            if inp is x:
                self.assertEqual(dinput, ref_x.grad)
            else:
                self.assertIsNone(dinput)
        self.assertEqual(x.grad, ref_x.grad)
        for param, ref_param in zip(mod.parameters(), ref_mod.parameters()):
            self.assertEqual(param.grad, ref_param.grad)

    def test_non_tensor_kwarg(self) -> None:
        x = torch.randn(2, 4, requires_grad=True)
        self._check_split_backward([x, _Mask(0.5)], x)

    def test_non_tensor_before_tensor(self) -> None:
        x = torch.randn(2, 4, requires_grad=True)
        self._check_split_backward([3, None, x, _Mask(0.5)], x)

    def test_tensor_without_grad_before_tensor(self) -> None:
        x = torch.randn(2, 4, requires_grad=True)
        self._check_split_backward([torch.arange(2), x], x)

    def test_matches_full_backward(self) -> None:
        # The full backward already gives None for non-tensor inputs
        torch.manual_seed(0)
        mod = _MaskedStage(4)
        x = torch.randn(2, 4, requires_grad=True)
        input_values = [x, _Mask(0.5)]
        out = mod(x, input_values[1])
        full = stage_backward([out], [torch.ones_like(out)], input_values)
        x.grad = None
        out = mod(x, input_values[1])
        split, _ = stage_backward_input([out], [torch.ones_like(out)], input_values, mod.parameters())
        self.assertEqual(len(split), len(full))
        self.assertEqual(split[0], full[0])
        self.assertIsNone(split[1])
        self.assertIsNone(full[1])


class TestPipeliningBackwardNonTensorInputsSchedule(DTensorTestBase):
    """A zero-bubble schedule whose stages take a non-tensor kwarg."""

    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_interleaved_zero_bubble_non_tensor_kwarg(self) -> None:
        torch.manual_seed(0)
        num_stages, n_microbatches = 2 * self.world_size, 4
        stage_mods = [_MaskedStage(8) for _ in range(num_stages)]
        ref_mods = copy.deepcopy(stage_mods)
        stage_indices = [self.rank + i * self.world_size for i in range(2)]
        stages = [PipelineStage(stage_mods[i], i, num_stages, torch.device(self.device_type)) for i in stage_indices]

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return ((out - target) ** 2).sum()

        schedule = ScheduleInterleavedZeroBubble(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
        x = torch.randn(8, 8, device=self.device_type)
        target = torch.randn(8, 8, device=self.device_type)
        mask = _Mask(0.5)
        if self.rank == 0:
            schedule.step(x, target=target, mask=mask)
        else:
            schedule.step(target=target, mask=mask)

        ref_loss = 0
        for x_mb, target_mb in zip(x.chunk(n_microbatches), target.chunk(n_microbatches)):
            h = x_mb
            for mod in ref_mods:
                h = mod(h, mask)
            ref_loss = ref_loss + loss_fn(h, target_mb)
        # The schedule scales the gradients by the number of microbatches
        (ref_loss / n_microbatches).backward()
        for i in stage_indices:
            for param, ref_param in zip(stage_mods[i].parameters(), ref_mods[i].parameters()):
                self.assertEqual(param.grad, ref_param.grad)


if __name__ == "__main__":
    run_tests()
