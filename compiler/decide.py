"""Decisions: template and config, or the aten op, for each epilogue group.

Policy ``auto`` (the default):

1. A record in the tuning database for this device (exact problem first, else a
   problem of the same math: the same performance identity, ``Problem.identity``, such
   as a shapes file's ``gelu_tanh(acc + bias[n])`` for the compiler's decomposed GELU
   with its rounding casts; else the nearest M of the same family, noted as a
   fallback): the template with
   the record's config when its time beats every baseline recorded for that
   problem (cuBLAS/cuBLASLt + eager epilogue, Inductor); the aten op (cuBLAS,
   with Inductor fusing the epilogue as usual) when a baseline is faster. With
   no baseline recorded, the tuned config is used. A group that reads fp8 inputs
   through the graph's dequantize ops (``Group.aten_dequantizes``: a dequantize-then-mm
   the compiler reads as an fp8 GEMM) is not held to its problem's baselines: they time
   an fp8 library GEMM (cuBLASLt), while its aten path is those dequantize ops and a
   16-bit GEMM over 2-byte copies of the inputs; the launch-bound rules below and the
   model's verdicts (``tune --model``) still apply.
   Without a record of the problem or its math, the nearest record of its template
   (``policy/nearest.py``: a distance over batch, M, N, K, layouts and epilogue bytes;
   nearer than the family's M fallback) gives a *transferred* config, checked for
   feasibility; under ``auto`` only within ``MAX_DISTANCE`` and where the source record
   beat its own baselines by ``MIN_SPEEDUP`` (the distance and margin where transfer
   held on the held-out half of two suites, RESULTS.md).
   A verdict recorded by ``model_tuning/tune.py`` (the model timed with and without the
   template) overrules the records: a problem whose model was faster without the
   template keeps the aten op, in the CUDA-graph mode and Inductor mode (default or
   max-autotune, which autotunes the aten op's own kernel) the verdict was measured in, and
   for the kind of graph it was measured in (inference, or a training step's forward and
   backward graphs: ``Context.training``).
2. No record: with ``tune_missing`` the problem is tuned now with a small budget
   and stored, then rule 1 applies. Otherwise the aten op. The documented rule
   for using the untuned heuristic config is "nowhere": over the cases of
   the probe in benchmarks/RESULTS.md the heuristic config lost to Inductor's cuBLAS
   + fused epilogue at some shapes and won at others of the same K ("Untuned
   heuristic vs Inductor"), so no shape rule we measured keeps
   the promise that switching the backend on never makes a model slower.

Launch-bound problems: without CUDA graphs a template call through the custom op costs more
CPU time than what it replaces (benchmarks/launch_overhead.py; RESULTS.md, "Launch cost"),
and for short kernels that decides the model's speed. So, unless the graph is
replayed as a CUDA graph (``mode="reduce-overhead"``, where kernel times alone
decide), the aten op is kept when the tuned kernel takes under
``FUSED_LAUNCH_BOUND_MS``, or under ``LAUNCH_BOUND_MS`` when the template fuses
nothing (its aten path is a single cuBLAS call); between the two it must save at
least ``LAUNCH_EXTRA_MS`` (the measured difference of the two launches) over the
best baseline, and without a recorded baseline it is not used at all. The
thresholds come from the end-to-end runs of benchmarks/e2e.py (RESULTS.md, issues 5
and 6), where short fused templates made small models slower than Inductor. A call that
Inductor launches as its own kernel (``launches_as_kernel``, ``compiler/emit.py``) costs the
host no more than the kernels it replaces, and is held to the kernel times alone.

Policy ``always`` uses the template wherever it applies (the recorded config, else the
heuristic: for a static M or N <= 16 the gemv template's, never a 16-row matmul tile);
``never`` does not install the pass at all (plain Inductor).

Dynamic M: the problem's M is a sympy expression. The plan is a small table of
M buckets, each with its config (the nearest record to the bucket's
representative M, or the heuristic); under ``auto`` the template is used only
when records exist and each bucket's record beats its baselines.

Dynamic batch (a convolution's images): only ``Shape.batch`` is symbolic. A config does not
depend on the batch (a convolution's transfer key leaves it out), so the problem is decided
as above at ``BATCH_HINT`` images and the call runs the chosen template's problem with the
batch left symbolic. A twin of another shape (a 1x1 convolution's matmul, whose M would be
the batch times the pixels) cannot run so: the aten op is kept where one is chosen.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from epilab.config import settings
from epilab.db import DeviceInfo, Lookup, TuningDB, Verdict, Versions, comparable_ms
from epilab.db.keys import canonical
from epilab.ir.config import Config
from epilab.ir.problem import Problem, identity_key_of
from epilab.policy.nearest import MAX_DISTANCE, MIN_SPEEDUP, distance_to, limits_of, why_not
from epilab.policy.space import run_error
from epilab.policy.suites import problem_label
from epilab.templates.registry import default_config, for_template, kind_of, twins, untuned_choice

if TYPE_CHECKING:
    from epilab.compiler.switch import Switches

LAUNCH_BOUND_MS = 0.05  # without CUDA graphs: shorter templates that fuse nothing keep aten
FUSED_LAUNCH_BOUND_MS = 0.02  # without CUDA graphs: shorter templates keep aten
LAUNCH_EXTRA_MS = 0.010  # without CUDA graphs: what a template call costs over the aten op (RESULTS.md)

BATCH_HINT = 32  # the images a dynamic-batch problem is decided at

# Representative M of each bucket and the bucket's upper bound (geometric midpoints).
BUCKETS: tuple[tuple[int, int | None], ...] = (
    (1, 3),
    (8, 22),
    (64, 90),
    (128, 181),
    (256, 362),
    (512, 724),
    (1024, 1448),
    (2048, 2896),
    (4096, 5792),
    (8192, None),
)


@dataclass(frozen=True)
class Decision:
    """One anchor's fate, as ``epilab.explain()`` shows it."""

    anchor: str  # the aten op, e.g. "aten.addmm"
    epilogue: str  # the fused epilogue as users read it (Problem.epilogue_text; "" when no group)
    shape: str  # M x N x K (batch x M x N x K for bmm)
    template: str | None  # the template used, or None where the aten op was kept
    config: dict[str, Any] | None  # the config (or M-bucket table) of the template call
    source: str | None  # exact record, nearest record (M=...), heuristic, tuned now
    reason: str
    problem_key: str | None = None
    device: str | None = None
    candidates: tuple[str, ...] = ()  # keys of the problems that could run the group (its twins)
    tried: bool = False  # decided on a trial copy of the graph (a norm fold tried), not applied
    replayed: bool = False  # Inductor served the graph from its cache; decided when it was compiled
    # how the template runs in the graph: "kernel" (launched by Inductor's output code:
    # ``compiler/emit.py``), or "op: <why not a kernel>" (the custom op ``epilab::template_call``)
    runs_as: str = ""
    module: str = ""  # the module its anchor was traced in (``graph_pass.module_of``); "" unknown
    # the epilogue's canonical IR (``Epilogue.text()``, as in the problem's key): what scripts
    # and tests match on (an operand's broadcast, a rounding cast the readable text leaves out)
    epilogue_ir: str = ""


