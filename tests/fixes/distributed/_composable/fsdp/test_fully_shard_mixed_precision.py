# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    parallelize_module,
    ParallelStyle,
    SequenceParallel,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.utils.checkpoint import checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

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
        mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
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
        self._run_grad_acc(_Towers().to(self.device_type), (), uses_vision=(False, False, True))

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


class _GatedNorm(nn.Module):
    """An RMS norm and a gate: elementwise ops, which accept mixed dtypes, and
    save their inputs for backward."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(dim))
        self.gate = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        return h * torch.sigmoid(self.gate)


class _Looped(nn.Module):
    """One block applied twice, with an op between the calls that saves the
    first call's output."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        return self.block(h * h)


class TestFsdpAcRecomputeInputCast(DTensorTestBase):
    """
    Non-reentrant activation checkpointing around modules sharded with a
    ``MixedPrecisionPolicy``: the recomputation in backward casts a module's
    inputs to ``param_dtype``, and its outputs to ``output_dtype``, as the
    forward did.
    """

    @property
    def world_size(self) -> int:
        return 2

    def _check_checkpoint_parity(
        self,
        model: nn.Module,
        mp_policy: MixedPrecisionPolicy,
        shard_units: tuple[str, ...],
    ) -> None:
        """Runs ``checkpoint(model, x)`` with the ``shard_units`` submodules
        ("": the root) sharded with ``mp_policy`` and compares its gradients
        with a replica that casts the same way by hand, without
        checkpointing."""
        ref_model = copy.deepcopy(model)
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        for name in shard_units:
            fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=mp_policy)
        if "" not in shard_units:
            fully_shard(model, mesh=mesh)

        handles = []
        for name in shard_units:
            module = ref_model.get_submodule(name).to(mp_policy.param_dtype)
            handles.append(
                module.register_forward_pre_hook(lambda _, args: tuple(a.to(mp_policy.param_dtype) for a in args))
            )
            if mp_policy.output_dtype is not None:
                handles.append(module.register_forward_hook(lambda _, __, out: out.to(mp_policy.output_dtype)))

        torch.manual_seed(1 + self.rank)
        x = torch.randn(4, 16, device=self.device_type, requires_grad=True)
        ref_x = x.detach().clone().requires_grad_(True)
        out = checkpoint(model, x, use_reentrant=False)
        out.sum().backward()
        ref_out = ref_model(ref_x)
        ref_out.sum().backward()

        self.assertEqual(out.dtype, ref_out.dtype)
        self.assertEqual(x.grad, ref_x.grad)
        for name, ref_param in ref_model.named_parameters():
            ref_grad = ref_param.grad.to(torch.float32)
            dist.all_reduce(ref_grad)
            ref_grad.div_(self.world_size)
            grad = model.get_parameter(name).grad
            self.assertEqual(grad.dtype, torch.float32, msg=name)
            self.assertEqual(grad.full_tensor(), ref_grad, msg=name)
        for handle in handles:
            handle.remove()

    @with_comms
    def test_checkpointed_linear_gets_cast_inputs(self) -> None:
        # Uncast: mat1 and mat2 must have the same dtype, in the recomputation
        torch.manual_seed(0)
        self._check_checkpoint_parity(
            nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)).to(self.device_type),
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            ("",),
        )

    @with_comms
    def test_recomputed_values_keep_their_dtype(self) -> None:
        # Uncast: the recomputation saves fp32 tensors where the forward saved
        # bf16 ones (CheckpointError: Recomputed values ... different metadata)
        torch.manual_seed(0)
        self._check_checkpoint_parity(
            _GatedNorm(16).to(self.device_type),
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            ("",),
        )

    @with_comms
    def test_recomputed_outputs_get_output_dtype(self) -> None:
        # The block's first call is recomputed after its pre-backward: its
        # output, saved by h * h, must be fp32 again
        torch.manual_seed(0)
        self._check_checkpoint_parity(
            _Looped(16).to(self.device_type),
            MixedPrecisionPolicy(
                param_dtype=torch.bfloat16,
                reduce_dtype=torch.float32,
                output_dtype=torch.float32,
            ),
            ("block",),
        )


