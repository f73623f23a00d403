"""Transformers end to end with their norms folded into the GEMMs around them (issue 22).

    python3 benchmarks/norm_fold.py --model llama [--batch 4 --seq 2048] [--max-autotune] [--rounds 5]
    python3 benchmarks/norm_fold.py --model gpt2 --db tuned.db --record   # record the problems
    epilab tune --seen --db tuned.db ...                                  # tune them
    python3 benchmarks/norm_fold.py --model gpt2 --db tuned.db --json out.json

The zoo's Llama-style block (d 2048, 16 heads, 8 KV heads, SwiGLU 5632; RMSNorm) or its GPT-2
(2 pre-LayerNorm blocks, d 768, LM head 8192; ``tests/zoo``), bf16, inference
(``torch.no_grad``), random norm weights and biases, every variant compiled from its own model:

- ``inductor``: Inductor default with ``freezing`` (the weights constants, as epilab's fold
  needs them); ``max-autotune``: the same with max-autotune (``--max-autotune``);
- ``epilab (no fold)``: the epilab backend, policy ``always``, without freezing (the norms stay
  Inductor kernels; dual GEMM for gate/up);
- ``epilab``: the same with freezing: each RMSNorm's ``g`` folded into its projections' weights,
  the statistic from the producer's epilogue, ``rstd[m]`` in each consumer's epilogue;
- ``epilab auto, fold only``: policy ``auto`` with no records: every GEMM stays cuBLAS, only the
  graph rewrite of the fold (``rstd[m] * (h @ (diag(g) W))``) is left, lowered by Inductor.

Timing: interleaved rounds of per-call CUDA events (L2 flushed), median and spread (``rounds``);
error: ``||out - ref|| / ||ref||`` against the block in float64. The profile of one call lists
every kernel of the epilab variant (JSON), and the table names the norm kernels left.
Without ``--db`` epilab runs its untuned heuristics (policy ``always``, an empty database);
with ``--db`` policy ``auto`` on that database (templates only where their records win, and
their verdicts in context where ``epilab tune --model norm_fold:gpt2 --freezing`` gave some).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch
from rounds import device_header, interleaved, save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from zoo.transformers import GPT2, LlamaBlock

_names = itertools.count()
# the zoo's real sizes; (width, default batch, default sequence)
MODELS = {
    "llama": (lambda: LlamaBlock(d=2048, heads=16, kv_heads=8, f=5632, max_seq=4096), 2048, 4, 2048),
    "gpt2": (lambda: GPT2(d=768, heads=12, layers=2, vocab=8192), 768, 8, 1024),
}
_model = "llama"


def build(seed: int, name: str | None = None) -> torch.nn.Module:
    """The model (``--model``'s unless named) with random norm weights (and LayerNorm
    biases): the fold must carry them."""
    torch.manual_seed(seed)
    model = MODELS[name or _model][0]().cuda().eval()
    for mod in model.modules():
        if hasattr(mod, "weight") and mod.weight is not None and mod.weight.dim() == 1:
            mod.weight.data.uniform_(0.5, 1.5)
            if getattr(mod, "bias", None) is not None:
                mod.bias.data.uniform_(-0.5, 0.5)
    return model


def factory(name: str):
    """The model and its input at its default size, for ``epilab tune --model norm_fold:llama``
    (or ``:gpt2``, from this folder; with ``--freezing`` for the fold)."""

    def made() -> tuple[torch.nn.Module, torch.Tensor]:
        width, batch, seq = MODELS[name][1:]
        return build(0, name), torch.randn(batch, seq, width).to(torch.bfloat16)

    return made


llama, gpt2 = factory("llama"), factory("gpt2")


def compiled(x: torch.Tensor, freezing: bool, **kwargs: object):
    """A fresh bf16 model compiled with ``kwargs`` under its freezing setting (read when Dynamo
    traces, so every call runs inside it), and its first output. Each variant calls the model
    from a function of its own (a code object of its own: Dynamo keeps one cache per code
    object, and variants that share one would run each other's graphs; freezing is no guard)."""
    scope: dict[str, object] = {}
    name = f"variant_{next(_names)}"
    exec(f"def {name}(model, x):\n    return model(x)\n", scope)
    model = build(0).to(torch.bfloat16)
    step = torch.compile(scope[name], **kwargs)  # type: ignore[call-overload]
    fn = lambda x: step(model, x)  # noqa: E731

    def call() -> torch.Tensor:
        with torch.no_grad(), torch._inductor.config.patch(freezing=freezing):
            return fn(x)

    return call, call()


def kernels(call) -> list[tuple[str, float]]:
    """(name, us) of every GPU kernel of one call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [
        (e.key, e.device_time_total)
        for e in prof.key_averages()
        if e.device_time_total > 0 and "memcpy" not in e.key.lower() and "memset" not in e.key.lower()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--db", help="a tuning database: epilab's variants run policy auto on it")
    parser.add_argument("--record", action="store_true", help="only compile (recording the problems in --db)")
    parser.add_argument("--json")
    args = parser.parse_args()
    global _model
    _model = args.model
    width, batch, seq = MODELS[_model][1:]
    import epilab  # noqa: F401  (registers the backend)

    # every variant compiled afresh: Inductor's caches do not key on freezing (a frozen compile
    # was served the unfrozen graph of the variant before it)
    torch._inductor.config.force_disable_caches = True

    header = device_header(torch.cuda.get_device_properties(0).multi_processor_count)
    model = build(0)
    x = torch.randn(args.batch or batch, args.seq or seq, width, device="cuda")
    with torch.no_grad():
        want = model.double()(x.double())
    x = x.to(torch.bfloat16)
    del model
    db = str(Path(tempfile.mkdtemp()) / "norm_fold.db")  # empty: no records
    ours = {"policy": "auto", "db": args.db} if args.db else {"policy": "always", "db": db}
    variants, errors = {}, {}
    plan = [
        *([] if args.record else [("inductor", True, {})]),
        *([("max-autotune", True, {"mode": "max-autotune-no-cudagraphs"})] if args.max_autotune else []),
        ("epilab (no fold)", False, {"backend": "epilab", "options": ours}),
        ("epilab", True, {"backend": "epilab", "options": ours}),
        *(
            []
            if args.db
            else [
                (
                    "epilab auto, fold only",
                    True,
                    {"backend": "epilab", "options": {"policy": "auto", "db": db}},
                )
            ]
        ),
    ]
    torch._dynamo.config.cache_size_limit = 64
    for name, freezing, kwargs in plan:
        call, out = compiled(x, freezing, **kwargs)
        variants[name] = call
        errors[name] = ((out.double() - want).norm() / want.norm()).item()
        print(f"compiled {name}: error {errors[name]:.3e}", flush=True)
    if args.record:
        return
    profile = {name: kernels(call) for name, call in variants.items()}
    times = interleaved(variants, args.rounds)
    base = min(times[n]["ms"] for n in ("inductor", "max-autotune") if n in times)
    rows = []
    for name in variants:
        t = times[name]
        norms = [k for k, _ in profile[name] if "rsqrt" in k or "mean" in k]
        rows.append(
            {
                "variant": name,
                **t,
                "vs_best_inductor": base / t["ms"],
                "error": errors[name],
                "kernels": len(profile[name]),
                "norm_kernels": norms,
                "profile": profile[name],
            }
        )
    save(args.json, header, rows)
    print(f"\n{_model} {tuple(x.shape)} bf16, epilab on {args.db or 'no records, policy always'}; {header}")
    print("| variant | ms (median) | spread | vs best Inductor | error vs fp64 | kernels | norm kernels |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["spread"]
        print(
            f"| {r['variant']} | {r['ms']:.3f} | {lo:.3f}-{hi:.3f} | {r['vs_best_inductor']:.3f}x | "
            f"{r['error']:.2e} | {r['kernels']} | {len(r['norm_kernels'])} |"
        )
    for r in rows:
        print(f"{r['variant']}: norm kernels {[k[:70] for k in r['norm_kernels']]}")


if __name__ == "__main__":
    main()