@dataclass(frozen=True)
class Plan:
    """What the custom op runs: one config, or configs by M bucket."""

    config: Config | None = None
    buckets: tuple[tuple[int | None, Config], ...] = ()

    def to_json(self) -> str:
        if self.config is not None:
            return canonical({"config": self.config.to_dict()})
        return canonical({"buckets": [[upper, c.to_dict()] for upper, c in self.buckets]})

    @staticmethod
    def from_json(text: str) -> Plan:
        d = json.loads(text)
        if "config" in d:
            return Plan(config=Config.from_dict(d["config"]))
        return Plan(buckets=tuple((upper, Config.from_dict(c)) for upper, c in d["buckets"]))

    def choose(self, m: int) -> Config:
        if self.config is not None:
            return self.config
        for upper, config in self.buckets:
            if upper is None or m <= upper:
                return config
        return self.buckets[-1][1]

    def describe(self) -> dict[str, Any]:
        if self.config is not None:
            return self.config.to_dict()
        return {"buckets": [[upper, c.short()] for upper, c in self.buckets]}


@dataclass
class Context:
    """Everything decisions depend on, fixed for one compilation."""

    policy: str
    device: DeviceInfo | None  # None: CPU tensors without the interpreter
    target: str | None  # "cuda" or "interpreter"
    versions: Versions
    db: TuningDB | None
    db_error: str | None = None
    tune: Callable[[Problem], None] | None = None  # tune_missing: tunes and records a problem
    cuda_graphs: bool = False  # the compiled graph is replayed as a CUDA graph: no launch cost
    exclude: frozenset[str] = frozenset()  # problem keys left to the aten op (tune_model's ablations)
    verdicts: bool = True  # follow the verdicts of models measured with and without a template
    inductor_mode: str = "default"  # or "max-autotune": what the aten op becomes (verdicts are per mode)
    training: bool = False  # a training step's graph (forward or backward): verdicts of training steps
    # how chosen templates enter the graph: "kernels" (as Inductor's own kernel launches where they
    # can, ``compiler/emit.py``; else the custom op), "kernels_only" (where they cannot, the aten
    # op stays: an AOTInductor package, ``compiler/aot.py``), "op" (the custom op always), or
    # "interpreted" (kernels also for the interpreter: a graph run eagerly, as tests do)
    emit: str = "kernels"
    # tune --model's check: each group given a template runs it or its aten path by its
    # problem's flag in these (``compiler/switch.py``)
    switches: Switches | None = None


