"""``epilab.matmul`` and ``epilab.gated_matmul``: one fused matmul, or one dual GEMM, for
users and tests.

    act(alpha * a @ b + beta * bias) + residual      (or any IR epilogue)
    act(a @ b + bias) * (a @ b2 + bias2)             (or any IR epilogue of acc and acc2)

Builds the epilogue (cached per signature), the Problem, a default config when
none is given, and launches the template (matmul; dual_matmul, or dual_gemv for M <= 16).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, Expr, acc, acc2, const, operand, ops
from epilab.ir.problem import Problem
from epilab.ir.quantize import quantized_groups
from epilab.templates.gemm.block_scaled import A_SCALES, B_SCALES, make_block_problem, scale_shapes
from epilab.templates.gemm.dual_matmul import B2, make_dual_problem
from epilab.templates.gemm.matmul import H100_SMS, check_inputs, make_problem
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES
from epilab.templates.gemm.weight_only import make_weight_only_problem
from epilab.templates.registry import default_config, launch_unchecked, untuned_choice
from epilab.templates.runtime.binding import target_for

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


@lru_cache(maxsize=16)
def _device_facts(device: torch.device) -> dict[str, Any]:
    """What ``default_config`` asks of the device: its SMs and compute capability."""
    if device.type != "cuda":
        return {"sm_count": H100_SMS}
    props = torch.cuda.get_device_properties(device)
    return {"sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    out_dtype: torch.dtype | None = None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    scale_result: torch.Tensor | float | None = None,
    use_fast_accum: bool = False,
    epilogue: Epilogue | None = None,
    operands: Mapping[str, torch.Tensor] | None = None,
    config: Config | None = None,
    allow_tf32: bool = False,
    quantize: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """One fused matmul: ``(act(alpha * scale_a * scale_b * a @ b + beta * bias) + residual) * scale_result``.

    ``a``: [M, K] or [batch, M, K]; ``b``: [K, N] or [batch, K, N]; fp16, bf16, fp32
    (fp32 dots are IEEE unless ``allow_tf32``), or fp8 (float8_e4m3fn or float8_e5m2, both
    the same; a GPU of compute capability 8.9 or newer). Weight-only fp8: a 2-D fp16 / bf16
    ``a`` and a 2-D fp8 ``b`` (a weight's [N, K] in fp8, transposed): B is converted to a's
    dtype in the K loop; its scales are ``scale_b`` (per column or per tensor). ``bias`` broadcasts to the
    output ([N] per column, [M, 1] per row, [M, N], or one element); ``residual``
    too. ``activation`` is one of relu, gelu, gelu_tanh, silu, sigmoid, tanh.
    The output dtype is ``out_dtype``, else the inputs' dtype (bfloat16 for fp8 inputs); an
    fp8 output saturates (beyond +-448 for e4m3, +-57344 for e5m2, inf too, the largest
    finite value; NaN stays NaN).

    Scaled matmuls, as ``torch._scaled_mm``: ``scale_a`` is float32 of one element (per
    tensor) or [M, 1] (per row of a), ``scale_b`` of one element or [1, N] / [N] (per
    column of b); ``scale_result`` multiplies the result before its cast (an fp8 output's
    quantization scale). fp8 dots add the products of one or a few K blocks (256 elements of
    K at most) in fp32 unless ``use_fast_accum`` (the tensor cores' own accumulator over all
    of K: faster, less exact). Block scales (DeepSeek-V3's; 2-D fp8 only): ``scale_a`` of
    [M, ceil(K/128)] (per row and 128 of K: per-token-group activations) and ``scale_b`` of
    [ceil(N/128), ceil(K/128)] (per 128x128 block of the weight, b being the weight's [N, K]
    transposed); each group of 128 elements of K is scaled inside the K loop, then added in
    fp32.

    For any other epilogue pass ``epilogue`` (an ``Epilogue``) and the tensors
    it reads as ``operands``; the result is one tensor per epilogue output.
    ``config`` picks the tiling; without one ``default_config`` chooses.

    ``quantize``: a group width (128 for DeepSeek-V3's activations): the result, rounded to its
    dtype, is quantized to float8_e4m3fn per row and ``quantize`` columns in the epilogue
    (``ir.quantize``), and the call returns ``(q, scale)``: q [M, N] in e4m3 and scale
    [M, ceil(N / quantize)] float32, the ``scale_a`` of a block-scaled matmul reading q.

    There is no backward: with grad mode on, inputs that require grad are refused (the
    result would silently stop the gradient). To train, compile the model with
    ``torch.compile(model, backend="epilab")``, which differentiates it as Inductor does.
    """
    weight_only = weight_only_inputs(a, b)
    check_inputs(a, b, weight_only=weight_only)
    _refuse_grad("matmul", {"a": a, "b": b, "bias": bias, "residual": residual, **(operands or {})})
    simple = {
        "bias": bias,
        "activation": activation,
        "residual": residual,
        "alpha": alpha,
        "beta": beta,
        "out_dtype": out_dtype,
        "scale_a": scale_a,
        "scale_b": scale_b,
        "scale_result": scale_result,
    }
    block = False
    if epilogue is not None:
        given = [k for k, v in simple.items() if v is not None and k not in ("alpha", "beta")]
        if given or alpha != 1.0 or beta != 1.0:
            raise ValueError(
                "pass either epilogue= (with operands=) or bias/activation/residual/"
                "alpha/beta/out_dtype/scale_a/scale_b/scale_result, not both"
            )
        tensors = dict(operands or {})
    else:
        if operands:
            raise ValueError("operands= is only used together with epilogue=")
        block = _check_simple(a, b, weight_only=weight_only, use_fast_accum=use_fast_accum, **simple)
        if block:  # block scales are multiplied in the K loop, not in the epilogue
            simple.update(scale_a=None, scale_b=None)
        epilogue, tensors = simple_epilogue(a, b, **simple)
    epilogue = _quantized(epilogue, quantize)
    if block:
        tensors.update({A_SCALES: scale_a, B_SCALES: scale_b.t()})  # type: ignore[union-attr]
        return _run(make_block_problem(a, b, epilogue, tensors), config, a, b, tensors)
    if weight_only:
        if use_fast_accum or allow_tf32:
            raise ValueError(
                "a weight-only matmul's 16-bit dots add in fp32: use_fast_accum and allow_tf32 do not apply"
            )
        return _run(make_weight_only_problem(a, b, epilogue, tensors), config, a, b, tensors)
    batched = a.dim() == 3 or b.dim() == 3
    op = ("baddbmm" if batched else "addmm") if bias is not None else ("bmm" if batched else "mm")
    precision = "fast" if use_fast_accum else "tf32" if allow_tf32 else "ieee"
    problem = make_problem(a, b, epilogue, tensors, op=op, precision=precision)
    return _run(problem, config, a, b, tensors)


def _check_simple(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    weight_only: bool,
    use_fast_accum: bool,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    **_: object,
) -> bool:
    """Refuse the scales a matmul of these inputs cannot take; whether they are block scales."""
    if weight_only and scale_a is not None:
        raise ValueError(
            "a weight-only matmul (16-bit a, fp8 b) scales the weight only: scale_b per column "
            "of b or per tensor; scale_a does not apply"
        )
    block = block_scales(a, b, scale_a, scale_b)
    if block and use_fast_accum:
        raise ValueError(
            "block scales accumulate exactly (each group of 128 elements of K is scaled, then "
            "added in fp32): use_fast_accum does not apply"
        )
    return block


def weight_only_inputs(a: object, b: object) -> bool:
    """Whether ``a`` is float16 / bfloat16 and ``b`` fp8: a weight stored in fp8
    (``templates/gemm/weight_only.py``)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return (
        dtypes.name_or_none(a.dtype) in WEIGHT_ONLY_DTYPES
        and dtypes.name_or_none(b.dtype) in dtypes.FP8_DTYPES
    )


def block_scales(a: torch.Tensor, b: torch.Tensor, scale_a: object, scale_b: object) -> bool:
    """Whether ``scale_a`` and ``scale_b`` are block scales of 2-D fp8 ``a`` and ``b``: [M,
    ceil(K/128)] and [ceil(N/128), ceil(K/128)] (the weight's [N, K] in blocks of 128x128), and
    not also the rowwise or tensorwise scales they would read as otherwise (shapes that fit
    both, K and N of at most 128, mean the same product either way)."""
    if not (isinstance(scale_a, torch.Tensor) and isinstance(scale_b, torch.Tensor)):
        return False
    if a.dim() != 2 or b.dim() != 2 or dtypes.name_of(a.dtype) not in dtypes.FP8_DTYPES:
        return False
    (m, k), n = a.shape, b.shape[1]
    shapes = scale_shapes(m, n, k)
    block = tuple(scale_a.shape) == shapes[A_SCALES] and tuple(scale_b.shape) == shapes[B_SCALES][::-1]
    rowwise_a = scale_a.numel() == 1 or tuple(scale_a.shape) == (m, 1)
    rowwise_b = scale_b.numel() == 1 or tuple(scale_b.shape) in ((1, n), (n,))
    return block and not (rowwise_a and rowwise_b)


def matmul_problem(
    a: torch.Tensor, b: torch.Tensor, epilogue: Epilogue, operands: Mapping[str, torch.Tensor] | None = None
) -> Problem:
    """The problem ``matmul(a, b, epilogue=epilogue, operands=operands)`` runs (checks them)."""
    return make_problem(a, b, epilogue, dict(operands or {}))


def _run(
    problem: Problem,
    config: Config | None,
    a: torch.Tensor,
    b: torch.Tensor,
    tensors: Mapping[str, torch.Tensor],
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Launch ``problem`` with ``config`` (the default heuristic's when None): one tensor
    per epilogue output, a single one unwrapped."""
    if config is None:
        config = default_config(problem, target_for(a.device), **_device_facts(a.device))
    if not isinstance(config, Config):
        raise TypeError(f"config must be an epilab.Config, got {type(config).__name__}")
    outs = launch_unchecked(problem, config, a, b, tensors)
    return outs[0] if len(outs) == 1 else outs


def _quantized(epilogue: Epilogue, quantize: object) -> Epilogue:
    """``epilogue`` with its output quantized per row and ``quantize`` columns, if asked."""
    if quantize is None:
        return epilogue
    if isinstance(quantize, bool) or not isinstance(quantize, int):
        raise TypeError(f"quantize is a group width (an int such as 128), got {quantize!r}")
    return quantized_groups(epilogue, quantize)


def _refuse_grad(name: str, inputs: Mapping[str, object]) -> None:
    needs_grad = [n for n, t in inputs.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    if needs_grad and torch.is_grad_enabled():
        raise NotImplementedError(
            f"epilab.{name} has no backward, and {', '.join(needs_grad)} require(s) grad: call it "
            "under torch.no_grad() (inference), or compile the model with torch.compile(model, "
            'backend="epilab") to train it'
        )


def gated_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    b2: torch.Tensor,
    *,
    activation: str = "silu",
    bias: torch.Tensor | None = None,
    bias2: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    epilogue: Epilogue | None = None,
    operands: Mapping[str, torch.Tensor] | None = None,
    config: Config | None = None,
    allow_tf32: bool = False,
    quantize: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """A gated MLP's gate and up projections in one kernel: ``act(a @ b + bias) * (a @ b2 + bias2)``.

    ``a``: [M, K]; ``b`` and ``b2``: [K, N] with the same strides (two nn.Linear weights as
    ``w.t()``, or the halves of one concatenated ``[2N, K]`` weight: ``halves(w.t())``);
    ``bias``/``bias2``: [N]. ``activation`` is one of relu, gelu, gelu_tanh, silu, sigmoid,
    tanh (SwiGLU: silu, GeGLU: gelu_tanh). For any other join pass ``epilogue`` (reading
    ``acc`` = a @ b and ``acc2`` = a @ b2) and its ``operands``. M <= 16 runs the dual GEMV.
    ``quantize`` as ``matmul``'s: ``(q, scale)``, the down projection's block-scaled input.
    Inference only, as ``matmul``.
    """
    _refuse_grad("gated_matmul", {"a": a, "b": b, "b2": b2, "bias": bias, "bias2": bias2, **(operands or {})})
    if epilogue is not None:
        if bias is not None or bias2 is not None or out_dtype is not None or activation != "silu":
            raise ValueError(
                "pass either epilogue= (with operands=) or activation/bias/bias2/out_dtype, not both"
            )
        tensors = dict(operands or {})
    else:
        if operands:
            raise ValueError("operands= is only used together with epilogue=")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
        tensors = {name: t for name, t in (("bias", bias), ("bias2", bias2)) if t is not None}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor of N values, got {getattr(t, 'shape', t)!r}")
        dtype = dtypes.name_of(out_dtype if out_dtype is not None else a.dtype)
        epilogue = _build_gated(activation, bias is not None, bias2 is not None, dtype)
    epilogue = _quantized(epilogue, quantize)
    problem = make_dual_problem(a, b, b2, epilogue, tensors, precision="tf32" if allow_tf32 else "ieee")
    problem = untuned_choice(problem) if config is None else problem
    return _run(problem, config, a, b, {B2: b2, **tensors})


@lru_cache(maxsize=64)
def _build_gated(activation: str, has_bias: bool, has_bias2: bool, dtype: str) -> Epilogue:
    gate: Expr = acc() + operand("bias", "row") if has_bias else acc()
    up: Expr = acc2() + operand("bias2", "row") if has_bias2 else acc2()
    return Epilogue.build([(getattr(ops, activation)(gate) * up, dtype)])


def simple_epilogue(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    out_dtype: torch.dtype | None = None,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    scale_result: torch.Tensor | float | None = None,
) -> tuple[Epilogue, dict[str, torch.Tensor]]:
    """The epilogue ``matmul(a, b, bias=..., ...)`` runs, and its operand tensors."""
    out_shape = check_inputs(a, b, weight_only=weight_only_inputs(a, b)).out_shape
    if isinstance(scale_result, (int, float)) and not isinstance(scale_result, bool):
        scale_result = torch.tensor(float(scale_result), device=a.device)
    scales = {"scale_a": scale_a, "scale_b": scale_b, "scale_result": scale_result}
    scale_broadcasts = {
        name: _scale_broadcast(t, name, out_shape) for name, t in scales.items() if t is not None
    }
    for name, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number, got {v!r}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    fp8_in = dtypes.name_of(a.dtype) in dtypes.FP8_DTYPES
    dtype = dtypes.name_of(out_dtype if out_dtype is not None else torch.bfloat16 if fp8_in else a.dtype)
    if dtype == "bool":
        raise TypeError("out_dtype must be a floating dtype")
    bias_broadcast = None if bias is None else _broadcast_of(bias, out_shape, "bias")
    residual_broadcast = None if residual is None else _broadcast_of(residual, out_shape, "residual")
    tensors = {name: t for name, t in (("bias", bias), ("residual", residual)) if t is not None}
    tensors.update({name: t for name, t in scales.items() if t is not None})
    ep = _build_simple(
        bias_broadcast,
        activation,
        residual_broadcast,
        float(alpha),
        float(beta),
        dtype,
        tuple(scale_broadcasts.get(name) for name in scales),
    )
    return ep, tensors


_SCALE_SHAPES = {  # the operand broadcasts each scale may take, and the shape it then has
    "scale_a": (
        "one element (per tensor) or [M, 1] (per row of a); with 2-D fp8 a and b also "
        "[M, ceil(K/128)] (block scales, with scale_b [ceil(N/128), ceil(K/128)])",
        ("scalar", "col"),
    ),
    "scale_b": (
        "one element (per tensor) or [1, N] or [N] (per column of b); with 2-D fp8 a and b also "
        "[ceil(N/128), ceil(K/128)] (block scales, with scale_a [M, ceil(K/128)])",
        ("scalar", "row"),
    ),
    "scale_result": ("one element", ("scalar",)),
}


def _scale_broadcast(t: object, name: str, out_shape: tuple[int, ...]) -> str:
    """scalar / col / row: how a scale is read; a clear error for anything else."""
    accepted, broadcasts = _SCALE_SHAPES[name]
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor of {accepted}, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (as torch._scaled_mm takes it), got {t.dtype}")
    broadcast = _broadcast_of(t, out_shape, name)
    ok = broadcast in broadcasts and (t.dim() <= 2 or broadcast == "scalar")
    if broadcast == "col":
        ok = ok and t.dim() == 2
    if not ok:
        m, n = out_shape[-2:]
        raise ValueError(f"{name} must be {accepted} (M={m}, N={n}), got shape {tuple(t.shape)}")
    return broadcast


@lru_cache(maxsize=256)
def _build_simple(
    bias_broadcast: str | None,
    activation: str | None,
    residual_broadcast: str | None,
    alpha: float,
    beta: float,
    dtype: str,
    scale_broadcasts: tuple[str | None, str | None, str | None] = (None, None, None),
) -> Epilogue:
    """``(act(alpha * scale_a * scale_b * acc + beta * bias) + residual) * scale_result``,
    the scales first after the accumulator (as ``torch._scaled_mm`` applies them)."""
    x: Expr = acc()
    for name, broadcast in zip(("scale_a", "scale_b"), scale_broadcasts[:2], strict=True):
        if broadcast is not None:
            x = x * operand(name, broadcast)
    x = x if alpha == 1.0 else const(alpha) * x
    if bias_broadcast is not None:
        term = operand("bias", bias_broadcast)
        x = x + (term if beta == 1.0 else const(beta) * term)
    if activation is not None:
        x = getattr(ops, activation)(x)
    if residual_broadcast is not None:
        x = x + operand("residual", residual_broadcast)
    if scale_broadcasts[2] is not None:
        x = x * operand("scale_result", scale_broadcasts[2])
    return Epilogue.build([(x, dtype)])


def _broadcast_of(t: torch.Tensor, out_shape: tuple[int, ...], name: str) -> str:
    """row / col / tile / scalar: how a tensor broadcast to C is indexed."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.numel() == 1 and t.dim() <= len(out_shape):
        return "scalar"
    sizes = [1] * (3 - t.dim()) + list(t.shape)
    if t.dim() > 3:
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not broadcast to {out_shape}")
    m_bcast, n_bcast = sizes[-2] == 1, sizes[-1] == 1
    if m_bcast and not n_bcast:
        return "row"
    if n_bcast and not m_bcast:
        return "col"
    return "tile"
