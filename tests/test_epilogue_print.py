"""Epilogues as users read them (``ir/epilogue_print.readable``): the shortest text the
language parses back to the same epilogue (as far as performance goes), named ops recognised,
one round trip text -> epilogue -> text for every catalog entry, random trees and the zoo's
epilogues (``test_zoo.py`` checks each compiled model's)."""

from __future__ import annotations

import random

import pytest

from epilab.ir.catalog import EPILOGUES, epilogue
from epilab.ir.epilogue import Epilogue, Expr, acc, acc2, const, operand, ops, row_total
from epilab.ir.epilogue_print import number, readable
from epilab.ir.epilogue_text import parse_text
from epilab.ir.patterns import identity
from epilab.ir.problem import Problem


def round_trips(ep: Epilogue, dtype: str) -> str:
    """``ep``'s text, checked to parse back to ``ep``'s identity and to print the same."""
    text = readable(ep, dtype)
    back = parse_text(text, dtype)
    assert identity(back) == identity(ep), (text, back.text(), ep.text())
    assert readable(back, dtype) == text
    return text


@pytest.mark.parametrize("name", list(EPILOGUES))
def test_every_catalog_epilogue_round_trips(name):
    text = round_trips(epilogue(name, "bfloat16"), "bfloat16")
    assert "%" not in text and "operand[" not in text  # no IR


@pytest.mark.parametrize(
    "build, text",
    [
        (lambda: ops.gelu_tanh(acc() + operand("bias", "row")), "gelu_tanh(acc + bias[n])"),
        (lambda: acc2() * ops.silu(acc()), "silu(acc) * acc2"),  # the accumulator first
        (
            lambda: (
                ops.relu(acc() * operand("scale", "row") + operand("shift", "row"))
                + operand("residual", "tile")
            ),
            "relu(acc * scale[n] + shift[n]) + residual",
        ),
        (lambda: 0.5 * acc() + -2.0 * operand("bias", "row"), "0.5 * acc + -2 * bias[n]"),
        (lambda: acc() * operand("s", "scalar") + 1.0, "acc * s[] + 1"),  # constant factors first, terms last
        (lambda: -(acc() * operand("w", "col")), "-(acc * w[m])"),
        (lambda: ops.pow(-acc(), exponent=2.0), "(-acc) ** 2"),
        (lambda: acc() - (operand("a", "row") - operand("b", "row")), "acc - (a[n] - b[n])"),
        (lambda: acc() / (acc() * operand("c", "row")), "acc / (acc * c[n])"),
        (lambda: ops.clamp(acc(), min=-1.5, max=2.0), "clamp(acc, min=-1.5, max=2)"),
        (lambda: ops.leaky_relu(acc(), negative_slope=0.01), "leaky_relu(acc, 0.01)"),
        (lambda: ops.maximum(acc(), operand("b", "row")), "max(acc, b[n])"),
        (lambda: acc() * row_total(acc() * acc()), "acc * row_total(acc * acc)"),
    ],
)
def test_the_text_is_what_a_person_writes(build, text):
    assert round_trips(Epilogue.build([(build(), "float16")]), "float16") == text


def test_decomposed_activations_print_as_their_names():
    x = acc() + operand("bias", "row")
    decomposed = {  # as AOTAutograd and Inductor's decompositions leave them
        "gelu_tanh": 0.5 * x * (1.0 + ops.tanh(0.7978845608028654 * (x + 0.044715 * (x * (x * x))))),
        "silu": x / (1.0 + ops.exp(-x)),
        "relu6": Expr("clamp_max", (Expr("clamp_min", (x,), (("min", 0.0),)),), (("max", 6.0),)),
        "hardswish": x * ops.clamp(x + 3.0, min=0.0, max=6.0) / 6.0,
        "hardsigmoid": ops.clamp(x + 3.0, min=0.0, max=6.0) / 6.0,
        "mish": x * ops.tanh(ops.where(ops.gt(x, 20.0), x, ops.log1p(ops.exp(x)))),
    }
    for name, e in decomposed.items():
        ep = Epilogue.build([(e, "bfloat16")])
        assert round_trips(ep, "bfloat16") == f"{name}(acc + bias[n])", name


