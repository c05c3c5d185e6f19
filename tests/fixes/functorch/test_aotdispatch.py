# Owner(s): ["module: aotdispatch"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo.test_case
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.two_tensor import TwoTensor

# The expected graphs were recorded on unpatched torch; where torch's graphs differ
# between releases (2.14 added size/stride inputs for the plain tensors inside a
# subclass, 2.15 renamed nodes), each release family has its own expectation.
from tests.fixes._torch_gates import for_torch


def _graphs(fn: Callable[..., Any], inputs: Sequence[Any], *, dynamic: bool) -> tuple[str, str | None]:
    fw_graphs: list[str] = []
    bw_graphs: list[str] = []

    def fw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        fw_graphs.append(gm.code.strip())
        return make_boxed_func(gm)

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        bw_graphs.append(gm.code.strip())
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler)
    out = torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    if any(o.requires_grad for o in outs):
        sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    return fw_graphs[0], (bw_graphs[0] if bw_graphs else None)


def _two_tensor(requires_grad: bool = True) -> TwoTensor:
    return TwoTensor(torch.randn(4, 3), torch.randn(4, 3)).requires_grad_(requires_grad)


def _plain_with_view(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z = x.sin() * y
    return z, z.view(-1)


def _cos_plus_one(a: torch.Tensor) -> torch.Tensor:
    return a.cos() + 1


class TestAotSubclassOutputsGuard(torch._dynamo.test_case.TestCase):
    """
    Functions whose outputs never hit the subclass-output bugs (plain tensors,
    TwoTensor, nested jagged tensors; static and dynamic shapes, an input
    mutation, an inference graph) compile to the same partitioned graphs as
    before the fix.
    """

    def test_plain_static(self):
        fw, bw = _graphs(
            _plain_with_view,
            [
                torch.randn(4, 3, requires_grad=True),
                torch.randn(4, 3, requires_grad=True),
            ],
            dynamic=False,
        )
        self.assertExpectedInline(
            fw,
            """\
def forward(self, primals_1, primals_2):
    sin = torch.ops.aten.sin.default(primals_1)
    mul = torch.ops.aten.mul.Tensor(sin, primals_2)
    view = torch.ops.aten.view.default(mul, [-1])
    return (mul, view, primals_1, primals_2, sin)""",
        )
        self.assertExpectedInline(
            bw,
            """\
def forward(self, primals_1, primals_2, sin, tangents_1):
    mul_1 = torch.ops.aten.mul.Tensor(tangents_1, sin);  sin = None
    mul_2 = torch.ops.aten.mul.Tensor(tangents_1, primals_2);  tangents_1 = primals_2 = None
    cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
    mul_3 = torch.ops.aten.mul.Tensor(mul_2, cos);  mul_2 = cos = None
    return (mul_3, mul_1)""",
        )

    def test_plain_dynamic(self):
        fw, bw = _graphs(
            _plain_with_view,
            [
                torch.randn(4, 3, requires_grad=True),
                torch.randn(4, 3, requires_grad=True),
            ],
            dynamic=True,
        )
        self.assertExpectedInline(
            fw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_1, primals_2, primals_3, primals_4):
    sin = torch.ops.aten.sin.default(primals_3)
    mul_2 = torch.ops.aten.mul.Tensor(sin, primals_4)
    view = torch.ops.aten.view.default(mul_2, [-1])
    return (mul_2, view, primals_3, primals_4, sin, primals_2, primals_1)""",
                    "2.14": """\
def forward(self, primals_1, primals_2, primals_3, primals_4):
    sin = torch.ops.aten.sin.default(primals_1)
    mul_2 = torch.ops.aten.mul.Tensor(sin, primals_4)
    view = torch.ops.aten.view.default(mul_2, [-1])
    return (mul_2, view, primals_1, primals_4, sin, primals_3, primals_2)""",
                    "2.15": """\
def forward(self, primals_1, primals_2, primals_3, primals_4):
    sin = torch.ops.aten.sin.default(primals_1)
    mul = torch.ops.aten.mul.Tensor(sin, primals_4)
    view = torch.ops.aten.view.default(mul, [-1])
    return (mul, view, primals_1, primals_4, sin, primals_3, primals_2)""",
                }
            ),
        )
        self.assertExpectedInline(
            bw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_2, primals_1, primals_3, primals_4, sin, tangents_1):
    mul_6 = torch.ops.aten.mul.Tensor(tangents_1, sin);  sin = None
    mul_7 = torch.ops.aten.mul.Tensor(tangents_1, primals_4);  tangents_1 = primals_4 = None
    cos = torch.ops.aten.cos.default(primals_3);  primals_3 = None
    mul_8 = torch.ops.aten.mul.Tensor(mul_7, cos);  mul_7 = cos = None
    return (None, None, mul_8, mul_6)""",
                    "2.14": """\
def forward(self, primals_3, primals_2, primals_1, primals_4, sin, tangents_1):
    mul_6 = torch.ops.aten.mul.Tensor(tangents_1, sin);  sin = None
    mul_7 = torch.ops.aten.mul.Tensor(tangents_1, primals_4);  tangents_1 = primals_4 = None
    cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
    mul_8 = torch.ops.aten.mul.Tensor(mul_7, cos);  mul_7 = cos = None
    return (mul_8, None, None, mul_6)""",
                    "2.15": """\
def forward(self, primals_3, primals_2, primals_1, primals_4, sin, tangents_1):
    mul_1 = torch.ops.aten.mul.Tensor(tangents_1, sin);  sin = None
    mul_2 = torch.ops.aten.mul.Tensor(tangents_1, primals_4);  tangents_1 = primals_4 = None
    cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
    mul_3 = torch.ops.aten.mul.Tensor(mul_2, cos);  mul_2 = cos = None
    return (mul_3, None, None, mul_1)""",
                }
            ),
        )

    def test_two_tensor_static(self):
        fw, bw = _graphs(_cos_plus_one, [_two_tensor()], dynamic=False)
        self.assertExpectedInline(
            fw,
            """\
def forward(self, primals_1, primals_2):
    cos = torch.ops.aten.cos.default(primals_1)
    cos_1 = torch.ops.aten.cos.default(primals_2)
    add = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_1 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add, add_1, primals_1, primals_2)""",
        )
        self.assertExpectedInline(
            bw,
            """\
def forward(self, primals_1, primals_2, tangents_1, tangents_2):
    sin = torch.ops.aten.sin.default(primals_1);  primals_1 = None
    sin_1 = torch.ops.aten.sin.default(primals_2);  primals_2 = None
    neg = torch.ops.aten.neg.default(sin);  sin = None
    neg_1 = torch.ops.aten.neg.default(sin_1);  sin_1 = None
    mul = torch.ops.aten.mul.Tensor(tangents_1, neg);  tangents_1 = neg = None
    mul_1 = torch.ops.aten.mul.Tensor(tangents_2, neg_1);  tangents_2 = neg_1 = None
    return (mul, mul_1)""",
        )

    def test_two_tensor_dynamic(self):
        fw, bw = _graphs(_cos_plus_one, [_two_tensor()], dynamic=True)
        self.assertExpectedInline(
            fw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7):
    cos = torch.ops.aten.cos.default(primals_3)
    cos_1 = torch.ops.aten.cos.default(primals_4)
    add_9 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_13 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_9, add_13, primals_5, primals_7, primals_7, primals_3, primals_4, primals_5, primals_7)""",
                    "2.14": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13):
    cos = torch.ops.aten.cos.default(primals_1)
    cos_1 = torch.ops.aten.cos.default(primals_5)
    add_9 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_13 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_9, primals_12, primals_13, primals_13, add_13, primals_12, primals_13, primals_13, primals_12, primals_13, primals_13, primals_1, primals_5, primals_12, primals_13)""",
                    "2.15": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13):
    cos = torch.ops.aten.cos.default(primals_1)
    cos_1 = torch.ops.aten.cos.default(primals_5)
    add_3 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_4 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_3, primals_12, primals_13, primals_13, add_4, primals_12, primals_13, primals_13, primals_12, primals_13, primals_13, primals_1, primals_5, primals_12, primals_13)""",
                }
            ),
        )
        self.assertExpectedInline(
            bw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_5, primals_7, primals_3, primals_4, tangents_1, tangents_2):
    sin = torch.ops.aten.sin.default(primals_3);  primals_3 = None
    sin_1 = torch.ops.aten.sin.default(primals_4);  primals_4 = None
    neg = torch.ops.aten.neg.default(sin);  sin = None
    neg_1 = torch.ops.aten.neg.default(sin_1);  sin_1 = None
    mul_12 = torch.ops.aten.mul.Tensor(tangents_1, neg);  tangents_1 = neg = None
    mul_13 = torch.ops.aten.mul.Tensor(tangents_2, neg_1);  tangents_2 = neg_1 = None
    return (None, None, mul_12, mul_13, primals_5, primals_7, primals_7)""",
                    "2.14": """\
def forward(self, primals_12, primals_13, primals_1, primals_5, tangents_1, tangents_2):
    sin = torch.ops.aten.sin.default(primals_1);  primals_1 = None
    sin_1 = torch.ops.aten.sin.default(primals_5);  primals_5 = None
    neg = torch.ops.aten.neg.default(sin);  sin = None
    neg_1 = torch.ops.aten.neg.default(sin_1);  sin_1 = None
    mul_12 = torch.ops.aten.mul.Tensor(tangents_1, neg);  tangents_1 = neg = None
    mul_13 = torch.ops.aten.mul.Tensor(tangents_2, neg_1);  tangents_2 = neg_1 = None
    return (mul_12, primals_12, primals_13, primals_13, mul_13, primals_12, primals_13, primals_13, primals_12, primals_13, primals_13, None, None)""",
                    "2.15": """\
def forward(self, primals_12, primals_13, primals_1, primals_5, tangents_1, tangents_2):
    sin = torch.ops.aten.sin.default(primals_1);  primals_1 = None
    sin_1 = torch.ops.aten.sin.default(primals_5);  primals_5 = None
    neg = torch.ops.aten.neg.default(sin);  sin = None
    neg_1 = torch.ops.aten.neg.default(sin_1);  sin_1 = None
    mul_4 = torch.ops.aten.mul.Tensor(tangents_1, neg);  tangents_1 = neg = None
    mul_5 = torch.ops.aten.mul.Tensor(tangents_2, neg_1);  tangents_2 = neg_1 = None
    return (mul_4, primals_12, primals_13, primals_13, mul_5, primals_12, primals_13, primals_13, primals_12, primals_13, primals_13, None, None)""",
                }
            ),
        )

    def test_two_tensor_input_mutation(self):
        def fn(a, b):
            a.mul_(2)
            return (a + b).sin()

        fw, bw = _graphs(fn, [_two_tensor(False), _two_tensor()], dynamic=False)
        self.assertExpectedInline(
            fw,
            """\
def forward(self, primals_1, primals_2, primals_3, primals_4):
    mul = torch.ops.aten.mul.Tensor(primals_1, 2);  primals_1 = None
    mul_1 = torch.ops.aten.mul.Tensor(primals_2, 2);  primals_2 = None
    add = torch.ops.aten.add.Tensor(mul, primals_3);  primals_3 = None
    add_1 = torch.ops.aten.add.Tensor(mul_1, primals_4);  primals_4 = None
    sin = torch.ops.aten.sin.default(add)
    sin_1 = torch.ops.aten.sin.default(add_1)
    return (mul, mul_1, sin, sin_1, add, add_1)""",
        )
        self.assertExpectedInline(
            bw,
            """\
def forward(self, add, add_1, tangents_1, tangents_2):
    cos = torch.ops.aten.cos.default(add);  add = None
    cos_1 = torch.ops.aten.cos.default(add_1);  add_1 = None
    mul_2 = torch.ops.aten.mul.Tensor(tangents_1, cos);  tangents_1 = cos = None
    mul_3 = torch.ops.aten.mul.Tensor(tangents_2, cos_1);  tangents_2 = cos_1 = None
    return (None, mul_2, mul_3)""",
        )

    def test_plain_input_mutation_two_tensor_output_dynamic(self):
        def fn(p, b):
            p.add_(1)
            return b * p

        fw, bw = _graphs(fn, [torch.randn(4, 3), _two_tensor()], dynamic=True)
        self.assertExpectedInline(
            fw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8):
    add_3 = torch.ops.aten.add.Tensor(primals_3, 1);  primals_3 = None
    mul_4 = torch.ops.aten.mul.Tensor(primals_4, add_3);  primals_4 = None
    mul_7 = torch.ops.aten.mul.Tensor(primals_5, add_3);  primals_5 = None
    return (add_3, mul_4, mul_7, primals_6, primals_8, primals_8, add_3, primals_6, primals_8)""",
                    "2.14": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, primals_14):
    add_3 = torch.ops.aten.add.Tensor(primals_12, 1);  primals_12 = None
    mul_4 = torch.ops.aten.mul.Tensor(primals_1, add_3);  primals_1 = None
    mul_7 = torch.ops.aten.mul.Tensor(primals_5, add_3);  primals_5 = None
    return (add_3, mul_4, primals_13, primals_14, primals_14, mul_7, primals_13, primals_14, primals_14, primals_13, primals_14, primals_14, add_3, primals_13, primals_14)""",
                    "2.15": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, primals_14):
    add_3 = torch.ops.aten.add.Tensor(primals_12, 1);  primals_12 = None
    mul_2 = torch.ops.aten.mul.Tensor(primals_1, add_3);  primals_1 = None
    mul_3 = torch.ops.aten.mul.Tensor(primals_5, add_3);  primals_5 = None
    return (add_3, mul_2, primals_13, primals_14, primals_14, mul_3, primals_13, primals_14, primals_14, primals_13, primals_14, primals_14, add_3, primals_13, primals_14)""",
                }
            ),
        )
        self.assertExpectedInline(
            bw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_6, primals_8, add_3, tangents_1, tangents_2):
    mul_12 = torch.ops.aten.mul.Tensor(tangents_1, add_3);  tangents_1 = None
    mul_13 = torch.ops.aten.mul.Tensor(tangents_2, add_3);  tangents_2 = add_3 = None
    return (None, None, None, mul_12, mul_13, primals_6, primals_8, primals_8)""",
                    "2.14": """\
def forward(self, primals_13, primals_14, add_3, tangents_1, tangents_2):
    mul_12 = torch.ops.aten.mul.Tensor(tangents_1, add_3);  tangents_1 = None
    mul_13 = torch.ops.aten.mul.Tensor(tangents_2, add_3);  tangents_2 = add_3 = None
    return (mul_12, primals_13, primals_14, primals_14, mul_13, primals_13, primals_14, primals_14, primals_13, primals_14, primals_14, None, None, None)""",
                    "2.15": """\
def forward(self, primals_13, primals_14, add_3, tangents_1, tangents_2):
    mul_6 = torch.ops.aten.mul.Tensor(tangents_1, add_3);  tangents_1 = None
    mul_7 = torch.ops.aten.mul.Tensor(tangents_2, add_3);  tangents_2 = add_3 = None
    return (mul_6, primals_13, primals_14, primals_14, mul_7, primals_13, primals_14, primals_14, primals_13, primals_14, primals_14, None, None, None)""",
                }
            ),
        )

    def test_two_tensor_inference_dynamic(self):
        fw, bw = _graphs(_cos_plus_one, [_two_tensor(False)], dynamic=True)
        self.assertIsNone(bw)
        self.assertExpectedInline(
            fw,
            for_torch(
                {
                    "2.11": """\
def forward(self, arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1):
    cos = torch.ops.aten.cos.default(arg2_1);  arg2_1 = None
    cos_1 = torch.ops.aten.cos.default(arg3_1);  arg3_1 = None
    add_9 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_13 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_9, add_13, arg4_1, arg6_1, arg6_1)""",
                    "2.14": """\
def forward(self, arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1, arg10_1, arg11_1, arg12_1):
    cos = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
    cos_1 = torch.ops.aten.cos.default(arg4_1);  arg4_1 = None
    add_9 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_13 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_9, arg11_1, arg12_1, arg12_1, add_13, arg11_1, arg12_1, arg12_1, arg11_1, arg12_1, arg12_1)""",
                    "2.15": """\
def forward(self, arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1, arg10_1, arg11_1, arg12_1):
    cos = torch.ops.aten.cos.default(arg0_1);  arg0_1 = None
    cos_1 = torch.ops.aten.cos.default(arg4_1);  arg4_1 = None
    add_3 = torch.ops.aten.add.Tensor(cos, 1);  cos = None
    add_4 = torch.ops.aten.add.Tensor(cos_1, 1);  cos_1 = None
    return (add_3, arg11_1, arg12_1, arg12_1, add_4, arg11_1, arg12_1, arg12_1, arg11_1, arg12_1, arg12_1)""",
                }
            ),
        )

    def test_nested_jagged_dynamic(self):
        nt = torch.nested.nested_tensor(
            [torch.randn(2, 3), torch.randn(4, 3)],
            layout=torch.jagged,
            requires_grad=True,
        )
        fw, bw = _graphs(lambda nt: nt.sin() * 2, [nt], dynamic=True)
        self.assertExpectedInline(
            fw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9):
    sin = torch.ops.aten.sin.default(primals_3)
    mul = torch.ops.aten.mul.Tensor(sin, 2);  sin = None
    return (mul, primals_4, primals_5, primals_6, primals_7, primals_9, primals_9, primals_3, primals_7, primals_9)""",
                    "2.14": """\
