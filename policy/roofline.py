"""When a search may stop early because its best config already runs at the device's roofline.

The roofline here is what kernels *reach* on the device, measured, not its data sheet: dense
bf16/fp16 tensor-core GEMMs at cuBLAS's best (690-760 TFLOP/s on H100 and H200, RESULTS.md's
suites), memory at a device-to-device copy's bandwidth (3.0 TB/s on an H100, 4.2 TB/s on an
H200). A problem's floor is ``max(flops / compute, bytes / bandwidth)``: the fewest FLOPs and
bytes any kernel must spend (``tune.problem_bytes``). A search whose best time is within
``AT_ROOFLINE`` of that floor stops ("roofline"): no config can gain more than the rest of the
budget costs. Devices not listed, and dtypes without a figure (fp32, which runs on other
units), never stop this way.
"""

from __future__ import annotations

# name fragment -> (dense bf16/fp16 TFLOP/s reached, copy GB/s reached); first match wins.
# An H100 PCIe matches "H100" (SXM figures, higher than it reaches: it stops later, never early).
REACHED: tuple[tuple[str, float, float], ...] = (
    ("H200", 760.0, 4200.0),
    ("H100", 760.0, 3000.0),
)
# compute relative to bf16: fp8 tensor cores run twice as many FLOPs
COMPUTE_SCALE = {"bfloat16": 1.0, "float16": 1.0, "float8_e4m3fn": 2.0, "float8_e5m2": 2.0}
AT_ROOFLINE = 0.95  # a best time at 95% of the reached throughput or more stops the search


def floor_ms(flops: int, nbytes: int, dtype: str, device_name: str) -> float | None:
    """The fewest milliseconds a kernel of ``flops`` and ``nbytes`` reaches on the device,
    or None where the device or the dtype has no figure."""
    row = next((r for r in REACHED if r[0] in device_name), None)
    scale = COMPUTE_SCALE.get(dtype)
    if row is None or scale is None:
        return None
    _, tflops, gbs = row
    return max(flops / (tflops * scale * 1e9), nbytes / (gbs * 1e6))


def good_enough_ms(flops: int, nbytes: int, dtype: str, device_name: str) -> float | None:
    """A best time at or under this stops the search ("roofline"); None: never."""
    floor = floor_ms(flops, nbytes, dtype, device_name)
    return None if floor is None else floor / AT_ROOFLINE
