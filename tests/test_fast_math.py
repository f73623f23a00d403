"""The fast epilogue forms (rules.py's ``fast`` column, ``fast_math.py.jinja``) against float64
over every finite input value of bfloat16 and float16, with the bound rules.py documents: the
result, rounded to the output dtype, is never more than ``FAST_ULPS`` units in its last place
further from float64 than torch's own fp32 computation rounded the same way, plus
``FAST_ABS_FLOOR``; special values (+-0, +-inf, NaN) come out as torch's.

On CPU the kernel runs in Triton's interpreter, over emulations of the GPU's approximations (no
more accurate than their documented bounds); ``-m gpu`` runs the same checks on the GPU's own
instructions. Also: which nodes take fast forms (``Epilogue.fast_nodes``), and that the exact
forms stay where an output is fp32, a statistic or a predicate.
"""

from __future__ import annotations

import math

import pytest
import torch

import epilab
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.quantize import quantized_groups
from epilab.ir.rules import FAST_ABS_FLOOR, FAST_ULPS, RULES

FAST_OPS = sorted(name for name, rule in RULES.items() if rule.fast)
OUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# significand bits after the point, and the smallest normal exponent, of each output dtype
_FORMAT = {torch.bfloat16: (7, -126), torch.float16: (10, -14)}


def every_value(dtype: torch.dtype) -> torch.Tensor:
    """All 65536 bit patterns of a 16-bit float dtype, as fp32, shaped [256, 256]."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).float().reshape(256, 256)


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at float64 values ``v`` (the subnormal spacing below its normals)."""
    mant, min_exp = _FORMAT[dtype]
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0**-200))).clamp_min(min_exp)
    return torch.exp2(e - mant)


