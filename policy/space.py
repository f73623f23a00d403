"""Search spaces and feasibility: each kind's space (``kind.space``, one flat,
documented table beside its template), cut at the problem, and the rules that keep
infeasible configs from ever being compiled. The kinds' spaces:

    matmul:  BLOCK_M, BLOCK_N, BLOCK_K in 16..256 (powers of two; BLOCK_M also 192 where the
             problem promotes, fp8 with exact accumulation: sm90_cooperative's three warp groups),
             GROUP_M in {1, 4, 8, 16}, num_warps in {2, 4, 8},
             num_stages in 1..6; the main loop (variant default, tma, persistent,
             tma_persistent, stream_k, tma_stream_k; on sm_90 sm90_persistent, sm90_pingpong,
             sm90_cooperative); SPLIT_K in {1, 2, 4, 8, 16} (two-pass, on the default
             and tma loops, the epilogue in the reduction); EPILOGUE_SUBTILE in {1, 2, 4};
             for the persistent variants PROGRAMS_PER_SM in {1, 2}, FLATTEN and WARP_SPECIALIZE in {0, 1};
             for the tma variants TMA_STORE in {0, 1} (outputs through descriptors)
    gemv:    BLOCK_M = 16, BLOCK_N in 16..256, BLOCK_K in 16..256,
             SPLIT_K in 1..32 with its reduction (variant default = no
             split, two_pass or atomic), num_warps in {2, 4, 8},
             num_stages in 1..6
    conv2d:  BLOCK_M (output pixels), BLOCK_N (output channels of a group)
             in 16..256, BLOCK_K (input channels per step) in 16..128,
             GROUP_M in {1, 4, 8}, SPLIT_K in {1, 2, 4, 8} (two-pass, over the (r, s, c)
             reduction; not depthwise), num_warps in {2, 4, 8}, num_stages in 1..5
    dual_matmul, dual_gemv: the matmul's and the gemv's spaces (two accumulators: the
             feasibility rules below cut their tiles)

A config is feasible for a problem on a device when
- its pipelined tiles fit the device's shared memory:
  num_stages * (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N * accumulators) * element size <= limit
  (a dual GEMM's kinds stage a B and a B2 tile and hold two accumulators), plus with
  TMA_STORE the staged output slices, BLOCK_M * BLOCK_N / EPILOGUE_SUBTILE per output
  element byte (an H200 refused 256x128x128 x 2 stages with a 64 KiB store buffer);
- no block is larger than the padded problem (next power of two, at least 16);
- the fp32 accumulators fit the register file: accumulators * BLOCK_M * BLOCK_N /
  (32 * num_warps) <= 128 registers per thread (half of the 255 a thread may have);
- the template accepts it (its kind's ``config_error``: the input dtype is one its main loops
  take (fp8 only on the matmul, with BLOCK_K >= 32); its ``check``: the gemv variant matches SPLIT_K;
  the tma variants take 2-D problems whose rows are 16-byte aligned, and TMA_STORE non-bool
  outputs with aligned rows; the persistent knobs are left at their defaults by the other
  variants);
- two programs per SM (persistent) fit twice in shared memory, and their accumulators
  take at most half of the 64K-register file;
- stream-K (the matmul kinds) only where whole-tile waves would leave at least 10% of
  the SMs' time idle (tiles x batch over the device's SMs) and K has 2 blocks or more;
- split-K on the matmul kinds and conv2d (``split_k_underfilled``) only where it can pay: the output
  tiles (x batch) underfill the device's SMs, every split gets at least 2 K blocks, and the
  programs (tiles x SPLIT_K) are at most 4 waves;
- the kind's search rule passes (``search_error``): split-K has at least one K block
  per split (gemv); each thread holds at least 4 accumulator elements (matmul, conv2d);
- it avoids a Triton 3.6 miscompile: 2 warps with
  BLOCK_K >= 128 when K is not a multiple of 16 gave illegal memory accesses or
  wrong results (K=777, B stored K-contiguous; 4 warps, or BLOCK_K=64, were right).
  The tuner's check against float64 caught it first; this rule keeps the tuner
  from spending trials on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import triton

from epilab.db import INTERPRETER_DEVICE, DeviceInfo
from epilab.ir.config import Config, Value, check_declared
from epilab.ir.dtypes import FP8_CAPABILITY, FP8_DTYPES
from epilab.ir.problem import Problem, Shape
from epilab.templates.gemm.matmul_sm90 import SHARED_BYTES, warp_groups
from epilab.templates.kind import MAX_ACC_REGS, TemplateKind
from epilab.templates.registry import kind_of

REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80, sm_90)


@dataclass(frozen=True)
class DeviceLimits:
    """What feasibility needs to know of a device."""

    name: str
    capability: str
    sm_count: int
    smem_bytes: int  # opt-in shared memory per block
    memory_bytes: int = 0  # the device's memory (0: not known); the interpreter's is the host's
    interpreter: bool = False  # Triton's interpreter stands in for it (it runs no Gluon kernel)

    @classmethod
    def of(cls, device: object) -> DeviceLimits:
        import torch

        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_block_optin", 0) or SHARED_BYTES
        return cls(
            props.name,
            f"{props.major}.{props.minor}",
            props.multi_processor_count,
            int(smem),
            int(props.total_memory),
        )

    @property
    def info(self) -> DeviceInfo:
        """The device as the database names it."""
        return DeviceInfo(self.name, self.capability, self.sm_count)


# What the interpreter dry run assumes: an H100/H200 (sm_90: 227 KiB per block).
HOPPER = DeviceLimits("Triton interpreter (H100 limits)", "9.0", 132, SHARED_BYTES, interpreter=True)
__all__ = [
    "HOPPER",
    "INTERPRETER_DEVICE",
    "DeviceLimits",
    "applies",
    "configs",
    "infeasible",
    "run_error",
    "space_for",
]


def _padded(dim: object) -> int:
    return 1 << 30 if not isinstance(dim, int) else max(16, triton.next_power_of_2(max(dim, 1)))


def _device_error(kind: TemplateKind, variant: str, limits: DeviceLimits) -> str | None:
    """Why the device cannot run ``kind``'s kernel of ``variant`` (its kind says)."""
    return kind.device_error(variant, limits.capability, limits.interpreter)


