# Owner(s): ["oncall: distributed"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from tests.fixes._aot_subclass_cases import SubclassOutputTestCase


PLACEMENTS = {"replicate": Replicate(), "shard0": Shard(0), "shard1": Shard(1)}


class TestDTensorOutputsViewingOneIntermediate(SubclassOutputTestCase):
    """
    DTensor.from_local() returns a view, so DTensor outputs built from views of one
    intermediate have local tensors that alias it, while the DTensors do not alias
    as far as autograd is concerned. The dense metadata used to count that
    intermediate as a forward output the traced graph never returns
    (torchtitan#3013, pytorch#172549).
    """

    @parametrize("placement", list(PLACEMENTS))
    @parametrize("dynamic", [False, True])
    def test_from_local_slices_of_one_intermediate(self, placement, dynamic):
        # torchtitan#3013: AssertionError: Node tangents_1 was invalid, but is output
        pl = PLACEMENTS[placement]

        def fn(x):
            h = x * 2
            return (
                DTensor.from_local(h[:3], self.mesh, [pl], run_check=False),
                DTensor.from_local(h[3:], self.mesh, [pl], run_check=False),
            )

        self.check_same_as_eager(
            fn,
            lambda: [torch.randn(6, 4, requires_grad=True)],
            dynamic=dynamic,
        )

    @parametrize("view", ["split", "unbind", "narrow", "transpose"])
    def test_from_local_views_of_one_intermediate(self, view):
        def fn(x):
            h = x.sin()
            if view == "split":
                parts = h.split([2, 4])
            elif view == "unbind":
                parts = h.unbind(0)[:2]
            elif view == "narrow":
                parts = (h.narrow(0, 0, 3), h.narrow(1, 1, 2))
            else:
                parts = (h.t(), h)
            return tuple(
                DTensor.from_local(p, self.mesh, [Replicate()], run_check=False)
                for p in parts
            )

        self.check_same_as_eager(fn, lambda: [torch.randn(6, 4, requires_grad=True)])

    def test_from_local_of_dtensor_input_local_views(self):
        # The intermediate is the local tensor of a DTensor input
        def fn(x):
            h = x.to_local() + 1
            a = DTensor.from_local(h[:2], self.mesh, [Shard(0)], run_check=False)
            b = DTensor.from_local(h[2:], self.mesh, [Shard(0)], run_check=False)
            return a * 3, b

        self.check_same_as_eager(
            fn, lambda: [self.dtensor(torch.randn(4, 3), [Shard(0)])]
        )

    def test_mixed_plain_and_dtensor_outputs(self):
        def fn(x, w):
            h = x @ w
            a = DTensor.from_local(h[:, :2], self.mesh, [Replicate()], run_check=False)
            b = DTensor.from_local(h[:, 2:], self.mesh, [Shard(0)], run_check=False)
            return h.sum(0), a, w.cos(), b

        self.check_same_as_eager(
            fn,
            lambda: [
                torch.randn(4, 3, requires_grad=True),
                torch.randn(3, 5, requires_grad=True),
            ],
        )

    @parametrize("detached_first", [True, False])
    def test_aliased_outputs_one_detached(self, detached_first):
        # pytorch#172549: AssertionError: Node view_2 (or mul) was invalid, but is output
        def fn(x):
            out = x.to_local().sin()
            out_dt = DTensor.from_local(out, self.mesh, [Shard(0)], run_check=False)
            if detached_first:
                return out_dt.detach(), out_dt
            return out_dt, out_dt.detach()

        self.check_same_as_eager(
            fn,
            lambda: [self.dtensor(torch.randn(4, 4), [Shard(0)])],
            strict_views=False,
        )

    def test_partial_output_next_to_replicate_view(self):
        def fn(x):
            h = x.to_local() * x.to_local()
            return (
                DTensor.from_local(h[:2], self.mesh, [Partial()], run_check=False),
                DTensor.from_local(h[2:], self.mesh, [Replicate()], run_check=False),
            )

        self.check_same_as_eager(
            fn, lambda: [self.dtensor(torch.randn(4, 2), [Replicate()])]
        )

    def test_from_local_slices_inductor(self):
        def fn(x):
            h = x * 2
            return (
                DTensor.from_local(h[:3], self.mesh, [Shard(0)], run_check=False),
                DTensor.from_local(h[3:], self.mesh, [Replicate()], run_check=False),
            )

        self.check_same_as_eager(
            fn, lambda: [torch.randn(6, 4, requires_grad=True)], backend="inductor"
        )

    def test_aliased_outputs_one_detached_inductor(self):
        def fn(x):
            out_dt = DTensor.from_local(
                x.to_local().sin(), self.mesh, [Shard(0)], run_check=False
            )
            return out_dt.detach(), out_dt

        self.check_same_as_eager(
            fn,
            lambda: [self.dtensor(torch.randn(4, 4), [Shard(0)])],
            backend="inductor",
            strict_views=False,
        )

    def test_no_alias_between_locals_is_unchanged(self):
        # Neighbour: from_local of two separate intermediates never hit the bug
        def fn(x):
            return (
                DTensor.from_local(x * 2, self.mesh, [Replicate()], run_check=False),
                DTensor.from_local(x + 1, self.mesh, [Shard(0)], run_check=False),
            )

        self.check_same_as_eager(fn, lambda: [torch.randn(4, 4, requires_grad=True)])


instantiate_parametrized_tests(TestDTensorOutputsViewingOneIntermediate)


if __name__ == "__main__":
    run_tests()
