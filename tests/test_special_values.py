"""Every rule of the pointwise table (``rules.py``) against torch over special values: +-0,
+-inf, NaN, subnormals, tiny and huge numbers, in every argument, and attributes that are
themselves special (a NaN or infinite clamp bound, slope or exponent).

A rule runs inside a real kernel: its first argument is the accumulator of a K = 1 product
(``x @ ones``), the others are tile operands, so each output element sees one pair (or
triple) of special values. The kernel also stores the accumulator it saw, and torch's own
fp32 computation over that is the reference (``always``, imported and transferred records
never pass through the tuner's float64 check, so a form must be right by itself): the same
NaNs, the same infinities, the same predicates, finite values within a few units in the last
place (on the GPU, the few more of its transcendental instructions). The fast forms keep the
bound ``tests/test_fast_math.py`` states and checks over every 16-bit input, special values
included.
"""

from __future__ import annotations

import math

import pytest
import torch

from epilab.ir.epilogue import Epilogue, acc, apply, operand, ops
from epilab.ir.rules import DTYPES, RULES
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import default_config, launch

SPECIALS = [
    0.0, -0.0, math.inf, -math.inf, math.nan,
    1.4e-45, -1.4e-45, 1e-40, -1e-40,  # subnormals (the smallest, and one in the middle)
    1.2e-38, 1e-30, -1e-30, 1e-8, -1e-8,  # the smallest normal, tiny
    0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 20.0, -20.0, 100.0, -100.0,
    3.0e38, -3.0e38,  # huge: squares and exponentials overflow
]  # fmt: skip
# attributes as a user or an imported record may give them: ordinary, then special
ATTRS: dict[str, list[dict[str, float]]] = {
    "clamp": [
        {"min": -1.0, "max": 6.0},
        {"min": -1.0, "max": math.nan},
        {"min": math.nan, "max": 1.0},
        {"min": -math.inf, "max": math.inf},
        {"min": 2.0, "max": -2.0},  # min above max: torch gives max
    ],
    "clamp_min": [{"min": 0.5}, {"min": math.nan}, {"min": -math.inf}, {"min": math.inf}],
    "clamp_max": [{"max": 0.5}, {"max": math.nan}, {"max": math.inf}, {"max": -math.inf}],
    "hardtanh": [
        {"min_val": -1.0, "max_val": 1.0},
        {"min_val": math.nan, "max_val": 1.0},
        {"min_val": -1.0, "max_val": math.nan},
        {"min_val": -math.inf, "max_val": math.inf},
    ],
    "leaky_relu": [{"negative_slope": 0.01}, {"negative_slope": math.nan}, {"negative_slope": math.inf}],
    "pow": [
        {"exponent": e}
        for e in (
            0.0,
            1.0,
            2.0,
            3.0,
            4.0,
            -3.0,
            0.5,
            -0.5,
            -1.0,
            -2.0,
            1.5,
            -1.5,
            1.7,
            math.inf,
            -math.inf,
            math.nan,
        )
    ],
    "cast": [{"dtype": d} for d in DTYPES],  # type: ignore[dict-item]
}


# a NaN bound gives NaN, as torch.clamp with both bounds and Inductor's lowering give; eager
# clamp_min / clamp_max with a NaN bound return x on torch 2.11 (CPU and CUDA), NaN on 2.13's CPU
NAN_BOUNDED = ("clamp", "clamp_min", "clamp_max", "hardtanh")


