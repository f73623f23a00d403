"""The epilogue IR: canonical text, JSON round trips, validation, and the rule
table's two forms (Triton through a real kernel, torch as the reference)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from epilab.ir.check import rel_error
from epilab.ir.epilogue import Epilogue, Node, Output, acc, apply, const, operand, ops
from epilab.ir.rules import DTYPES, RULES
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import default_config, launch


def _gelu_block() -> Epilogue:
    x = acc() + operand("bias", "row")
    return Epilogue.build([(ops.gelu_tanh(x) + operand("res", "tile"), "bfloat16"), (x, "float32")])


# ---------------------------------------------------------------- canonical


def test_structurally_equal_epilogues_have_equal_text():
    bias = operand("bias", "row")
    one = Epilogue.build([(ops.relu(acc() + bias) * 2.0, "float16")])
    # same structure, built the other way round (commutative args) and with fresh leaf objects
    two = Epilogue.build([(2.0 * ops.relu(operand("bias", "row") + acc()), "float16")])
    assert one.text() == two.text()
    assert one == two


def test_different_epilogues_have_different_text():
    base = acc() + operand("bias", "row")
    texts = {
        Epilogue.build([(ops.relu(base), "float16")]).text(),
        Epilogue.build([(ops.relu(base), "bfloat16")]).text(),
        Epilogue.build([(ops.gelu(base), "float16")]).text(),
        Epilogue.build([(acc() - operand("bias", "row"), "float16")]).text(),
        Epilogue.build([(operand("bias", "row") - acc(), "float16")]).text(),  # sub is not commutative
        Epilogue.build([(acc() + operand("bias", "col"), "float16")]).text(),
        Epilogue.build([(ops.leaky_relu(acc(), negative_slope=0.01), "float16")]).text(),
        Epilogue.build([(ops.leaky_relu(acc(), negative_slope=0.02), "float16")]).text(),
    }
    assert len(texts) == 8


def test_shared_subexpressions_become_one_node():
    x = acc() + operand("bias", "row")
    ep = Epilogue.build([(x * ops.sigmoid(x), "float32"), (x, "float32")])
    assert [n.op for n in ep.nodes] == ["acc", "operand", "add", "sigmoid", "mul"]
    assert ep.outputs[1].node == 2


def test_text_is_stable_across_processes():
    code = (
        "from epilab.ir.epilogue import *\n"
        "x = acc() + operand('bias', 'row')\n"
        "y = ops.gelu_tanh(x) + operand('res', 'tile')\n"
        "print(Epilogue.build([(y, 'bfloat16'), (x, 'float32')]).text())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _gelu_block().text()


def test_constants_fold_and_bools_are_cast():
    ep = Epilogue.build([(acc() * (ops.sqrt(4.0) + 1.0), "float32")])
    assert [n.op for n in ep.nodes] == ["acc", "const", "mul"]
    assert ep.nodes[1].attr["value"] == 3.0
    masked = Epilogue.build([(acc() * ops.gt(acc(), 0.0), "float32")])  # bool into arithmetic
    assert "cast[dtype=float32]" in masked.text()
    chosen = Epilogue.build([(ops.where(acc(), acc(), 1.0), "float32")])  # float as a predicate
    assert "cast[dtype=bool]" in chosen.text()


# --------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    "make",
    [
        _gelu_block,
        lambda: Epilogue.build([(ops.clamp(acc(), min=-math.inf, max=6.0), "float16")]),
        lambda: Epilogue.build(
            [
                (ops.where(ops.gt(acc(), operand("t", "tile")), acc(), math.nan), "float32"),
                (ops.le(acc(), 0.0), "bool"),
            ]
        ),
        lambda: Epilogue.build(
            [(ops.cast(ops.pow(acc(), exponent=3), dtype="bfloat16") * operand("s", "scalar"), "float32")]
        ),
    ],
    ids=["gelu-block", "inf-attr", "nan-const-bool-out", "cast-pow-scalar"],
)
def test_json_round_trip(make):
    ep = make()
    again = Epilogue.from_json(ep.to_json())
    assert again == ep and again.text() == ep.text()


@pytest.mark.parametrize(
    "bad,match",
    [
        ('{"nodes": [["acc", [], {}]], "outputs": []}', "at least one output"),
        (
            '{"nodes": [["acc", [], {}], ["system", [0], {}]], "outputs": [[1, "float32"]]}',
            "unknown epilogue op",
        ),
        ('{"nodes": [["acc", [], {}], ["add", [0, 5], {}]], "outputs": [[1, "float32"]]}', "earlier nodes"),
        ('{"nodes": [["acc", [], {}]], "outputs": [[0, "float64"]]}', "output dtype"),
        ('{"nodes": [["acc", [], {}], ["pow", [0], {}]], "outputs": [[1, "float32"]]}', "attributes"),
        (
            '{"nodes": [["acc", [], {}], ["pow", [0], {"exponent": "__import__"}]],'
            ' "outputs": [[1, "float32"]]}',
            "must be a number",
        ),
        (
            '{"nodes": [["operand", [], {"broadcast": "row", "name": "x; import os"}], ["acc", [], {}],'
            ' ["add", [1, 0], {}]],'
            ' "outputs": [[2, "float32"]]}',
            "not allowed",
        ),
        (
            '{"nodes": [["operand", [], {"broadcast": "row", "name": "b"}]], "outputs": [[0, "float32"]]}',
            "does not depend on the accumulator",
        ),
        ('{"nodes": 5}', "not a valid epilogue"),
    ],
)
def test_invalid_epilogue_json_is_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        Epilogue.from_json(bad)


def test_an_operands_broadcast_stored_as_its_old_name_reads_as_it_was_meant():
    """Until revision 0009 an operand's row/col/tile/scalar was stored as ``kind``: such JSON
    (an old export, cache or database row) reads as the same epilogue, written anew."""
    ep = Epilogue.build([(ops.relu(acc() + operand("bias", "row")) * operand("s", "scalar"), "float16")])
    old = ep.to_json().replace('"broadcast":', '"kind":')
    assert '"kind":"row"' in old and Epilogue.from_json(old) == ep
    assert (
        Epilogue.from_json(old).to_json() == ep.to_json() and "operand[broadcast=row,name=bias]" in ep.text()
    )
    with pytest.raises(ValueError, match="takes attributes"):  # not both names at once
        Epilogue.from_json(ep.to_json().replace('"broadcast":"row",', '"broadcast":"row","kind":"row",'))
    with pytest.raises(ValueError, match="operand broadcast 'diagonal' is not one of"):
        operand("x", "diagonal")


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match="must be bool"):
        Epilogue((Node("acc"), Node("logical_not", (0,))), (Output(1, "bool"),))
    with pytest.raises(ValueError, match="used both as row and tile"):
        Epilogue.build([(acc() + operand("x", "row") + operand("x", "tile"), "float32")])
    with pytest.raises(ValueError, match="unknown epilogue op"):
        apply("softmax", acc())
    with pytest.raises(ValueError, match="takes 2 argument"):
        apply("add", acc())
    with pytest.raises(AttributeError, match="no epilogue op"):
        ops.not_an_op  # noqa: B018


# ----------------------------------------------------------- every rule, both forms

_POSITIVE = {"log", "sqrt", "rsqrt", "reciprocal", "log1p"}
_EXPONENTS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.5, -0.5, -1.0, -2.0, 1.7]


def _rule_cases():
    for name, rule in sorted(RULES.items()):
        if name == "pow":
            for e in _EXPONENTS:
                yield pytest.param(name, {"exponent": e}, id=f"pow-{e}")
        elif name == "cast":
            for dt in DTYPES:
                yield pytest.param(name, {"dtype": dt}, id=f"cast-{dt}")
        elif rule.attrs:
            values = {"negative_slope": 0.1, "min": -0.7, "max": 0.4, "min_val": -0.3, "max_val": 0.9}
            yield pytest.param(name, {a: values[a] for a in rule.attrs}, id=name)
        else:
            yield pytest.param(name, {}, id=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name,attrs", list(_rule_cases()))
def test_rule_triton_and_torch_forms_agree(name, attrs, device):
    """Each rule inside a real kernel (acc = x exactly, via K=1 and B=1) vs its torch form in float64."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    m, n = 33, 47
    x = torch.randn(m, 1, generator=gen) * 3
    if name in _POSITIVE:
        x = x.abs() + 0.05
    if name == "pow" and not float(attrs["exponent"]).is_integer():
        x = x.abs() + 0.05
    b = torch.ones(1, n)
    y = torch.randn(m, n, generator=gen) * 3
    z = torch.randn(m, n, generator=gen)
    if name == "div":
        y = y.sign() * (y.abs() + 0.1)
    rule = RULES[name]
    pool = [acc(), operand("y", "tile"), operand("z", "tile")]
    args = [ops.gt(pool[i], 0.0) if rule.arg_kind(i) == "bool" else pool[i] for i in range(rule.arity)]
    expr = apply(name, *args, **attrs)
    kind = "bool" if rule.kind == "bool" or attrs.get("dtype") == "bool" else "float32"
    ep = Epilogue.build([(expr, kind)])
    operands = {nm: t.to(device) for nm, t in (("y", y), ("z", z)) if nm in dict(ep.operands)}
    x, b = x.to(device), b.to(device)
    problem = make_problem(x, b, ep, operands)
    target = "cuda" if device == "cuda" else "interpreter"
    (out,) = launch(problem, default_config(problem, target), x, b, operands)
    (ref,) = ep.evaluate(x.double() @ b.double(), {k: v.double() for k, v in operands.items()})
    if kind == "bool":
        assert torch.equal(out, ref), f"{name}: {(out != ref).sum()} predicates differ"
        return
    # GPU transcendentals are within a few ulp; the interpreter rounds fp32 -> bf16 by
    # truncation (Triton 3.6), up to one bf16 ulp where the GPU rounds to nearest.
    bound = 2e-6 if device == "cpu" else 1e-5
    if device == "cpu" and attrs.get("dtype") == "bfloat16":
        bound = 2.0**-7
    err = rel_error(out, ref)
    assert err < bound, f"{name}{attrs}: ||triton-torch||/||torch|| = {err:.2e} >= {bound:.1e}"


