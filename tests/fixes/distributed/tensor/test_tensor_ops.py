# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from hypothesis import assume, example, given, settings, strategies as st
from torch.distributed._local_tensor import maybe_disable_local_tensor_mode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    distribute_tensor,
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    LocalDTensorTestBase,
    with_comms,
)


def _placements(mesh_ndim: int, ndim: int, reduce_op: str):
    one = st.one_of(
        st.just(Replicate()),
        st.just(Partial(reduce_op)),
        st.integers(0, ndim - 1).map(Shard),
    )
    return st.lists(one, min_size=mesh_ndim, max_size=mesh_ndim).map(tuple)


@st.composite
def _factory_case(draw):
    mesh_shape = draw(st.sampled_from([(4,), (2, 2)]))
    ndim = draw(st.integers(1, 3))
    reduce_op = draw(st.sampled_from(["sum", "max"]))
    placements = draw(_placements(len(mesh_shape), ndim, reduce_op))
    # Sizes divisible by every mesh dim keep Shard placements evenly shardable.
    shape = tuple(draw(st.integers(1, 3)) * 4 for _ in range(ndim))
    perm = draw(st.permutations(range(ndim)))
    strides = [0] * ndim
    step = 1
    for d in reversed(perm):
        strides[d] = step
        step *= shape[d]
    op = draw(st.sampled_from(["new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"]))
    same_shape = draw(st.booleans())
    # Out of scope here: initialized factories of Shard+Partial inputs follow the input,
    # Partial included (wrong values), on torch < 2.15; a separate upstream issue.
    assume(
        op in ("new_empty", "new_empty_strided")
        or not (any(p.is_shard() for p in placements) and any(p.is_partial() for p in placements))
    )
    return mesh_shape, placements, shape, tuple(strides), op, same_shape


_INITIALIZED_FILL = {"new_zeros": 0.0, "new_ones": 1.0, "new_full": 3.0}


def _new_factory(x: torch.Tensor, op: str, shape: tuple[int, ...]) -> torch.Tensor:
    if op == "new_full":
        return x.new_full(shape, 3.0)
    if op == "new_empty_strided":
        return x.new_empty_strided(shape, torch.empty(shape).stride())
    return getattr(x, op)(shape)


def _expected_factory_placements(placements: tuple[Placement, ...], op: str, same_shape: bool) -> tuple[Placement, ...]:
    # Each mesh dim on its own: a new shape replicates; a Shard dim follows the
    # input; a Partial dim follows only for uninitialized factories, since the
    # values an initialized factory writes would be reduced across that dim.
    if not same_shape:
        return (Replicate(),) * len(placements)
    return tuple(Replicate() if p.is_partial() and op in _INITIALIZED_FILL else p for p in placements)


@st.composite
def _shard_partial_case(draw):
    mesh_shape = draw(st.sampled_from([(4,), (2, 2)]))
    ndim = draw(st.integers(1, 3))
    # One reduce op per input: DTensor refuses most mixes of Partial reduce ops.
    reduce_op = draw(st.sampled_from(["sum", "avg", "max", "min"]))
    placement = st.one_of(
        st.just(Replicate()),
        st.just(Partial(reduce_op)),
        st.integers(0, ndim - 1).map(Shard),
    )
    placements = tuple(draw(placement) for _ in mesh_shape)
    # Sizes divisible by every mesh dim keep every Shard evenly shardable.
    shape = tuple(draw(st.integers(1, 3)) * 4 for _ in range(ndim))
    op = draw(st.sampled_from([*_INITIALIZED_FILL, "new_empty", "new_empty_strided"]))
    same_shape = draw(st.booleans())
    return mesh_shape, placements, shape, op, same_shape


