"""``epilab demo``: one fused matmul and its error against float64."""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from rich.table import Table

import epilab
from epilab import config
from epilab.cli.common import DEMO_DTYPES, console


def demo(
    m: Annotated[
        int | None, typer.Option(help="rows of A and C (default: 2048 on a GPU, 96 on the CPU)")
    ] = None,
    n: Annotated[int | None, typer.Option(help="columns of B and C (default: 2048 / 80)")] = None,
    k: Annotated[int | None, typer.Option(help="inner dimension (default: 2048 / 72)")] = None,
    dtype: Annotated[
        str, typer.Option(help=f"input dtype: one of {', '.join(DEMO_DTYPES)} (fp8: benchmarks/fp8.py)")
    ] = "bfloat16",
    seed: Annotated[int, typer.Option(help="random seed of the inputs")] = 0,
) -> None:
    """Run one fused matmul, gelu_tanh(A @ B + bias) + residual, and print its error.

    On a machine without CUDA it runs in Triton's interpreter on the CPU.
    """
    import torch

    if dtype not in DEMO_DTYPES:
        raise typer.BadParameter(
            f"{dtype!r} is not one of {', '.join(DEMO_DTYPES)} (the demo's bias and residual are of "
            "the input dtype; fp8 matmuls: epilab.matmul(a8, b8, scale_a=..., scale_b=...))",
            param_hint="--dtype",
        )
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["EPILAB_INTERPRET"] = os.environ["TRITON_INTERPRET"] = "1"
        epilab.enable_interpreter_if_asked()  # and numpy's warnings on masked lanes kept quiet
        console.print("[yellow]No CUDA device: running in Triton's interpreter on the CPU.[/yellow]")
    m = (2048 if cuda else 96) if m is None else m
    n = (2048 if cuda else 80) if n is None else n
    k = (2048 if cuda else 72) if k is None else k
    for name, v in (("--m", m), ("--n", n), ("--k", k)):
        if v <= 0:
            raise typer.BadParameter(f"must be positive, got {v}", param_hint=name)

    from epilab.api.matmul import matmul_problem, simple_epilogue
    from epilab.ir.check import rel_error, tolerance
    from epilab.templates.registry import default_config, kind_of

    device = "cuda" if cuda else "cpu"
    gen = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)
    a = torch.randn(m, k, generator=gen).to(device, tdt)
    b = torch.randn(k, n, generator=gen).to(device, tdt)
    bias = torch.randn(n, generator=gen).to(device, tdt)
    residual = torch.randn(m, n, generator=gen).to(device, tdt)
    ep, operands = simple_epilogue(a, b, bias=bias, activation="gelu_tanh", residual=residual)
    with config.patch(interpret=not cuda):
        problem = matmul_problem(a, b, ep, operands)
        cfg = default_config(problem, "cuda" if cuda else "interpreter")
        start = time.perf_counter()
        out = epilab.matmul(a, b, epilogue=ep, operands=operands, config=cfg)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    (ref64,) = kind_of(problem).reference(problem, a, b, operands)
    eager = torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh") + residual
    err, eager_err = rel_error(out, ref64), rel_error(eager, ref64)
    bound = tolerance(dtype, "ieee", dtype)

    table = Table(title=f"gelu_tanh(A @ B + bias) + residual, {m}x{n}x{k} {dtype} on {device}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("config (default heuristic)", cfg.short())
    table.add_row("first call, incl. compile", f"{seconds:.2f} s")
    table.add_row("epilab ||out-ref||/||ref||", f"{err:.2e}")
    table.add_row("torch eager ||out-ref||/||ref||", f"{eager_err:.2e}")
    table.add_row("bound for this dtype", f"{bound:.0e}")
    console.print(table)
    if not err <= bound:
        console.print(f"[red]FAILED: error {err:.2e} is above {bound:.0e}[/red]")
        raise typer.Exit(1)
    console.print("[green]OK[/green]: epilab matches the float64 reference")
