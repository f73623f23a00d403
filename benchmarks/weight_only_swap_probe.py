"""Probe (issue 44): a weight-only bf16 x fp8 main loop with the weight as the dot's first
operand (out^T = W x^T: on Hopper the converted tile could feed wgmma from registers) against
the weight as its second operand, in standalone Triton kernels (pointer loads, no epilogue);
cuBLAS on the bf16 weight and dequantize + cuBLAS in the same process. Each kernel checked
against the fp32 product (relative error < 1e-2), timed with ``triton.testing.do_bench``
(median, L2 cleared before each repetition); the best of a few tiles each. Result: no gain
(RESULTS.md, 2026-11-28).

    python3 benchmarks/weight_only_swap_probe.py
"""

# ruff: noqa: B007, B023  (a probe: loop counters unused, lambdas timed inside their loop)

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def kern(
    x,
    w,
    out,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    SWAP: tl.constexpr,
):
    pid = tl.program_id(0)
    nm = tl.cdiv(M, BM)
    nn = tl.cdiv(N, BN)
    if SWAP:  # walk N-tiles fastest within a group of GROUP M... keep weight tile reuse: group over N
        width = GROUP * nm
        g = pid // width
        first = g * GROUP
        size = min(nn - first, GROUP)
        pn = first + (pid % width) % size
        pm = (pid % width) // size
    else:
        width = GROUP * nn
        g = pid // width
        first = g * GROUP
        size = min(nm - first, GROUP)
        pm = first + (pid % width) % size
        pn = (pid % width) // size
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    if SWAP:
        wp = w + on[:, None] * K + ok[None, :]
        xp = x + ok[:, None] + om[None, :] * K
        acc = tl.zeros((BN, BM), tl.float32)
        for k in range(0, K, BK):
            wt = tl.load(wp).to(tl.bfloat16)
            xt = tl.load(xp)
            acc = tl.dot(wt, xt, acc)
            wp += BK
            xp += BK
        tl.store(out + om[None, :] * N + on[:, None], acc.to(tl.bfloat16))
    else:
        xp = x + om[:, None] * K + ok[None, :]
        wp = w + ok[:, None] + on[None, :] * K
        acc = tl.zeros((BM, BN), tl.float32)
        for k in range(0, K, BK):
            a = tl.load(xp)
            b = tl.load(wp).to(tl.bfloat16)
            acc = tl.dot(a, b, acc)
            wp += BK
            xp += BK
        tl.store(out + om[:, None] * N + on[None, :], acc.to(tl.bfloat16))


def run(x, w8, bm, bn, bk, warps, stages, swap, group=8):
    M, K = x.shape
    N = w8.shape[0]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    kern[grid](x, w8, out, M, N, K, bm, bn, bk, group, swap, num_warps=warps, num_stages=stages)
    return out


NORMAL = [
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (64, 128, 64, 4, 4),
    (128, 128, 128, 8, 3),
    (64, 64, 64, 4, 4),
    (16, 64, 128, 4, 4),
]
SWAPPED = [
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (128, 64, 64, 4, 4),
    (128, 128, 128, 8, 3),
    (64, 64, 64, 4, 4),
    (128, 16, 128, 4, 4),
    (64, 16, 128, 4, 4),
    (128, 32, 128, 4, 4),
    (64, 16, 256, 4, 4),
]
shapes = [
    (2048, 6144, 4096),
    (2048, 28672, 4096),
    (2048, 4096, 14336),
    (128, 28672, 4096),
    (128, 4096, 4096),
    (16, 28672, 4096),
    (16, 6144, 4096),
]
rows = []
for M, N, K in shapes:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w8 = (torch.randn(N, K, device="cuda")).to(torch.float8_e4m3fn)
    wb = w8.to(torch.bfloat16)
    ref = x.float() @ wb.float().t()
    best = {}
    for swap, cfgs in ((False, NORMAL), (True, SWAPPED)):
        for c in cfgs:
            bm, bn, bk, wa, st = c
            if swap:  # config written as (rows of W tile, tokens tile, ...)
                bn_, bm_ = bm, bn
            else:
                bm_, bn_ = bm, bn
            if M % bm_ or N % bn_:
                continue
            try:
                o = run(x, w8, bm_, bn_, bk, wa, st, swap)
                err = ((o.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, err
                t = do_bench(lambda: run(x, w8, bm_, bn_, bk, wa, st, swap), warmup=20, rep=60)
            except Exception as e:
                print("fail", M, N, K, swap, c, str(e)[:100])
                continue
            if swap not in best or t < best[swap][0]:
                best[swap] = (t, c)
    tc = do_bench(lambda: x @ wb.t(), warmup=20, rep=60)
    td = do_bench(lambda: x @ w8.to(torch.bfloat16).t(), warmup=20, rep=60)
    f = 2 * M * N * K / 1e9
    line = (
        f"{M}x{N}x{K} | normal {best[False][0] * 1e3:.1f}us {best[False][1]} ({f / best[False][0]:.0f} TF)"
        f" | swapped {best[True][0] * 1e3:.1f}us {best[True][1]} ({f / best[True][0]:.0f} TF)"
        f" | cuBLAS bf16 {tc * 1e3:.1f}us | deq+cuBLAS {td * 1e3:.1f}us"
    )
    print(line, flush=True)
