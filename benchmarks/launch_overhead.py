"""Per-call CPU cost of launching a template: one call layer by layer, then a compiled graph.

    python benchmarks/launch_overhead.py                   # both parts
    python benchmarks/launch_overhead.py --graph --layers 16 --m 64 --d 512 --rounds 9 --json OUT

**One call** (the first table): a tiny problem (1 x 4096 x 1024 bf16 addmm + bias) whose
kernel takes a few microseconds, so that a loop of calls is bound by the CPU: wall time per
call after warm-up (2000 calls, one synchronize at the end) is the launch cost.
Rows go from the bare Triton launch up to the custom op as Inductor's compiled
code calls it, with cuBLAS and an Inductor-compiled addmm for comparison.

**A graph of N calls** (``--graph``): N layers of Linear + GELU(tanh) at a small M, compiled
six ways: Inductor as it is (cuBLAS mm + a fused pointwise kernel a layer), Inductor's own
Triton mm template with GELU in its epilogue (max-autotune, Triton only: one Triton kernel a
layer that Inductor emits itself), epilab under policy ``always`` with its templates as
Inductor's kernels (``compiler/emit.py``; launched by Triton's own launcher, Inductor's default
for a user's kernels, and again by Inductor's static CUDA launcher, which launches its own),
epilab through its custom op (``kernels=False``), and each of them again with Inductor's C++
wrapper (``cpp_wrapper``), where the custom op cannot go. Host-bound: the time per model call
(no CUDA graphs) is the host's cost of its N launches. Variants run in interleaved rounds in
one process (median and the range of the rounds); the per-template difference is (model time
- Inductor Triton's) / N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from rounds import run_meta

from epilab.api.matmul import simple_epilogue
from epilab.compiler.decide import Plan
from epilab.compiler.op import template_call
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import bind, default_config
from epilab.templates.runtime.replay import Replay


def per_call_us(fn: Callable[[], object], calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def one_call() -> None:
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


class Layers(torch.nn.Module):
    """``layers`` x (Linear(d, d) + GELU(tanh)): one matmul with a fused epilogue a layer."""

    def __init__(self, layers: int, d: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x), approximate="tanh")
        return x


def graph_variants(
    model: torch.nn.Module, db: str, cpp_wrapper: bool = True
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    triton_mm = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON"}
    epilab = {"policy": "always", "db": db}
    made: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    wrappers = (("", {}), (" (cpp_wrapper)", {"cpp_wrapper": True}))
    for wrapper, extra in wrappers if cpp_wrapper else wrappers[:1]:
        made[f"Inductor: cuBLAS mm + pointwise{wrapper}"] = torch.compile(model, options={**extra})
        made[f"Inductor: its Triton mm template{wrapper}"] = torch.compile(
            model, options={**triton_mm, **extra}
        )
        made[f"epilab: templates as Inductor kernels{wrapper}"] = torch.compile(
            model, backend="epilab", options={**epilab, **extra}
        )
        if not wrapper:  # the custom op's string arguments cannot go into the C++ wrapper
            made["epilab: templates as Inductor kernels, static launcher"] = torch.compile(
                model, backend="epilab", options={**epilab, "static_launch_user_defined_triton_kernels": True}
            )
            made["epilab: templates through the custom op"] = torch.compile(
                model, backend="epilab", options={**epilab, "kernels": False}
            )
    return made


def graph(
    layers: int, m: int, d: int, rounds: int, calls: int, out: Path | None, cpp_wrapper: bool = True
) -> None:
    import epilab

    torch.manual_seed(0)
    model = Layers(layers, d).to("cuda", torch.bfloat16)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        variants = graph_variants(model, str(Path(tmp) / "t.db"), cpp_wrapper)
        ref = model(x).float()
        errors = {}
        for name, fn in variants.items():  # compile (and check) each before any timing
            epilab.explain(clear=True)
            got = fn(x).float()
            errors[name] = float((got - ref).norm() / ref.norm())
            used = [d for d in epilab.explain() if d.template]
            if used:
                errors[name + " runs as"] = sorted({d.runs_as for d in used})  # type: ignore[assignment]
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(per_call_us(lambda fn=fn: fn(x), calls))
    base = statistics.median(times["Inductor: its Triton mm template"])
    base_cpp = statistics.median(times.get("Inductor: its Triton mm template (cpp_wrapper)", [0.0]))
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton_version()}")
    print(f"{layers} x (Linear({d}, {d}) + GELU(tanh)), M = {m}, bf16; {rounds} rounds of {calls} calls")
    print("| variant | us per model call, median | rounds' range | per layer vs Inductor Triton | rel. err |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        against = base_cpp if "cpp_wrapper" in name else base
        print(
            f"| {name} | {med:.1f} | {min(ts):.1f}-{max(ts):.1f} | {(med - against) / layers:+.2f} us "
            f"| {errors[name]:.2g} |"
        )
    for name in variants:
        if name + " runs as" in errors:
            print(f"{name}: templates run as {errors[name + ' runs as']}")
    if out is not None:
        record = {"layers": layers, "m": m, "d": d, "rounds": rounds, "calls": calls, "times_us": times}
        record |= {**run_meta(), "errors": errors}
        out.write_text(json.dumps(record, indent=1))


def triton_version() -> str:
    import triton

    return triton.__version__


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--graph", action="store_true", help="only the graph of N template calls")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", type=Path, default=None, help="write the rounds' times here")
    parser.add_argument(
        "--no-cpp-wrapper", action="store_true", help="leave out the C++ wrapper's variants (slow to compile)"
    )
    args = parser.parse_args()
    if not args.graph:
        one_call()
    graph(args.layers, args.m, args.d, args.rounds, args.calls, args.json, not args.no_cpp_wrapper)


if __name__ == "__main__":
    main()