_time = comparable_ms  # compare like with like: CUDA-graph times when both have them


def fuses_nothing(problem: Problem) -> bool:
    """The epilogue only stores the product (casts aside): the aten path is one library call."""
    ep = problem.epilogue
    return len(ep.outputs) == 1 and all(n.op in ("acc", "cast") for n in ep.nodes)


def launches_as_kernel(ctx: Context, problem: Problem, config: Mapping[str, Any]) -> bool:
    """Whether the template's call will be launched by Inductor's output code as its own kernel
    (``compiler/emit.py``): a GPU, static shapes, a ``triton.jit`` kernel (not a Gluon one:
    those the interpreter cannot run either, ``TemplateKind.device_error``) and no ordered
    statistics. Such a call costs the host what Inductor's own kernels cost, so the
    launch-bound rules, measured for the custom op, do not hold it back."""
    if ctx.emit == "op" or ctx.target != "cuda" or not problem.shape.is_static():
        return False
    ordered = settings().deterministic or torch.are_deterministic_algorithms_enabled()
    if problem.epilogue.reductions and ordered:
        return False
    variant = str(config.get("variant", "default"))
    return kind_of(problem).device_error(variant, "9.0", True) is None


def _verdict(ctx: Context, hit: Lookup, problem: Problem, aten_dequantizes: bool = False) -> tuple[bool, str]:
    """Whether the record beats the baselines recorded beside it, and the evidence. Where the
    aten path dequantizes fp8 inputs (``Group.aten_dequantizes``) the baselines, fp8 GEMMs of
    a library, are not what the model runs without the template, and are passed over."""
    assert ctx.db is not None and ctx.device is not None
    bases = [b for b in ctx.db.baselines(hit.record.problem_key, ctx.device) if b.median_ms]
    if aten_dequantizes:
        tr = _time(hit.record)
        untimed = f" (the recorded {', '.join(sorted({b.library for b in bases}))} fp8 GEMM is not that path)"
        won = f"tuned {tr:.4g} ms; the aten path dequantizes the fp8 inputs and runs a 16-bit GEMM"
        won, saved = won + (untimed if bases else ""), None
    elif not bases:
        tr = _time(hit.record)
        won, saved = f"tuned {tr:.4g} ms; no baseline recorded", None
    else:
        best = min(bases, key=lambda b: _time(b, hit.record))
        tb, tr = _time(best, hit.record), _time(hit.record, best)
        if tr >= tb:
            return False, f"{best.library} {tb:.4g} ms is faster than the tuned {tr:.4g} ms"
        won, saved = f"tuned {tr:.4g} ms beats {best.library} {tb:.4g} ms ({tb / tr:.2f}x)", tb - tr
    if ctx.cuda_graphs or tr >= LAUNCH_BOUND_MS or launches_as_kernel(ctx, problem, hit.record.config or {}):
        return True, won
    if fuses_nothing(problem):
        return False, f"{won}, but launch-bound with nothing fused: one cuBLAS launch costs less"
    if tr < FUSED_LAUNCH_BOUND_MS:
        return False, f"{won}, but launch-bound (< {FUSED_LAUNCH_BOUND_MS * 1e3:.0f} us) without CUDA graphs"
    if saved is None or saved < LAUNCH_EXTRA_MS:
        gain = "an unknown gain" if saved is None else f"{saved * 1e3:.1f} us"
        return False, (
            f"{won}, but launch-bound: without CUDA graphs the template call costs "
            f"~{LAUNCH_EXTRA_MS * 1e3:.0f} us more than the aten op, more than {gain}"
        )
    return True, won