class _RecordAllReduceDtypes(TorchDispatchMode):
    """Records the input dtype of every all-reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_reduce" in func.name():
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


class TestFsdpGradDtype(DTensorTestBase):
    """
    ``fully_shard`` keeps the ``grad_dtype`` set on a parameter: the sharded
    gradient has that dtype, and without a ``reduce_dtype`` it is also the
    dtype in which gradients are accumulated and reduced.
    """

    @property
    def world_size(self) -> int:
        return 2

    def _check_grad_dtype(
        self,
        param_dtype: torch.dtype,
        grad_dtype: torch.dtype,
        mp_policy: MixedPrecisionPolicy,
        num_microbatches: int,
    ) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        model.to(self.device_type, param_dtype)
        compute_dtype = mp_policy.param_dtype or param_dtype
        ref_model = copy.deepcopy(model).to(compute_dtype)
        for param in model.parameters():
            param.grad_dtype = grad_dtype
        # Autograd accumulates the replica's gradients in the dtype FSDP
        # reduces in: reduce_dtype, else grad_dtype
        for param in ref_model.parameters():
            param.grad_dtype = mp_policy.reduce_dtype or grad_dtype
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)

        torch.manual_seed(1 + self.rank)
        for step in range(num_microbatches):
            model.set_requires_gradient_sync(step == num_microbatches - 1)
            x = torch.randn(4, 8, device=self.device_type)
            model(x.to(param_dtype)).sum().backward()
            ref_model(x.to(compute_dtype)).sum().backward()

        for param, ref_param in zip(model.parameters(), ref_model.parameters()):
            ref_grad = ref_param.grad
            dist.all_reduce(ref_grad)
            ref_grad = (ref_grad / self.world_size).to(grad_dtype)
            self.assertEqual(param.grad.dtype, grad_dtype)
            self.assertEqual(param.grad.full_tensor(), ref_grad)

    @with_comms
    def test_fp32_grad_dtype_bf16_params(self) -> None:
        self._check_grad_dtype(torch.bfloat16, torch.float32, MixedPrecisionPolicy(), num_microbatches=2)

    @with_comms
    def test_bf16_grad_dtype_fp32_params(self) -> None:
        self._check_grad_dtype(
            torch.float32,
            torch.bfloat16,
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            num_microbatches=2,
        )

    @with_comms
    def test_grad_dtype_of_some_params(self) -> None:
        """Parameters of one group with and without a grad_dtype."""
        torch.manual_seed(0)
        model = nn.Linear(8, 8, device=self.device_type, dtype=torch.bfloat16)
        model.weight.grad_dtype = torch.float32
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        fully_shard(model, mesh=mesh)
        x = torch.randn(4, 8, device=self.device_type, dtype=torch.bfloat16)
        model(x).sum().backward()
        self.assertEqual(model.weight.grad.dtype, torch.float32)
        self.assertEqual(model.bias.grad.dtype, torch.bfloat16)


class TestFsdpTpAllreduceReduceDtype(DTensorTestBase):
    """
    FSDP2 x TP with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:
    the gradient of a parameter replicated over TP (a SequenceParallel norm's
    weight) is ``Partial`` over TP, and FSDP's all-reduce of it runs in
    ``reduce_dtype``, like the reduce-scatter and like gradients accumulated
    without reduction.
    """

    @property
    def world_size(self) -> int:
        return 4

    def _init_model(self, with_linear: bool) -> tuple[nn.Module, nn.Module]:
        torch.manual_seed(0)
        mesh = init_device_mesh(self.device_type, (2, self.world_size // 2), mesh_dim_names=("dp", "tp"))
        model = nn.Sequential(nn.LayerNorm(16))
        if with_linear:
            model.append(nn.Linear(16, 16))
        model.to(self.device_type)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_()
        ref_model = copy.deepcopy(model).to(torch.bfloat16)
        plan: dict[str, ParallelStyle] = {"0": SequenceParallel()}
        if with_linear:
            plan["1"] = ColwiseParallel(input_layouts=Shard(1))
        parallelize_module(model, mesh["tp"], plan)
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(model, mesh=mesh["dp"], mp_policy=mp_policy)
        return model, ref_model

    @with_comms
    def test_sequence_parallel_norm(self) -> None:
        model, ref_model = self._init_model(with_linear=False)
        # Each rank holds its own block of a sequence (SequenceParallel's
        # Shard(1)): the norm's gradients are the sum of every rank's block
        # gradients in bf16, added in fp32 and divided by the DP size
        scale = torch.arange(16, device=self.device_type, dtype=torch.float32)
        torch.manual_seed(1 + self.rank)
        all_reduces = _RecordAllReduceDtypes()
        x = torch.randn(2, 4, 16, device=self.device_type) * 3
        with all_reduces:
            (model(x).to_local().float() * scale).sum().backward()
        (ref_model(x.to(torch.bfloat16)).float() * scale).sum().backward()
        # The TP all-reduces of the norm's weight and bias gradients
        self.assertEqual(all_reduces.dtypes, [torch.float32] * 2)
        for param, ref_param in zip(model.parameters(), ref_model.parameters()):
            ref_grad = ref_param.grad.float()
            dist.all_reduce(ref_grad)
            self.assertEqual(param.grad.dtype, torch.float32)
            self.assertEqual(param.grad.full_tensor(), ref_grad / 2)

    @with_comms
    def test_group_with_tp_sharded_params(self) -> None:
        """A group whose TP-sharded parameters' gradients stay in bf16 until
        the reduce-scatter, beside the norm's, reduced over TP in fp32."""
        model, _ = self._init_model(with_linear=True)
        torch.manual_seed(1 + self.rank)
        x = torch.randn(2, 4, 16, device=self.device_type)
        all_reduces = _RecordAllReduceDtypes()
        with all_reduces:
            model(x).float().sum().backward()
        # The TP all-reduces of the norm's weight and bias gradients
        self.assertEqual(all_reduces.dtypes, [torch.float32] * 2)
        for param in model.parameters():
            self.assertEqual(param.grad.dtype, torch.float32)


