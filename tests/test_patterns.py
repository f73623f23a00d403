"""Decomposed activations back to named ops (``recognise``: same values) and the performance
identity of an epilogue (``identity``: what a record is shared by)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epilab.ir.epilogue import Epilogue, Expr, acc, operand, ops
from epilab.ir.epilogue_text import parse_epilogue
from epilab.ir.patterns import identity, recognise


def _rounded(x: Expr, dtype: str = "bfloat16") -> Expr:
    """What the unfused graph does to a value it stores and reloads: round, then fp32."""
    return ops.cast(ops.cast(x, dtype="bfloat16" if dtype == "bfloat16" else dtype), dtype="float32")


BIAS = acc() + operand("bias", "row")

# (the form the compiler sees, with the graph's rounding, as the post-grad graph has it;
#  the same math as text)
FORMS = {
    "gelu_tanh": (
        lambda y: 0.5 * y * (1.0 + ops.tanh(0.7978845608028654 * (y + 0.044715 * (y * (y * y))))),
        "gelu_tanh(acc + bias[n])",
    ),
    "gelu": (lambda y: (y * 0.5) * (1.0 + ops.erf(y * 0.7071067811865476)), "gelu(acc + bias[n])"),
    "silu": (lambda y: y / (1.0 + ops.exp(-y)), "silu(acc + bias[n])"),
    "silu_sigmoid": (lambda y: y * ops.sigmoid(y), "silu(acc + bias[n])"),
    "sigmoid": (lambda y: 1.0 / (1.0 + ops.exp(-y)), "sigmoid(acc + bias[n])"),
    "relu": (lambda y: ops.clamp_min(y, min=0.0), "relu(acc + bias[n])"),
    "relu6": (
        lambda y: ops.clamp_max(ops.clamp_min(y, min=0.0), max=6.0),
        "clamp(acc + bias[n], min=0, max=6)",
    ),
    "hardtanh": (lambda y: ops.hardtanh(y, min_val=-1.0, max_val=1.0), "clamp(acc + bias[n], min=-1, max=1)"),
    "leaky_relu": (
        lambda y: ops.where(ops.gt(y, 0.0), y, y * 0.01),
        "leaky_relu(acc + bias[n], negative_slope=0.01)",
    ),
}


def _values(ep: Epilogue) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(37, 29, generator=gen, dtype=torch.float64) * 4
    operands = {name: torch.randn(29, generator=gen, dtype=torch.float64) for name, _ in ep.operands}
    return ep.evaluate(a, operands)


@pytest.mark.parametrize("name", list(FORMS))
def test_the_compilers_forms_are_recognised_with_their_values_kept(name):
    form, text = FORMS[name]
    graph = Epilogue.build([(ops.cast(form(_rounded(BIAS)), dtype="bfloat16"), "bfloat16")])
    named = recognise(graph)
    assert len(named.nodes) < len(graph.nodes)
    for got, want in zip(_values(named), _values(graph), strict=True):  # as stored: bf16
        torch.testing.assert_close(got.to(torch.bfloat16), want.to(torch.bfloat16), rtol=8e-3, atol=1e-6)
    # the performance identity: the text's epilogue, rounding or not
    assert identity(graph) == identity(parse_epilogue([(text, None)], "bfloat16"))


def test_only_equal_math_is_rewritten():
    y = BIAS
    near_miss = [
        0.5 * y * (1.0 + ops.tanh(0.8 * (y + 0.044715 * (y * (y * y))))),  # another constant
        ops.clamp_max(ops.clamp_min(y, min=6.0), max=0.0),  # min above max: not a clamp
        ops.where(ops.gt(y, 0.0), y, acc() * 0.01),  # the negative side is another value
        y / (1.0 + ops.exp(-acc())),  # silu of another value
    ]
    for e in near_miss:
        ep = Epilogue.build([(e, "float32")])
        assert recognise(ep) == ep, ep.text()


def test_identity_drops_rounding_and_names_operands_by_kind():
    rounded = Epilogue.build(
        [(ops.relu(ops.cast(acc() + operand("r", "tile"), dtype="bfloat16")), "bfloat16")]
    )
    plain = Epilogue.build([(ops.relu(acc() + operand("residual", "tile")), "bfloat16")])
    assert rounded != plain and identity(rounded) == identity(plain)
    assert identity(plain).operands == (("tile0", "tile"),)
    # a predicate stored as a float keeps its cast: it is not rounding
    mask = Epilogue.build([(ops.cast(ops.gt(acc(), 0.0), dtype="float32"), "float32")])
    assert identity(mask) == mask
    # outputs keep their dtypes: the bytes written are part of the identity
    fp32 = Epilogue.build([(ops.relu(acc() + operand("residual", "tile")), "float32")])
    assert identity(fp32) != identity(plain)


@pytest.mark.usefixtures("fresh_compiler")
def test_a_compiled_gelu_has_the_identity_of_its_text(tmp_path):
    import epilab
    from epilab.db import TuningDB
    from epilab.ir.problem import Problem

    w, b = torch.randn(24, 16, dtype=torch.bfloat16), torch.randn(24, dtype=torch.bfloat16)
    db = str(tmp_path / "t.db")
    with torch.no_grad():
        torch.compile(
            lambda x: F.gelu(x @ w.t() + b, approximate="tanh"), backend="epilab", options={"db": db}
        )(torch.randn(8, 16, dtype=torch.bfloat16))
    (decision,) = epilab.explain()
    with TuningDB.open(db) as store:
        problem = Problem.from_json(store.problem_json(decision.problem_key)[1])
    assert "tanh" in problem.epilogue.text() and "gelu_tanh" not in problem.epilogue.text()  # decomposed
    assert identity(problem.epilogue) == identity(
        parse_epilogue([("gelu_tanh(acc + bias[n])", None)], "bfloat16")
    )


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize(
    "text,act",
    [
        ("hardswish(acc + bias[n])", F.hardswish),
        ("hardsigmoid(acc + bias[n])", F.hardsigmoid),
        ("relu6(acc + bias[n])", F.relu6),
        ("softplus(acc + bias[n])", F.softplus),
        ("mish(acc + bias[n])", F.mish),
    ],
)
def test_activations_without_an_op_have_the_identity_of_their_text(tmp_path, text, act):
    import epilab
    from epilab.db import TuningDB
    from epilab.ir.problem import Problem

    w, b = torch.randn(24, 16, dtype=torch.bfloat16), torch.randn(24, dtype=torch.bfloat16)
    db = str(tmp_path / "t.db")
    with torch.no_grad():
        torch.compile(lambda x: act(x @ w.t() + b), backend="epilab", options={"db": db})(
            torch.randn(8, 16, dtype=torch.bfloat16)
        )
    (decision,) = epilab.explain()
    with TuningDB.open(db) as store:
        problem = Problem.from_json(store.problem_json(decision.problem_key)[1])
    assert identity(problem.epilogue) == identity(parse_epilogue([(text, None)], "bfloat16")), (
        problem.epilogue.text()
    )