def test_nan_propagates_like_torch():
    """maximum/minimum/relu/clamp keep NaN, as torch does."""
    x = torch.tensor([[math.nan], [1.0], [-1.0]])
    b = torch.ones(1, 16)
    exprs = [
        ops.maximum(acc(), 0.0),
        ops.minimum(acc(), 0.0),
        ops.relu(acc()),
        ops.clamp(acc(), min=0, max=0.5),
        ops.hardtanh(acc(), min_val=-0.5, max_val=0.5),
        ops.leaky_relu(acc(), negative_slope=0.1),
    ]
    ep = Epilogue.build([(e, "float32") for e in exprs])
    problem = make_problem(x, b, ep, {})
    outs = launch(problem, default_config(problem, "interpreter"), x, b, {})
    refs = ep.evaluate(x.double() @ b.double(), {})
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        assert torch.equal(o.isnan(), r.isnan()), f"output {i}: NaN pattern differs"
        assert rel_error(o, r) < 1e-6


def test_every_rule_is_covered_by_the_agreement_test():
    covered = {p.values[0] for p in _rule_cases()}
    assert covered == set(RULES)


def test_constant_only_output_is_rejected():
    with pytest.raises(ValueError, match="does not depend on the accumulator"):
        Epilogue.build([(const(1.0) + 2.0, "float32")])


