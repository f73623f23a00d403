"""``ir/check.py``: an output's error against the float64 reference, on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

from epilab.ir.check import rel_error


def test_the_error_is_the_relative_norm_and_nan_or_inf_where_the_reference_is_finite_is_infinite():
    ref = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    out = torch.tensor([1.0, -2.0, 3.5])
    assert rel_error(out, ref) == pytest.approx(0.5 / math.sqrt(14))
    assert rel_error(torch.tensor([1.0, math.nan, 3.0]), ref) == math.inf
    assert rel_error(torch.tensor([1.0, -math.inf, 3.0]), ref) == math.inf
    # NaN and inf where the reference has them, in the same places, are right
    both = torch.tensor([1.0, math.nan, -math.inf], dtype=torch.float64)
    assert rel_error(both.float(), both) == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_a_reference_beyond_the_output_dtype_takes_its_overflow_and_nothing_else(dtype):
    """A reference past the dtype's largest value (fp16: 65504) is met by inf of its sign or
    by the largest value (round down; fp8's saturation), and such elements leave the norm."""
    largest = torch.finfo(dtype).max
    ref = torch.tensor([1.0, 4 * largest, -4 * largest, 2.0], dtype=torch.float64)
    inf = math.inf if dtype != torch.float8_e4m3fn else largest  # e4m3fn has no inf: it saturates
    right = torch.tensor([1.0, inf, -inf, 2.0]).to(dtype)
    assert rel_error(right, ref) == 0.0
    assert rel_error(torch.tensor([1.0, largest, -largest, 2.0]).to(dtype), ref) == 0.0
    assert rel_error(torch.tensor([1.5, inf, -inf, 2.0]).to(dtype), ref) == pytest.approx(0.5 / math.sqrt(5))
    # the wrong sign, a value short of the largest, or NaN
    for wrong in ([1.0, -inf, -inf, 2.0], [1.0, largest / 2, -inf, 2.0], [1.0, math.nan, -inf, 2.0]):
        assert rel_error(torch.tensor(wrong).to(dtype), ref) == math.inf, wrong
    # inf (or the largest value) where the reference is within the dtype's range stays wrong
    assert rel_error(torch.tensor([largest, inf, -inf, 2.0]).to(dtype), ref) > 100
    if dtype != torch.float8_e4m3fn:
        assert rel_error(torch.tensor([math.inf, inf, -inf, 2.0]).to(dtype), ref) == math.inf


def test_a_float32_output_of_a_reference_within_float32_is_unaffected():
    ref = torch.tensor([1e30, -1e30], dtype=torch.float64)
    assert rel_error(ref.float(), ref) < 1e-7
    assert rel_error(torch.tensor([math.inf, -1e30]), ref) == math.inf