def _context_verdict(ctx: Context, chosen: Problem) -> Verdict | None:
    """The verdict of a model measured with and without ``chosen``'s template for this
    context's device, versions and mode (None without one, or where verdicts are not read)."""
    if not ctx.verdicts or ctx.db is None or ctx.device is None:
        return None
    return ctx.db.verdict(
        chosen.key,
        ctx.device,
        ctx.versions,
        cuda_graphs=ctx.cuda_graphs,
        inductor_mode=ctx.inductor_mode,
        training=ctx.training,
    )


def _in_context(ctx: Context, chosen: Problem, ok: bool, why: str) -> tuple[bool, str]:
    """The record's verdict, overruled where a model measured with and without the template
    (``model_tuning/tune.py``) was faster without it, or where the caller excludes the problem."""
    if chosen.key in ctx.exclude:
        return False, "left to the aten op on request (measuring the model without this template)"
    if not ok:
        return ok, why
    verdict = _context_verdict(ctx, chosen)
    if verdict is None:
        return ok, why
    if not verdict.keep:
        return False, f"{why}, but {verdict.describe()}: {verdict.why_not()}"
    return True, f"{why}; {verdict.describe()}"


def _source(hit: Lookup) -> str:
    if hit.via == "identity":
        return "record of the same math (another epilogue form: named ops, rounding, operand names)"
    return "exact record" if hit.exact else f"nearest record (M={hit.m})"


def _decide_unrecorded(
    problem: Problem, ctx: Context, made: Callable[..., Any]
) -> tuple[Decision, Plan | None, Problem]:
    """The decision where nothing is recorded for the problem or its twins: the heuristic
    config under policy always, else the aten path."""
    missing = f"nothing recorded for this problem on {ctx.device.name}"
    if ctx.db is None:
        missing = f"no tuning database ({ctx.db_error})"
    if ctx.policy == "always":
        # a skinny matmul runs on the gemv template's heuristic, not on a 16-row matmul tile
        chosen = untuned_choice(problem)
        device = ctx.device
        config = default_config(chosen, ctx.target, sm_count=device.sm_count, capability=device.capability)  # type: ignore[arg-type,union-attr]
        return made(
            chosen.key not in ctx.exclude,
            Plan(config=config),
            "heuristic",
            f"policy always; {missing}",
            chosen,
        )
    return made(
        False,
        None,
        None,
        f"{missing}; the untuned template is not known to win here "
        "(run `epilab tune --seen`, or compile with tune_missing=True)",
    )


