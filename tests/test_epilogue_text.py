"""Epilogues written as text (``ir/epilogue_text.py``) and shapes files that use them:
the same IR as the builders, operand broadcasts from the index, errors that name the column,
batched and conv2d specs."""

from __future__ import annotations

import contextlib
import random

import pytest

from epilab.ir.catalog import epilogue
from epilab.ir.epilogue import Epilogue, acc, const, operand, ops
from epilab.ir.epilogue_text import MAX_DEPTH, EpilogueSyntaxError, parse_epilogue
from epilab.policy.suites import load_shapes
from epilab.templates.conv.conv_spec import ConvSpec
from epilab.templates.gemm.gemm_spec import Spec

# text -> the catalog entry it writes out
AS_CATALOG = {
    "acc": "none",
    "acc + bias[n]": "bias",
    "relu(acc + bias[n])": "bias_relu",
    "gelu(acc + bias[n])": "bias_gelu",
    "gelu_tanh(acc + bias[n])": "bias_gelu_tanh",
    "silu(bias[n] + acc)": "bias_silu",  # commutative arguments are ordered canonically
    "acc + residual": "residual",
    "acc + bias[n] + residual[m, n]": "bias_residual",
    "gelu_tanh(acc + bias[n]) + residual": "bias_gelu_tanh_residual",
    "relu(acc + bias[n] + residual)": "bias_residual_relu",
    "0.5 * acc + -2.0 * bias[n]": "alpha_beta",
    "acc * scale[m]": "col_vector",
    "acc * s[] + 1": "scalar",
    "relu(acc * scale[n] + shift[n])": "bn_relu",
}


@pytest.mark.parametrize("text", list(AS_CATALOG))
def test_text_gives_the_same_ir_as_the_builders(text):
    assert parse_epilogue([(text, None)], "bfloat16") == epilogue(AS_CATALOG[text], "bfloat16")


def test_outputs_dtypes_attributes_and_predicates():
    got = parse_epilogue(
        [
            ("acc + bias[n]", "float32"),
            ("clamp(acc + bias[n], min=0, max=6) ** 2", None),
            ("acc > 0", "bool"),
        ],
        "float16",
    )
    bias = acc() + operand("bias", "row")
    want = Epilogue.build(
        [
            (bias, "float32"),
            (ops.pow(ops.clamp(bias, min=0.0, max=6.0), exponent=2.0), "float16"),
            (ops.gt(acc(), const(0.0)), "bool"),
        ]
    )
    assert got == want
    assert parse_epilogue([("leaky_relu(acc, 0.01)", None)], "float32") == Epilogue.build(
        [(ops.leaky_relu(acc(), negative_slope=0.01), "float32")]
    )
    assert parse_epilogue([("where(acc > 0, acc, -acc / 2)", None)], "float32") == Epilogue.build(
        [(ops.where(ops.gt(acc(), const(0.0)), acc(), -acc() / 2.0), "float32")]
    )
    assert parse_epilogue([("max(acc, 0) + cast(acc, bfloat16)", None)], "float32") == Epilogue.build(
        [(ops.maximum(acc(), const(0.0)) + ops.cast(acc(), dtype="bfloat16"), "float32")]
    )


@pytest.mark.parametrize(
    "text, col, says",
    [
        ("gelu_tanh(acc + bias[n]", 24, "expected ')' to close the call of gelu_tanh"),
        ("acc + + ", 9, "expected a value"),
        ("foo(acc)", 1, "unknown op 'foo'"),
        ("acc + bias[n] + bias", 17, "read as row and as tile"),
        ("acc $ 2", 5, "unexpected character '$'"),
        ("relu(acc, 3)", 11, "relu takes 1 argument"),
        ("acc ** acc", 5, "an exponent must be a number"),
        ("bias[k] + acc", 1, "index it by [n]"),
        ("", 1, "empty epilogue"),
        ("acc[n]", 4, "acc takes no index"),
        ("clamp(acc, min=0)", 1, "needs the attribute(s) ['max']"),
        ("clamp(acc, low=0, max=1)", 12, "no attribute 'low'"),
        ("relu + acc", 1, "is an op; call it"),
        ("acc < 1 < 2", 9, "comparisons do not chain"),
        ("acc + def[n]", 7, "operand name 'def' is not allowed"),
        ("cast(acc, int8)", 1, "dtype must be one of"),
        ("acc )", 5, "unexpected ')'"),
    ],
)
def test_errors_name_the_column(text, col, says):
    with pytest.raises(EpilogueSyntaxError) as e:
        parse_epilogue([(text, None)], "bfloat16")
    assert e.value.col == col and says in str(e.value), str(e.value)
    assert str(e.value).splitlines()[-1].index("^") == 4 + col - 1  # the caret under the column


def test_an_output_must_depend_on_the_accumulator_and_nesting_is_bounded():
    with pytest.raises(ValueError, match="does not depend on the accumulator"):
        parse_epilogue([("1 + 2", None)], "float32")
    deep = "relu(" * (MAX_DEPTH + 1) + "acc" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(EpilogueSyntaxError, match="nested more than"):
        parse_epilogue([(deep, None)], "float32")


