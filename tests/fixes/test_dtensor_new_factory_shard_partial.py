# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from hypothesis import example, given, settings, strategies as st
from torch.distributed._local_tensor import maybe_disable_local_tensor_mode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    create_local_tensor_test_class,
    DTensorTestBase,
    LocalDTensorTestBase,
    with_comms,
)


_INITIALIZED_FILL = {"new_zeros": 0.0, "new_ones": 1.0, "new_full": 3.0}


def _new_factory(x: torch.Tensor, op: str, shape: tuple[int, ...]) -> torch.Tensor:
    if op == "new_full":
        return x.new_full(shape, 3.0)
    if op == "new_empty_strided":
        return x.new_empty_strided(shape, torch.empty(shape).stride())
    return getattr(x, op)(shape)


def _expected_factory_placements(
    placements: tuple[Placement, ...], op: str, same_shape: bool
) -> tuple[Placement, ...]:
    # Each mesh dim on its own: a new shape replicates; a Shard dim follows the
    # input; a Partial dim follows only for uninitialized factories, since the
    # values an initialized factory writes would be reduced across that dim.
    if not same_shape:
        return (Replicate(),) * len(placements)
    return tuple(
        Replicate() if p.is_partial() and op in _INITIALIZED_FILL else p
        for p in placements
    )


class DistNewFactoryShardPartialTest(DTensorTestBase):
    @property
    def world_size(self) -> int:
        return 4

    @with_comms
    def test_new_factory_shard_partial_2d_mesh(self):
        with maybe_disable_local_tensor_mode():
            mesh = init_device_mesh(self.device_type, (2, 2))
        for placements in ([Shard(0), Partial()], [Partial(), Shard(0)]):
            x = DTensor.from_local(
                torch.randn(2, 4, device=self.device_type),
                mesh,
                placements,
                run_check=False,
            )
            for op, fill in _INITIALIZED_FILL.items():
                y = _new_factory(x, op, tuple(x.shape))
                self.assertEqual(y.full_tensor(), torch.full((4, 4), fill))
                self.assertEqual(
                    y.placements,
                    _expected_factory_placements(tuple(placements), op, True),
                )
            # Uninitialized factories still follow the input, Partial included.
            for op in ("new_empty", "new_empty_strided"):
                y = _new_factory(x, op, tuple(x.shape))
                self.assertEqual(y.placements, tuple(placements))


DistNewFactoryShardPartialTestWithLocalTensor = create_local_tensor_test_class(
    DistNewFactoryShardPartialTest
)


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


class NewFactoryShardPartialPropertyTest(LocalDTensorTestBase):
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
                x = DTensor.from_local(
                    torch.randn(local_shape), mesh, placements, run_check=False
                )
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
