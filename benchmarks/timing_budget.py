"""How much the tuner's timing budget can shrink before its numbers move: each candidate is
timed with CUDA events (L2 flushed before each repetition) and a CUDA graph rotating over input
sets (``tuner.evaluate._measure``). This script times the same kernels under the old budget
(25 ms warm-up, 100 ms / at most 500 repetitions, 20 graph replays) and the lean one the tuner
now uses (``EVENT_WARMUP_MS``, ``EVENT_REP_MS``, ``EVENT_MAX_REPS``, ``GRAPH_REPLAYS``), in
``--rounds`` interleaved rounds in one process, and prints per problem and budget the median of
the rounds' graph and events times, their spread over the rounds ((max - min) / median) and
the seconds one timing took.

    python benchmarks/timing_budget.py --rounds 6 [--json out.json]

The kernels: each problem's default config (``kinds.default_config``), checked once against the
float64 reference before it is timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import triton

from epilab.templates.gemm_spec import Spec
from epilab.templates.kinds import bind, default_config, kind_of
from epilab.templates.verify import failure, output_errors
from epilab.tuner import evaluate
from epilab.tuner.evaluate import _other_sets, make_inputs
from epilab.tuner.timing import time_cuda, time_graph

PROBLEMS = (  # (m, n, k, epilogue): decode, small, mid and large GEMMs of the quick and llm suites
    (16, 4096, 4096, "bias"),
    (1, 14336, 4096, "bias_gelu_tanh"),
    (1024, 1024, 1024, "none"),
    (2048, 4096, 4096, "bias_residual"),
    (8192, 14336, 4096, "bias_gelu_tanh"),
)
BUDGETS = {
    "old": {"warmup_ms": 25.0, "rep_ms": 100.0, "max_reps": 500, "replays": 20},
    "lean": {
        "warmup_ms": evaluate.EVENT_WARMUP_MS,
        "rep_ms": evaluate.EVENT_REP_MS,
        "max_reps": evaluate.EVENT_MAX_REPS,
        "replays": evaluate.GRAPH_REPLAYS,
    },
}


def timed(run, more, budget: dict) -> tuple[float, float, float]:
    """(graph ms, events ms, seconds taken) under ``budget``, as ``evaluate._measure`` times."""
    start = time.perf_counter()
    events = time_cuda(
        run, warmup_ms=budget["warmup_ms"], rep_ms=budget["rep_ms"], max_reps=budget["max_reps"]
    )
    runs = [run, *more]
    rounds = max(
        1, min(64 // len(runs), round(evaluate.GRAPH_REPLAY_MS / max(events.median_ms * len(runs), 1e-3)))
    )
    graph = time_graph(runs, calls=rounds, replays=budget["replays"])
    return graph.median_ms, events.median_ms, time.perf_counter() - start


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for m, n, k, epilogue in PROBLEMS:
        problem = Spec(m, n, k, dtype="bfloat16", layout="NT", epilogue=epilogue).problem()
        config = default_config(
            problem, sm_count=torch.cuda.get_device_properties(device).multi_processor_count
        )
        a, b, operands = make_inputs(problem, device, 0)
        bound = bind(problem, config, a, b, operands)
        bound.run()
        torch.cuda.synchronize()
        why = failure(output_errors(problem, bound.outs, kind_of(problem).reference(problem, a, b, operands)))
        if why is not None:
            raise SystemExit(f"{problem.shape}: the default config is wrong: {why}")
        more = [bind(problem, config, *x).run for x in _other_sets(problem, (a, b, operands), bound.outs, 0)]
        got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in BUDGETS}
        for _ in range(args.rounds):
            for name, budget in BUDGETS.items():
                got[name].append(timed(bound.run, more, budget))
        for name, values in got.items():
            graph, events, seconds = ([v[i] for v in values] for i in range(3))
            rows.append(
                {
                    "problem": f"{m}x{n}x{k} {epilogue}",
                    "budget": name,
                    "graph_ms": statistics.median(graph),
                    "graph_spread": spread(graph),
                    "events_ms": statistics.median(events),
                    "events_spread": spread(events),
                    "seconds": statistics.median(seconds),
                }
            )
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"medians of {args.rounds} interleaved rounds; spread = (max - min) / median over the rounds")
    print("| problem | budget | graph ms | graph spread | events ms | events spread | s per timing |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['problem']} | {r['budget']} | {r['graph_ms']:.4f} | {r['graph_spread']:.1%} | "
            f"{r['events_ms']:.4f} | {r['events_spread']:.1%} | {r['seconds']:.3f} |"
        )
    if args.json:
        meta = {
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "triton": triton.__version__,
        }
        with open(args.json, "w") as f:
            json.dump(
                {**meta, "python": platform.python_version(), "rounds": args.rounds, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
