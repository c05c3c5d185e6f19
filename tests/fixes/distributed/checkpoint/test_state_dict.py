# Owner(s): ["oncall: distributed checkpointing"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import re

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    StateDictOptions,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_utils import parametrize, run_tests, TestCase
from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir


# The implementations of Adam and AdamW, by their constructor arguments.
_ADAM_IMPLS = {
    "for_loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def _adam_model_and_optim(
    device: str, optim_name: str, impl: str, grad_dtype: torch.dtype | None
) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 4, device=device)
    for param in model.parameters():
        param.grad_dtype = grad_dtype
    optim_cls = getattr(torch.optim, optim_name)
    optim = optim_cls(model.parameters(), lr=0.1, **_ADAM_IMPLS[impl])
    return model, optim


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

    @parametrize("optim_name", ["Adam", "AdamW"])
    @parametrize("impl", list(_ADAM_IMPLS))
    def test_adam_raises_as_its_training_step_raises(self, device, optim_name, impl):
        # Adam and AdamW cannot step on a gradient whose dtype differs from the
        # parameter's: the state dict of a fresh optimizer fails in its step(), with
        # the error a training step on the same model gives, and not in DSD.
        model, optim = _adam_model_and_optim(device, optim_name, impl, torch.bfloat16)
        model(torch.randn(2, 4, device=device)).sum().backward()
        with self.assertRaises(RuntimeError) as training_error:
            optim.step()

        model, optim = _adam_model_and_optim(device, optim_name, impl, torch.bfloat16)
        with self.assertRaisesRegex(RuntimeError, re.escape(str(training_error.exception))):
            get_optimizer_state_dict(model, optim)


class TestDsdInitOptimStateGradDtypeGuard(TestCase):
    """Adam and AdamW on parameters whose ``grad_dtype`` is set and equal to their
    dtype, or ``None`` (any dtype): a checkpoint taken in training resumes it bit for
    bit through DCP and set_optimizer_state_dict."""

    def _train_step(self, model: nn.Module, optim: torch.optim.Optimizer, seed: int) -> None:
        torch.manual_seed(seed)
        model(torch.randn(2, 4, device=model.weight.device)).sum().backward()
        optim.step()
        optim.zero_grad()

    @parametrize("optim_name", ["Adam", "AdamW"])
    @parametrize("impl", list(_ADAM_IMPLS))
    @parametrize("grad_dtype", [torch.float32, None])
    @with_temp_dir
    def test_adam_resumes_from_dcp_checkpoint(self, device, optim_name, impl, grad_dtype):
        model, optim = _adam_model_and_optim(device, optim_name, impl, grad_dtype)
        for seed in range(2):
            self._train_step(model, optim, seed)
        dcp.save(
            {
                "model": get_model_state_dict(model),
                "optim": get_optimizer_state_dict(model, optim),
            },
            checkpoint_id=self.temp_dir,
        )

        new_model, new_optim = _adam_model_and_optim(device, optim_name, impl, grad_dtype)
        state_dict = {
            "model": get_model_state_dict(new_model),
            "optim": get_optimizer_state_dict(new_model, new_optim),
        }
        dcp.load(state_dict, checkpoint_id=self.temp_dir)
        set_model_state_dict(new_model, state_dict["model"])
        set_optimizer_state_dict(new_model, new_optim, state_dict["optim"])
        self._train_step(model, optim, 2)
        self._train_step(new_model, new_optim, 2)

        self.assertEqual(new_model.state_dict(), model.state_dict(), atol=0, rtol=0)
        self.assertEqual(new_optim.state_dict(), optim.state_dict(), atol=0, rtol=0)
        for param in new_model.parameters():
            self.assertEqual(param.grad_dtype, grad_dtype)


