# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import unittest

import torch
import torch._dynamo.test_case
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    distribute_module,
    distribute_tensor,
    DTensor,
    Replicate,
    Shard,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    parallelize_module,
    RowwiseParallel,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.torch_version import TorchVersion


_TORCH_2_11 = TorchVersion(torch.__version__) < "2.12"


class _TopKMixer(torch.autograd.Function):
    # A router whose backward uses scatter_add_ on plain tensors (like PhiMoE's
    # sparsemixer): it cannot take DTensor inputs, so callers feed it local views.
    @staticmethod
    def forward(ctx, logits: torch.Tensor, top_k: int) -> torch.Tensor:
        top_vals, top_idx = logits.topk(top_k, dim=-1)
        probs = top_vals.softmax(dim=-1)
        ctx.save_for_backward(probs, top_idx)
        return torch.zeros_like(logits).scatter(-1, top_idx, probs)

    @staticmethod
    def backward(ctx, grad_scores: torch.Tensor):
        probs, top_idx = ctx.saved_tensors
        grad_probs = grad_scores.gather(-1, top_idx)
        grad_vals = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
        grad_logits = torch.zeros_like(grad_scores)
        grad_logits.scatter_add_(-1, top_idx, grad_vals)
        return grad_logits, None


class _Router(nn.Module):
    def __init__(self, dim: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, dim) * 0.5)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _TopKMixer.apply(F.linear(x, self.weight), self.top_k)


class _Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)))


