# Owner(s): ["oncall: distributed checkpointing"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
    StateDictOptions,
)
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests, TestCase
from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir


class TestDsdInitOptimStateGradDtype(TestCase):
    """Parameters whose ``grad_dtype`` differs from their dtype (fp32 weights
    accumulating bf16 gradients) get their optimizer state primed at that dtype."""

    def _model_and_optim(self, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Linear(4, 4, device=device)
        for param in model.parameters():
            param.grad_dtype = torch.bfloat16
        optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, optim

    def _train_step(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        model(torch.randn(2, 4, device=model.weight.device)).sum().backward()
        optim.step()
        optim.zero_grad()

    def test_state_dict_of_fresh_optimizer(self, device):
        ref_model, ref_optim = self._model_and_optim(device)
        self._train_step(ref_model, ref_optim)
        model, optim = self._model_and_optim(device)
        params = copy.deepcopy(model.state_dict())

        osd = get_optimizer_state_dict(model, optim)

        self.assertEqual(set(osd["state"]), {"weight", "bias"})
        for name, param in model.named_parameters():
            buf = osd["state"][name]["momentum_buffer"]
            # The state a training step creates: bf16 buffers for bf16 grads.
            ref_buf = ref_optim.state[getattr(ref_model, name)]["momentum_buffer"]
            self.assertEqual(buf.dtype, ref_buf.dtype)
            self.assertEqual(buf, torch.zeros_like(param, dtype=torch.bfloat16))
            self.assertIsNone(param.grad)
            self.assertEqual(param.grad_dtype, torch.bfloat16)
        self.assertEqual(model.state_dict(), params)

    @with_temp_dir
    def test_dcp_load_into_fresh_optimizer(self, device):
        model, optim = self._model_and_optim(device)
        self._train_step(model, optim)
        dcp.save(
            {"optim": get_optimizer_state_dict(model, optim)},
            checkpoint_id=self.temp_dir,
        )

        new_model, new_optim = self._model_and_optim(device)
        osd = get_optimizer_state_dict(new_model, new_optim)
        dcp.load({"optim": osd}, checkpoint_id=self.temp_dir)
        # The load target has the dtypes of the saved state: read as saved.
        for name, param in model.named_parameters():
            self.assertEqual(
                osd["state"][name]["momentum_buffer"],
                optim.state[param]["momentum_buffer"],
            )
        set_optimizer_state_dict(new_model, new_optim, osd)

        # Optimizer.load_state_dict casts the state to the parameter's dtype.
        self.assertEqual(new_optim.state_dict(), optim.state_dict(), exact_dtype=False)
        for param in new_model.parameters():
            self.assertIsNone(param.grad)


class _ModelWithUnusedGate(nn.Module):
    """``gate`` is trainable but gets no gradient (a non-differentiable router)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, device=device)
        self.gate = nn.Linear(4, 2, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class TestDsdOptimStateParamsWithoutGrad(TestCase):
    """Trainable parameters that never got a gradient have no optimizer state
    after training; the state dict must still cover them, as it does for a
    fresh optimizer, or a checkpoint cannot be loaded into a fresh one."""

    def _model_and_optim(self, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = _ModelWithUnusedGate(device)
        optim = torch.optim.AdamW(model.parameters(), lr=0.1)
        return model, optim

    def _train(self, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        for _ in range(2):
            model(torch.randn(2, 4, device=model.proj.weight.device)).sum().backward()
            optim.step()
            optim.zero_grad()

    def test_state_dict_covers_params_without_grad(self, device):
        model, optim = self._model_and_optim(device)
        self._train(model, optim)
        trained_state = copy.deepcopy(optim.state_dict()["state"])
        params = copy.deepcopy(model.state_dict())

        osd = get_optimizer_state_dict(model, optim)

        self.assertEqual(
            set(osd["state"]), {"proj.weight", "proj.bias", "gate.weight", "gate.bias"}
        )
        # The state the optimizer built in training is left as it is.
        self.assertEqual(osd["state"]["proj.weight"], trained_state[0])
        self.assertEqual(osd["state"]["proj.bias"], trained_state[1])
        for name in ("gate.weight", "gate.bias"):
            state = osd["state"][name]
            self.assertEqual(set(state), {"step", "exp_avg", "exp_avg_sq"})
            self.assertEqual(state["exp_avg"].count_nonzero(), 0)
            self.assertEqual(state["exp_avg_sq"].count_nonzero(), 0)
        self.assertEqual(model.state_dict(), params)
        for param in model.parameters():
            self.assertIsNone(param.grad)

    @parametrize("flatten", [False, True])
    @with_temp_dir
    def test_dcp_load_into_fresh_optimizer(self, device, flatten):
        options = StateDictOptions(flatten_optimizer_state_dict=flatten)
        model, optim = self._model_and_optim(device)
        self._train(model, optim)
        dcp.save(
            {"optim": get_optimizer_state_dict(model, optim, options=options)},
            checkpoint_id=self.temp_dir,
        )

        new_model, new_optim = self._model_and_optim(device)
        osd = get_optimizer_state_dict(new_model, new_optim, options=options)
        dcp.load({"optim": osd}, checkpoint_id=self.temp_dir)
        set_optimizer_state_dict(new_model, new_optim, osd, options=options)

        self.assertEqual(new_optim.state_dict(), optim.state_dict())


instantiate_device_type_tests(TestDsdInitOptimStateGradDtype, globals())
instantiate_device_type_tests(TestDsdOptimStateParamsWithoutGrad, globals())


if __name__ == "__main__":
    run_tests()
