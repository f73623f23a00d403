"""A training step through `tune --model --train`: tuned, checked in context, timed, its gradients checked.

    python benchmarks/train_step.py --db train.db --model gpt2 --modes "CUDA graphs" [--json out.json]

The zoo's real-size model (``tests/zoo``, random weights, bf16) runs as a training step
(``model_tuning/step.py``: grads reset, forward, backward of a fixed random cotangent; no optimizer
step) through ``tune_model(..., options=ModelOptions(train=True))``, what
``epilab tune --model ... --train`` runs: the forward's and the backward's problems are tuned,
each chosen template is checked in the step, and the step is timed against Inductor (and
eager, per call) in paired interleaved rounds. Then one step of epilab's compile (the verdicts
followed) is checked against eager's in the same dtype: each parameter's gradient,
``||g - g_eager|| / ||g_eager||``. ``--modes`` takes ``tune --model``'s modes (comma-separated);
on a shared lease the CUDA-graph mode alone (the step's GPU time) is the one to afford.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rounds import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from zoo import ZOO

from epilab.db import TuningDB
from epilab.model_tuning.step import Workload
from epilab.model_tuning.tune import tune_model
from epilab.model_tuning.variants import MODES, ModelOptions
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner


def gradient_errors(model: torch.nn.Module, x: torch.Tensor, db: str) -> dict[str, float]:
    """Each parameter's relative gradient error of epilab's compiled step against eager's."""
    grads = []
    torch._dynamo.reset()
    for fn in (model, torch.compile(model, backend="epilab", options={"db": db})):
        Workload(model, (x,), train=True).bind(fn)()
        grads.append({n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None})
    torch._dynamo.reset()
    eager, ours = grads
    return {n: float((ours[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in eager.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--model", default="gpt2", choices=sorted(ZOO["real"]))
    parser.add_argument("--modes", default="CUDA graphs", help=f"comma-separated, of {MODES}")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-rounds", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    modes = tuple(m.strip() for m in args.modes.split(","))
    spec = ZOO["real"][args.model]
    torch.manual_seed(0)
    model = spec.build().to("cuda", torch.bfloat16).train()
    x = torch.randn(spec.input_shape, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)
    budget = Budget(trials=args.trials, seconds=args.seconds, patience=max(3, args.trials // 2))
    options = ModelOptions(modes=modes, rounds=args.rounds, max_rounds=args.max_rounds, train=True)
    started = time.monotonic()
    with TuningDB.open(args.db) as db, Tuner(db, TuneOptions(budget=budget, baselines=("cublas",))) as tuner:
        report = tune_model(model, x, db=db, tuner=tuner, options=options, label=f"{args.model} train step")
    report.seconds["total"] = time.monotonic() - started
    errors = gradient_errors(model, x, args.db)
    result = {
        **run_meta(),
        "budget": {"trials": args.trials, "seconds": args.seconds},
        "report": report.to_dict(),
        "gradient_errors": errors,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if report.tuned:
        print("| problem | tuned ms | cuBLAS ms | timed as | speedup alone |\n|---|---:|---:|---|---:|")
        for r in report.tuned:
            tuned = r.compared[r.library][1] if r.library in r.compared else r.best_ms
            cells = [f"{v:.4f}" if v else "-" for v in (tuned, r.library_ms)]
            speedup = f"{r.speedup:.2f}x" if r.speedup else ""
            print(f"| {r.label} | {cells[0]} | {cells[1]} | {r.timed_as or ''} | {speedup} |")
    print(report.table())
    worst = max(errors.values())
    print(f"\nepilab's step vs eager: worst relative gradient error {worst:.2e}, {len(errors)} parameters")
    versions = f"torch {result['torch']}, triton {result['triton']}"
    print(f"{result['gpu']}, {versions}; {report.seconds['total']:.0f} s")


if __name__ == "__main__":
    main()
