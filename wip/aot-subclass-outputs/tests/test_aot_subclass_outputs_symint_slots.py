# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.two_tensor import TwoTensor

from tests.fixes._aot_subclass_cases import scale, SubclassOutputTestCase


PLACEMENTS = {"replicate": Replicate(), "shard0": Shard(0), "shard1": Shard(1)}


class TestSubclassOutputSymIntSlots(SubclassOutputTestCase):
    """
    The size/stride SymInts of a subclass output are extra graph outputs. The
    metadata pass counts them before the joint is traced; if the backward then
    specializes a symbol (here: a custom op's backward calls int() on a size), the
    re-wrapped output reports a plain int and the slot used to be dropped, so the
    graph and the runtime disagreed on the number of outputs (pytorch#185296:
    `Node view_3 was invalid, but is output`, or a TypeError at runtime).
    """

    @parametrize("placement", list(PLACEMENTS))
    def test_backward_specializes_output_size(self, placement):
        pl = PLACEMENTS[placement]

        def fn(x):
            return DTensor.from_local(scale(x), self.mesh, [pl], run_check=False)

        self.check_same_as_eager(
            fn,
            lambda: [torch.randn(4, 3, requires_grad=True)],
            dynamic=True,
            strict_views=False,
        )

    def test_backward_specializes_dtensor_input_size(self):
        def fn(x):
            y = scale(x.to_local()).sin()
            return DTensor.from_local(y, self.mesh, [Shard(0)], run_check=False)

        self.check_same_as_eager(
            fn,
            lambda: [self.dtensor(torch.randn(4, 3), [Shard(0)])],
            dynamic=True,
            strict_views=False,
        )

    def test_mixed_plain_and_dtensor_outputs(self):
        def fn(x, w):
            y = scale(x) @ w
            return (
                y.sum(1),
                DTensor.from_local(y, self.mesh, [Replicate()], run_check=False),
                DTensor.from_local(w * 2, self.mesh, [Shard(1)], run_check=False),
            )

        self.check_same_as_eager(
            fn,
            lambda: [
                torch.randn(4, 3, requires_grad=True),
                torch.randn(3, 5, requires_grad=True),
            ],
            dynamic=True,
            strict_views=False,
        )

    def test_two_tensor_output(self):
        # Not only DTensor: any subclass output whose size a backward specializes
        def fn(x):
            return scale(x).sin()

        x = TwoTensor(torch.randn(4, 3), torch.randn(4, 3)).requires_grad_()
        ref_x = x.detach().clone().requires_grad_()
        out = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)(x)
        ref = fn(ref_x)
        self.assertIs(type(out), TwoTensor)
        self.assertEqual(out.a, ref.a)
        self.assertEqual(out.b, ref.b)
        out.sum().backward()
        ref.sum().backward()
        self.assertEqual(x.grad.a, ref_x.grad.a)
        self.assertEqual(x.grad.b, ref_x.grad.b)

    def test_backward_specializes_output_size_inductor(self):
        def fn(x):
            return DTensor.from_local(
                scale(x).sin(), self.mesh, [Shard(0)], run_check=False
            )

        self.check_same_as_eager(
            fn,
            lambda: [torch.randn(4, 3, requires_grad=True)],
            backend="inductor",
            dynamic=True,
            strict_views=False,
        )

    @parametrize("dynamic", [False, True])
    def test_no_specialization_is_unchanged(self, dynamic):
        # Neighbour: without a late specialization the slots always agreed
        def fn(x):
            y = x.to_local() * 2
            return DTensor.from_local(y, self.mesh, [Shard(1)], run_check=False)

        self.check_same_as_eager(
            fn,
            lambda: [self.dtensor(torch.randn(4, 6), [Shard(1)])],
            dynamic=dynamic,
            strict_views=False,
        )

    def test_static_shapes_with_specializing_backward(self):
        # Neighbour: static shapes have no slots to lose
        def fn(x):
            return DTensor.from_local(scale(x), self.mesh, [Shard(0)], run_check=False)

        self.check_same_as_eager(
            fn, lambda: [torch.randn(4, 3, requires_grad=True)], strict_views=False
        )


instantiate_parametrized_tests(TestSubclassOutputSymIntSlots)


if __name__ == "__main__":
    run_tests()
