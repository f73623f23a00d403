"""Probe (issue 44): a block-scaled fp8 GEMM in Gluon whose promotions overlap the tensor cores.

    python3 benchmarks/block_scaled_sm90_probe.py [--rounds 3] [--json out.json]
    python3 benchmarks/block_scaled_sm90_probe.py --compile-only   # no GPU: ptxas for sm_90a

The Triton loop of the ``block_scaled_matmul`` kind runs at 0.44-0.52x cuBLASLt because each
K group's tensor-core sum must be waited for before it is scaled and added, and one warp group
cannot overlap its own wait. This kernel is the scheme of DeepGEMM and CUTLASS's blockwise
sm90 kernels: warp-specialized, one producer warp issues TMA loads of A (split in per-consumer
row slices) and B into a ring of STAGES stages; CONSUMERS warp groups each own SUB_M = 64 rows
of the BLOCK_M = 64 x CONSUMERS tile and run free of each other, so one's scale-and-add runs
while another's wgmma is on the tensor cores. Per K group (BLOCK_K = 128) a consumer loads its
rows' A scales and the tile's B scale, issues the wgmma into a zeroed accumulator, waits for
it, frees the stage and adds ``part * (sa * sb)`` in fp32 (promotion every 128 elements of K,
cuBLASLt's and DeepGEMM's interval; the ``PIPELINE`` knob loads the scales a K group ahead,
and also keeps two products in flight: neither helped, RESULTS.md 2026-11-28 (late). But
``_scales`` multiplies them as soon as they are loaded, so each step's wgmma still waits for
the next step's loads (``--compile-only`` counts such waits in each K loop); in the kind's
kernel, loaded ahead without that wait, they are 2-8% faster, RESULTS.md 2026-11-29).
``--exact`` runs the same loop for rowwise fp8 with exact accumulation (scales of ones inside,
the rowwise scales outside are not the question).

Each config is checked against the float64 product of the dequantized inputs (relative error
below 1e-2, where cuBLASLt's is 1.7e-3) and timed by CUDA events with L2 flushed
(``rounds.timed``), the best config and ``torch._scaled_mm`` in interleaved rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

SHAPES = [  # DeepSeek-V3's dense projections at M = 4096 (DeepGEMM's table): M, N, K
    (4096, 2112, 7168),
    (4096, 24576, 1536),
    (4096, 32768, 512),
    (4096, 7168, 16384),
    (4096, 4096, 7168),
    (4096, 7168, 2048),
]
EXACT_SHAPES = [(8192, 8192, 8192)]
SUB_M = 64  # rows a consumer warp group owns (one m64 wgmma)
GROUP_K = 128  # elements of K a scale covers and a promotion sums


@triton.jit
def tile_order(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * grid_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    return pid_m, pid_n


@gluon.jit
def _producer(
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_SMS: gl.constexpr, CONSUMERS: gl.constexpr,
):  # fmt: skip
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    it = 0
    for tile_id in range(gl.program_id(0), tiles, NUM_SMS):
        pid_m, pid_n = tile_order(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for kk in range(k_tiles):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, CONSUMERS * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for c in gl.static_range(CONSUMERS):
                tma.async_copy_global_to_shared(
                    a_desc, [pid_m * BLOCK_M + c * (BLOCK_M // CONSUMERS), kk * BLOCK_K], bar,
                    a_bufs.index(slot * CONSUMERS + c),
                )  # fmt: skip
            tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, kk * BLOCK_K], bar, b_bufs.index(slot))
            it += 1


@gluon.jit
def _scales(at, kk, valid, BLOCK_N: gl.constexpr, SCALED: gl.constexpr):
    """K group kk's scales of this warp group's rows times the tile's (BLOCK_N <= 128: one block
    of B's columns); 1.0 when not SCALED; zeros where not ``valid``. ``at``: the rows' A scales,
    the tile's B scale, their strides along K, the rows' mask."""
    sa_rows, sb_block, stride_sak, stride_sbk, mask_m = at
    if SCALED:
        gl.static_assert(BLOCK_N <= 128, "a tile of one block of B's columns (BLOCK_N 256 spilled)")
        sa = gl.load(sa_rows + kk * stride_sak, mask=mask_m & valid, other=0.0)
        s = sa[:, None] * gl.load(sb_block + kk * stride_sbk, mask=valid, other=0.0)
    else:
        s = 1.0
    return s


@gluon.jit
def _product(a_bufs, b_bufs, ready, it, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
             WHICH: gl.constexpr, SUB: gl.constexpr, BLOCK_N: gl.constexpr, MMA: gl.constexpr):  # fmt: skip
    """K step ``it``'s product of this warp group's rows, issued once its stage has landed (async)."""
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    return warpgroup_mma(
        a_bufs.index(slot * CONSUMERS + WHICH), b_bufs.index(slot).permute((1, 0)),
        gl.zeros((SUB, BLOCK_N), dtype=gl.float32, layout=MMA),
        use_acc=False, is_async=True,
    )  # fmt: skip


@gluon.jit
def _consumer(
    a_bufs, b_bufs, ready, empty, out_ptr, sa_ptr, sb_ptr, M, N, K,
    stride_om, stride_sam, stride_sak, stride_sbk, stride_sbn,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_SMS: gl.constexpr, CONSUMERS: gl.constexpr, WHICH: gl.constexpr,
    MMA: gl.constexpr, SCALED: gl.constexpr, PIPELINE: gl.constexpr,
):  # fmt: skip
    """PIPELINE 0: a K group's scales loaded in its own step; 1: a step ahead; 2: also two
    products in flight (K group kk's MMA runs while kk - 1's is promoted)."""
    SUB: gl.constexpr = BLOCK_M // CONSUMERS
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    it = 0
    for tile_id in range(gl.program_id(0), tiles, NUM_SMS):
        pid_m, pid_n = tile_order(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + WHICH * SUB + gl.arange(0, SUB, layout=gl.SliceLayout(1, MMA))
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA))
        mask_m = rm < M
        sb_block = sb_ptr + (pid_n * BLOCK_N // 128) * stride_sbn
        at = (sa_ptr + rm * stride_sam, sb_block, stride_sak, stride_sbk, mask_m)
        acc = gl.zeros((SUB, BLOCK_N), dtype=gl.float32, layout=MMA)
        if PIPELINE < 2:
            s_next = _scales(at, 0, True, BLOCK_N, SCALED)
            for kk in range(k_tiles):
                if PIPELINE == 1:
                    s = s_next
                    s_next = _scales(at, kk + 1, kk + 1 < k_tiles, BLOCK_N, SCALED)
                else:
                    s = _scales(at, kk, True, BLOCK_N, SCALED)
                part = _product(a_bufs, b_bufs, ready, it, STAGES, CONSUMERS, WHICH, SUB, BLOCK_N, MMA)
                part = warpgroup_mma_wait(0, deps=(part,))
                mbarrier.arrive(empty.index(it % STAGES), count=1)
                acc += part * s
                it += 1
        else:
            s_prev = _scales(at, 0, True, BLOCK_N, SCALED)
            prev = _product(a_bufs, b_bufs, ready, it, STAGES, CONSUMERS, WHICH, SUB, BLOCK_N, MMA)
            it += 1
            for kk in range(1, k_tiles):
                s = _scales(at, kk, True, BLOCK_N, SCALED)
                cur = _product(a_bufs, b_bufs, ready, it, STAGES, CONSUMERS, WHICH, SUB, BLOCK_N, MMA)
                prev = warpgroup_mma_wait(1, deps=(prev,))
                mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
                acc += prev * s_prev
                prev = cur
                s_prev = s
                it += 1
            prev = warpgroup_mma_wait(0, deps=(prev,))
            mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
            acc += prev * s_prev
        out = out_ptr + rm[:, None] * stride_om + rn[None, :]
        gl.store(out, acc.to(gl.bfloat16), mask=mask_m[:, None] & (rn[None, :] < N))


@gluon.jit
def block_scaled_ws(
    a_desc, b_desc, out_ptr, sa_ptr, sb_ptr, M, N, K,
    stride_om, stride_sam, stride_sak, stride_sbk, stride_sbn,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_SMS: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    SCALED: gl.constexpr, PIPELINE: gl.constexpr,
):  # fmt: skip
    """out [M, N] (bf16) = sum_g (A_g @ B_g^T) * sa[:, g] * sb[g, n // 128]; A [M, K], B [N, K] e4m3."""
    SUB: gl.constexpr = BLOCK_M // CONSUMERS
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * CONSUMERS, SUB, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        out_ptr,
                        sa_ptr,
                        sb_ptr,
                        M,
                        N,
                        K,
                        stride_om,
                        stride_sam,
                        stride_sak,
                        stride_sbk,
                        stride_sbn,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                        0,
                        MMA,
                        SCALED,
                        PIPELINE,
                    ),
                ),
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        out_ptr,
                        sa_ptr,
                        sb_ptr,
                        M,
                        N,
                        K,
                        stride_om,
                        stride_sam,
                        stride_sak,
                        stride_sbk,
                        stride_sbn,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                        1,
                        MMA,
                        SCALED,
                        PIPELINE,
                    ),
                ),
                (
                    _producer,
                    (
                        a_desc,
                        b_desc,
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        M,
                        N,
                        K,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                    ),
                ),
            ],
            [4, 1],
            [CONSUMER_REGS, 40],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        out_ptr,
                        sa_ptr,
                        sb_ptr,
                        M,
                        N,
                        K,
                        stride_om,
                        stride_sam,
                        stride_sak,
                        stride_sbk,
                        stride_sbn,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                        0,
                        MMA,
                        SCALED,
                        PIPELINE,
                    ),
                ),
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        out_ptr,
                        sa_ptr,
                        sb_ptr,
                        M,
                        N,
                        K,
                        stride_om,
                        stride_sam,
                        stride_sak,
                        stride_sbk,
                        stride_sbn,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                        1,
                        MMA,
                        SCALED,
                        PIPELINE,
                    ),
                ),
                (
                    _consumer,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        out_ptr,
                        sa_ptr,
                        sb_ptr,
                        M,
                        N,
                        K,
                        stride_om,
                        stride_sam,
                        stride_sak,
                        stride_sbk,
                        stride_sbn,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                        2,
                        MMA,
                        SCALED,
                        PIPELINE,
                    ),
                ),
                (
                    _producer,
                    (
                        a_desc,
                        b_desc,
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        M,
                        N,
                        K,
                        BLOCK_M,
                        BLOCK_N,
                        BLOCK_K,
                        GROUP_M,
                        STAGES,
                        NUM_SMS,
                        CONSUMERS,
                    ),
                ),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, 40],
        )


