"""Probe (issue 44): how a weight-only main loop turns its fp8 weight tile into bf16, in
standalone Triton kernels (pointer loads, no epilogue): ``.to(bf16)``; integer bit moves
(e4m3 -> bf16 x 2^-120, scaled back in bf16 or in the epilogue); ``.to(fp16).to(bf16)``; and a
bf16 weight (no conversion: the 16-bit loop's ceiling), with cuBLAS bf16. Each checked against
the fp32 product (relative error < 1e-2; the weight holds subnormals), timed with
``triton.testing.do_bench`` (median, L2 cleared before each repetition), the best of five
tiles; then every e4m3 code through the bit moves compared with torch's conversion. Result:
through fp16 is 15-20% faster (RESULTS.md, 2026-11-28), what ``weight_only.render_vars`` uses.

    python3 benchmarks/weight_only_convert_probe.py
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
    MODE: tl.constexpr,
):
    pid = tl.program_id(0)
    nm = tl.cdiv(M, BM)
    nn = tl.cdiv(N, BN)
    width = GROUP * nn
    g = pid // width
    first = g * GROUP
    size = min(nm - first, GROUP)
    pm = first + (pid % width) % size
    pn = (pid % width) // size
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    xp = x + om[:, None] * K + ok[None, :]
    wp = w + ok[:, None] + on[None, :] * K
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        a = tl.load(xp)
        if MODE == 0:  # .to(bf16)
            b = tl.load(wp).to(tl.bfloat16)
        elif MODE == 1:  # bits: e4m3 -> bf16 * 2^-120, exact, then * 2^120 in bf16
            u = tl.load(wp.to(tl.pointer_type(tl.uint8), bitcast=True)).to(tl.uint16)
            bits = ((u & 0x7F) << 4) | ((u & 0x80) << 8)
            b = bits.to(tl.bfloat16, bitcast=True) * 1.329227995784916e36
            b = b.to(tl.bfloat16)
        elif MODE == 2:  # bits, 2^120 left to the epilogue
            u = tl.load(wp.to(tl.pointer_type(tl.uint8), bitcast=True)).to(tl.uint16)
            bits = ((u & 0x7F) << 4) | ((u & 0x80) << 8)
            b = bits.to(tl.bfloat16, bitcast=True)
        elif MODE == 3:  # via fp16
            b = tl.load(wp).to(tl.float16).to(tl.bfloat16)
        else:  # a bf16 weight (no conversion): the 16-bit loop's speed
            b = tl.load(wp)
        acc = tl.dot(a, b, acc)
        wp += BK
        xp += BK
    if MODE == 2:
        acc = acc * 1.329227995784916e36
    tl.store(out + om[:, None] * N + on[None, :], acc.to(tl.bfloat16))


def run(x, w, bm, bn, bk, warps, stages, mode):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    kern[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        x, w, out, M, N, K, bm, bn, bk, 8, mode, num_warps=warps, num_stages=stages
    )
    return out


CFGS = [
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (128, 128, 128, 8, 3),
    (128, 256, 64, 8, 4),
]
NAMES = [".to(bf16)", "bits*2^120", "bits, 2^120 in epilogue", "via fp16", "bf16 weight"]
for M, N, K in [(2048, 6144, 4096), (2048, 28672, 4096), (2048, 4096, 14336)]:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w8 = (torch.randn(N, K, device="cuda") * 8).to(torch.float8_e4m3fn)
    w8[0, :64] = torch.tensor([2**-9] * 32 + [-(2**-8)] * 32, device="cuda").to(
        torch.float8_e4m3fn
    )  # subnormals
    wb = w8.to(torch.bfloat16)
    ref = x.float() @ wb.float().t()
    cells = []
    for mode in range(5):
        w = wb if mode == 4 else w8
        best = None
        for c in CFGS:
            try:
                o = run(x, w, *c, mode)
                err = ((o.float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, err
                t = do_bench(lambda: run(x, w, *c, mode), warmup=20, rep=60)
            except Exception as e:
                print("fail", mode, c, str(e)[:200])
                continue
            if best is None or t < best[0]:
                best = (t, c, err)
        cells.append(f"{NAMES[mode]} {2 * M * N * K / best[0] / 1e9:.0f} TF {best[1]} err {best[2]:.1e}")
    tc = do_bench(lambda: x @ wb.t(), warmup=20, rep=60)
    print(
        f"{M}x{N}x{K}: " + " | ".join(cells) + f" | cuBLAS bf16 {2 * M * N * K / tc / 1e9:.0f} TF", flush=True
    )


@triton.jit
def cv(w, o, N: tl.constexpr, SCALE: tl.constexpr):
    i = tl.arange(0, N)
    u = tl.load(w.to(tl.pointer_type(tl.uint8), bitcast=True) + i).to(tl.uint16)
    bits = ((u & 0x7F) << 4) | ((u & 0x80) << 8)
    b = bits.to(tl.bfloat16, bitcast=True)
    if SCALE:
        b = (b * 1.329227995784916e36).to(tl.bfloat16)
        tl.store(o + i, b.to(tl.float32))
    else:
        tl.store(o + i, b.to(tl.float32) * 1.329227995784916e36)


allv = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
for s in (True, False):
    o = torch.empty(256, device="cuda")
    cv[(1,)](allv, o, 256, s)
    ref = allv.float()
    bad = ~((o == ref) | ref.isnan())
    print(
        "conversion",
        "scaled in bf16" if s else "scaled in fp32",
        "mismatches:",
        bad.nonzero().flatten().tolist(),
        "NaN code reads",
        o[127].item(),
    )
