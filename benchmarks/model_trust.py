"""Do `tune --model`'s verdicts hold? Each model tuned and checked twice on one database.

    python benchmarks/model_trust.py --db trust.db --models qwen_decode,fp8_mlp,gpt2 [--json out.json]

The first run tunes, checks each template in context and measures; the second finds every
problem served, checks and measures again. Agreement: of the verdicts the first run called
decided ("faster", alone or together, or "not faster": its interval cleared the margin), the share the second
run decided the same way; of the speedups it called significant, the share the second run
called significant in the same direction. ``--profile`` lists each variant's kernels (per
call, torch.profiler) for the decode MLP: what the model runs with the dual GEMV and without.

Models: ``qwen_decode`` (a Qwen2-1.5B MLP, one concatenated gate_up weight chunked in halves,
d=1536, F=8960, 8 tokens), ``fp8_mlp`` (rowwise-scaled float8 weights, ``torch._scaled_mm``),
and the zoo's transformers (``tests/zoo``, real sizes) by name.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from rounds import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from zoo.quantized import Fp8Linear

from epilab.db import TuningDB
from epilab.db.values import FASTER_TOGETHER
from epilab.model_tuning.report import ModelReport
from epilab.model_tuning.tune import tune_model
from epilab.model_tuning.variants import ModelOptions
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

DECIDED = ("faster", "not faster", FASTER_TOGETHER)


class QwenMlp(nn.Module):
    def __init__(self, d: int = 1536, f: int = 8960) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Fp8Mlp(nn.Module):
    def __init__(self, d: int = 2048, f: int = 8192) -> None:
        super().__init__()
        self.up, self.down = Fp8Linear(d, f), Fp8Linear(f, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def qwen_decode():
    return QwenMlp().to(torch.bfloat16), (torch.randn(8, 1, 1536).to(torch.bfloat16),)


def fp8_mlp():
    return Fp8Mlp(), (torch.randn(256, 2048).to(torch.bfloat16),)


def _built(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    if name in ("qwen_decode", "fp8_mlp"):
        model, inputs = globals()[name]()
    else:
        from zoo import ZOO

        spec = ZOO["real"][name]
        model, inputs = spec.build().to(torch.bfloat16), (torch.randn(spec.input_shape).to(torch.bfloat16),)
    return model.to("cuda").eval(), tuple(t.to("cuda") for t in inputs)


def agreement(first: ModelReport, second: ModelReport) -> dict:
    """Of the first run's decided verdicts and significant speedups, how many the second repeats."""
    again = {(v["mode"], v["problem"]): v["outcome"] for v in second.verdicts}
    decided = [(v["mode"], v["problem"], v["outcome"]) for v in first.verdicts if v["outcome"] in DECIDED]
    same = sum(again.get((m, p)) == o for m, p, o in decided)
    speed2 = {(r["mode"], r["variant"]): r["speedup"] for r in second.rows if r.get("speedup")}
    significant = [
        (r["mode"], r["variant"], r["speedup"]["ratio"]["estimate"] > 1)
        for r in first.rows
        if r.get("speedup") and r["speedup"]["significant"]
    ]
    held = sum(
        bool(s := speed2.get((m, v))) and s["significant"] and (s["ratio"]["estimate"] > 1) == up
        for m, v, up in significant
    )
    same_graph_claims = sum(
        r["speedup"]["significant"]
        for rep in (first, second)
        for r in rep.rows
        if r.get("speedup") and r["speedup"]["same_graph"]
    )
    return {
        "decided_verdicts": len(decided),
        "repeated": same,
        "significant_speedups": len(significant),
        "speedups_repeated": held,
        "same_graph_claims": same_graph_claims,
    }


def profile(model: nn.Module, x: torch.Tensor, db: str, out: Path) -> None:
    """Kernels of one per-call step of the decode MLP under Inductor and under epilab."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    lines = []
    for name, how in (
        ("inductor", {"backend": "inductor"}),
        ("epilab", {"backend": "epilab", "options": {"db": db}}),
    ):
        torch._dynamo.reset()
        fn = torch.compile(model, **how)
        with torch.no_grad():
            for _ in range(5):
                fn(x)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(x)
                torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
        lines += [f"## {name}", table]
    torch._dynamo.reset()
    (out / "decode_profile.txt").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--models", default="qwen_decode,fp8_mlp")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--stop-after", type=float, default=420.0, help="start no model after these seconds")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    began = time.monotonic()
    budget = Budget(trials=args.trials, seconds=args.seconds, patience=max(4, args.trials // 2))
    options = ModelOptions(modes=("per call", "CUDA graphs"))
    results = []
    meta = {
        **run_meta(),
        "budget": {"trials": args.trials, "seconds": args.seconds},
    }
    with TuningDB.open(args.db) as db, Tuner(db, TuneOptions(budget=budget, baselines=("cublas",))) as tuner:
        for name in args.models.split(","):
            if time.monotonic() - began > args.stop_after:
                print(f"{name}: skipped (time)", flush=True)
                continue
            torch.manual_seed(0)
            model, inputs = _built(name)
            reports = []
            for run in range(args.runs):
                started = time.monotonic()
                report = tune_model(
                    model,
                    *inputs,
                    db=db,
                    tuner=tuner,
                    options=options,
                    label=f"{name} run {run + 1}",
                    progress=False,
                )
                report.seconds["total"] = time.monotonic() - started
                print(report.table(), flush=True)
                reports.append(report)
            entry = {"model": name, "reports": [r.to_dict() for r in reports]}
            if len(reports) == 2:
                entry["agreement"] = agreement(*reports)
            results.append(entry)
            if args.json:  # after every model: a call cut by its time limit keeps what it measured
                Path(args.json).write_text(json.dumps({**meta, "results": results}, indent=1))
            if args.profile and name == "qwen_decode":
                profile(model, inputs[0], db.url, Path(args.json).parent if args.json else Path("."))
            del model
            torch.cuda.empty_cache()
    print(f"\n{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}")
    print("| model | decided verdicts | repeated | significant speedups | repeated | same-graph claims |")
    print("|---|---:|---:|---:|---:|---:|")
    for e in results:
        a = e.get("agreement")
        if a:
            print(
                f"| {e['model']} | {a['decided_verdicts']} | {a['repeated']} | {a['significant_speedups']} | "
                f"{a['speedups_repeated']} | {a['same_graph_claims']} |"
            )


if __name__ == "__main__":
    main()