def test_rounding_casts_are_left_out_and_other_dtypes_said():
    x = ops.cast(acc() + operand("bias", "row"), dtype="bfloat16")  # stored and reloaded
    ep = Epilogue.build([(ops.gelu(ops.cast(x, dtype="float32")), "bfloat16"), (acc(), "float32")])
    assert round_trips(ep, "bfloat16") == "gelu(acc + bias[n]) ; acc -> float32"
    assert readable(ep, None) == "gelu(acc + bias[n]) -> bfloat16 ; acc -> float32"  # no default: each said


def test_reductions_and_groups_say_their_kind():
    ep = Epilogue.build(
        [
            (acc(), "bfloat16"),
            (acc() * acc(), "float32", "row_sum"),
            (ops.abs(acc()), "float32", "group_max", 128),
        ]
    )
    assert round_trips(ep, "bfloat16") == "acc ; acc * acc -> row_sum ; abs(acc) -> group_max[128]"


def test_constants_print_as_the_shortest_text_that_reads_back():
    for v in [0.0, -0.0, 1.0, -3.0, 0.1, 1e-6, 0.7978845608028654, 1e300, float("inf"), float("-inf")]:
        back = parse_text(f"acc * {number(v)}", "float32")
        assert back == Epilogue.build([(acc() * const(v), "float32")]), v
    assert number(2.0) == "2" and number(0.5) == "0.5" and number(float("nan")) == "nan"


def _random_tree(rng: random.Random, depth: int) -> Expr:
    leaves = [
        acc,
        lambda: operand("bias", "row"),
        lambda: operand("w", "col"),
        lambda: operand("residual", "tile"),
        lambda: operand("s", "scalar"),
        lambda: const(rng.choice([0.5, 2.0, -1.0, 3.0])),
    ]
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(leaves)()
    a, b = _random_tree(rng, depth - 1), _random_tree(rng, depth - 1)
    return rng.choice(
        [
            lambda: a + b,
            lambda: a - b,
            lambda: a * b,
            lambda: a / b,
            lambda: -a,
            lambda: ops.pow(a, exponent=rng.choice([2.0, -0.5, 3.0])),
            lambda: ops.relu(a),
            lambda: ops.tanh(a),
            lambda: ops.where(ops.gt(a, b), a, b),
            lambda: ops.maximum(a, b),
            lambda: ops.clamp(a, min=-1.0, max=1.0),
        ]
    )()


def test_random_trees_round_trip():
    rng = random.Random(0)
    checked = 0
    while checked < 300:
        e = _random_tree(rng, 4) + acc() * rng.choice([1.0, 0.5])  # every output reads acc
        try:
            ep = Epilogue.build([(e, "float32")])
        except ValueError:
            continue
        round_trips(ep, "float32")
        checked += 1


def test_a_problem_and_a_label_show_the_text():
    from epilab.policy.suites import problem_label
    from epilab.templates.gemm.gemm_spec import Spec

    spec = Spec(m=64, n=32, k=16, dtype="bfloat16", layout="NT", epilogue="bias_gelu_tanh")
    problem: Problem = spec.problem()
    assert problem.epilogue_text() == "gelu_tanh(acc + bias[n])"
    assert spec.label().endswith("bfloat16 row/col gelu_tanh(acc + bias[n])")
    assert problem_label(problem) == "addmm 64x32x16 bfloat16 row/col gelu_tanh(acc + bias[n])"


@pytest.mark.parametrize(
    "text, says",
    [
        ("acc -> float64", "after '->' write a dtype"),
        ("acc -> row_mean", "row_sum"),
        ("acc -> group_max[3]", "power of two"),
        ("group_max(acc)", "group's size"),
    ],
)
def test_output_annotations_refuse_what_they_do_not_know(text, says):
    with pytest.raises(ValueError, match=r"(?s).*" + says.replace("[", r"\[")):
        parse_text(text, "bfloat16")