def run_fast(op: str, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``op(acc * x)`` with acc = 1 exactly (a K = 1 product of ones), out in ``out_dtype``:
    the kernel's form of ``op`` on exactly the values of ``x``."""
    m, n = x.shape
    ep = Epilogue.build([(getattr(ops, op)(acc() * operand("x", "tile")), str(out_dtype).split(".")[-1])])
    assert ep.fast_nodes, f"{op} should render fast for {out_dtype} outputs"
    a = torch.ones(m, 1, dtype=torch.bfloat16, device=x.device)
    b = torch.ones(1, n, dtype=torch.bfloat16, device=x.device)
    config = Config(64, 64, 16, 4, num_warps=4, num_stages=1)
    return epilab.matmul(a, b, epilogue=ep, operands={"x": x}, config=config)


def _sigmoid_tail(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(z)


# float64 references without the cancellation of 1 + tanh (or erf) near -1 in their tails
ACCURATE = {
    "gelu": lambda x: x * 0.5 * torch.special.erfc(-x / math.sqrt(2.0)),
    "gelu_tanh": lambda x: _sigmoid_tail(x, 2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)),
}


def check_bound(op: str, x: torch.Tensor, out: torch.Tensor) -> None:
    dtype = out.dtype
    rule = RULES[op]
    ref = ACCURATE.get(op, rule.torch)(x.double().cpu())
    own = rule.torch(x).to(dtype).double().cpu()  # torch's fp32 computation, rounded
    got = out.double().cpu()
    xs = x.cpu()
    finite = torch.isfinite(ref)
    # special values and overflow: exactly torch's, or the float64 value where torch's fp32 is
    # a NaN of its own (torch 2.13's vectorized CPU gelu on some hosts: gelu(inf) = nan)
    torch_slip = own.isnan() & ~ref.isnan() & (got == ref)
    same = (got == own) | (got.isnan() & own.isnan()) | torch_slip
    bad = ~finite & ~same
    assert not bad.any(), (
        f"{op} -> {dtype}: at x = {xs[bad][:5].tolist()} got {got[bad][:5].tolist()}, torch {own[bad][:5].tolist()}"
    )
    zeros = xs == 0  # f(+-0) as torch's (0 and -0 compare equal: torch's CPU gelu(-0) is +0)
    assert torch.equal(got[zeros], own[zeros]), f"{op} -> {dtype}: f(+-0) = {got[zeros].tolist()[:4]}"
    allowed = (own - ref).abs() + FAST_ULPS * ulp(ref, dtype) + FAST_ABS_FLOOR
    err = (got - ref).abs()
    over = finite & ~(err <= allowed)
    if over.any():
        i = torch.argmax(torch.where(over, err / allowed, 0.0))
        xi, ri, gi, oi = (t.flatten()[i].item() for t in (xs, ref, got, own))
        raise AssertionError(
            f"{op} -> {dtype}: {int(over.sum())} inputs outside the bound; worst x = {xi!r}: "
            f"float64 {ri!r}, fast {gi!r}, torch {oi!r} (allowed {allowed.flatten()[i].item():.3e})"
        )
    # the error in units of the output's last place, for the record
    worst_ulps = float(((got - ref).abs() / ulp(ref, dtype))[finite & (ref.abs() > 2.0**-100)].max())
    assert math.isfinite(worst_ulps)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("out_dtype", list(OUT_DTYPES))
@pytest.mark.parametrize("op", FAST_OPS)
def test_fast_form_within_bound_over_every_input(op: str, out_dtype: str) -> None:
    dtype = OUT_DTYPES[out_dtype]
    x = every_value(dtype).to(_device())
    check_bound(op, x, run_fast(op, x, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", list(OUT_DTYPES))
@pytest.mark.parametrize("op", FAST_OPS)
def test_fast_form_within_bound_over_every_input_gpu(op: str, out_dtype: str) -> None:
    test_fast_form_within_bound_over_every_input(op, out_dtype)


@pytest.mark.parametrize("op", FAST_OPS)
def test_special_values_like_torch(op: str) -> None:
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 3.0e38, -3.0e38, 90.0, -90.0, -100.0]
    x = torch.tensor(specials * 6, dtype=torch.float32).reshape(6, -1).to(_device())
    out = run_fast(op, x, torch.bfloat16)
    check_bound(op, x, out)


# -------------------------------------------------------------- where fast forms are used


def test_fast_nodes_only_where_low_precision_outputs_read_them() -> None:
    x = acc() + operand("bias", "row")
    g = ops.gelu(x)
    # bf16 output only: the gelu is fast
    ep = Epilogue.build([(g, "bfloat16")])
    assert [ep.nodes[i].op for i in ep.fast_nodes] == ["gelu"]
    # fp32 output: exact
    assert not Epilogue.build([(g, "float32")]).fast_nodes
    # read by a bf16 output and an fp32 one: exact
    assert not Epilogue.build([(g, "bfloat16"), (g * 2.0, "float32")]).fast_nodes
    # a statistic of it: exact
    assert not Epilogue.build([(g, "bfloat16"), (g * g, "float32", "row_sum")]).fast_nodes
    # a predicate of it: exact
    assert not Epilogue.build([(g, "bfloat16"), (ops.gt(g, 0.0), "bool")]).fast_nodes
    # through more float arithmetic into fp16: fast
    ep = Epilogue.build([(ops.silu(x) * operand("up", "tile") + 1.0, "float16")])
    assert [ep.nodes[i].op for i in ep.fast_nodes] == ["silu"]
    # rounded to bf16 before an fp32 output, a statistic or a group max reads it: fast (the
    # quantize step's scales read the rounded output), but not without the cast
    y = ops.cast(g, dtype="bfloat16")
    for ep in (
        Epilogue.build([(y * 2.0, "float32")]),
        Epilogue.build([(y, "bfloat16"), (y * y, "float32", "row_sum")]),
        quantized_groups(Epilogue.build([(g, "bfloat16")]), 16),
    ):
        assert [ep.nodes[i].op for i in ep.fast_nodes] == ["gelu"], ep.text()
    assert not Epilogue.build([(ops.cast(g, dtype="float32") * 2.0, "float32")]).fast_nodes
    # a predicate keeps the exact form through a cast
    assert not Epilogue.build([(ops.gt(y, 0.5), "bool")]).fast_nodes
    assert not Epilogue.build([(y, "bfloat16"), (ops.gt(y * 2.0, 0.5), "bool")]).fast_nodes


def test_fast_forms_render_only_for_fast_nodes() -> None:
    from epilab.ir.problem import OperandSpec, Problem, Shape
    from epilab.templates.gemm.matmul import KIND
    from epilab.templates.registry import template_hash
    from epilab.templates.runtime.render import render

    def source(out_dtype: str) -> str:
        ep = Epilogue.build([(ops.gelu_tanh(acc() + operand("bias", "row")), out_dtype)])
        problem = Problem(
            "addmm",
            "matmul",
            template_hash("matmul", ep),
            "bfloat16",
            "row",
            "col",
            (OperandSpec("bias", "bfloat16", "vector"),),
            ep,
            Shape(1, 64, 64, 64),
        )
        return render(KIND, problem, Config(64, 64, 32), target="cuda")

    assert "= fast_gelu_tanh(" in source("bfloat16")
    assert "= fast_gelu_tanh(" not in source("float32")
    assert "tanh.approx.f32" in source("bfloat16")  # the helper is in the module, over inline PTX