def decide(
    problem: Problem, ctx: Context, anchor: str, shape: str, *, aten_dequantizes: bool = False
) -> tuple[Decision, Plan | None, Problem]:
    """The decision for one group's problem, the plan of the template call (if any), and
    the problem the call runs: the group's, or its gemv twin for small M when that
    template's record is faster. ``aten_dequantizes``: the group replaces dequantize ops and a
    16-bit GEMM (``Group.aten_dequantizes``), which no recorded baseline times."""

    def made(
        template: bool, plan: Plan | None, source: str | None, reason: str, chosen: Problem = problem
    ) -> tuple[Decision, Plan | None, Problem]:
        return (
            Decision(
                anchor=anchor,
                epilogue=problem.epilogue_text(),
                epilogue_ir=problem.epilogue.text(),
                shape=shape,
                template=chosen.template if template else None,
                config=plan.describe() if plan is not None else None,
                source=source,
                reason=reason,
                problem_key=chosen.key,
                device=ctx.device.name if ctx.device else None,
                candidates=tuple(c.key for c in candidates_of(problem)) if problem.shape.is_static() else (),
            ),
            plan if template else None,
            chosen,
        )

    if ctx.device is None or ctx.target is None:
        return made(False, None, None, "CPU tensors: templates run on CPU only with EPILAB_INTERPRET=1")
    if not problem.shape.is_static():
        if _batch_only(problem):
            return _decide_batch(problem, ctx, anchor, shape, aten_dequantizes)
        return _decide_dynamic(problem, ctx, made, aten_dequantizes)
    candidates = candidates_of(problem)
    found = _best_hit(candidates, ctx)
    moved = _transfer(candidates, ctx) if found is None or found[1].via == "family" else None
    if moved is not None and (found is None or moved[1].distance < _m_distance(*found)):  # type: ignore[operator]
        chosen, hit = moved
        plan, source = _plan(hit), _transferred(hit)
        if ctx.policy == "always":
            return made(chosen.key not in ctx.exclude, plan, source, "policy always", chosen)
        ok, why = _in_context(ctx, chosen, *_transfer_verdict(ctx, hit, chosen, aten_dequantizes))
        return made(ok, plan, source, why, chosen)
    if found is None and ctx.tune is not None and ctx.policy == "auto":
        for candidate in candidates:
            ctx.tune(candidate)
        found = _best_hit(candidates, ctx)
        if found is not None:
            chosen, hit = found
            ok, why = _in_context(ctx, chosen, *_verdict(ctx, hit, chosen, aten_dequantizes))
            return made(ok, _plan(hit), "tuned now", why, chosen)
    if found is not None:
        chosen, hit = found
        plan = _plan(hit)
        if ctx.policy == "always":
            return made(chosen.key not in ctx.exclude, plan, _source(hit), "policy always", chosen)
        ok, why = _in_context(ctx, chosen, *_verdict(ctx, hit, chosen, aten_dequantizes))
        return made(ok, plan, _source(hit), why, chosen)
    return _decide_unrecorded(problem, ctx, made)


def candidates_of(problem: Problem) -> list[Problem]:
    """The templates that can run the problem (``registry.twins``): its own, gemv for a
    static M or N <= 16, matmul for a 1x1 NHWC convolution."""
    return twins(problem)


