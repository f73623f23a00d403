"""The contract of the custom op ``epilab::template_call``: its fake implementation and its
real call return outputs of the same sizes and strides, for every template, whatever
strides the inputs arrive with.

Inductor may hand a custom op inputs laid out otherwise than the graph's values it was
traced with (issue 15: a max-pool's output, channels_last at trace time, arrived
contiguous; the convolution's real output followed it while the fake had promised
channels_last, and the compiled graph's stride assertion failed). So each case makes the
problem from one layout of the inputs and calls the op with every other layout the
templates accept (contiguous, transposed, channels_last, sliced views, expanded
operands): the fake's outputs for the problem's inputs, the fake's outputs for the
call's inputs and the real outputs must all have the same sizes and strides, and the
real outputs must match float64. ``torch.library.opcheck`` checks schema and fake
against real for one layout of each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from epilab.compiler.decide import Plan
from epilab.compiler.op import TEMPLATE_CALL
from epilab.ir.check import rel_error
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import Problem
from epilab.templates.conv.conv2d import conv_epilogue, make_conv_problem, matmul_twin
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_reference import reference
from epilab.templates.gemv.gemv import gemv_twin
from epilab.templates.registry import default_config

GEN = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=GEN)


def _matrix(rows: int, cols: int, layout: str, batch: int | None = None) -> torch.Tensor:
    """A [rows, cols] (or [batch, rows, cols]) tensor stored ``row``-major, ``col``-major,
    as a ``sliced`` view of a wider one, or ``expanded`` over the batch (stride 0)."""
    lead = () if batch is None else (batch,)
    if layout == "row":
        return _randn(*lead, rows, cols)
    if layout == "col":
        return _randn(*lead, cols, rows).transpose(-1, -2)
    if layout == "sliced":
        return _randn(*lead, rows + 3, cols + 5)[..., 1 : rows + 1, 2 : cols + 2]
    if layout == "expanded":
        return _randn(1, rows, cols).expand(batch or 1, rows, cols)
    raise ValueError(layout)


def _image(n: int, c: int, h: int, w: int, layout: str) -> torch.Tensor:
    if layout == "nhwc":
        return _randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    if layout == "nchw":
        return _randn(n, c, h, w)
    if layout == "sliced":  # a channel slice of a wider NHWC tensor: no format at all
        return _randn(n, c + 4, h, w).contiguous(memory_format=torch.channels_last)[:, 2 : c + 2]
    raise ValueError(layout)


@dataclass(frozen=True)
class Call:
    """The tensors of one call: a, b, operands by name, and the float64 reference."""

    a: torch.Tensor
    b: torch.Tensor
    operands: dict[str, torch.Tensor]
    reference: Callable[[], tuple[torch.Tensor, ...]]


MATMUL_EP = Epilogue.build(
    [
        (acc() + operand("bias", "row"), "float32"),
        (ops.gelu(acc() + operand("bias", "row")) + operand("res", "tile"), "float32"),
    ]
)
CONV_EP = Epilogue.build(
    [(ops.relu(acc() * operand("scale", "row") + operand("res", "tile")), "float32"), (acc(), "float32")]
)


def _matmul_call(m: int, n: int, k: int, la: str, lb: str, lres: str, batch: int | None = None) -> Call:
    a, b = _matrix(m, k, la, batch), _matrix(k, n, lb, batch)
    bias = _randn(n) if lres != "expanded" else _randn(n).expand(m, n)
    res = _matrix(m, n, lres if lres != "expanded" else "row", batch)
    operands = {"bias": bias, "res": res}
    return Call(a, b, operands, lambda: reference(MATMUL_EP, a, b, operands))


def _conv_call(layout: str, res_layout: str, *, k: int = 6, r: int = 3) -> Call:
    x, w = _image(2, 5, 6, 7, layout), _image(k, 5, r, r, "nhwc" if layout == "sliced" else layout)
    res = _image(2, k, 6, 7, res_layout)
    operands = {"scale": _randn(k), "res": res}

    def ref() -> tuple[torch.Tensor, ...]:
        acc64 = F.conv2d(x.double(), w.double(), padding=r // 2)
        p = make_conv_problem(x, w, CONV_EP, operands, padding=r // 2)
        return conv_epilogue(p, acc64, {name: t.double() for name, t in operands.items()})

    return Call(x, w, operands, ref)


def _problem_of(template: str, call: Call) -> Problem:
    if template == "conv2d":
        r = call.b.shape[-1]
        return make_conv_problem(call.a, call.b, CONV_EP, call.operands, padding=r // 2)
    if template == "twin":
        twin = matmul_twin(make_conv_problem(call.a, call.b, CONV_EP, call.operands))
        assert twin is not None, "a 1x1 NHWC convolution has a matmul twin"
        return twin
    problem = make_problem(call.a, call.b, MATMUL_EP, call.operands)
    if template == "gemv":
        twin = gemv_twin(problem)
        assert twin is not None, "a skinny matmul has a gemv twin"
        return twin
    return problem


# (template, a call that makes the problem, calls with other strides)
CASES: dict[str, tuple[str, Callable[[], Call], list[Callable[[], Call]]]] = {
    "matmul": (
        "matmul",
        lambda: _matmul_call(9, 13, 7, "row", "row", "row"),
        [
            lambda: _matmul_call(9, 13, 7, "col", "col", "col"),
            lambda: _matmul_call(9, 13, 7, "sliced", "sliced", "sliced"),
            lambda: _matmul_call(9, 13, 7, "row", "col", "expanded"),
        ],
    ),
    "matmul-from-col": (
        "matmul",
        lambda: _matmul_call(9, 13, 7, "col", "col", "col"),
        [lambda: _matmul_call(9, 13, 7, "row", "sliced", "row")],
    ),
    "bmm": (
        "matmul",
        lambda: _matmul_call(9, 13, 7, "row", "row", "row", batch=3),
        [
            lambda: _matmul_call(9, 13, 7, "col", "expanded", "col", batch=3),
            lambda: _matmul_call(9, 13, 7, "sliced", "col", "sliced", batch=3),
        ],
    ),
    "gemv-small-m": (
        "gemv",
        lambda: _matmul_call(3, 40, 24, "row", "col", "row"),
        [
            lambda: _matmul_call(3, 40, 24, "col", "row", "col"),
            lambda: _matmul_call(3, 40, 24, "sliced", "sliced", "expanded"),
        ],
    ),
    "gemv-small-n": (
        "gemv",
        lambda: _matmul_call(40, 5, 24, "row", "col", "row"),
        [lambda: _matmul_call(40, 5, 24, "col", "sliced", "sliced")],
    ),
    "conv2d-nhwc": (
        "conv2d",
        lambda: _conv_call("nhwc", "nhwc"),
        [lambda: _conv_call("nchw", "nchw"), lambda: _conv_call("sliced", "nchw")],
    ),
    "conv2d-nchw": (
        "conv2d",
        lambda: _conv_call("nchw", "nchw"),
        [lambda: _conv_call("nhwc", "nhwc"), lambda: _conv_call("nhwc", "sliced")],
    ),
    "conv1x1-twin": (
        "twin",
        lambda: _conv_call("nhwc", "nhwc", r=1),
        [lambda: _conv_call("nchw", "nchw", r=1), lambda: _conv_call("sliced", "nhwc", r=1)],
    ),
}


def _args(problem: Problem, call: Call) -> tuple:
    plan = Plan(config=default_config(problem, "interpreter")).to_json()
    operands = [call.operands[spec.name] for spec in problem.operands]
    return (problem.to_json(), plan, call.a, call.b, operands)


def _fake_layouts(args: tuple) -> list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]:
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args[2:4]], [mode.from_tensor(t) for t in args[4]]
        outs = TEMPLATE_CALL(*args[:2], *fake[0], fake[1])
    return [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs]


@pytest.mark.parametrize("case", list(CASES))
def test_fake_and_real_outputs_agree_for_any_input_strides(case):
    template, made_from, others = CASES[case]
    traced = made_from()
    problem = _problem_of(template, traced)
    promised = _fake_layouts(_args(problem, traced))
    for make in [made_from, *others]:
        call = make()
        args = _args(problem, call)
        assert _fake_layouts(args) == promised, f"{case}: the fake's outputs depend on the input strides"
        outs = TEMPLATE_CALL(*args)
        got = [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs]
        assert got == promised, f"{case}: the real call returned {got}, the fake promised {promised}"
        for out, ref in zip(outs, call.reference(), strict=True):
            err = rel_error(out, ref)
            assert err <= 1e-5, f"{case}: relative error {err:.3g} with strides {call.a.stride()}"


@pytest.mark.parametrize("case", ["matmul", "bmm", "gemv-small-n", "conv2d-nhwc", "conv1x1-twin"])
def test_opcheck(case):
    template, made_from, _ = CASES[case]
    call = made_from()
    torch.library.opcheck(
        TEMPLATE_CALL, _args(_problem_of(template, call), call), test_utils=("test_schema", "test_faketensor")
    )
