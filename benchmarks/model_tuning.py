"""`epilab.tune_model` on the zoo's transformer models (``tests/zoo``, ``real`` sizes, bf16):
tuning wall time, the verdicts in context, and the model timed against Inductor.

    python benchmarks/model_tuning.py --db models.db --models gpt2,llama --shape prefill \
        [--trials 16 --seconds 15 --rounds 3] [--json out.json]

``prefill``: the zoo's input (batch x sequence x d); ``decode``: one token per sequence
(batch x 1 x d, so M = batch). Each model goes through ``tune_model`` (record, tune until
no new problem, check each template in the compiled model, measure); the method of every
number is in ``model_tuning/tune.py``. The last table is one line per model and mode: epilab
against the faster of Inductor default and Inductor max-autotune.
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
from epilab.model_tuning.tune import tune_model
from epilab.model_tuning.variants import MODES, ModelOptions
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

TRANSFORMERS = ("gpt2", "llama", "bert", "moe", "vit")


def _input(name: str, shape: str, given: str | None = None) -> tuple[int, ...]:
    """The input shape: ``given`` (``4x2048x2048``), else the zoo's for ``prefill`` and one
    token per sequence for ``decode``."""
    spec = ZOO["real"][name]
    if given:
        return tuple(int(d) for d in given.split("x"))
    if shape == "decode":
        if spec.image:
            raise SystemExit(f"{name} takes images: no decode shape")
        return (spec.input_shape[0], 1, *spec.input_shape[2:])
    return spec.input_shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--shape", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--patience", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-max-autotune", action="store_true", help="leave Inductor max-autotune out")
    parser.add_argument("--input", help="the input's shape instead of the zoo's (e.g. 4x2048x2048)")
    parser.add_argument("--json")
    args = parser.parse_args()
    budget = Budget(trials=args.trials, seconds=args.seconds, patience=args.patience)
    modes = tuple(m for m in MODES if not (args.no_max_autotune and m.endswith("max-autotune")))
    reports = []
    with TuningDB.open(args.db) as db, Tuner(db, TuneOptions(budget=budget, baselines=("cublas",))) as tuner:
        for name in args.models.split(","):
            shape = _input(name, args.shape, args.input)
            torch.manual_seed(0)
            model = ZOO["real"][name].build().to("cuda", torch.bfloat16).eval()
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            if ZOO["real"][name].image:
                x = x.contiguous(memory_format=torch.channels_last)
                model = model.to(memory_format=torch.channels_last)
            started = time.monotonic()
            report = tune_model(
                model,
                x,
                db=db,
                tuner=tuner,
                options=ModelOptions(rounds=args.rounds, modes=modes),
                label=f"{name} {'x'.join(map(str, shape))}",
                say=lambda text: print(f"  {text}", flush=True),
            )
            report.seconds["total"] = time.monotonic() - started
            print(report.table(), flush=True)
            reports.append(report)
            del model
            torch.cuda.empty_cache()
    result = {
        **run_meta(),
        "budget": {"trials": args.trials, "seconds": args.seconds, "patience": args.patience},
        "rounds": args.rounds,
        "reports": [r.to_dict() for r in reports],
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(summary(reports))


def summary(reports: list) -> str:
    """One line per model and CUDA-graph mode: epilab in Inductor's default and max-autotune
    modes against Inductor in each."""
    lines = [
        "| model | CUDA graphs | Inductor default | Inductor max-autotune | epilab default | "
        "epilab max-autotune | epilab vs same-mode Inductor | best epilab vs best Inductor | "
        "templates kept/checked | tune s | check s | total s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        for graphs in ("per call", "CUDA graphs"):
            ms = {
                (row["mode"], row["variant"]): row["ms"] for row in r.rows if row["mode"].startswith(graphs)
            }
            auto = f"{graphs}, max-autotune"
            cells = [ms.get((m, v)) for m, v in ((graphs, "inductor"), (auto, "inductor"))]
            ours = [ms.get((m, "epilab")) for m in (graphs, auto)]
            if ours[0] is None:
                continue
            none = {
                row["mode"]: not row["templates"] for row in r.rows if row["variant"] == "epilab"
            }  # no template: Inductor's own graph, the ratio is noise
            same = " / ".join(
                f"{i / e:.3f}x" + ("*" if none.get(m) else "")
                for i, e, m in zip(cells, ours, (graphs, auto), strict=True)
                if i and e
            )
            best = min(c for c in cells if c) / min(e for e in ours if e)
            checked = [v for v in r.verdicts if v["mode"].startswith(graphs)]

            def fmt(v: float | None) -> str:
                return "-" if v is None else f"{v:.4f}"

            lines.append(
                f"| {r.label} | {graphs == 'CUDA graphs'} | {fmt(cells[0])} | {fmt(cells[1])} | "
                f"{fmt(ours[0])} | {fmt(ours[1])} | {same} | {best:.3f}x | "
                f"{sum(v['keep'] for v in checked)}/{len(checked)} | {r.seconds.get('tune', 0):.0f} | "
                f"{r.seconds.get('context check', 0):.0f} | {r.seconds.get('total', 0):.0f} |"
            )

    lines.append(
        "\n*: epilab chose no template in that mode (its verdicts rejected them): the same compiled "
        "graph as Inductor, so the ratio is timing noise"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