def test_random_text_only_ever_raises_value_errors():
    rng = random.Random(18)
    alphabet = "acc bias[n] m , ( ) + - * / ** < > = 0.5 1e3 relu gelu_tanh where s[] residual \"'$"
    words = alphabet.split(" ")
    for _ in range(3000):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        with contextlib.suppress(ValueError):  # anything else fails the test
            parse_epilogue([(text, None)], "bfloat16")


def test_shapes_file_with_expressions_batches_outputs_and_convolutions(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(
        """[
  {"m": 512, "n": 1024, "k": 256, "epilogue": "gelu_tanh(acc + bias[n]) + residual"},
  {"m": 64, "n": 256, "k": 128, "batch": 4, "epilogue": "silu(acc) * up"},
  {"m": 64, "n": 256, "k": 128, "epilogue": ["acc + bias[n]", {"expr": "gelu(acc + bias[n])", "dtype": "float32"}]},
  {"m": 64, "n": 256, "k": 128, "epilogue": "acc * scale[m] + s[]"},
  {"n": 2, "c": 64, "h": 14, "w": 14, "k": 128, "r": 3, "s": 3, "padding": 1,
   "epilogue": "relu(acc * scale[n] + shift[n])"},
  {"n": 2, "c": 64, "h": 14, "w": 14, "k": 64, "r": 1, "s": 1, "layout": "nchw",
   "epilogue": "relu(acc + bias[n] + residual)"}
]"""
    )
    specs = load_shapes(path)
    problems = [s.problem() for s in specs]
    assert [type(s) for s in specs] == [Spec] * 4 + [ConvSpec] * 2
    assert problems[0].epilogue == epilogue("bias_gelu_tanh_residual", "bfloat16")
    assert problems[0].op == "addmm" and problems[1].op == "bmm" and problems[1].shape.batch == 4
    assert [o.dtype for o in problems[2].epilogue.outputs] == ["bfloat16", "float32"]
    assert {(o.name, o.layout) for o in problems[3].operands} == {("scale", "vector"), ("s", "scalar")}
    assert problems[4].geometry is not None and problems[4].geometry.padding == (1, 1)
    assert dict((o.name, o.layout) for o in problems[5].operands) == {"bias": "vector", "residual": "nchw"}
    assert "silu(acc) * up" in specs[1].label()


def test_a_shapes_file_takes_the_dtype_names_input_takes(tmp_path):
    """`--input 8x64:bf16` and `"dtype": "bf16"`: one set of dtype names (``DTYPE_ALIASES``)."""
    f = tmp_path / "s.json"
    f.write_text('[{"m": 8, "n": 8, "k": 8, "dtype": "bf16"}, {"m": 8, "n": 8, "k": 8, "dtype": "FP16"}]')
    short, upper = (s.problem() for s in load_shapes(str(f)))
    assert short == Spec(8, 8, 8, dtype="bfloat16").problem() and upper.dtype == "float16"


@pytest.mark.parametrize(
    "body, says",
    [
        (
            '{"m": 8, "n": 8, "k": 8,\n "epilogue": "gelu_tanh(acc + bias[n]"}',
            ":3:38: epilogue 'gelu_tanh(acc + bias[n]', column 24",
        ),
        ('{"m": 8, "n": 8, "k": 8, "epilogue": ["acc", 3]}', ':2: an epilogue output is a string or {"expr"'),
        ('{"m": 8, "n": 8, "k": 8, "epilogue": []}', ":2: epilogue must be a string or a non-empty list"),
        (
            '{"n": 1, "c": 4, "h": 4, "w": 4, "k": 4, "r": 3, "s": 3, "m": 2}',
            ":2: unknown keys ['m'] for a conv2d problem",
        ),
        ('{"n": 1, "c": 4, "h": 4, "w": 4, "k": 4, "r": 3}', ":2: missing ['s']"),
        ('{"n": 1, "c": 4, "h": 2, "w": 2, "k": 4, "r": 3, "s": 3}', ":2: "),  # no output pixels
        ('{"n": 1, "c": 4, "h": 4, "w": 4, "k": 4, "r": 1, "s": 1, "layout": "nwhc"}', ":2: layout 'nwhc'"),
        ('{"n": 1, "c": 4, "h": 4, "w": 4, "k": 4, "r": 1, "s": 1, "epilogue": "acc * x[m]"}', "per channel"),
        ('{"n": 1, "c": 4, "h": 4, "w": 4, "k": 4, "r": 1, "s": true}', ":2: s must be an int"),
    ],
)
def test_shapes_file_errors_name_the_line(tmp_path, body, says):
    path = tmp_path / "bad.json"
    path.write_text("[\n" + body + "\n]")
    with pytest.raises(ValueError) as e:
        load_shapes(path)
    assert str(path) in str(e.value) and says in str(e.value), str(e.value)
