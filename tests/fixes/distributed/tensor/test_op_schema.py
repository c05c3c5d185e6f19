# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import copy
import gc
import weakref
from collections import Counter
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Replicate,
    Shard,
)
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpStrategy,
    RuntimeSchemaInfo,
    TupleStrategy,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


WORLD_SIZE = 2

_SCHEMA_INFOS = {
    "none": None,
    "static_argnum": RuntimeSchemaInfo(static_argnum=1),
    "needs_pytree": RuntimeSchemaInfo(needs_pytree=True),
    "static_kwargkey": RuntimeSchemaInfo(static_argnum=1, static_kwargkey=["k"]),
}


def _spec() -> DTensorSpec:
    return DTensorSpec(mesh=None, placements=(Shard(0),), tensor_meta=None)


def _live(*types: type) -> list[object]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) in types]


def _born_since(before: list[object], *types: type) -> dict[str, int]:
    """Objects of ``types`` alive now that were not alive in ``before``.

    Counting only these keeps the check to what the steps themselves left behind:
    objects of earlier tests in the same process may be freed meanwhile. ``before``
    holds its objects, so no new object can reuse one of their ids.
    """
    seen = {id(o) for o in before}
    counts = Counter(type(o) for o in _live(*types) if id(o) not in seen)
    return {t.__name__: counts[t] for t in types}


class FakeProcessGroupTestCase(TestCase):
    """One process, fake process group, a 1-D mesh of WORLD_SIZE."""

    @property
    def device_type(self) -> str:
        return "cuda" if torch.cuda.is_available() else "cpu"

    def setUp(self) -> None:
        super().setUp()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
        self.mesh = init_device_mesh(self.device_type, (WORLD_SIZE,))

    def tearDown(self) -> None:
        super().tearDown()
        dist.destroy_process_group()


class TestDtensorOpschemaKeyLeak(TestCase):
    """
    An OpSchema's comparison key must not keep its arguments alive after the
    schema is gone: DTensor builds an OpSchema for every op it propagates
    sharding for, often with a DTensorSpec made just for that op.
    """

    @parametrize("schema_info", ["none", "static_argnum", "needs_pytree"])
    def test_spec_freed_with_schema(self, schema_info: str) -> None:
        spec = _spec()
        ref = weakref.ref(spec)
        schema = OpSchema(
            torch.ops.aten.add.Tensor,
            (spec, [spec, None], 2.0),
            {},
            schema_info=_SCHEMA_INFOS[schema_info],
        )
        schema._recompute_comparison_key()
        del schema, spec
        self.assertIsNone(ref(), "the comparison key kept the DTensorSpec alive")

    def test_schemas_leave_no_objects_behind(self) -> None:
        # Weak references to the schemas' own specs: other DTensorSpecs alive in the
        # process (earlier tests, caches) do not count.
        refs = []
        for _ in range(100):
            spec = _spec()
            refs.append(weakref.ref(spec))
            OpSchema(torch.ops.aten.mul.Tensor, (spec, 2.0), {})
        del spec
        gc.collect()
        self.assertEqual(sum(r() is not None for r in refs), 0)


class TestDtensorOpschemaKeyLeakOptimizer(FakeProcessGroupTestCase):
    """
    One process, fake process group: AdamW steps over DTensor parameters whose
    gradients are new DTensors each step (as FSDP2 makes them). Once warm, a
    step must leave no DTensorSpec or TensorMeta behind. The multi-tensor
    implementations build OpSchemas holding these gradients' specs, and fused
    Adam also specs for its scalar step tensors, every step.
    """

    @parametrize("impl", ["foreach", "fused"])
    @parametrize("placement", ["shard", "replicate"])
    def test_adamw_steps_leave_no_specs(self, impl: str, placement: str) -> None:
        placements = [Shard(0)] if placement == "shard" else [Replicate()]
        params = [
            nn.Parameter(distribute_tensor(torch.randn(16, 16, device=self.device_type), self.mesh, placements))
            for _ in range(4)
        ]
        kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
        optim = torch.optim.AdamW(params, lr=0.1, **kwargs)

        def step() -> None:
            for p in params:
                p.grad = DTensor.from_local(torch.randn_like(p.to_local()), self.mesh, placements)
            optim.step()
            optim.zero_grad()

        for _ in range(3):
            step()
        before = _live(DTensorSpec, TensorMeta)
        for _ in range(5):
            step()
        self.assertEqual(_born_since(before, DTensorSpec, TensorMeta), {"DTensorSpec": 0, "TensorMeta": 0})