class _ModelWithUnusedGate(nn.Module):
    """``gate`` is trainable but gets no gradient (a non-differentiable router)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, device=device)
        self.gate = nn.Linear(4, 2, device=device)

    def forward(self, x: torch.Tensor, use_gate: bool = False) -> torch.Tensor:
        out = self.proj(x)
        if use_gate:
            # A batch that takes the branch: from here on ``gate`` gets gradients.
            out = out + self.gate(x).sum(dim=-1, keepdim=True)
        return out


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

        self.assertEqual(set(osd["state"]), {"proj.weight", "proj.bias", "gate.weight", "gate.bias"})
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
        saved_osd = get_optimizer_state_dict(model, optim, options=options)
        dcp.save({"optim": saved_osd}, checkpoint_id=self.temp_dir)

        new_model, new_optim = self._model_and_optim(device)
        osd = get_optimizer_state_dict(new_model, new_optim, options=options)
        dcp.load({"optim": osd}, checkpoint_id=self.temp_dir)
        set_optimizer_state_dict(new_model, new_optim, osd, options=options)

        self.assertEqual(get_optimizer_state_dict(new_model, new_optim, options=options), saved_osd)

    @parametrize("flatten", [False, True])
    def test_set_state_dict_into_fresh_optimizer(self, device, flatten):
        # The state dict of a trained optimizer, kept in memory or saved with
        # torch.save, loads into a fresh optimizer in strict mode.
        options = StateDictOptions(flatten_optimizer_state_dict=flatten)
        model, optim = self._model_and_optim(device)
        self._train(model, optim)
        osd = copy.deepcopy(get_optimizer_state_dict(model, optim, options=options))

        new_model, new_optim = self._model_and_optim(device)
        set_optimizer_state_dict(new_model, new_optim, copy.deepcopy(osd), options=options)

        self.assertEqual(get_optimizer_state_dict(new_model, new_optim, options=options), osd)
        for param in new_model.parameters():
            self.assertIsNone(param.grad)


# Optimizers to take a state dict from in the middle of training, by their
# constructors: Adam in each implementation, and two whose state primed by a
# zero-gradient step differs from a new one in more than ``step`` (SGD's
# dampened momentum buffer, NAdam's ``mu_product``).
_OPTIMIZERS = {
    "Adam": lambda params: torch.optim.Adam(params, lr=0.1),
    "AdamW_for_loop": lambda params: torch.optim.AdamW(params, lr=0.1, foreach=False),
    "AdamW_foreach": lambda params: torch.optim.AdamW(params, lr=0.1, foreach=True),
    "AdamW_fused": lambda params: torch.optim.AdamW(params, lr=0.1, fused=True),
    "SGD_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.5),
    "NAdam": lambda params: torch.optim.NAdam(params, lr=0.1),
}


class TestDsdOptimStateParamsWithoutGradGuard(TestCase):
    """A frozen parameter never trained has no optimizer state, and needs none:
    it gets none when the state is initialized, and a checkpoint without it loads
    in strict mode. Taking a state dict while a trainable parameter has no state
    yet (a checkpoint saved before a branch is first taken) leaves the training
    as it is: the parameter's first update is the one of a run that saved no
    checkpoint, and the step hooks see the training steps only."""

    def _model_and_optim(self, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = _ModelWithUnusedGate(device)
        model.gate.requires_grad_(False)
        optim = torch.optim.AdamW(model.parameters(), lr=0.1)
        return model, optim

    @parametrize("flatten", [False, True])
    @with_temp_dir
    def test_frozen_param_without_state(self, device, flatten):
        options = StateDictOptions(flatten_optimizer_state_dict=flatten)
        model, optim = self._model_and_optim(device)
        for _ in range(2):
            model(torch.randn(2, 4, device=device)).sum().backward()
            optim.step()
            optim.zero_grad()
        osd = get_optimizer_state_dict(model, optim, options=options)
        self.assertEqual(len(optim.state), 2)
        dcp.save({"optim": osd}, checkpoint_id=self.temp_dir)

        for from_dcp in (True, False):
            new_model, new_optim = self._model_and_optim(device)
            new_osd = get_optimizer_state_dict(new_model, new_optim, options=options)
            self.assertEqual(len(new_optim.state), 2)
            if from_dcp:
                dcp.load({"optim": new_osd}, checkpoint_id=self.temp_dir)
            else:
                new_osd = copy.deepcopy(osd)
            set_optimizer_state_dict(new_model, new_optim, new_osd, options=options)

            self.assertEqual(new_optim.state_dict(), optim.state_dict())
            for param in new_model.gate.parameters():
                self.assertNotIn(param, new_optim.state)

    def _run(self, device: str, optim_name: str, save_at: int | None) -> tuple[dict, dict, list[str]]:
        torch.manual_seed(0)
        model = _ModelWithUnusedGate(device)
        optim = _OPTIMIZERS[optim_name](model.parameters())
        # Step hooks, as an EMA or a step counter uses them: the optimizer's
        # own and the global ones, before and after the step.
        hook_calls: list[str] = []
        handles = [
            optim.register_step_pre_hook(lambda *_: hook_calls.append("pre")),
            optim.register_step_post_hook(lambda *_: hook_calls.append("post")),
            register_optimizer_step_pre_hook(lambda *_: hook_calls.append("global pre")),
            register_optimizer_step_post_hook(lambda *_: hook_calls.append("global post")),
        ]
        try:
            for step in range(5):
                if step == save_at:
                    get_optimizer_state_dict(model, optim)
                    for param in model.gate.parameters():
                        self.assertNotIn(param, optim.state)
                x = torch.randn(2, 4, device=device)
                model(x, use_gate=step >= 3).sum().backward()
                optim.step()
                optim.zero_grad()
        finally:
            for handle in handles:
                handle.remove()
        return copy.deepcopy(model.state_dict()), copy.deepcopy(optim.state_dict()), hook_calls

    @parametrize("optim_name", list(_OPTIMIZERS))
    def test_state_dict_before_first_grad(self, device, optim_name):
        params, osd, hook_calls = self._run(device, optim_name, save_at=None)
        saved_params, saved_osd, saved_hook_calls = self._run(device, optim_name, save_at=2)
        self.assertEqual(saved_params, params, atol=0, rtol=0)
        self.assertEqual(saved_osd, osd, atol=0, rtol=0)
        self.assertEqual(len(hook_calls), 4 * 5)
        self.assertEqual(saved_hook_calls, hook_calls)


instantiate_device_type_tests(TestDsdInitOptimStateGradDtype, globals())
instantiate_device_type_tests(TestDsdInitOptimStateGradDtypeGuard, globals())
instantiate_device_type_tests(TestDsdOptimStateParamsWithoutGrad, globals())
instantiate_device_type_tests(TestDsdOptimStateParamsWithoutGradGuard, globals())


if __name__ == "__main__":
    run_tests()