class TestFsdpMpDtypesAfterUnfreeze(DTensorTestBase):
    """
    Mixed precision after a first forward with every parameter frozen
    (``requires_grad_(False)``; lazy init then sees no trainable parameter):
    once unfrozen, gradients are reduced in ``reduce_dtype`` and cast to the
    parameters' dtype.
    """

    @property
    def world_size(self) -> int:
        return 2

    def _check_unfreeze(self, reduce_dtype: torch.dtype | None, nested: bool) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        model.to(self.device_type)
        ref_model = copy.deepcopy(model).to(torch.bfloat16)
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        if nested:
            fully_shard(model[0], mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)

        torch.manual_seed(1 + self.rank)
        model.requires_grad_(False)
        model(torch.randn(4, 8, device=self.device_type))
        model.requires_grad_(True)
        x = torch.randn(4, 8, device=self.device_type)
        model(x).sum().backward()
        ref_model(x.to(torch.bfloat16)).sum().backward()

        for param, ref_param in zip(model.parameters(), ref_model.parameters()):
            ref_grad = ref_param.grad.to(reduce_dtype or torch.bfloat16)
            dist.all_reduce(ref_grad)
            self.assertEqual(param.grad.dtype, torch.float32)
            self.assertEqual(param.grad.full_tensor(), (ref_grad / self.world_size).float())

    @with_comms
    def test_unfreeze_after_frozen_forward(self) -> None:
        self._check_unfreeze(torch.float32, nested=False)

    @with_comms
    def test_unfreeze_after_frozen_forward_nested(self) -> None:
        self._check_unfreeze(torch.float32, nested=True)


if __name__ == "__main__":
    run_tests()
