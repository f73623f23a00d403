"""The gemm family's own config knobs (``ir.config.declare``): the matmul's Hopper knobs, fp8's
promotion interval and the weight-only dot's swap. The other families leave them at their
defaults (``foreign_knobs_error``)."""

from __future__ import annotations

from epilab.ir.config import Config, Knob, declare

# the epilogue runs on 1, 2 or 4 column slices of the tile (fewer live registers)
EPILOGUE_SUBTILE = Knob("EPILOGUE_SUBTILE", (1, 2, 4), 1, "sub{}")
# persistent loops: programs per multiprocessor (NUM_SMS = this x the device's SMs), and the
# tile loop's tl.range options (0/1): flatten the K loop into it, warp-specialize it
PROGRAMS_PER_SM = Knob("PROGRAMS_PER_SM", (1, 2), 1, "{}/sm")
FLATTEN = Knob("FLATTEN", (0, 1), 0, "flat")
WARP_SPECIALIZE = Knob("WARP_SPECIALIZE", (0, 1), 0, "ws")
# tma loops: outputs stored through tensor descriptors (where the outputs allow)
TMA_STORE = Knob("TMA_STORE", (0, 1), 0, "tma-store")
# fp8, exact accumulation: K blocks whose products the tensor cores sum before the sum is
# added in fp32 (promotion every PROMOTE * BLOCK_K elements of K)
PROMOTE = Knob("PROMOTE", (1, 2, 4), 1, "promote{}")
# weight-only: the dot's operands swapped, the converted fp8 weight tile on the left
# (C^T = B^T @ A^T, transposed after the K loop): Hopper's wgmma reads a left operand from
# registers, a right one only from shared memory
SWAP_AB = Knob("SWAP_AB", (0, 1), 0, "swap")

KNOBS = declare(EPILOGUE_SUBTILE, PROGRAMS_PER_SM, FLATTEN, WARP_SPECIALIZE, TMA_STORE, PROMOTE, SWAP_AB)
HOPPER_KNOBS = tuple(k.name for k in KNOBS)  # the matmul's own (the other kinds leave them at their defaults)
PERSISTENT_KNOBS = (PROGRAMS_PER_SM.name, FLATTEN.name, WARP_SPECIALIZE.name)


def hopper_knobs_error(config: Config) -> str | None:
    """For the other templates: the matmul's Hopper knobs must keep their defaults."""
    if any(name in HOPPER_KNOBS for name, _ in config.knobs):
        return f"only the matmul template has the knobs {sorted(HOPPER_KNOBS)}; leave them at their defaults"
    return None