def _cases():
    for name in sorted(RULES):
        for attrs in ATTRS.get(name, [{}]):
            label = ",".join(f"{k}={v}" for k, v in attrs.items())
            yield pytest.param(name, attrs, id=f"{name}[{label}]" if label else name)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _run(name: str, attrs: dict, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the kernel's result, torch's in fp32 and in float64 over the accumulator it saw)."""
    rule = RULES[name]
    n = len(SPECIALS)
    x = torch.tensor(SPECIALS, dtype=torch.float32).reshape(n, 1)
    # argument i > 0 sees special j on column j (rolled for the third argument)
    y = torch.tensor(SPECIALS, dtype=torch.float32).expand(n, n).contiguous()
    z = y.roll(7, dims=1).contiguous()
    pool = [acc(), operand("y", "tile"), operand("z", "tile")]
    args = [ops.ne(pool[i], 0.0) if rule.arg_kind(i) == "bool" else pool[i] for i in range(rule.arity)]
    kind = "bool" if rule.kind == "bool" or attrs.get("dtype") == "bool" else "float32"
    ep = Epilogue.build([(apply(name, *args, **attrs), kind), (acc(), "float32")])
    operands = {k: t.to(device) for k, t in (("y", y), ("z", z)) if k in dict(ep.operands)}
    a, b = x.to(device), torch.ones(1, n, device=device)
    problem = make_problem(a, b, ep, operands)
    target = "cuda" if device == "cuda" else "interpreter"
    got, seen = launch(problem, default_config(problem, target), a, b, operands)
    torch_args = [seen, *(operands[k] for k in ("y", "z")[: rule.arity - 1])]
    torch_args = [t != 0 if rule.arg_kind(i) == "bool" else t for i, t in enumerate(torch_args)]
    want = rule.torch(*torch_args, **attrs)
    exact = rule.torch(*(t.double() if t.is_floating_point() else t for t in torch_args), **attrs)
    if kind == "float32":
        want, exact = want.to(torch.float32), exact.double()
    if name in NAN_BOUNDED and any(math.isnan(v) for v in attrs.values()):
        want, exact = torch.full_like(want, math.nan), torch.full_like(exact, math.nan)
    return got, want, exact


def check_like_torch(
    name: str, attrs: dict, got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, rel: float
) -> None:
    """``got`` as torch's fp32 ``want``: the same predicates, NaNs and infinities; a finite
    value within ``rel`` of ``want``, or no further from the float64 ``exact`` than ``want``
    is (plus ``rel``): torch's own fp32 forms cancel at places (gelu_tanh's 1 + tanh)."""
    where = f"{name}{attrs or ''}"
    if want.dtype == torch.bool:
        bad = got != want
    else:
        got, want = got.double(), want.double()
        slack = rel * want.abs() + 2.0**-126
        # torch's own fp32 NaN or infinity where its float64 has another value (the vectorized
        # CPU gelu of torch 2.13 on some hosts: gelu(inf) = nan, gelu(3e38) = inf, while float64
        # and the scalar path give inf and 3e38): ours must then be the float64 value
        to_exact = (got == exact) | ((got - exact).abs() <= rel * exact.abs() + 2.0**-126)
        torch_slip = ~torch.isfinite(want) & ~exact.isnan() & (want != exact) & to_exact
        same = (got == want) | (got.isnan() & want.isnan()) | torch_slip
        near = ((got - want).abs() <= slack) | ((got - exact).abs() <= (want - exact).abs() + slack)
        bad = ~(same | (torch.isfinite(want) & torch.isfinite(got) & near))
    if bad.any():
        i, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{where}: {int(bad.sum())} of {bad.numel()} values differ from torch; first at "
            f"args ({SPECIALS[i]!r}, {SPECIALS[j]!r}): got {got[i, j].item()!r}, torch {want[i, j].item()!r}"
        )


@pytest.mark.parametrize("name,attrs", list(_cases()))
def test_rule_matches_torch_on_special_values(name: str, attrs: dict) -> None:
    device = _device()
    got, want, exact = _run(name, attrs, device)
    check_like_torch(name, attrs, got.cpu(), want.cpu(), exact.cpu(), rel=1e-5 if device == "cuda" else 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name,attrs", list(_cases()))
def test_rule_matches_torch_on_special_values_gpu(name: str, attrs: dict) -> None:
    test_rule_matches_torch_on_special_values(name, attrs)


def test_every_rule_has_special_value_cases() -> None:
    assert {p.values[0] for p in _cases()} == set(RULES)