def norm_group_loses(
    ctx: Context,
    chosen: Problem,
    plain: Problem,
    fused_work: str = "the norm in its epilogue",
    left: str = "Inductor computes the norm",
) -> str | None:
    """Why the group without a norm (``plain``: Inductor then computes the norm) runs rather
    than ``chosen``, the template problem of the group that normalises in its epilogue (row
    totals), or None to run ``chosen``. Under ``auto`` the norm's group runs where a model
    measured it in context (a keep verdict), or where its record is no slower than the plain
    group's best: its own baseline (the library plus the norm in eager torch) says nothing of
    the plain kernel plus Inductor's norm kernel, which it must beat (measured on an H200 the
    fused norm took 2.2x the plain kernel's time, which the eager norm's baseline hid). The
    same rule weighs a grouped GEMM that gathers its rows (``fused_work``, ``left``: what the
    message says of it) against the plain one after Inductor's copy of them: the gathered
    rows are loaded by pointers, not TMA, which cost 7-8% on Mixtral's gate and up
    projections on an H200 (RESULTS.md, 2026-11-27 routing)."""
    if ctx.policy == "always" or ctx.db is None or ctx.device is None:
        return None
    verdict = _context_verdict(ctx, chosen)
    if verdict is not None and verdict.keep:
        return None
    fused, other = _best_hit([chosen], ctx), _best_hit(candidates_of(plain), ctx)
    if fused is None or other is None:
        return None
    tf, tp = _time(fused[1].record, other[1].record), _time(other[1].record, fused[1].record)
    if tf <= tp:
        return None
    return (
        f"the group with {fused_work} ({tf:.4g} ms) is slower than the group without "
        f"it ({tp:.4g} ms), which runs; {left}"
    )


def _best_hit(candidates: list[Problem], ctx: Context) -> tuple[Problem, Lookup] | None:
    """The candidate whose record is fastest (exact records before nearest ones)."""
    hits = [(p, h) for p in candidates if (h := _lookup(p, ctx)) is not None]
    if not hits:
        return None
    return min(hits, key=lambda ph: (not ph[1].exact, _time(ph[1].record)))


def _transfer(candidates: list[Problem], ctx: Context) -> tuple[Problem, Lookup] | None:
    """The nearest record of each candidate whose config is feasible for it
    (``policy/nearest.py``); under ``auto`` only within the distance where transfer held."""
    if ctx.db is None or ctx.device is None:
        return None
    within = MAX_DISTANCE if ctx.policy == "auto" else math.inf
    best: tuple[Problem, Lookup] | None = None
    for p in candidates:
        for hit in ctx.db.nearest(
            p, ctx.device, distance_to(p), versions=ctx.versions, usable=_runs(p, ctx), within=within
        ):
            if why_not(p, Config.from_dict(hit.record.config or {}), ctx.device) is None:
                if best is None or hit.distance < best[1].distance:  # type: ignore[operator]
                    best = (p, hit)
                break
    return best


def _m_distance(problem: Problem, hit: Lookup) -> float:
    """A family fallback's distance (another M only), to weigh against a transfer's."""
    m = problem.shape.m
    return abs(math.log2(int(m) / hit.m)) if isinstance(m, int) and m > 0 and hit.m else math.inf


def _transferred(hit: Lookup) -> str:
    source = Problem.from_json(hit.source_json or "")
    return f"transferred from {problem_label(source)} (distance {hit.distance:.2f})"


def _transfer_verdict(
    ctx: Context, hit: Lookup, problem: Problem, aten_dequantizes: bool = False
) -> tuple[bool, str]:
    """A transferred config is used where its source record beat its own baselines by
    ``MIN_SPEEDUP`` (what a transfer may lose, measured: policy/nearest.py)."""
    assert ctx.db is not None and ctx.device is not None
    bases = [b for b in ctx.db.baselines(hit.record.problem_key, ctx.device) if b.median_ms]
    if not bases:
        return False, "the source record has no baseline: a transfer's gain is unknown"
    best = min(bases, key=lambda b: _time(b, hit.record))
    margin = _time(best, hit.record) / max(_time(hit.record, best), 1e-12)
    if margin < MIN_SPEEDUP:
        return False, (
            f"the source beats {best.library} by {margin:.2f}x, under the {MIN_SPEEDUP:.2f}x a transferred "
            "config needs"
        )
    ok, why = _verdict(ctx, hit, problem, aten_dequantizes)
    return ok, f"source: {why}"


