import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch._dynamo.test_case
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_module, DTensor, Partial, Replicate
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

from torch_overlay.recipes import use_local_param_views


class _TopKMixer(torch.autograd.Function):
    # Custom autograd code written for plain tensors (scatter_add_ in the backward).
    @staticmethod
    def forward(ctx, logits: torch.Tensor, top_k: int) -> torch.Tensor:
        if isinstance(logits, DTensor):
            raise TypeError("plain tensors only")
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
    def __init__(self, dim: int = 8, num_experts: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, dim) * 0.5)
        self.bias = nn.Parameter(torch.zeros(num_experts))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.norm(x), self.weight, self.bias)
        return _TopKMixer.apply(logits, 2)


def _loss(scores: torch.Tensor) -> torch.Tensor:
    return (scores * torch.arange(1.0, scores.shape[-1] + 1)).pow(2).sum()


def _maybe_compile(module: nn.Module, backend: str) -> None:
    if backend != "eager":
        module.compile(backend=backend)


class TestUseLocalParamViews(torch._dynamo.test_case.TestCase):
    """One process, fake process group: the wrapper's contract."""

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        self.mesh = init_device_mesh("cpu", (2,))

    def tearDown(self) -> None:
        super().tearDown()
        dist.destroy_process_group()

    def _router(self) -> tuple[_Router, _Router]:
        torch.manual_seed(0)
        ref = _Router()
        model = copy.deepcopy(ref)
        distribute_module(model, self.mesh)
        return ref, model

    def _assert_no_shadows(self, model: nn.Module) -> None:
        for module in model.modules():
            for name, p in module._parameters.items():
                self.assertNotIn(name, module.__dict__)
                self.assertIsInstance(getattr(module, name), DTensor)
                self.assertTrue(p._local_tensor.is_leaf)

    def test_forward_sees_plain_views_only_during_the_call(self):
        _, model = self._router()
        seen = []

        def record(module, args):
            # Runs inside the router's forward: the views are in place.
            seen.append((type(model.weight), type(model.norm.weight)))

        model.norm.register_forward_pre_hook(record)
        use_local_param_views(model)
        model(torch.randn(3, 8))
        self.assertEqual(seen, [(torch.Tensor, torch.Tensor)])
        self._assert_no_shadows(model)
        names = ["weight", "bias", "norm.weight", "norm.bias"]
        self.assertEqual([name for name, _ in model.named_parameters()], names)
        self.assertEqual(list(model.state_dict()), names)

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_matches_plain_module(self, backend: str):
        ref, model = self._router()
        use_local_param_views(model)
        _maybe_compile(model, backend)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(6, 8)
            _loss(ref(x)).backward()
            out = model(x)
            self.assertNotIsInstance(out, DTensor)
            _loss(out).backward()
            for name, p in model.named_parameters():
                self.assertIsInstance(p.grad, DTensor)
                self.assertEqual(p.grad.placements, (Replicate(),))
                self.assertEqual(p.grad.to_local(), ref.get_parameter(name).grad)
            self._assert_no_shadows(model)
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()

    @parametrize("backend", ["eager", "aot_eager"])
    def test_grad_placements(self, backend: str):
        _, model = self._router()
        use_local_param_views(model, grad_placements={"weight": [Partial()]})
        _maybe_compile(model, backend)
        _loss(model(torch.randn(6, 8))).backward()
        self.assertEqual(model.weight.grad.placements, (Partial(),))
        self.assertEqual(model.bias.grad.placements, (Replicate(),))
        self.assertEqual(model.norm.weight.grad.placements, (Replicate(),))

    def test_shadows_removed_when_forward_raises(self):
        _, model = self._router()
        use_local_param_views(model)
        with self.assertRaises(RuntimeError):
            model(torch.randn(3, 5))  # wrong feature size
        self._assert_no_shadows(model)

    def test_remove_and_deepcopy(self):
        _, model = self._router()
        handle = use_local_param_views(model)
        with self.assertRaisesRegex(RuntimeError, "already active"):
            use_local_param_views(model)
        clone = copy.deepcopy(model)
        clone(torch.randn(3, 8))
        self._assert_no_shadows(clone)
        self._assert_no_shadows(model)
        handle.remove()
        self.assertNotIn("forward", model.__dict__)
        with self.assertRaisesRegex(RuntimeError, "mixed torch.Tensor and DTensor"):
            model(torch.randn(3, 8))
        clone(torch.randn(3, 8))  # the copy keeps its own wrapper
        self._assert_no_shadows(clone)

    def test_rejects_bad_grad_placements(self):
        _, model = self._router()
        with self.assertRaisesRegex(ValueError, "no DTensor parameter"):
            use_local_param_views(model, grad_placements={"nope": [Partial()]})
        with self.assertRaisesRegex(ValueError, "must be 1 Placement"):
            use_local_param_views(model, grad_placements=[Partial(), Partial()])
        with self.assertRaisesRegex(ValueError, "has no DTensor parameters"):
            use_local_param_views(_Router())
        self.assertNotIn("forward", model.__dict__)


class TestUseLocalParamViewsSplitTokens(DTensorTestBase):
    """Two ranks on gloo, each seeing half the tokens: the gradient must be Partial."""

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
    @parametrize("backend", ["eager", "inductor"])
    def test_partial_grad_for_rank_local_tokens(self, backend: str):
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        torch.manual_seed(0)
        ref = _Router()
        model = copy.deepcopy(ref)
        distribute_module(model, mesh)
        use_local_param_views(model, grad_placements=[Partial()])
        _maybe_compile(model, backend)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            torch.manual_seed(step)  # same global batch on every rank
            x = torch.randn(2 * self.world_size, 8)
            _loss(ref(x)).backward()
            _loss(model(x.chunk(self.world_size)[self.rank])).backward()
            for name, p in model.named_parameters():
                self.assertEqual(p.grad.placements, (Partial(),))
                self.assertEqual(p.grad.full_tensor(), ref.get_parameter(name).grad)
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()
        for name, p in model.named_parameters():
            self.assertEqual(p.full_tensor(), ref.get_parameter(name), msg=name)


instantiate_parametrized_tests(TestUseLocalParamViews)
instantiate_parametrized_tests(TestUseLocalParamViewsSplitTokens)

if __name__ == "__main__":
    run_tests()