class _MoE(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 16, num_experts: int = 4) -> None:
        super().__init__()
        self.gate = _Router(dim, num_experts, top_k=2)
        self.experts = nn.ModuleList(_Expert(dim, hidden) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            out = out + scores[:, i : i + 1] * expert(x)
        return out


def _shadow_weight_with_local_view(module: nn.Module, args: tuple) -> None:
    # torchtitan#3122's pre-hook, refreshing the shadow from the parameter each call.
    module.__dict__["weight"] = module._parameters["weight"].to_local()


class TestCompiledToLocalOfInput(torch._dynamo.test_case.TestCase):
    """One process, fake process group: to_local() of a DTensor graph input."""

    world_size = 2

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=self.world_size
        )
        self.mesh = init_device_mesh("cpu", (self.world_size,))

    def tearDown(self) -> None:
        super().tearDown()
        dist.destroy_process_group()

    def _param(self) -> nn.Parameter:
        torch.manual_seed(0)
        return nn.Parameter(
            distribute_tensor(torch.randn(4, 4), self.mesh, [Replicate()])
        )

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_to_local_of_parameter_keeps_inner_tensor_a_leaf(self, backend: str):
        def fn(w):
            return w.to_local()

        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        w_ref, w = self._param(), self._param()
        x = torch.randn(3, 4)
        for step in range(3):
            ref = fn(w_ref)
            out = compiled(w)
            # A fresh alias of the parameter's local tensor, as in eager.
            self.assertIsNot(out, w._local_tensor)
            self.assertEqual(out.data_ptr(), w._local_tensor.data_ptr())
            self.assertIsNotNone(out.grad_fn)
            self.assertTrue(w._local_tensor.is_leaf)
            self.assertIsNone(w._local_tensor.grad_fn)
            (x @ ref * (step + 1)).sum().backward()
            (x @ out * (step + 1)).sum().backward()
            self.assertEqual(w.grad, w_ref.grad)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_to_local_of_parameter_no_grad(self, backend: str):
        compiled = torch.compile(lambda w: w.to_local(), backend=backend)
        w = self._param()
        with torch.no_grad():
            out = compiled(w)
        self.assertIsNot(out, w._local_tensor)
        self.assertEqual(out, w._local_tensor)
        self.assertTrue(w._local_tensor.is_leaf)

    @parametrize("dynamic", [False, True])
    def test_noop_view_of_to_local_of_parameter(self, dynamic: bool):
        # In the dense graph this output is a plain view of the input (alias_of_input).
        compiled = torch.compile(
            lambda w: w.to_local().view(4, 4),
            backend="inductor",
            dynamic=dynamic,
            fullgraph=True,
        )
        w = self._param()
        out = compiled(w)
        self.assertIsNot(out, w._local_tensor)
        self.assertIs(out._base, w._local_tensor)
        out.sum().backward()
        self.assertTrue(w._local_tensor.is_leaf)
        self.assertEqual(w.grad.to_local(), torch.ones(4, 4))

    @parametrize("dynamic", [False, True])
    def test_to_local_of_parameter_with_mutated_dtensor_input(self, dynamic: bool):
        # The mutated input is a graph output ahead of the user outputs.
        def fn(w, b):
            b.mul_(2)
            return b.to_local().sum(), w.to_local()

        def make_b():
            torch.manual_seed(1)
            local = torch.randn(2, 4)
            return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False)

        compiled = torch.compile(
            fn, backend="inductor", dynamic=dynamic, fullgraph=True
        )
        w_ref, w, b_ref, b = self._param(), self._param(), make_b(), make_b()
        for step in range(2):
            ref, out = fn(w_ref, b_ref), compiled(w, b)
            self.assertEqual(out[0], ref[0])
            self.assertEqual(b.to_local(), b_ref.to_local())
            self.assertIsNot(out[1], w._local_tensor)
            self.assertIs(out[1]._base, w._local_tensor)
            (ref[1] * (step + 1)).sum().backward()
            (out[1] * (step + 1)).sum().backward()
            self.assertTrue(w._local_tensor.is_leaf)
            self.assertEqual(w.grad, w_ref.grad)

    @unittest.skipIf(
        _TORCH_2_11, "torch 2.11's AOTAutograd cache bypasses graphs with to_local()"
    )
    def test_to_local_of_parameter_cache_round_trip(self):
        # A graph whose output is re-aliased is saved to the AOTAutograd cache and
        # loaded from it, and the loaded graph re-aliases it as well.
        def fn(w, x):
            return w.to_local(), (x @ w.to_local()).sum()

        x = torch.randn(3, 4)
        w_ref = self._param()
        local_ref, loss_ref = fn(w_ref, x)
        (local_ref.sum() + loss_ref).backward()
        with (
            fresh_cache(),
            torch._functorch.config.patch(
                enable_autograd_cache=True, strict_autograd_cache=True
            ),
            torch._inductor.config.patch(
                fx_graph_cache=True, fx_graph_remote_cache=False
            ),
        ):
            for counter in ("autograd_cache_saved", "autograd_cache_hit"):
                torch._dynamo.reset()
                counters.clear()
                w = self._param()
                compiled = torch.compile(fn, backend="inductor", fullgraph=True)
                local, loss = compiled(w, x)
                self.assertIsNot(local, w._local_tensor)
                self.assertIs(local._base, w._local_tensor)
                # A training graph is saved once its backward is compiled.
                (local.sum() + loss).backward()
                self.assertEqual(counters["aot_autograd"][counter], 1, msg=counter)
                self.assertTrue(w._local_tensor.is_leaf)
                self.assertEqual(w.grad, w_ref.grad)

    def test_to_local_and_plain_input_outputs(self):
        # A plain input returned as is stays the same object, as in eager; only the
        # subclass input's inner tensor is re-aliased.
        def fn(w, y):
            return y, w.to_local(), y.t()

        compiled = torch.compile(fn, backend="inductor", fullgraph=True)
        w = self._param()
        y = torch.randn(4, 4, requires_grad=True)
        out_y, out_local, out_t = compiled(w, y)
        self.assertIs(out_y, y)
        self.assertIsNot(out_local, w._local_tensor)
        self.assertIs(out_t._base, y)
        (out_y.sum() + out_local.sum() + (out_t * 2).sum()).backward()
        self.assertTrue(w._local_tensor.is_leaf)
        self.assertEqual(w.grad.to_local(), torch.ones(4, 4))
        self.assertEqual(y.grad, torch.full((4, 4), 3.0))

    def test_shadowing_pre_hook(self):
        # torchtitan#3122 in one process: the shadow is a graph output each step.
        torch.manual_seed(0)
        ref = _Router(8, 4, top_k=2)
        distribute_module(ref, self.mesh)
        model = copy.deepcopy(ref)
        for m in (ref, model):
            m.register_forward_pre_hook(_shadow_weight_with_local_view)
        model.compile(backend="inductor")
        for step in range(3):
            x = torch.randn(6, 8)
            (ref(x) * torch.arange(4.0)).sum().backward()
            (model(x) * torch.arange(4.0)).sum().backward()
            weight, weight_ref = model._parameters["weight"], ref._parameters["weight"]
            self.assertEqual(weight.grad, weight_ref.grad)
            self.assertTrue(weight._local_tensor.is_leaf)