class TestDtensorOpschemaKeyGuard(FakeProcessGroupTestCase):
    """
    OpSchema's comparison key is what the sharding propagation caches hash and
    compare: it must be the key the native helper computes, for the schemas
    DTensor builds and for the corner cases of static args and kwargs.
    """

    def _assert_native_key(self, schema: OpSchema) -> None:
        native = copy.copy(schema)
        torch._C._DTensor_OpSchema_recompute_comparison_key(native)
        key, native_key = schema._comparison_key, native._comparison_key
        self.assertEqual(type(key), type(native_key))
        self.assertEqual(len(key), len(native_key))
        for item, native_item in zip(key, native_key):
            self.assertEqual(type(item), type(native_item))
            self.assertTrue(item == native_item, f"{key!r} != {native_key!r}")
        try:
            native_hash = hash(native_key)
        except TypeError:
            self.assertRaises(TypeError, hash, schema)
        else:
            self.assertEqual(hash(schema), native_hash)
        self.assertTrue(schema == native)

    def test_key_of_argument_kinds(self) -> None:
        spec, other = _spec(), _spec()
        strategy = OpStrategy([])
        args_cases = [
            (),
            (spec,),
            (spec, other, 1, 2.5),
            (spec, [spec, None, other], [1, 2]),
            (spec, None, "x", torch.float32, [0.1, 0.2]),
            ([None, None],),
            ([],),
            (spec, (1, 2), [spec, 1]),
            (strategy, TupleStrategy([strategy]), [strategy, None]),
            ([spec, other], [0.5, 0.25], 1.0),
        ]
        kwargs_cases = [{}, {"k": 1}, {"k": spec, "other": 3}, {"k": [1, 2]}]
        infos = [
            *_SCHEMA_INFOS.values(),
            RuntimeSchemaInfo(static_argnum=0),
            RuntimeSchemaInfo(static_argnum=2, static_kwargkey=["k", "missing"]),
            RuntimeSchemaInfo(static_kwargkey=[]),
        ]
        for schema_info in infos:
            for args in args_cases:
                for kwargs in kwargs_cases:
                    self._assert_native_key(
                        OpSchema(
                            torch.ops.aten.add.Tensor,
                            args,
                            kwargs,
                            schema_info=schema_info,
                        )
                    )

    def test_key_of_dispatched_ops(self) -> None:
        built: list[OpSchema] = []
        post_init = OpSchema.__post_init__

        def record(schema: OpSchema) -> None:
            post_init(schema)
            built.append(schema)

        x = distribute_tensor(torch.randn(8, 8), self.mesh, [Shard(0)])
        w = distribute_tensor(torch.randn(8, 8), self.mesh, [Replicate()])
        params = [nn.Parameter(distribute_tensor(torch.randn(8, 8), self.mesh, [Shard(1)]))]
        with mock.patch.object(OpSchema, "__post_init__", record):
            x + w
            torch.mm(x, w)
            torch.addmm(w, x, w, beta=0.5)
            x.sum(dim=1, keepdim=True)
            x.view(64)
            torch.cat([x, w])
            x.to(torch.float64)
            torch._foreach_mul([x, w], [0.5, 0.25])
            torch._foreach_add([x, w], [w, x], alpha=2.0)
            for kwargs in ({"foreach": True}, {"foreach": False}, {"fused": True}):
                optim = torch.optim.AdamW(params, lr=0.1, **kwargs)
                for _ in range(2):
                    params[0].grad = torch.ones_like(params[0])
                    optim.step()
        self.assertGreater(len(built), 10)
        for schema in built:
            self._assert_native_key(schema)

    def test_sharding_cache_hits_again(self) -> None:
        propagator = DTensor._op_dispatcher.sharding_propagator
        xs = [distribute_tensor(torch.randn(8, 8), self.mesh, [Shard(0)]) for _ in range(3)]
        ys = [distribute_tensor(torch.randn(8, 8), self.mesh, [Shard(0)]) for _ in range(3)]
        torch._foreach_add(xs, ys)
        xs[0] + ys[0]
        misses = propagator.propagate_op_sharding.cache_info().misses
        # Ops the native cache misses are propagated through the Python cache,
        # or uncached; neither may run again for the same inputs.
        with mock.patch.object(
            propagator,
            "propagate_op_sharding_non_cached",
            wraps=propagator.propagate_op_sharding_non_cached,
        ) as non_cached:
            torch._foreach_add(xs, ys)
            xs[0] + ys[0]
        self.assertEqual(non_cached.call_count, 0)
        self.assertEqual(propagator.propagate_op_sharding.cache_info().misses, misses)


instantiate_parametrized_tests(TestDtensorOpschemaKeyLeak)
instantiate_parametrized_tests(TestDtensorOpschemaKeyLeakOptimizer)


if __name__ == "__main__":
    run_tests()