def _runs(problem: Problem, ctx: Context) -> Callable[[Any], bool]:
    """Whether a record's config runs ``problem`` on the device: records this version cannot
    run (another version's, a bad import, another problem's whose config does not fit this
    one) are passed over, never chosen to fail on the first call."""
    assert ctx.device is not None
    limits = limits_of(ctx.device)

    def runs(d: Any) -> bool:
        return Config.is_valid(d) and run_error(problem, Config.from_dict(d), limits) is None

    return runs


def _lookup(problem: Problem, ctx: Context, m: int | None = None) -> Lookup | None:
    if ctx.db is None or ctx.device is None:
        return None
    hit = ctx.db.lookup(
        problem,
        ctx.device,
        ctx.versions,
        m=m,
        usable=_runs(problem, ctx),
        same=lambda text: identity_key_of(text) == problem.identity_key,
    )
    return None if hit is None or hit.record.config is None else hit


def _plan(hit: Lookup) -> Plan:
    return Plan(config=Config.from_dict(hit.record.config or {}))


def _batch_only(problem: Problem) -> bool:
    """Whether the batch is the problem's only symbolic dim (a dynamic batch of images)."""
    s = problem.shape
    return all(isinstance(d, int) for d in (s.m, s.n, s.k)) and not isinstance(s.batch, int)


def _decide_batch(
    problem: Problem, ctx: Context, anchor: str, shape: str, aten_dequantizes: bool
) -> tuple[Decision, Plan | None, Problem]:
    """A dynamic-batch problem, decided at ``BATCH_HINT`` images; the call runs the chosen
    template with the batch symbolic (see the module's docstring)."""
    at = dataclasses.replace(problem, shape=dataclasses.replace(problem.shape, batch=BATCH_HINT))
    decision, plan, chosen = decide(at, ctx, anchor, shape, aten_dequantizes=aten_dequantizes)
    if decision.template is None:
        return decision, plan, problem
    if chosen.shape != at.shape:
        reason = f"dynamic batch: the {chosen.template} twin chosen at batch {BATCH_HINT} has another shape"
        return dataclasses.replace(decision, template=None, config=None, reason=reason), None, problem
    why = f"{decision.reason} (dynamic batch, decided at {BATCH_HINT} images)"
    return dataclasses.replace(decision, reason=why), plan, for_template(problem, chosen.template)


def _decide_dynamic(
    problem: Problem, ctx: Context, made: Callable[..., Any], aten_dequantizes: bool
) -> tuple[Decision, Plan | None, Problem]:
    assert ctx.device is not None and ctx.target is not None
    buckets: list[tuple[int | None, Config]] = []
    verdicts: list[str] = []
    recorded = all_win = 0
    for rep, upper in BUCKETS:
        hit = _lookup(problem, ctx, m=rep)
        if hit is not None:
            recorded += 1
            ok, why = _verdict(ctx, hit, problem, aten_dequantizes)
            all_win += ok
            verdicts.append(f"M~{rep}: {why}")
            buckets.append((upper, Config.from_dict(hit.record.config or {})))
        else:
            at = dataclasses.replace(problem, shape=dataclasses.replace(problem.shape, m=rep))
            device = ctx.device
            untuned = default_config(at, ctx.target, sm_count=device.sm_count, capability=device.capability)  # type: ignore[arg-type,union-attr]
            buckets.append((upper, untuned))
    plan = Plan(buckets=tuple(buckets))
    source = "nearest records by M bucket" if recorded else "heuristic by M bucket"
    if ctx.policy == "always":
        return made(True, plan, source, f"policy always; symbolic M, {recorded} bucket(s) from records")
    if recorded and all_win == recorded:
        return made(True, plan, source, "symbolic M; every bucket's record beats its baselines")
    if recorded:
        losing = [v for v in verdicts if "faster than" in v]
        return made(False, None, None, "symbolic M; a baseline is faster for " + "; ".join(losing[:3]))
    return made(False, None, None, "symbolic M and nothing recorded for its family on " + ctx.device.name)