class TestCompiledPlainInputAliases(torch._dynamo.test_case.TestCase):
    """Plain-tensor functions returning an input or a view of it: unchanged."""

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_returns_input(self, backend: str):
        compiled = torch.compile(lambda x: x, backend=backend)
        x = torch.randn(4, requires_grad=True)
        self.assertIs(compiled(x), x)
        with torch.no_grad():
            self.assertIs(compiled(x), x)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_returns_input_and_views(self, backend: str):
        def fn(x):
            return x, x.view(2, 2), x[1:], x.detach(), x.view_as(x)

        compiled = torch.compile(fn, backend=backend)
        x = torch.randn(4, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        outs, refs = compiled(x), fn(x_ref)
        self.assertIs(outs[0], x)
        for out, ref in zip(outs[1:], refs[1:]):
            self.assertIsNot(out, x)
            self.assertEqual(out._base is x, ref._base is x_ref)
            self.assertEqual(out.data_ptr(), x.data_ptr() + out.storage_offset() * 4)
            self.assertEqual(out, ref)
            self.assertEqual(out.requires_grad, ref.requires_grad)
        sum(o.sum() * (i + 1) for i, o in enumerate(outs) if o.requires_grad).backward()
        sum(o.sum() * (i + 1) for i, o in enumerate(refs) if o.requires_grad).backward()
        self.assertEqual(x.grad, x_ref.grad)
        self.assertTrue(x.is_leaf)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_custom_function_view_of_input(self, backend: str):
        class ViewAsSelf(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        compiled = torch.compile(ViewAsSelf.apply, backend=backend)
        x = torch.randn(4, requires_grad=True)
        for _ in range(2):
            out = compiled(x)
            self.assertIsNot(out, x)
            self.assertTrue(x.is_leaf)
            out.sum().backward()
        self.assertEqual(x.grad, torch.full((4,), 4.0))


class TestCompiledGateUnderTP(DTensorTestBase):
    """torchtitan#3122: TP MoE block, compiled router gate, param-shadowing pre-hook."""

    @property
    def world_size(self) -> int:
        return 2

    @property
    def device_type(self) -> str:
        return "cpu"

    @property
    def backend(self) -> str:
        return "gloo"

    @with_comms
    def test_compiled_gate_with_shadowing_pre_hook(self):
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        torch.manual_seed(0)
        ref = _MoE()
        model = copy.deepcopy(ref)
        plan = {}
        for i in range(len(ref.experts)):
            plan[f"experts.{i}.w1"] = ColwiseParallel()
            plan[f"experts.{i}.w2"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
        # The gate is replicated on the TP mesh; its autograd code sees local views.
        distribute_module(model.gate, mesh)
        model.gate.register_forward_pre_hook(_shadow_weight_with_local_view)
        model.gate.compile(backend="inductor")

        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            torch.manual_seed(step)  # same tokens on every rank
            x = torch.randn(6, 8)
            ref(x).pow(2).sum().backward()
            model(x).pow(2).sum().backward()
            for name, p in model.named_parameters():
                p_ref = ref.get_parameter(name)
                self.assertEqual(p.grad.full_tensor(), p_ref.grad, msg=name)
            self.assertTrue(model.gate._parameters["weight"]._local_tensor.is_leaf)
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()


instantiate_parametrized_tests(TestCompiledToLocalOfInput)
instantiate_parametrized_tests(TestCompiledPlainInputAliases)

if __name__ == "__main__":
    run_tests()
