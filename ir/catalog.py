"""Named epilogues: the one catalog that shapes files and built-in suites (``policy/suites.py``)
and the template tests draw from.

An entry gives the epilogue's outputs as (expression, dtype) pairs; a dtype of None stores
the output in the input dtype. Operands are named by their role: ``bias`` (a row vector),
``residual`` (a tile of the output's shape), ``scale``/``shift`` (per-row or per-column
vectors), ``s`` (a scalar). Editing an entry that suites use changes their problems' keys
(their records no longer apply): add entries, do not change them.
"""

from __future__ import annotations

from collections.abc import Callable

from epilab.ir.epilogue import Epilogue, Expr, acc, const, operand, ops, row_total


def _bias() -> Expr:
    return acc() + operand("bias", "row")


def _residual() -> Expr:
    return operand("residual", "tile")


def _folded_bn() -> Expr:
    return acc() * operand("scale", "row") + operand("shift", "row")


def _layer_norm(x: Expr, eps: float = 1e-6) -> Expr:
    """A LayerNorm over each output row (a conv's channels), ``scale`` and ``shift`` its affine
    parameters: the row's length is the row total of 1, so the entry fits any width."""
    count = row_total(1.0)
    centred = x - row_total(x) / count
    rstd = ops.rsqrt(row_total(centred * centred) / count + eps)
    return centred * rstd * operand("scale", "row") + operand("shift", "row")


Outputs = list[tuple[Expr, str | None]]

EPILOGUES: dict[str, Callable[[], Outputs]] = {
    # the suites' and shapes files' names (kept as they are: problem keys depend on them)
    "none": lambda: [(acc(), None)],
    "bias": lambda: [(_bias(), None)],
    "bias_relu": lambda: [(ops.relu(_bias()), None)],
    "bias_gelu": lambda: [(ops.gelu(_bias()), None)],
    "bias_gelu_tanh": lambda: [(ops.gelu_tanh(_bias()), None)],
    "bias_silu": lambda: [(ops.silu(_bias()), None)],
    "residual": lambda: [(acc() + _residual(), None)],
    "bias_residual": lambda: [(_bias() + _residual(), None)],
    "bias_gelu_tanh_residual": lambda: [(ops.gelu_tanh(_bias()) + _residual(), None)],
    "bias_residual_relu": lambda: [(ops.relu(_bias() + _residual()), None)],
    # more shapes of epilogue: constants, column vectors, scalars, casts, several outputs
    "gelu_tanh": lambda: [(ops.gelu_tanh(acc()), None)],
    "silu": lambda: [(ops.silu(acc()), None)],
    "alpha_beta": lambda: [(const(0.5) * acc() + const(-2.0) * operand("bias", "row"), None)],
    "col_vector": lambda: [(acc() * operand("scale", "col"), None)],
    "scalar": lambda: [(acc() * operand("s", "scalar") + 1.0, None)],
    "cast_fp32": lambda: [(_bias(), "float32")],
    "two_outputs": lambda: [(_bias(), None), (ops.gelu(_bias()), None)],
    "silu_two_outputs": lambda: [(_bias(), None), (ops.silu(_bias()), None)],
    "bn_relu": lambda: [  # a folded batch norm, per output channel
        (ops.relu(_folded_bn()), None)
    ],
    # a folded batch norm and the activations of MobileNet (ReLU6, hardswish) and EfficientNet (SiLU)
    "bn_relu6": lambda: [(ops.clamp(_folded_bn(), min=0.0, max=6.0), None)],
    "bn_hardswish": lambda: [(_folded_bn() * ops.clamp(_folded_bn() + 3.0, min=0.0, max=6.0) / 6.0, None)],
    "bn_silu": lambda: [(ops.silu(_folded_bn()), None)],
    # a ConvNeXt block's depthwise conv and the LayerNorm over its channels (kinds whose
    # programs hold whole rows only: ``TemplateKind.row_error``)
    "bias_layer_norm": lambda: [(_layer_norm(_bias()), None)],
}


def epilogue(name: str, dtype: str) -> Epilogue:
    """The catalog's epilogue ``name`` for inputs of ``dtype``."""
    if name not in EPILOGUES:
        raise ValueError(f"epilogue {name!r} is not one of {sorted(EPILOGUES)}")
    return Epilogue.build([(e, dt or dtype) for e, dt in EPILOGUES[name]()])
