"""The one dtype table: every dtype epilab handles, by canonical name, with its torch
dtype, its Triton type, its element size and the roles it may take.

The torch and Triton columns come from the rule table (``rules.DTYPES``, torch imported on
first use, and ``rules.TRITON_DTYPES``), which renders the epilogue's casts and is hashed into every
template: stating them there once keeps the template hashes of existing records. Every
other module asks this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from epilab.ir import rules

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str  # canonical: "float16", "bfloat16", "float32", "bool", "float8_e4m3fn", "float8_e5m2"
    triton: str  # the Triton type a store converts to
    itemsize: int  # bytes per element
    input: bool  # may be A and B of a matmul or a convolution
    operand: bool  # may be an epilogue operand (bias, residual, scale, mask)
    output: bool  # may be an epilogue output or a cast's target

    @property
    def torch(self) -> torch.dtype:
        """Its torch dtype (torch imported on first use: reading problems needs none)."""
        return rules.DTYPES[self.name]


TABLE: dict[str, DType] = {
    name: DType(
        name,
        rules.TRITON_DTYPES[name],
        size,
        input=name != "bool",  # every float dtype
        operand=name not in rules.FP8_MAX,  # scales, biases and residuals are wider
        output=True,
    )
    for name, size in rules.DTYPE_SIZES.items()
}
FP8_DTYPES = tuple(rules.FP8_MAX)  # inputs of scaled matmuls (sm_89 and newer); outputs saturate
FP8_CAPABILITY = (8, 9)  # fp8 tensor-core dots: Ada (sm_89) and Hopper (sm_90) on
INPUT_DTYPES = tuple(name for name, d in TABLE.items() if d.input)
WIDE_INPUT_DTYPES = tuple(name for name in INPUT_DTYPES if name not in FP8_DTYPES)
OPERAND_DTYPES = tuple(name for name, d in TABLE.items() if d.operand)
OUTPUT_DTYPES = tuple(name for name, d in TABLE.items() if d.output)


# short names users write for dtypes (``--input 8x64:bf16``, ``"dtype": "bf16"`` in a shapes file)
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "fp64": "float64",
}


def canonical_dtype(name: str) -> str:
    """A dtype's canonical name for a name a user wrote (an alias of ``DTYPE_ALIASES``, or
    the name itself: what it is checked against is its reader's business)."""
    return DTYPE_ALIASES.get(name.strip().lower(), name) if isinstance(name, str) else name


def default_output_dtype(dtype: str) -> str:
    """The dtype an epilogue's outputs are stored in unless it says otherwise: the inputs',
    bfloat16 for fp8 inputs (a scaled matmul's output)."""
    return "bfloat16" if dtype in FP8_DTYPES else dtype


@cache
def _by_torch() -> dict[torch.dtype, str]:
    return {d.torch: name for name, d in TABLE.items()}


def name_or_none(dtype: torch.dtype) -> str | None:
    """The canonical name of a torch dtype, None for one epilab does not handle."""
    return _by_torch().get(dtype)


def name_of(dtype: torch.dtype) -> str:
    """The canonical name of a torch dtype; TypeError for one epilab does not handle."""
    name = _by_torch().get(dtype)
    if name is None:
        raise TypeError(f"dtype {dtype} is not supported here; use one of {sorted(TABLE)}")
    return name


def torch_dtype(name: str) -> torch.dtype:
    return TABLE[name].torch


def itemsize(name: str) -> int:
    return TABLE[name].itemsize