CONFIGS = [  # BLOCK_N, CONSUMERS, STAGES, GROUP_M, consumer registers, maxnreg, PIPELINE
    (128, 2, 6, 8, 232, 168, 0),
    (128, 2, 4, 8, 232, 168, 0),
    (128, 3, 5, 8, 152, 128, 0),
    (128, 3, 4, 8, 152, 128, 0),
    (128, 2, 6, 8, 232, 168, 1),
    (128, 3, 5, 8, 152, 128, 1),
    (128, 3, 4, 8, 152, 128, 1),
    (128, 2, 6, 8, 232, 168, 2),
    (128, 2, 4, 8, 232, 168, 2),
]
# PIPELINE: 0 a K group's scales loaded in its own step, 1 a step ahead, 2 also two products in
# flight (K group kk's MMA runs while kk - 1's is promoted: 64 more registers a thread)


NAMES = (  # block_scaled_ws's arguments, in order
    *("a_desc", "b_desc", "out_ptr", "sa_ptr", "sb_ptr", "M", "N", "K"),
    *("stride_om", "stride_sam", "stride_sak", "stride_sbk", "stride_sbn"),
    *(
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_K",
        "GROUP_M",
        "STAGES",
        "NUM_SMS",
        "CONSUMERS",
        "CONSUMER_REGS",
        "SCALED",
        "PIPELINE",
    ),
)