def _dtype_error(problem: Problem, limits: DeviceLimits) -> str | None:
    """fp8 inputs (A, or B where the kind reads it in fp8) need sm_89 or newer (the interpreter
    runs them anywhere)."""
    if problem.dtype not in FP8_DTYPES and kind_of(problem).b_dtype(problem) not in FP8_DTYPES:
        return None
    try:
        capability = tuple(int(x) for x in limits.capability.split("."))
    except ValueError:  # the interpreter's ("interpreter") runs fp8 anywhere
        return None
    if capability < FP8_CAPABILITY:
        wanted = ".".join(map(str, FP8_CAPABILITY))
        return f"fp8 dots need compute capability {wanted} or newer; {limits.name} is {limits.capability}"
    return None


def smem_bytes(problem: Problem, config: Config) -> int:
    """Shared memory one program of ``config`` takes (``TemplateKind.smem_bytes``)."""
    return kind_of(problem).smem_bytes(problem, config)


def run_error(problem: Problem, config: Config, limits: DeviceLimits | None = None) -> str | None:
    """Why the template cannot run ``problem`` with ``config`` at all (its kind's own rules;
    given ``limits``, the device's dtypes, variants and shared memory): what a stored
    record's config must pass before a compiled model uses it. ``infeasible`` adds the
    search's own limits."""
    kind = kind_of(problem)
    why = kind.config_error(problem, config)
    if why is None and limits is not None:
        why = _dtype_error(problem, limits) or _device_error(kind, config.variant, limits)
        smem = smem_bytes(problem, config)
        if why is None and smem > limits.smem_bytes:
            why = f"needs {smem} bytes of shared memory, the device has {limits.smem_bytes}"
    return why


def infeasible(problem: Problem, config: Config, limits: DeviceLimits) -> str | None:
    """Why ``config`` cannot run ``problem`` on the device, or None when it can."""
    kind = kind_of(problem)
    for name, values in kind.space.items():
        if getattr(config, name) not in values:
            return f"{name}={getattr(config, name)} is outside the {problem.template} search space"
    why = run_error(problem, config, limits)
    if why is not None:
        return why
    s = kind.kernel_shape(problem)
    for name, block, dim in (
        ("BLOCK_M", config.BLOCK_M, s.m),
        ("BLOCK_N", config.BLOCK_N, s.n),
        ("BLOCK_K", config.BLOCK_K, s.k),
    ):
        if block > _padded(dim):
            return f"{name}={block} is larger than the padded dimension {_padded(dim)}"
    accs = kind.accumulators
    smem = smem_bytes(problem, config)
    warps = config.num_warps * warp_groups(config)
    per_thread = accs * config.BLOCK_M * config.BLOCK_N // (32 * warps)
    if per_thread > MAX_ACC_REGS:
        what = "the accumulator needs" if accs == 1 else f"the {accs} accumulators need"
        return f"{what} {per_thread} registers per thread (at most {MAX_ACC_REGS})"
    if config.PROGRAMS_PER_SM > 1:
        programs = config.PROGRAMS_PER_SM
        if programs * smem > limits.smem_bytes:
            return f"{programs} programs per SM need {programs * smem} bytes of shared memory"
        if programs * accs * config.BLOCK_M * config.BLOCK_N > REGISTER_FILE // 2:
            return f"{programs} programs' accumulators would take over half of the register file"
    if config.SPLIT_K > 1 and kind.split_k_underfilled:
        why = _split_k_error(s, config, limits.sm_count)
        if why is not None:
            return why
    if kind.stream_k(config):
        why = _stream_k_error(s, config, limits.sm_count)
        if why is not None:
            return why
    why = kind.search_error(problem, config)
    if why is not None:
        return why
    if config.num_warps == 2 and config.BLOCK_K >= 128 and not (isinstance(s.k, int) and s.k % 16 == 0):
        return "2 warps with BLOCK_K >= 128 and K not a multiple of 16 miscompile in Triton 3.6"
    return None


