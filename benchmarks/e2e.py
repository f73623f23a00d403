"""End-to-end latency of models under eager, Inductor and the epilab backend.

    python benchmarks/e2e.py record  --db e2e.db            # compile once: records the problems
    epilab tune --seen --db e2e.db --baselines cublas,inductor
    python benchmarks/e2e.py measure --db e2e.db --json e2e.json

Models (bf16, inference, random weights), each at batch x seq in {1x1, 8x128, 4x2048}:
- ``mlp``: a Llama-style MLP block, down(silu(gate(x)) * up(x)), d=4096, f=14336, no bias;
- ``layer``: a Llama-style transformer layer: RMSNorm, q/k/v/o projections, causal
  SDPA with 32 heads, residual, RMSNorm, the MLP block, residual;
- ``small``: x + fc2(gelu(fc1(x))) with biases, d=1024, f=4096;
- ``resnet50``: ResNet-50 (torchvision's v1.5 layout, eval batch norms), bf16
  channels_last; its "batch x seq" is batch x image size (``--shapes 32x224``).

Variants: eager; Inductor default; Inductor max-autotune (no CUDA graphs, so that
kernels are compared, not launch schemes); epilab (``backend="epilab"``, policy
auto, the warm database); with ``--cuda-graphs`` also Inductor and epilab with
``mode="reduce-overhead"``. Every compiled variant is checked against eager first.

Method: per-call latency is the median of CUDA-event timings of one
call at a time after warm-up, L2 flushed before each (``tuner.timing.time_cuda``);
``graph`` is the per-call time of a CUDA graph of 10 calls (launch gaps removed).
The GPU is kept busy for 2 s before the first case; every variant of a case is
compiled and timed ``--rounds`` times in turn (default 2) and the fastest round's
median is reported (all rounds are in the JSON), since a single pass drifted by up
to 5% between identical graphs. Compile time is the wall time of the first call
after ``torch._dynamo.reset()`` in the first round, with Inductor's caches
disabled (every variant compiles from scratch).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from rounds import run_meta

import epilab
from epilab.compiler.explain import table
from epilab.ir.check import rel_error
from epilab.tuner.timing import time_cuda, time_graph

SHAPES = [(1, 1), (8, 128), (4, 2048)]


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class MLP(nn.Module):
    def __init__(self, d: int = 4096, f: int = 14336) -> None:
        super().__init__()
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, d: int = 4096, heads: int = 32, f: int = 14336) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.mlp = MLP(d, f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        att = F.scaled_dot_product_attention(
            heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True
        )
        x = x + self.o(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class Small(nn.Module):
    def __init__(self, d: int = 1024, f: int = 4096) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class Bottleneck(nn.Module):
    """ResNet-50's block (torchvision's v1.5: the stride on the 3x3 conv)."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or c_in != out:
            self.down = nn.Sequential(nn.Conv2d(c_in, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, c = [], 64
        for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(count):
                blocks.append(Bottleneck(c, width, stride if i == 0 else 1))
                c = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "mlp": (MLP, 4096),
    "layer": (Layer, 4096),
    "small": (Small, 1024),
    "resnet50": (ResNet50, 3),  # batch x seq means batch x image size, channels_last
}


def make_input(name: str, b: int, s: int, d: int) -> torch.Tensor:
    if name == "resnet50":
        x = torch.randn(b, d, s, s, device="cuda", dtype=torch.bfloat16)
        return x.contiguous(memory_format=torch.channels_last)
    return torch.randn(b, s, d, device="cuda", dtype=torch.bfloat16)


def build(name: str) -> tuple[nn.Module, int]:
    torch.manual_seed(0)
    make, d = MODELS[name]
    model = make().to("cuda", torch.bfloat16).eval()
    if name == "resnet50":  # default init (batch norms: identity statistics), channels_last
        return model.to(memory_format=torch.channels_last), d
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
            else:
                p.uniform_(-0.5, 0.5) if name == "small" else p.fill_(1.0)
    return model, d


def variants(db: str, cuda_graphs: bool) -> dict[str, Callable[[nn.Module], Callable]]:
    out: dict[str, Callable[[nn.Module], Callable]] = {
        "eager": lambda m: m,
        "inductor": lambda m: torch.compile(m),
        "inductor-max-autotune": lambda m: torch.compile(m, mode="max-autotune-no-cudagraphs"),
        "epilab": lambda m: torch.compile(m, backend="epilab", options={"db": db, "policy": "auto"}),
    }
    if cuda_graphs:
        out["inductor-reduce-overhead"] = lambda m: torch.compile(m, mode="reduce-overhead")
        out["epilab-reduce-overhead"] = lambda m: torch.compile(
            m, backend="epilab", options={"db": db, "mode": "reduce-overhead"}
        )
    return out


def record(args: argparse.Namespace) -> None:
    """Compile every case once with the backend: the problems land in the database."""
    for name in args.models:
        model, d = build(name)
        for b, s in args.shapes:
            torch._dynamo.reset()
            x = make_input(name, b, s, d)
            with torch.no_grad():
                torch.compile(model, backend="epilab", options={"db": args.db})(x)
            print(f"recorded {name} {b}x{s}")
        del model
    print(table(epilab.explain()))


def _warm_gpu() -> None:
    """Two seconds of matmuls, so that the first case is not timed on an idle GPU."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def _time_variant(variant: str, make: Callable, model: nn.Module, x: torch.Tensor, first: bool) -> dict:
    torch._dynamo.reset()
    epilab.explain(clear=True)
    fn = make(model)
    with torch._inductor.config.patch(force_disable_caches=first):
        start = time.perf_counter()
        out = fn(x).clone()  # a CUDA-graph output is overwritten by the next replay
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
    call = time_cuda(lambda: fn(x), warmup_ms=50, rep_ms=300)
    # reduce-overhead variants replay CUDA graphs themselves: no graph around them
    graph = call if "reduce-overhead" in variant else time_graph(lambda: fn(x), calls=10, replays=10)
    return {
        "out": out,
        "ms": call.median_ms,
        "p20": call.p20_ms,
        "p80": call.p80_ms,
        "graph_ms": graph.median_ms,
        "compile_s": compile_s,
        "decisions": epilab.explain(clear=True),
    }


def measure(args: argparse.Namespace) -> None:
    """Every variant of every case, ``--rounds`` times in turn; the fastest round's median counts."""
    rows = []
    explained: dict[str, str] = {}
    _warm_gpu()
    for name in args.models:
        model, d = build(name)
        for b, s in args.shapes:
            x = make_input(name, b, s, d)
            with torch.no_grad():
                ref = model(x)
                runs: dict[str, list[dict]] = {}
                for round_ in range(args.rounds):
                    for variant, make in variants(args.db, args.cuda_graphs).items():
                        if args.variants and variant not in args.variants:
                            continue
                        runs.setdefault(variant, []).append(
                            _time_variant(variant, make, model, x, round_ == 0)
                        )
                for variant, got in runs.items():
                    first = got[0]
                    decisions = first["decisions"]
                    row = {
                        "model": name,
                        "shape": f"{b}x{s}",
                        "variant": variant,
                        "ms": min(g["ms"] for g in got),
                        "graph_ms": min(g["graph_ms"] for g in got),
                        "rounds_ms": [g["ms"] for g in got],
                        "p20": first["p20"],
                        "p80": first["p80"],
                        "compile_s": first["compile_s"] if variant != "eager" else None,
                        "rel_err_vs_eager": rel_error(first["out"].float(), ref.float()),
                        "templates": sum(1 for dd in decisions if dd.template),
                        "anchors": len(decisions),
                    }
                    rows.append(row)
                    if variant == "epilab":
                        explained[f"{name} {b}x{s}"] = table(decisions)
                    print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    result = {
        **run_meta(),
        "method": __doc__.split("Method: ")[1].strip() if __doc__ else "",
        "rows": rows,
        "explain": explained,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(summary(rows))


def summary(rows: list[dict]) -> str:
    """A markdown table: ms (graph ms) per variant, speedups of epilab."""
    by = {(r["model"], r["shape"], r["variant"]): r for r in rows}
    out = [
        "| model | BxS | eager | inductor | max-autotune | epilab | vs inductor | vs max-autotune | "
        "compile epilab/inductor | templates |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, shape in dict.fromkeys((r["model"], r["shape"]) for r in rows):
        cells = {
            v: by.get((model, shape, v)) for v in ("eager", "inductor", "inductor-max-autotune", "epilab")
        }
        if any(c is None for c in cells.values()):
            continue

        def fmt(r: dict) -> str:
            return f"{r['ms']:.3f} ({r['graph_ms']:.3f})"

        e, i, m = cells["epilab"], cells["inductor"], cells["inductor-max-autotune"]
        out.append(
            f"| {model} | {shape} | {fmt(cells['eager'])} | {fmt(i)} | {fmt(m)} | {fmt(e)} | "
            f"{i['ms'] / e['ms']:.2f}x | {m['ms'] / e['ms']:.2f}x | {e['compile_s'] / i['compile_s']:.2f} "
            f"({e['compile_s']:.1f} s) | {e['templates']}/{e['anchors']} |"
        )
    ro = [
        (mo, sh)
        for mo, sh in dict.fromkeys((r["model"], r["shape"]) for r in rows)
        if (mo, sh, "epilab-reduce-overhead") in by and (mo, sh, "inductor-reduce-overhead") in by
    ]
    if ro:
        out += [
            "",
            "| model | BxS | inductor reduce-overhead | epilab reduce-overhead | speedup |",
            "|---|---|---:|---:|---:|",
        ]
        for mo, sh in ro:
            i, e = by[(mo, sh, "inductor-reduce-overhead")], by[(mo, sh, "epilab-reduce-overhead")]
            out.append(f"| {mo} | {sh} | {i['ms']:.3f} | {e['ms']:.3f} | {i['ms'] / e['ms']:.2f}x |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=["record", "measure"])
    parser.add_argument("--db", required=True, help="tuning database (path or URL)")
    parser.add_argument("--models", default="mlp,layer,small", type=lambda t: t.split(","))
    parser.add_argument(
        "--shapes",
        default=SHAPES,
        type=lambda t: [tuple(int(v) for v in bs.split("x")) for bs in t.split(",")],
        help="batch x seq list, e.g. 1x1,8x128 (default: 1x1,8x128,4x2048)",
    )
    parser.add_argument(
        "--variants",
        type=lambda t: t.split(","),
        help="only these variants (default: all), e.g. eager,epilab",
    )
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--rounds", type=int, default=2, help="times each variant is compiled and timed")
    parser.add_argument("--cuda-graphs", action="store_true", help='also time mode="reduce-overhead"')
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("e2e.py needs a CUDA device")
    record(args) if args.phase == "record" else measure(args)


if __name__ == "__main__":
    main()