def kernel_args(a, b, sa, sb, cfg, sms, scaled=True):
    """The launch's grid, keyword arguments and output for ``cfg``."""
    block_n, consumers, stages, group_m, regs, maxnreg, pipeline = cfg
    m, k = a.shape
    n = b.shape[0]
    block_m = SUB_M * consumers
    a_layout = gl.NVMMASharedLayout.get_default_for([SUB_M, GROUP_K], gl.float8e4nv)
    b_layout = gl.NVMMASharedLayout.get_default_for([block_n, GROUP_K], gl.float8e4nv)
    a_desc = TensorDescriptor.from_tensor(a, [SUB_M, GROUP_K], a_layout)
    b_desc = TensorDescriptor.from_tensor(b, [block_n, GROUP_K], b_layout)
    out = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    grid = (min(sms, tiles),)
    values = (
        *(a_desc, b_desc, out, sa, sb, m, n, k),
        *(out.stride(0), sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1)),
        *(block_m, block_n, GROUP_K, group_m, stages, grid[0], consumers, regs, scaled, pipeline),
    )
    return grid, {**dict(zip(NAMES, values, strict=True)), "num_warps": 4, "maxnreg": maxnreg}, out


def launch(a, b, sa, sb, cfg, sms, scaled=True):
    """out = block-scaled a @ b.T with ``cfg``; sa [M, K/128], sb [K/128, N/128] any strides
    (not scaled: the exact product, promoted every 128 of K)."""
    grid, kwargs, out = kernel_args(a, b, sa, sb, cfg, sms, scaled)
    block_scaled_ws[grid](**kwargs)
    return out