def _split_k_error(s: Shape, config: Config, sm_count: int) -> str | None:
    """Where split-K can pay on a tiled matmul: too few output tiles to fill the device."""
    dims = [d if isinstance(d, int) else 1 << 30 for d in (s.batch, s.m, s.n, s.k)]
    tiles = dims[0] * triton.cdiv(dims[1], config.BLOCK_M) * triton.cdiv(dims[2], config.BLOCK_N)
    if tiles >= sm_count:
        return f"split-K: {tiles} output tiles already fill the {sm_count} SMs"
    if triton.cdiv(dims[3], config.BLOCK_K) < 2 * config.SPLIT_K:
        return f"split-K: SPLIT_K={config.SPLIT_K} leaves a split fewer than 2 K blocks"
    if tiles * config.SPLIT_K > 4 * sm_count:
        return f"split-K: {tiles} tiles x SPLIT_K={config.SPLIT_K} is over 4 waves of {sm_count} SMs"
    return None


STREAM_K_WAVE_LOSS = 0.1  # stream-K is searched where whole-tile waves would idle >= 10% of the SMs


def _stream_k_error(s: Shape, config: Config, sm_count: int) -> str | None:
    """Where stream-K can pay: the output tiles (x batch) leave at least a tenth of the SMs'
    time idle in their last wave, and there are K iterations to share (2 K blocks or more)."""
    if not all(isinstance(d, int) for d in (s.batch, s.m, s.n, s.k)):
        return "stream-K: the tile count must be known (symbolic dims)"
    tiles = s.batch * triton.cdiv(s.m, config.BLOCK_M) * triton.cdiv(s.n, config.BLOCK_N)
    slots = triton.cdiv(tiles, sm_count) * sm_count
    if slots - tiles < STREAM_K_WAVE_LOSS * slots:
        return f"stream-K: {tiles} output tiles fill their waves of {sm_count} SMs to within 10%"
    if triton.cdiv(s.k, config.BLOCK_K) < 2:
        return "stream-K: a single K block leaves nothing to share"
    return None


def applies(problem: Problem) -> Callable[[str, Mapping[str, object]], bool]:
    """Which search dimensions mean anything given the values drawn before them (the
    problem's kind decides: the matmul's persistent knobs only for its persistent variants)."""
    return kind_of(problem).applies


def space_for(problem: Problem, limits: DeviceLimits | None = None) -> dict[str, tuple[int, ...]]:
    """The template's space (as its kind narrows it for the problem) with block sizes cut at
    the padded problem dims, so the sampler never proposes blocks the problem cannot use;
    with ``limits``, without the variants the device can never run (the sm90 ones off
    sm_90, or in the interpreter)."""
    s = kind_of(problem).kernel_shape(problem)
    caps = {"BLOCK_M": _padded(s.m), "BLOCK_N": _padded(s.n), "BLOCK_K": _padded(s.k)}
    space = {
        name: tuple(v for v in values if v <= caps.get(name, v)) or values[:1]
        for name, values in kind_of(problem).narrow(problem, kind_of(problem).space).items()
    }
    if limits is not None and "variant" in space:
        kind = kind_of(problem)
        runs = tuple(v for v in space["variant"] if _device_error(kind, str(v), limits) is None)
        space["variant"] = runs or space["variant"][:1]
    return space  # type: ignore[return-value]


def configs(problem: Problem, limits: DeviceLimits) -> list[Config]:
    """Every feasible config the search can propose for the problem's template, in a stable
    order: a dimension that does not apply to the values before it (``applies``) keeps its
    default, as in the search."""
    kind = kind_of(problem)
    check_declared(kind.space)  # once: each point is then built unchecked
    found: list[Config] = []

    def grow(chosen: dict[str, Value], rest: list[str]) -> None:
        if not rest:
            if infeasible(problem, c := Config.of_declared(chosen), limits) is None:
                found.append(c)
            return
        name, values = rest[0], kind.space[rest[0]]
        for value in values if kind.applies(name, chosen) else values[:1]:
            grow({**chosen, name: value}, rest[1:])

    grow({}, list(kind.space))
    return found