def test_row_totals_sum_over_whole_rows_and_are_never_folded():
    from epilab.ir.epilogue import row_total
    from epilab.ir.epilogue_text import parse_epilogue

    x = acc() + operand("bias", "row")
    centred = x - row_total(x) / row_total(1.0)  # the row's length is the row total of 1
    ep = Epilogue.build(
        [(centred * ops.rsqrt(row_total(centred * centred) / row_total(1.0) + 1e-5), "float32")]
    )
    assert ep.row_totals and not Epilogue.identity("float32").row_totals
    assert ep.text().count("row_total") == 3  # row_total of the constant 1 is kept: it is N, not 1
    a, bias = torch.randn(5, 7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    (got,) = ep.evaluate(a, {"bias": bias})
    want = torch.nn.functional.layer_norm(a + bias, (7,), eps=1e-5)
    assert torch.allclose(got, want, atol=1e-12)
    # a column vector is broadcast over the row before it is summed
    (col,) = Epilogue.build([(acc() + row_total(operand("s", "col")), "float32")]).evaluate(
        torch.zeros(2, 3, dtype=torch.float64), {"s": torch.tensor([[1.0], [2.0]], dtype=torch.float64)}
    )
    assert col.tolist() == [[3.0] * 3, [6.0] * 3]
    assert Epilogue.from_json(ep.to_json()) == ep
    assert parse_epilogue([("acc - row_total(acc) / 7", None)], "float32").row_totals
    lines, _ = ep.triton_lines({"acc": "acc", "bias": "op_bias"}, col_mask="mask_n")
    assert all("tl.where(mask_n[None, :]" in e for _, e in lines if "tl.sum" in e)
    with pytest.raises(ValueError, match="column mask"):
        ep.triton_lines({"acc": "acc", "bias": "op_bias"})
    # a predicate is summed as 0.0 / 1.0 (a cast is inserted), and the node takes one argument
    counted = Epilogue.build([(acc() + row_total(ops.gt(acc(), 0.0)), "float32")])
    assert "cast[dtype=float32]" in counted.text()
    with pytest.raises(ValueError, match="takes 1 argument"):
        Epilogue.from_dict(
            {"nodes": [["acc", [], {}], ["row_total", [0, 0], {}]], "outputs": [[1, "float32"]]}
        )