def compile_only() -> None:
    """Compile every config for sm_90a on this machine (no GPU): registers, spills, HGMMA count."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    from epilab.templates.cross import _inspect

    m, n, k = 4096, 2112, 7168
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    sa = torch.empty(k // 128, m).t()
    sb = torch.empty(k // 128, triton.cdiv(n, 128))
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kernel = block_scaled_ws
    for cfg, scaled in [(c, True) for c in CONFIGS] + [(c, False) for c in CONFIGS[:4]]:
        _, kwargs, _ = kernel_args(a, b, sa, sb, cfg, 132, scaled)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound_args, specialization, options = binder(**kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(
            backend, kwargs, bound_args, specialization, options
        )
        source = GluonASTSource(kernel, signature, constexprs, attrs)
        try:
            c = triton_compile(source, target=target, options=options.__dict__)
        except Exception as e:  # reported, the sweep goes on
            print(cfg, "FAILED", type(e).__name__, str(e)[-1500:])
            continue
        r = _inspect("k", c.asm["cubin"], c.metadata.shared, c.metadata.num_warps)
        ops = {o: r.opcodes.get(o, 0) for o in ("QGMMA", "HGMMA", "FFMA", "FMUL", "LDG", "STL", "LDL")}
        usage = f"regs {r.registers} local {r.local_bytes} stack {r.stack_bytes} smem {r.dynamic_shared}"
        loops = [f"{loop.instructions} ({len(loop.waits_on_loads)} wait for its loads)" for loop in r.loops]
        print(cfg, scaled, usage, ops, "K loops:", ", ".join(loops))


def inputs(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g)
    a = x.to(torch.float8_e4m3fn)
    b = w.to(torch.float8_e4m3fn)
    ga, gn = triton.cdiv(k, GROUP_K), triton.cdiv(n, 128)
    sa = (torch.rand(m, ga, device="cuda", generator=g) + 0.5).t().contiguous().t()  # M-major, as cuBLASLt
    sb = (torch.rand(gn, ga, device="cuda", generator=g) + 0.5).t().contiguous()  # [K/128, N/128]
    return a, b, sa, sb


def reference(a, b, sa, sb):
    k = a.shape[1]
    n = b.shape[0]
    sa_full = sa.double().repeat_interleave(GROUP_K, 1)[:, :k]
    sb_full = sb.double().t().repeat_interleave(128, 0)[:n].repeat_interleave(GROUP_K, 1)[:, :k]
    return (a.double() * sa_full) @ (b.double() * sb_full).t()


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def race(a, b, sa, sb, scaled, cublas, ref, rounds, sms, timed) -> dict | None:
    """Every config checked against ``ref`` and timed once, then the best and ``cublas`` in
    ``rounds`` interleaved rounds."""
    m, k = a.shape
    n = b.shape[0]
    single = {}
    for cfg in CONFIGS:
        try:
            err = rel(launch(a, b, sa, sb, cfg, sms, scaled), ref)
            if err > 1e-2:
                print(f"{m}x{n}x{k} {cfg}: WRONG rel {err:.2e}", flush=True)
                continue
            single[cfg] = timed(functools.partial(launch, a, b, sa, sb, cfg, sms, scaled))[0]
        except Exception as e:  # reported, the sweep goes on
            print(f"{m}x{n}x{k} {cfg}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    if not single:
        return None
    best = min(single, key=single.get)
    ours_fn = functools.partial(launch, a, b, sa, sb, best, sms, scaled)
    t_ours, t_cub = [], []
    for _ in range(rounds):
        t_ours.append(timed(ours_fn)[0])
        t_cub.append(timed(cublas)[0])
    ours, cub = statistics.median(t_ours), statistics.median(t_cub)
    flop = 2 * m * n * k
    return {
        "shape": [m, n, k],
        "best": list(best),
        "ms": ours,
        "spread": [min(t_ours), max(t_ours)],
        "tflops": flop / ours / 1e9,
        "cublas_ms": cub,
        "cublas_spread": [min(t_cub), max(t_cub)],
        "cublas_tflops": flop / cub / 1e9,
        "err": rel(ours_fn(), ref),
        "cublas_err": rel(cublas(), ref),
        "single_ms": {str(c): t for c, t in single.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--shapes", default="all", help="'all' or comma-separated indices")
    p.add_argument("--exact", action="store_true", help="also rowwise exact accumulation at 8192^3")
    p.add_argument("--compile-only", action="store_true", help="compile for sm_90a here (no GPU)")
    args = p.parse_args()
    if args.compile_only:
        compile_only()
        return
    sys.path.insert(0, "benchmarks")
    from rounds import timed

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__, flush=True)
    # correctness on awkward shapes first
    for m, n, k in [(200, 320, 384), (129, 264, 1040), (64, 128, 128)]:
        a, b, sa, sb = inputs(m, n, k, 1)
        ref = reference(a, b, sa, sb)
        for cfg in CONFIGS:
            try:
                err = rel(launch(a, b, sa, sb, cfg, sms), ref)
            except Exception as e:  # reported, the sweep goes on
                print(f"check {m}x{n}x{k} {cfg}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            print(f"check {m}x{n}x{k} {cfg}: rel {err:.2e} {'ok' if err < 1e-2 else 'WRONG'}", flush=True)
    picked = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows: dict[str, list[dict]] = {"block": [], "exact": []}
    for what, shapes in (("block", picked), ("exact", EXACT_SHAPES if args.exact else [])):
        for m, n, k in shapes:
            a, b, sa, sb = inputs(m, n, k)
            if what == "block":
                ref = reference(a, b, sa, sb)
                sb_k_major = sb.t().contiguous().t()  # [K/128, N/128] with stride (1, K/128)
                cublas = functools.partial(
                    torch._scaled_mm, a, b.t(), sa, sb_k_major, out_dtype=torch.bfloat16
                )
            else:  # no scales inside; unit rowwise scales for cuBLASLt
                ref = a.double() @ b.double().t()
                sa, sb = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
                cublas = functools.partial(
                    torch._scaled_mm, a, b.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False
                )
            row = race(a, b, sa, sb, what == "block", cublas, ref, args.rounds, sms, timed)
            if row is not None:
                rows[what].append(row)
                print(what, json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(
        "| what | M x N x K | Gluon ms [min-max] | TFLOP/s | config | cuBLASLt ms | TFLOP/s | vs cuBLASLt |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for what, found in rows.items():
        for r in found:
            m, n, k = r["shape"]
            lo, hi = r["spread"]
            ours = f"{r['ms']:.4f} [{lo:.4f}-{hi:.4f}] | {r['tflops']:.0f} | {r['best']}"
            theirs = f"{r['cublas_ms']:.4f} | {r['cublas_tflops']:.0f} | {r['cublas_ms'] / r['ms']:.2f}x"
            print(f"| {what} | {m}x{n}x{k} | {ours} | {theirs} |")


if __name__ == "__main__":
    main()
