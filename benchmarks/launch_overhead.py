"""Per-call CPU cost of launching a template, layer by layer.

    python benchmarks/launch_overhead.py

A tiny problem (1 x 4096 x 1024 bf16 addmm + bias) whose kernel takes a few
microseconds, so that a loop of calls is bound by the CPU: wall time per call
after warm-up (2000 calls, one synchronize at the end) is the launch cost.
Rows go from the bare Triton launch up to the custom op as Inductor's compiled
code calls it, with cuBLAS and an Inductor-compiled addmm for comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from epilab.compiler.decide import Plan
from epilab.compiler.op import template_call
from epilab.templates.kinds import bind, default_config
from epilab.templates.launcher import Replay
from epilab.templates.matmul import make_problem
from epilab.templates.matmul_api import simple_epilogue


def per_call_us(fn: Callable[[], object], calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    torch.manual_seed(0)
    a = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    ep, operands = simple_epilogue(a, w.t(), bias=bias)
    problem = make_problem(a, w.t(), ep, operands, op="addmm")
    config = default_config(problem)
    bound = bind(problem, config, a, w.t(), operands)
    compiled = bound.run()
    replay = Replay(bound, compiled, ["a_ptr", "b_ptr", "op_bias_ptr"])
    pj, plan = problem.to_json(), Plan(config=config).to_json()
    op = torch.ops.epilab.template_call.default
    compiled_addmm = torch.compile(lambda b, x, y: torch.addmm(b, x, y))
    rows = {
        "Bound.run (Triton JITFunction launch, args bound)": bound.run,
        "Replay (compiled kernel's launcher)": lambda: replay([a, w.t(), bias]),
        "template_call (the op's Python body)": lambda: template_call(pj, plan, a, w.t(), [bias]),
        "torch.ops.epilab.template_call.default": lambda: op(pj, plan, a, w.t(), [bias]),
        "torch.addmm (cuBLAS)": lambda: torch.addmm(bias, a, w.t()),
        "torch.compile(addmm) (Inductor)": lambda: compiled_addmm(bias, a, w.t()),
    }
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("| launch path | us per call |")
    print("|---|---:|")
    with torch.no_grad():
        for name, fn in rows.items():
            print(f"| {name} | {per_call_us(fn):.1f} |", flush=True)


if __name__ == "__main__":
    main()
