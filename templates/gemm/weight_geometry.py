"""The weight-only kinds' geometry: the dtype of a weight stored in fp8 (B), beside the
problem's own (A's, float16 or bfloat16), and the names the compiler, the specs and the kinds
share (``weight_only.py``, ``dual_weight_only.py``). Not a kind module: the compiler and the
spec format read it, as they read the conv2d and grouped kinds' geometries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from epilab.ir import dtypes
from epilab.ir.problem import Problem

WEIGHT_ONLY_DTYPES = ("bfloat16", "float16")  # A's dtypes of a weight-only matmul (B fp8)
WEIGHT_SCALE = "weight_scale"  # the weight's scales as an epilogue operand (a dual's second: + "2")


@dataclass(frozen=True)
class WeightGeometry:
    """B's dtype (fp8), which differs from the problem's (A's)."""

    KEY: ClassVar[str] = "weight"  # its place in the problem's JSON

    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in dtypes.FP8_DTYPES:
            raise ValueError(
                f"a weight-only problem's weight is one of {dtypes.FP8_DTYPES}, got {self.dtype!r:.40}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WeightGeometry:
        if not isinstance(d, Mapping) or set(d) != {"dtype"}:
            raise ValueError(f"a weight geometry is {{'dtype': ...}}, got {d!r:.80}")
        return cls(d["dtype"])


def weight_dtype(problem: Problem) -> str:
    """The fp8 dtype of a weight-only problem's B."""
    assert isinstance(problem.geometry, WeightGeometry)
    return problem.geometry.dtype
