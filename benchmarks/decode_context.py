"""Why a decode MLP's dual GEMV, faster alone, does not make the model faster in context.

    python benchmarks/decode_context.py --db trust.db [--json out.json]

The Qwen2-1.5B MLP of ``model_trust.py`` (one concatenated gate_up weight chunked in halves,
d=1536, F=8960, 8 tokens), tuned if the database has no records for it, compiled three ways:
Inductor, and epilab with its verdicts ignored (the dual GEMV the records choose). Each is
timed three ways, in paired interleaved rounds (``model_tuning/interleave.py``):

- ``calls``: ``time_calls`` per call (host time in: Dynamo's guards, the wrapper, launches);
- ``trees``: the ``reduce-overhead`` compile (CUDA-graph trees) timed by ``time_calls``,
  what ``tune --model``'s "CUDA graphs" mode times;
- ``gpu``: the per-call compile captured in one CUDA graph of 20 calls (``time_graph``):
  GPU time alone, no host work between calls.

Then the kernels of one step of each (torch.profiler, CUDA and CPU), so that a copy of the
weight, a split-K reduction or host work per call shows by name.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_trust import qwen_decode

import epilab
from epilab.db import TuningDB
from epilab.model_tuning.interleave import Comparison, Variant, compare
from epilab.model_tuning.timing import time_calls
from epilab.model_tuning.tune import tune_model
from epilab.model_tuning.variants import ModelOptions
from epilab.tuner.search import Budget
from epilab.tuner.timing import time_graph
from epilab.tuner.tune import TuneOptions, Tuner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    model, (x,) = qwen_decode()
    model, x = model.cuda().eval(), x.cuda()
    with TuningDB.open(args.db) as db, Tuner(db, TuneOptions(budget=Budget(trials=12, seconds=10))) as tuner:
        tune_model(model, x, db=db, tuner=tuner, options=ModelOptions(check_context=False, measure=False))
        url = db.url
    torch._dynamo.reset()
    ours = {"db": url, "policy": "auto", "verdicts": False}
    built = {
        "inductor": lambda mode: torch.compile(model, **({"mode": mode} if mode else {})),
        "dual": lambda mode: torch.compile(
            model, backend="epilab", options={**ours, **({"mode": mode} if mode else {})}
        ),
    }
    variants: dict[str, Variant] = {}
    with torch.no_grad():
        for name, make in built.items():
            epilab.explain(clear=True)
            per_call = make(None)
            per_call(x)
            decisions = epilab.explain(clear=True)
            trees = make("reduce-overhead")
            for _ in range(3):
                trees(x)
            print(name, [(d.anchor, d.template, d.reason[:90]) for d in decisions], flush=True)
            variants[f"{name} calls"] = Variant(f"{name} calls", "calls", lambda f=per_call: f(x), 0.0)
            variants[f"{name} trees"] = Variant(f"{name} trees", "trees", lambda f=trees: f(x), 0.0)
            variants[f"{name} gpu"] = Variant(f"{name} gpu", "gpu", lambda f=per_call: f(x), 0.0)

        def timer(name, fn):
            return time_graph(fn, calls=20, replays=10) if name.endswith("gpu") else time_calls(fn)

        comparisons = [
            Comparison(ours=variants[f"dual {how}"], theirs=variants[f"inductor {how}"], key=how)
            for how in ("calls", "trees", "gpu")
        ]
        held = compare(comparisons, rounds=8, max_rounds=24, confidence=0.95, margin=0.0, timer=timer)
        rows = []
        for c in comparisons:
            i = c.interval
            rows.append(
                {
                    "timed": c.key,
                    "inductor_ms": c.theirs.ms,
                    "dual_ms": c.ours.ms,
                    "speedup": i.estimate,
                    "low": i.low,
                    "high": i.high,
                    "rounds": c.rounds,
                    "outcome": c.outcome,
                }
            )
        profiles = {}
        from torch.profiler import ProfilerActivity, profile

        for name in ("inductor", "dual"):
            fn = variants[f"{name} calls"].fn
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            profiles[name] = {
                "cuda": prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10),
                "cpu": prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15),
            }
            print(
                f"## {name}: CUDA\n{profiles[name]['cuda']}\n## {name}: CPU\n{profiles[name]['cpu']}",
                flush=True,
            )
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {**meta, "python": platform.python_version(), "rows": rows, "profiles": profiles}, indent=1
            )
        )
    print(
        f"\n{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}; intervals at {held:.2%} per look"
    )
    print("| timed | inductor ms | epilab (dual GEMV) ms | speedup [interval] | rounds | outcome |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['timed']} | {r['inductor_ms']:.4f} | {r['dual_ms']:.4f} | "
            f"{r['speedup']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] | {r['rounds']} | {r['outcome']} |"
        )


if __name__ == "__main__":
    main()