class TestDtensorNewEmptyPartial(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 2

    @with_comms
    def test_new_empty_follows_partial_placement(self):
        mesh = self.build_device_mesh()
        x = DTensor.from_local(torch.randn(4, 6, device=self.device_type), mesh, [Partial()])
        self.assertEqual(x.new_empty((4, 6)).placements, (Partial(),))
        self.assertEqual(x.new_empty_strided((4, 6), (1, 4)).placements, (Partial(),))
        # Initialized factories stay Replicate: ones of a Partial would sum to world_size.
        for y in (x.new_zeros((4, 6)), x.new_ones((4, 6)), x.new_full((4, 6), 2.0)):
            self.assertEqual(y.placements, (Replicate(),))
        self.assertEqual(x.new_ones((4, 6)).full_tensor(), torch.ones(4, 6))
        # A different shape cannot follow the input.
        self.assertEqual(x.new_empty((3,)).placements, (Replicate(),))

    @with_comms
    def test_backward_partial_grad_with_transpose(self):
        # Broadcasting w.t() over a batch sharded across ranks makes w's gradient Partial
        # and, through the transpose, non-contiguous: autograd's layout contract copies it
        # into a new_empty_strided buffer, which must not force a reduction.
        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        w_full = torch.randn(6, 8, device=self.device_type)
        x_full = torch.randn(4, 8, 6, device=self.device_type)
        w = distribute_tensor(w_full, mesh, [Replicate()]).requires_grad_()
        x = distribute_tensor(x_full, mesh, [Shard(0)])

        out = x * w.t()
        with CommDebugMode() as comm_mode:
            out.sum().backward()

        self.assertEqual(comm_mode.get_total_counts(), 0)
        self.assertEqual(w.grad.placements, (Partial(),))
        w_ref = w_full.clone().requires_grad_()
        (x_full * w_ref.t()).sum().backward()
        self.assertEqual(w.grad.full_tensor(), w_ref.grad)


TestDtensorNewEmptyPartialWithLocalTensor = create_local_tensor_test_class(TestDtensorNewEmptyPartial)


class TestDtensorNewEmptyPartialProperty(LocalDTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_new_factory_placement_property(self):
        meshes = {
            (4,): self.build_device_mesh(),
            (2, 2): init_device_mesh(self.device_type, (2, 2)),
        }

        @settings(max_examples=60, deadline=None, derandomize=True)
        @given(_factory_case())
        def check(case) -> None:
            mesh_shape, placements, shape, strides, op, same_shape = case
            mesh = meshes[mesh_shape]
            with self._get_local_tensor_mode():
                local_shape = list(shape)
                for mesh_dim, p in enumerate(placements):
                    if isinstance(p, Shard):
                        local_shape[p.dim] //= mesh.size(mesh_dim)
                x = DTensor.from_local(torch.randn(local_shape), mesh, placements, run_check=False)
                out_shape = shape if same_shape else (shape[0] + 1,) + shape[1:]
                out_strides = strides if same_shape else None
                if op == "new_empty_strided":
                    y = x.new_empty_strided(out_shape, out_strides or torch.empty(out_shape).stride())
                elif op == "new_full":
                    y = x.new_full(out_shape, 3.0)
                else:
                    y = getattr(x, op)(out_shape)
                if op in ("new_zeros", "new_ones", "new_full"):
                    fill = {"new_zeros": 0.0, "new_ones": 1.0, "new_full": 3.0}[op]
                    values = y.full_tensor()
            # Assert outside LocalTensorMode, which would treat the checks as per-rank code.
            self.assertEqual(tuple(y.shape), out_shape)
            if not same_shape:
                self.assertEqual(tuple(y.placements), (Replicate(),) * mesh.ndim)
            elif op in ("new_empty", "new_empty_strided"):
                self.assertEqual(tuple(y.placements), placements)
            else:
                # Initialized factories may follow Shard, never Partial, and keep their values.
                self.assertFalse(any(p.is_partial() for p in y.placements))
            if op in ("new_zeros", "new_ones", "new_full"):
                self.assertEqual(values, torch.full(out_shape, fill))

        check()


class TestDtensorNewFactoryShardPartial(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_new_factory_shard_partial_2d_mesh(self):
        with maybe_disable_local_tensor_mode():
            mesh = init_device_mesh(self.device_type, (2, 2))
        self.run_subtests(
            {
                "placements": [(Shard(0), Partial()), (Partial(), Shard(0))],
                "op": [*_INITIALIZED_FILL, "new_empty", "new_empty_strided"],
            },
            self._test_new_factory_shard_partial_2d_mesh,
            mesh,
        )

    def _test_new_factory_shard_partial_2d_mesh(self, mesh, placements: tuple[Placement, ...], op: str) -> None:
        x = DTensor.from_local(
            torch.randn(2, 4, device=self.device_type),
            mesh,
            placements,
            run_check=False,
        )
        y = _new_factory(x, op, tuple(x.shape))
        if op in _INITIALIZED_FILL:
            self.assertEqual(y.full_tensor(), torch.full((4, 4), _INITIALIZED_FILL[op]))
            self.assertEqual(y.placements, _expected_factory_placements(placements, op, True))
        else:
            # Uninitialized factories still follow the input, Partial included.
            self.assertEqual(y.placements, placements)


TestDtensorNewFactoryShardPartialWithLocalTensor = create_local_tensor_test_class(TestDtensorNewFactoryShardPartial)


class TestDtensorNewFactoryShardPartialProperty(LocalDTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_new_factory_shard_partial_property(self):
        meshes = {
            (4,): self.build_device_mesh(),
            (2, 2): init_device_mesh(self.device_type, (2, 2)),
        }

        @settings(max_examples=100, deadline=None, derandomize=True)
        @given(_shard_partial_case())
        @example(((2, 2), (Shard(0), Partial()), (4, 4), "new_ones", True))
        @example(((2, 2), (Partial(), Shard(0)), (4, 4), "new_full", True))
        def check(case) -> None:
            mesh_shape, placements, shape, op, same_shape = case
            mesh = meshes[mesh_shape]
            out_shape = shape if same_shape else (shape[0] + 1,) + shape[1:]
            with self._get_local_tensor_mode():
                local_shape = list(shape)
                for mesh_dim, p in enumerate(placements):
                    if isinstance(p, Shard):
                        local_shape[p.dim] //= mesh.size(mesh_dim)
                x = DTensor.from_local(torch.randn(local_shape), mesh, placements, run_check=False)
                y = _new_factory(x, op, out_shape)
                if op in _INITIALIZED_FILL:
                    values = y.full_tensor()
            # Assert outside LocalTensorMode, which would treat the checks as per-rank code.
            self.assertEqual(tuple(y.shape), out_shape)
            if op in _INITIALIZED_FILL:
                plain = _new_factory(torch.randn(shape), op, out_shape)
                self.assertEqual(values, plain)
            self.assertEqual(
                tuple(y.placements),
                _expected_factory_placements(placements, op, same_shape),
            )

        check()


if __name__ == "__main__":
    run_tests()
