"""The quantize-activation step as an epilogue: an output quantized to fp8 per row and group
of columns, with its scales, as DeepSeek-V3 (and transformers' ``FineGrainedFP8Config``)
quantize the activations a block-scaled GEMM reads::

    groups = y.unflatten(-1, (-1, size)).float()
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX[dtype]
    q = (groups / scale).to(dtype)

``quantized_groups`` rewrites a one-output epilogue so that the kernel that produces ``y``
stores ``q`` [..., M, N] and ``scale`` [..., M, N / size] (float32) instead: the next GEMM
reads one byte an element and no quantize kernel runs between them.
"""

from __future__ import annotations

from epilab.ir.epilogue import GROUP_REDUCE, Epilogue, group_max, ops

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # the largest finite values
SCALE_FLOOR = 1e-12  # an all-zero group's scale (its values quantize to 0, not NaN)


def quantized_groups(ep: Epilogue, size: int = 128, dtype: str = "float8_e4m3fn") -> Epilogue:
    """``ep``'s one tile output, rounded to its dtype (as the unquantized graph stores it),
    quantized per row and ``size`` columns to ``dtype``: outputs (q, dtype) and (scale,
    float32, per group): q * scale is the output to fp8's precision."""
    if dtype not in FP8_MAX:
        raise ValueError(f"quantize to one of {sorted(FP8_MAX)}, not {dtype!r}")
    if len(ep.outputs) != 1 or ep.outputs[0].reduce:
        raise ValueError(f"quantizes an epilogue of one tile output, got {ep.text()}")
    (y,), out = ep.exprs(), ep.outputs[0]
    if out.dtype == "bool" or out.dtype in FP8_MAX:
        raise ValueError(f"quantizes a 16- or 32-bit output, not {out.dtype}")
    if out.dtype != "float32":
        y = ops.cast(y, dtype=out.dtype)
    scale = ops.maximum(group_max(abs(y), size), SCALE_FLOOR) / FP8_MAX[dtype]
    return Epilogue.build([(y / scale, dtype), (scale, "float32", GROUP_REDUCE, size)])
