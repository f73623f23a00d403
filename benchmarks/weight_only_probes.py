"""Probes of the weight-only main loop (issue 44): standalone Triton kernels of a bf16 x fp8
matmul (pointer loads, no epilogue) asking two questions, each kernel checked against the fp32
product (relative error < 1e-2) and timed with ``triton.testing.do_bench`` (median, L2 cleared
before each repetition), the best of a few tiles each, cuBLAS in the same process.

    python3 benchmarks/weight_only_probes.py [--question swap|convert|both]

``swap``: the weight as the dot's first operand (out^T = W x^T: on Hopper the converted tile
could feed wgmma from registers) against the weight as its second operand, with cuBLAS on the
bf16 weight and dequantize + cuBLAS. ``convert``: how the fp8 tile becomes bf16: ``.to(bf16)``;
integer bit moves (e4m3 -> bf16 x 2^-120, scaled back in bf16 or in the epilogue);
``.to(fp16).to(bf16)``; a bf16 weight (no conversion: the 16-bit loop's ceiling); then every
e4m3 code through the bit moves against torch's conversion. Results (H200, RESULTS.md
2026-11-28): swapping gains nothing; through fp16 is 14-21% faster, what
``weight_only.render_vars`` uses. (The two questions ran as two scripts, merged here after the
run; each kernel computes what it did.)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

TO_BF16, BITS, BITS_LATE, VIA_FP16, BF16_WEIGHT = range(5)  # how the weight tile becomes bf16


@triton.jit
def _bf16_tile(ptrs, MODE: tl.constexpr):
    """The weight tile at ``ptrs`` in bf16 (for BITS_LATE, x 2^-120)."""
    if MODE == 1 or MODE == 2:
        u = tl.load(ptrs.to(tl.pointer_type(tl.uint8), bitcast=True)).to(tl.uint16)
        t = (((u & 0x7F) << 4) | ((u & 0x80) << 8)).to(tl.bfloat16, bitcast=True)
        if MODE == 1:
            t = (t * 1.329227995784916e36).to(tl.bfloat16)
    elif MODE == 3:
        t = tl.load(ptrs).to(tl.float16).to(tl.bfloat16)
    elif MODE == 4:
        t = tl.load(ptrs)
    else:
        t = tl.load(ptrs).to(tl.bfloat16)
    return t


@triton.jit
def kern(x, w, out, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
         MODE: tl.constexpr, SWAP: tl.constexpr):  # fmt: skip
    """out [M, N] = x [M, K] @ w [N, K]^T; SWAP: computed as (w @ x^T)^T, tiles grouped along N."""
    pid = tl.program_id(0)
    nm, nn = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP * (nm if SWAP else nn)
    first = pid // width * GROUP
    size = min((nn if SWAP else nm) - first, GROUP)
    major, minor = first + (pid % width) % size, (pid % width) // size
    pm, pn = (minor, major) if SWAP else (major, minor)
    om, on, ok = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    if SWAP:
        wp, xp = w + on[:, None] * K + ok[None, :], x + ok[:, None] + om[None, :] * K
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        xp, wp = x + om[:, None] * K + ok[None, :], w + ok[:, None] + on[None, :] * K
        acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K, BK):
        if SWAP:
            acc = tl.dot(_bf16_tile(wp, MODE), tl.load(xp), acc)
        else:
            acc = tl.dot(tl.load(xp), _bf16_tile(wp, MODE), acc)
        wp += BK
        xp += BK
    if MODE == 2:
        acc = acc * 1.329227995784916e36
    if SWAP:
        tl.store(out + om[None, :] * N + on[:, None], acc.to(tl.bfloat16))
    else:
        tl.store(out + om[:, None] * N + on[None, :], acc.to(tl.bfloat16))


def launch(x, w, tile, mode=TO_BF16, swap=False):
    """One run; ``tile`` = (rows, columns, BLOCK_K, warps, stages) of the output's tile as the
    kernel holds it (swapped: weight rows first)."""
    (m, k), n = x.shape, w.shape[0]
    rows, cols, bk, warps, stages = tile
    bm, bn = (cols, rows) if swap else (rows, cols)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    kern[grid](x, w, out, m, n, k, bm, bn, bk, 8, mode, swap, num_warps=warps, num_stages=stages)
    return out


def best(x, w, ref, tiles, mode=TO_BF16, swap=False):
    """(ms, tile, error) of the fastest correct tile that fits the shape, or None."""
    found = None
    for tile in tiles:
        bm, bn = (tile[1], tile[0]) if swap else tile[:2]
        if x.shape[0] % bm or w.shape[0] % bn:
            continue
        try:
            out = launch(x, w, tile, mode, swap)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, err
            ms = do_bench(lambda t=tile: launch(x, w, t, mode, swap), warmup=20, rep=60)
        except Exception as e:  # a tile this Triton cannot build: say so, try the next
            print("fail", tuple(x.shape), tuple(w.shape), mode, swap, tile, str(e)[:120])
            continue
        if found is None or ms < found[0]:
            found = (ms, tile, err)
    return found


def problem(m, n, k, subnormals=False):
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w8 = (torch.randn(n, k, device="cuda") * (8 if subnormals else 1)).to(torch.float8_e4m3fn)
    if subnormals:
        w8[0, :64] = torch.tensor([2**-9] * 32 + [-(2**-8)] * 32, device="cuda").to(torch.float8_e4m3fn)
    wb = w8.to(torch.bfloat16)
    return x, w8, wb, x.float() @ wb.float().t()


NORMAL = [(128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
          (128, 128, 128, 8, 3), (64, 64, 64, 4, 4), (16, 64, 128, 4, 4)]  # fmt: skip
SWAPPED = [(128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3),
           (128, 64, 64, 4, 4), (128, 128, 128, 8, 3), (64, 64, 64, 4, 4), (128, 16, 128, 4, 4),
           (64, 16, 128, 4, 4), (128, 32, 128, 4, 4), (64, 16, 256, 4, 4)]  # fmt: skip
CONVERT = [(128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3),
           (128, 256, 64, 8, 4)]  # fmt: skip


def swap_question() -> None:
    shapes = [(2048, 6144, 4096), (2048, 28672, 4096), (2048, 4096, 14336), (128, 28672, 4096),
              (128, 4096, 4096), (16, 28672, 4096), (16, 6144, 4096)]  # fmt: skip
    for m, n, k in shapes:
        x, w8, wb, ref = problem(m, n, k)
        flops = 2 * m * n * k / 1e9
        normal, swapped = best(x, w8, ref, NORMAL), best(x, w8, ref, SWAPPED, swap=True)
        tc = do_bench(lambda x=x, wb=wb: x @ wb.t(), warmup=20, rep=60)
        td = do_bench(lambda x=x, w8=w8: x @ w8.to(torch.bfloat16).t(), warmup=20, rep=60)
        print(
            f"{m}x{n}x{k} | normal {normal[0] * 1e3:.1f}us {normal[1]} ({flops / normal[0]:.0f} TF)"
            f" | swapped {swapped[0] * 1e3:.1f}us {swapped[1]} ({flops / swapped[0]:.0f} TF)"
            f" | cuBLAS bf16 {tc * 1e3:.1f}us | deq+cuBLAS {td * 1e3:.1f}us",
            flush=True,
        )


@triton.jit
def _codes(w, o, N: tl.constexpr, SCALE: tl.constexpr):
    """Every e4m3 code through the bit moves, scaled back in bf16 (SCALE) or in fp32."""
    i = tl.arange(0, N)
    u = tl.load(w.to(tl.pointer_type(tl.uint8), bitcast=True) + i).to(tl.uint16)
    b = (((u & 0x7F) << 4) | ((u & 0x80) << 8)).to(tl.bfloat16, bitcast=True)
    if SCALE:
        tl.store(o + i, (b * 1.329227995784916e36).to(tl.bfloat16).to(tl.float32))
    else:
        tl.store(o + i, b.to(tl.float32) * 1.329227995784916e36)


def convert_question() -> None:
    names = [".to(bf16)", "bits*2^120", "bits, 2^120 in epilogue", "via fp16", "bf16 weight"]
    for m, n, k in [(2048, 6144, 4096), (2048, 28672, 4096), (2048, 4096, 14336)]:
        x, w8, wb, ref = problem(m, n, k, subnormals=True)
        flops = 2 * m * n * k / 1e9
        cells = []
        for mode in range(5):
            ms, tile, err = best(x, wb if mode == BF16_WEIGHT else w8, ref, CONVERT, mode)
            cells.append(f"{names[mode]} {flops / ms:.0f} TF {tile} err {err:.1e}")
        tc = do_bench(lambda x=x, wb=wb: x @ wb.t(), warmup=20, rep=60)
        print(f"{m}x{n}x{k}: " + " | ".join(cells) + f" | cuBLAS bf16 {flops / tc:.0f} TF", flush=True)
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    for scale in (True, False):
        out = torch.empty(256, device="cuda")
        _codes[(1,)](codes, out, 256, scale)
        ref = codes.float()
        bad = ~((out == ref) | ref.isnan())
        print(
            "conversion", "scaled in bf16" if scale else "scaled in fp32", "mismatches:",
            bad.nonzero().flatten().tolist(), "NaN code reads", out[127].item(),
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", choices=("swap", "convert", "both"), default="both")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    if args.question in ("swap", "both"):
        swap_question()
    if args.question in ("convert", "both"):
        convert_question()


if __name__ == "__main__":
    main()