def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, primals_14, primals_15):
    sin = torch.ops.aten.sin.default(primals_1)
    mul = torch.ops.aten.mul.Tensor(sin, 2);  sin = None
    return (mul, primals_2, primals_13, primals_13, primals_5, primals_13, primals_7, primals_8, primals_9, primals_10, primals_14, primals_13, primals_13, primals_1, primals_2, primals_8, primals_10, primals_13, primals_14)""",
                }
            ),
        )
        self.assertExpectedInline(
            bw,
            for_torch(
                {
                    "2.11": """\
def forward(self, primals_7, primals_9, primals_3, tangents_1, tangents_2, tangents_3, tangents_4):
    mul_1 = torch.ops.aten.mul.Tensor(tangents_1, 2);  tangents_1 = None
    cos = torch.ops.aten.cos.default(primals_3);  primals_3 = None
    mul_2 = torch.ops.aten.mul.Tensor(mul_1, cos);  mul_1 = cos = None
    return (None, None, mul_2, tangents_2, tangents_3, tangents_4, primals_7, primals_9, primals_9)""",
                    "2.14": """\
def forward(self, primals_2, primals_8, primals_10, primals_13, primals_14, primals_1, tangents_1, tangents_2, tangents_3, tangents_4):
    mul_1 = torch.ops.aten.mul.Tensor(tangents_1, 2);  tangents_1 = None
    cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
    mul_2 = torch.ops.aten.mul.Tensor(mul_1, cos);  mul_1 = cos = None
    return (mul_2, primals_2, primals_13, primals_13, tangents_2, primals_13, tangents_3, primals_8, tangents_4, primals_10, primals_14, primals_13, primals_13, None, None)""",
                }
            ),
        )


class TestAotSubclassOutputsViewReplayGuard(torch._dynamo.test_case.TestCase):
    """
    Outputs of a multi-output view op (``split``, ``chunk``, ``unbind``) of a
    TwoTensor input, which compiled before the fix through the ``as_strided()``
    regeneration of subclass views, still compile and match eager.
    """

    def test_multi_output_views_of_a_subclass_input(self):
        cases = {
            "chunk": lambda x: x.chunk(2),
            "unbind": lambda x: x.unbind(0),
            "split_sizes": lambda x: x.split([1, 3]),
            "split": lambda x: torch.split(x, 2),
        }
        for name, fn in cases.items():
            for backend in ("aot_eager", "inductor"):
                torch._dynamo.reset()
                x = _two_tensor()
                ref_x = TwoTensor(x.a.detach().clone(), x.b.detach().clone()).requires_grad_()
                outs = torch.compile(fn, backend=backend)(x)
                ref_outs = fn(ref_x)
                msg = f"{name}, {backend}"
                self.assertEqual(len(outs), len(ref_outs), msg=msg)
                for out, ref_out in zip(outs, ref_outs):
                    self.assertIsInstance(out, TwoTensor, msg=msg)
                    self.assertEqual((out.a, out.b), (ref_out.a, ref_out.b), msg=msg)
                sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
                sum((o * (i + 1)).sum() for i, o in enumerate(ref_outs)).backward()
                self.assertEqual((x.grad.a, x.grad.b), (ref_x.grad.a, ref_x.grad.b), msg=msg)


if __name__ == "__main__":
    run_tests()
