"""Tuning problems end to end: search, evaluate in isolation, record everything.

``Tuner.tune(spec)`` runs one optuna study (kept in the tuning database's URL
through optuna's RDB storage, so it resumes where it stopped), evaluates each
batch of proposals (compiled in parallel, each checked and timed in the GPU worker
as soon as its compile is done),
records every trial in the database (failed ones with their status), then times
and records the requested baselines.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from epilab.db import DeviceInfo, Record, Timing, TuningDB, Versions, comparable_ms
from epilab.db.models import COMPILE_FAILURES
from epilab.ir.config import Config
from epilab.ir.dtypes import itemsize
from epilab.ir.problem import Problem
from epilab.ir.spec import ProblemSpec
from epilab.policy.nearest import warm_seeds
from epilab.policy.roofline import good_enough_ms
from epilab.policy.space import HOPPER, INTERPRETER_DEVICE, DeviceLimits, applies, infeasible, space_for
from epilab.policy.suites import problem_label
from epilab.templates.registry import kind_of
from epilab.tuner.baselines import BASELINES, KIND_LIBRARIES
from epilab.tuner.compile_server import ServerPool, compile_pool
from epilab.tuner.learned import LearnedRules
from epilab.tuner.phases import add_phases
from epilab.tuner.profile import CompileStats, trial_compiles, trial_profile
from epilab.tuner.search import Budget, Outcome, SearchResult, TakenOver, adopt, in_space, make_study, search
from epilab.tuner.worker import CompilePool, Worker

# what a candidate's worker reports when the process died or stalled: the config's fault,
# unless the device itself no longer answers (probed before such a trial is recorded)
DEATHS = ("crashed", "timeout")


# a candidate that has not answered after the longer of these is killed as hung (``timeout``):
# HANG_FLOOR_S covers a fresh worker's start and a cold compile, HANG_FACTOR the longest check
# and timing of this run so far; never beyond ``TuneOptions.worker_timeout_s``, which alone
# applies until a candidate has finished and in the interpreter. (One hung matmul config cost
# a MobileNet's tuning 180 s of its 294 on an H100.)
HANG_FLOOR_S = 60.0
HANG_FACTOR = 5.0


class DeviceLost(RuntimeError):
    """The tuning device stopped answering (a candidate crashed and a probe then failed)."""


@dataclass(frozen=True)
class TuneOptions:
    budget: Budget = field(default_factory=Budget)
    baselines: tuple[str, ...] = KIND_LIBRARIES  # each problem's kind's own (the others are skipped)
    restart: bool = False
    jobs: int = 8
    device_index: int = 0
    interpret: bool = False
    worker_timeout_s: float = 180.0
    seed: int = 0
    warm: bool = True  # a new study starts from the records' configs (``seeds``)
    # ``--total-time``: the run's deadline (``time.monotonic``), and each problem's seconds of
    # search at most, its share of the time left (tuner/total_time.py)
    deadline: float | None = None
    seconds_for: Mapping[str, float] = field(default_factory=dict)
    remeasure_baselines: bool = False  # else a baseline this device and versions recorded is kept
    profile: bool = False  # each problem's result keeps a row of each trial (tuner/profile.py)
    compile_server: bool = True  # compile in the host's shared server (tuner/compile_server.py)

    def __post_init__(self) -> None:
        unknown = set(self.baselines) - set(BASELINES)
        if unknown:
            raise ValueError(f"unknown baseline(s) {sorted(unknown)}; choose from {', '.join(BASELINES)}")


@dataclass(frozen=True)
class ProblemResult:
    label: str
    key: str
    best: Config | None
    best_ms: float | None
    tflops: float | None
    baselines: dict[str, float]
    evaluated: int
    new: int
    stopped_by: str
    statuses: dict[str, int]
    seconds: float
    refused: str | None = None  # why the problem was not tuned (too large for the device)
    library: str = "cublas"  # the vendor library of the problem's kind (cuDNN for conv2d)
    # library -> (baseline ms, tuned ms, "graph" or "events"): like with like (db.comparable_ms)
    compared: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # where ``seconds`` went (phases.PHASES)
    compiles: dict[str, float | int] = field(default_factory=dict)  # profile.CompileStats.to_dict
    trials_profile: tuple[dict[str, Any], ...] = ()  # with TuneOptions.profile: profile.trial_profile rows

    @property
    def library_ms(self) -> float | None:
        """The vendor library's time (with the epilogue in eager torch) as the speedup
        compares it: CUDA-graph time when both sides have one, else the events median."""
        found = self.compared.get(self.library)
        return found[0] if found else self.baselines.get(self.library)

    @property
    def timed_as(self) -> str | None:
        found = self.compared.get(self.library)
        return found[2] if found else None

    @property
    def speedup(self) -> float | None:
        found = self.compared.get(self.library)
        return None if found is None or found[1] <= 0 else found[0] / found[1]

    def to_dict(self) -> dict[str, object]:
        """For ``epilab tune --json``."""
        return {
            "label": self.label,
            "key": self.key,
            "best": None if self.best is None else self.best.to_dict(),
            "best_ms": self.best_ms,
            "tflops": self.tflops,
            "baselines_ms": self.baselines,
            "compared": {
                lib: {"baseline_ms": b, "tuned_ms": t, "timed_as": how}
                for lib, (b, t, how) in self.compared.items()
            },
            "library": self.library,
            "speedup": self.speedup,
            "trials": self.evaluated,
            "new_trials": self.new,
            "stopped_by": self.stopped_by,
            "statuses": self.statuses,
            "seconds": round(self.seconds, 3),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "compiles": self.compiles,
            **({"trials_profile": list(self.trials_profile)} if self.trials_profile else {}),
            "refused": self.refused,
        }


def like_with_like(best: Record, baselines: list[Record]) -> dict[str, tuple[float, float, str]]:
    """Each library's fastest baseline against the tuned ``best``: (baseline ms, tuned ms,
    "graph" or "events"). CUDA-graph times where both have one (short kernels, where one
    call at a time is mostly launch gaps: three eager launches' host time is not the
    library's speed), else both events medians (``db.comparable_ms``)."""
    out: dict[str, tuple[float, float, str]] = {}
    for b in sorted(baselines, key=lambda r: r.median_ms or math.inf, reverse=True):  # fastest last
        both_graph = b.graph_ms is not None and best.graph_ms is not None
        out[str(b.library)] = (
            comparable_ms(b, best),
            comparable_ms(best, b),
            "graph" if both_graph else "events",
        )
    return out


def input_bytes(problem: Problem) -> int:
    """A and B as stored, each in its dtype (a weight-only B in fp8)."""
    kind = kind_of(problem)
    a, b = kind.input_elements(problem)
    return itemsize(problem.dtype) * a + itemsize(kind.b_dtype(problem)) * b


def problem_flops(problem: Problem) -> int:
    """The problem's FLOPs: 2 x MNK (times the batch) for each of its GEMMs (a dual's two)."""
    return problem.shape.flops() * kind_of(problem).accumulators


def problem_bytes(problem: Problem) -> int:
    """Fewest bytes a kernel must move: A and B read (as stored: a convolution's input and
    weight, not its im2col matrix), operands read, outputs written."""
    s = problem.shape
    batch, m, n = int(s.batch), int(s.m), int(s.n)
    total = input_bytes(problem)
    broadcasts = dict(problem.epilogue.operands)
    for spec in problem.operands:
        count = {"row": n, "col": m, "scalar": 1}.get(broadcasts[spec.name], batch * m * n)
        total += count * itemsize(spec.dtype)
    total += sum(batch * m * n * itemsize(o.dtype) for o in problem.epilogue.outputs)
    return total


def evaluation_bytes(problem: Problem) -> int:
    """About what checking a candidate allocates at once: the inputs and outputs, and the
    float64 reference (A and B converted, the accumulator and the epilogue's temporaries)."""
    s = problem.shape
    a_elems, b_elems = kind_of(problem).input_elements(problem)
    return problem_bytes(problem) + 8 * (a_elems + b_elems + 3 * int(s.batch) * int(s.m) * int(s.n))


def too_large(problem: Problem, memory_bytes: int) -> str | None:
    """Why ``problem`` cannot be evaluated in ``memory_bytes`` of device memory, or None."""
    need = evaluation_bytes(problem)
    if memory_bytes <= 0 or need <= 0.9 * memory_bytes:
        return None
    return (
        f"too large: checking a candidate needs about {_size(need)} (inputs, outputs and the float64 "
        f"reference); the device has {_size(memory_bytes)}"
    )


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def host_memory_bytes() -> int:
    """The host's physical memory (the interpreter's device), or 0 where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _timing(result: dict, flops: int, nbytes: int) -> Timing | None:
    """The database's Timing of a worker result (None when nothing was timed)."""
    ms = result.get("median_ms")
    if ms is None:
        return None
    return Timing(
        ms,
        result["p20_ms"],
        result["p80_ms"],
        result["method"],
        tflops=flops / (ms * 1e9),
        gbps=nbytes / (ms * 1e6),
        graph_ms=result.get("graph_ms"),
    )


def _add_worker_phases(phases: Counter[str], result: dict) -> None:
    """A candidate's phases as its worker timed them; the rest of the task's round trip
    (a process started or restarted, the pipe) is the worker's."""
    own = result.get("phases") or {}
    for name, seconds in own.items():
        phases[name] += seconds
    phases["worker"] += max(0.0, result.get("seconds", 0.0) - sum(own.values()))


def study_name(problem: Problem, device: DeviceInfo) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device.name).strip("-")
    return f"epilab-{problem.template}-{problem.key[:24]}-{slug}-sm{device.capability}-{device.sm_count}"


class Tuner:
    """Tunes problems one after another with one GPU worker (and a compile pool)."""

    def __init__(self, db: TuningDB, options: TuneOptions, *, hook: tuple[str, str] | None = None) -> None:
        self.db = db
        self.options = options
        if options.interpret:
            self.device = INTERPRETER_DEVICE
            self.limits = dataclasses.replace(HOPPER, memory_bytes=host_memory_bytes())
        else:
            self.limits = DeviceLimits.of(options.device_index)
            self.device = self.limits.info
        self.versions = Versions(torch.__version__, triton.__version__)
        self.worker = Worker.for_device(
            timeout_s=options.worker_timeout_s,
            device_index=-1 if options.interpret else options.device_index,
            hook=hook,
        )
        self.pool: CompilePool | ServerPool | None = None
        if options.jobs > 0 and not options.interpret:
            shared = options.compile_server
            self.pool = (compile_pool if shared else CompilePool)(options.jobs, options.device_index)
            self.pool.start()
        self.storage = db.optuna_storage()  # the studies, beside the records
        self._seeds = itertools.count(options.seed * 1_000_003 + 1)
        self._trial_numbers = itertools.count()
        self.evaluated = 0  # trials evaluated and recorded by this tuner
        self.longest_s = 0.0  # the longest check and timing of a candidate so far (its phases)

    @property
    def device_label(self) -> str:
        kind = "interpreter" if self.options.interpret else "cuda"
        return f"{kind}:{self.options.device_index}"

    def close(self) -> None:
        self.worker.close()
        if self.pool is not None:
            self.pool.close()

    def cancel(self) -> None:
        """From another thread (Ctrl-C): the evaluation under way raises Cancelled, nothing
        half-done is recorded, and so does every later one."""
        self.worker.cancel()
        if self.pool is not None:
            self.pool.cancel()

    def __enter__(self) -> Tuner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate(
        self,
        problem: Problem,
        configs: list[Config],
        *,
        study: str,
        on_result: Callable[[Config, dict], None] | None = None,
    ) -> list[Outcome]:
        """Compile ``configs`` in parallel, then check and time each in the worker;
        every one is recorded in the database as a trial of ``study``."""
        return list(self.iter_evaluate(problem, configs, study=study, on_result=on_result))

    def iter_evaluate(
        self,
        problem: Problem,
        configs: list[Config],
        *,
        study: str,
        on_result: Callable[[Config, dict], None] | None = None,
        holds: Callable[[], bool] = lambda: True,
        phases: Counter[str] | None = None,
        compiles: CompileStats | None = None,
        trace: list[dict[str, Any]] | None = None,
    ) -> Iterator[Outcome]:
        """``evaluate``, yielding each outcome once its trial is recorded; each candidate is
        checked as soon as its compile is done (``CompilePool.compiled``). A candidate that
        killed or stalled its worker is recorded as such only after a probe shows the device
        still computes; otherwise DeviceLost is raised and nothing is recorded for it.
        ``holds`` says whether the problem is still this runner's (its lease): when it is
        not, the trial is dropped unrecorded and TakenOver raised. ``phases`` gathers where
        the seconds went (``phases.PHASES``), ``compiles`` the Triton compiles, and ``trace``
        a row of each trial (``profile.trial_profile``)."""
        phases = Counter() if phases is None else phases
        compiles = CompileStats() if compiles is None else compiles
        problem_json = problem.to_json()
        flops, nbytes = problem_flops(problem), problem_bytes(problem)
        compiled = (
            self.pool.compiled(problem_json, [c.to_dict() for c in configs])
            if self.pool
            else iter([{"status": "compiled"}] * len(configs))
        )
        for config in configs:
            trial: Counter[str] = Counter()  # this trial's phases
            started = time.monotonic()
            pre = next(compiled)  # the later candidates compile while this one is checked and timed
            trial["compile"] += time.monotonic() - started
            if pre["status"] in COMPILE_FAILURES:
                result = pre
            else:
                result = self.worker.run(
                    {
                        "job": "candidate",
                        "problem": problem_json,
                        "config": config.to_dict(),
                        "seed": next(self._seeds),
                    },
                    timeout_s=self.hang_timeout_s(),
                )
                _add_worker_phases(trial, result)
                if result["status"] not in DEATHS:
                    self.longest_s = max(self.longest_s, sum((result.get("phases") or {}).values()))
            # the search minimises the comparable time: CUDA-graph replay where measured
            status, ms = result["status"], result.get("graph_ms") or result.get("median_ms")
            if status in DEATHS:
                self._probe(result)
            timing = _timing(result, flops, nbytes)
            if not holds():  # paused past its lease: the new holder measures this config
                raise TakenOver(f"{problem_label(problem)}: the lease was lost while a trial ran")
            recording = time.monotonic()
            self.db.record_trial(
                problem,
                self.device,
                config=config.to_dict(),
                status=status,
                timing=timing,
                max_rel_error=result.get("max_rel_error"),
                versions=self.versions,
                study=study,
                trial_number=next(self._trial_numbers),
                detail=result.get("detail"),
            )
            trial["database"] += time.monotonic() - recording
            phases.update(trial)
            made = trial_compiles(pre, result)
            compiles.merge(made)
            if trace is not None:
                trace.append(trial_profile(len(trace), config, status, ms, trial, made.to_dict()))
            self.evaluated += 1
            if on_result is not None:
                on_result(config, result)
            yield Outcome(status, ms if status == "ok" else None)

    def hang_timeout_s(self) -> float:
        """How long the next candidate may take before it is killed as hung (``HANG_FLOOR_S``)."""
        if self.options.interpret or self.longest_s <= 0:
            return self.options.worker_timeout_s
        return min(self.options.worker_timeout_s, max(HANG_FLOOR_S, HANG_FACTOR * self.longest_s))

    def _probe(self, died: dict) -> None:
        """Raise DeviceLost unless the (restarted) worker's device still computes."""
        probe = self.worker.run({"job": "probe"}, timeout_s=120.0)
        if probe["status"] != "ok":
            raise DeviceLost(
                f"{self.device_label} stopped answering: a candidate {died['status']} "
                f"({died.get('detail', '')[:300]}), then a probe {probe['status']} "
                f"({probe.get('detail', '')[:300]})"
            )

    def seeds(self, problem: Problem) -> list[Config]:
        """Configs a new study tries first: with ``TuneOptions.warm``, the records' and then the
        template's (``warm_start``); else the template's alone (``own_seeds``)."""
        if not self.options.warm:
            return self.own_seeds(problem)
        return self.warm_start(problem, warm_seeds(self.db, problem, self.device, self.versions))

    def own_seeds(self, problem: Problem) -> list[Config]:
        """The default heuristic's config, then the template's known-good list."""
        target = "interpreter" if self.options.interpret else "cuda"
        kind = kind_of(problem)
        return [kind.default_config(problem, target, sm_count=self.limits.sm_count), *kind.seeds_for(problem)]

    def warm_start(self, problem: Problem, warm: list[Config]) -> list[Config]:
        """``warm`` (the records' configs: ``nearest.warm_seeds``), then the default heuristic's
        and the template's known-good list, each once. (Keeping only two of the list after the
        records' configs, to leave the sampler more of a 16-trial budget, did worse on the
        held-out half of llm + midm + conv: RESULTS.md 2026-11-27, "Warm starts".)"""
        return [*warm, *(c for c in self.own_seeds(problem) if c not in warm)]

    def prefetch(self, problem: Problem) -> None:
        """Compile the first batch of ``problem``'s seeds in the compile pool's spare time, while
        another problem is searched (``CompilePool.warm``): its search then starts on binaries
        Triton has cached. (At 12 trials on an H100, each problem of quick + llm waited 1-2 s
        for its first compiles: RESULTS.md, 2026-11-27 "Tuning throughput".)"""
        if self.pool is None or not problem.shape.is_static():
            return
        try:
            space = space_for(problem, self.limits)
            seeds = self.seeds(problem)
            first = [c for c in seeds if in_space(space, c) and infeasible(problem, c, self.limits) is None]
        except Exception as e:  # a guess that failed: never the current search's failure
            logging.getLogger("epilab").debug("no prefetch for %s: %s", problem_label(problem), e)
            return
        self.pool.warm(problem.to_json(), [c.to_dict() for c in first[: self.options.budget.batch]])

    def tune(
        self, spec: ProblemSpec, on_trial: Callable[[int, Config, Outcome, float | None], None] | None = None
    ) -> ProblemResult:
        """Search ``spec``'s problem, record every trial, time the baselines."""
        return self.tune_problem(spec.problem(), spec.label(), on_trial)

    def tune_problem(
        self,
        problem: Problem,
        label: str,
        on_trial: Callable[[int, Config, Outcome, float | None], None] | None = None,
        *,
        exclusive: bool = False,
        stop: Callable[[], str | None] = lambda: None,
        holds: Callable[[], bool] = lambda: True,
        restart: bool | None = None,
        upcoming: Sequence[Problem] = (),
    ) -> ProblemResult:
        """Search ``problem`` (static shape), record every trial, time the baselines.
        ``exclusive``: this process holds the problem's lease, so the study is its alone
        and is first made whole after a killed runner (``search.adopt``). ``stop`` ends the
        search early with its reason (a lost lease); ``holds``, checked before each trial is
        recorded, raises TakenOver when the problem is no longer this runner's. ``restart``
        (default: the options') deletes the problem's study first. ``upcoming``: the problems
        likely tuned next, whose seeds compile in the background once this search is under
        way (``prefetch``)."""
        if not problem.shape.is_static():
            raise ValueError(f"{label}: only problems with static shapes can be tuned, got {problem.shape}")
        started = time.monotonic()
        refused = self._refusal(problem)
        if refused is not None:  # refused up front: nothing allocated, nothing recorded, the run goes on
            library = kind_of(problem).library
            return ProblemResult(
                label, problem.key, None, None, None, {}, 0, 0, "refused", {}, 0.0, refused, library
            )
        phases: Counter[str] = Counter()
        compiles = CompileStats()
        trace: list[dict[str, Any]] | None = [] if self.options.profile else None
        opened = time.monotonic()
        restart = self.options.restart if restart is None else restart
        name, study, space, seeds, learned = self._open_study(problem, restart=restart, exclusive=exclusive)
        phases["database"] += time.monotonic() - opened  # (and the problem's row, stored above)
        statuses: Counter[str] = Counter()

        def why_not(config: Config) -> str | None:
            checked = time.monotonic()
            why = infeasible(problem, config, self.limits) or learned.why(config)
            phases["feasibility"] += time.monotonic() - checked
            return why

        def progress(config: Config, outcome: Outcome, best: Config | None, best_ms: float | None) -> None:
            statuses[outcome.status] += 1
            if on_trial is not None:
                on_trial(sum(statuses.values()), config, outcome, best_ms)

        ahead = list(upcoming)

        def evaluate(configs: list[Config]) -> Iterator[Outcome]:
            for outcome in self.iter_evaluate(
                problem, configs, study=name, holds=holds, phases=phases, compiles=compiles, trace=trace
            ):
                yield outcome
                while ahead:  # after the first trial: its batch's compiles are under way
                    self.prefetch(ahead.pop(0))

        result = search(
            study,
            space,
            evaluate=evaluate,
            infeasible=why_not,
            budget=self.budget_for(problem),
            seeds=seeds,
            on_trial=progress,
            applies=applies(problem),
            stop=stop,
            good_enough_ms=self.roofline_ms(problem),
        )
        return self._result(problem, label, result, started, phases, statuses, compiles, trace, learned)

    def _result(
        self,
        problem: Problem,
        label: str,
        result: SearchResult,
        started: float,
        phases: Counter[str],
        statuses: Counter[str],
        compiles: CompileStats,
        trace: list[dict[str, Any]] | None,
        learned: LearnedRules,
    ) -> ProblemResult:
        """A searched problem's result, its baselines timed (the rest of its time, from
        ``started``, counted as the search's)."""
        flops = problem_flops(problem)
        timed = time.monotonic()
        baselines = self._baselines(problem, problem.to_json(), flops, problem_bytes(problem))
        phases["baselines"] += time.monotonic() - timed
        best_ms = result.best_ms
        compared = self._compared(problem)
        refused = learned.refusal() if result.evaluated == 0 else None
        seconds = time.monotonic() - started
        phases["search"] += max(0.0, seconds - sum(phases.values()))
        return ProblemResult(
            label=label,
            key=problem.key,
            best=result.best,
            best_ms=best_ms,
            tflops=None if best_ms is None else flops / (best_ms * 1e9),
            baselines=baselines,
            evaluated=result.evaluated,
            new=result.new,
            stopped_by=result.stopped_by,
            statuses=dict(statuses),
            seconds=seconds,
            library=kind_of(problem).library,
            compared=compared,
            phases=add_phases({}, phases),
            compiles={**compiles.to_dict(), "refused_as_learned": len(learned.refused)},
            trials_profile=tuple(trace or ()),
            refused=refused,
        )

    def _refusal(self, problem: Problem) -> str | None:
        """Why ``problem`` is refused before its search (too large for the device, or one the
        database cannot store); None after storing its row."""
        refused = too_large(problem, self.limits.memory_bytes)
        if refused is None:
            try:
                self.db.put_problem(problem)
            except ValueError as e:  # a problem the database cannot store (its checks say why)
                refused = f"not stored: {e}"
        return refused

    def _open_study(
        self, problem: Problem, *, restart: bool, exclusive: bool
    ) -> tuple[str, Any, dict[str, tuple[int, ...]], list[Config], LearnedRules]:
        """The problem's study (made whole after a killed runner where ``exclusive``), its
        space, the seeds a new study starts from, and the compile failures learned for it."""
        name = study_name(problem, self.device)
        study = make_study(name, self.storage, restart=restart, seed=self.options.seed)
        space = space_for(problem, self.limits)
        if exclusive:
            adopt(study, space, {} if restart else self._recorded(problem, name), applies(problem))
        seeds = [] if study.get_trials(deepcopy=False) else self.seeds(problem)  # a new study's only
        # --restart tries the configs Triton failed to build before again (a fixed Triton, a
        # rule learned from a failure that was the host's): nothing else clears them
        failed = [] if restart else self.db.failed_compiles(problem, self.device, self.versions.triton)
        return name, study, space, seeds, LearnedRules(problem, failed)

    def _recorded_baselines(self, problem: Problem) -> dict[str, float]:
        """Library -> time of the baselines this device recorded for ``problem`` with these
        torch and triton versions: not timed again (a problem's baselines took 2-10 s of each
        ``tune`` of it, and of each resumed one)."""
        return {
            str(r.library): r.graph_ms or float(r.median_ms)
            for r in self.db.baselines(problem.key, self.device)
            if r.versions == self.versions and r.status == "ok" and r.median_ms
        }

    def budget_for(self, problem: Problem) -> Budget:
        """The options' budget, its seconds capped by the problem's share of a total time."""
        budget, share = self.options.budget, self.options.seconds_for.get(problem.key)
        return budget if share is None else dataclasses.replace(budget, seconds=min(budget.seconds, share))

    def roofline_ms(self, problem: Problem) -> float | None:
        """A best time that stops the search at the device's roofline (``policy/roofline.py``)."""
        if self.options.interpret:
            return None
        flops, nbytes = problem_flops(problem), problem_bytes(problem)
        return good_enough_ms(flops, nbytes, problem.dtype, self.device.name)

    def _recorded(self, problem: Problem, study: str) -> dict[Config, Outcome]:
        """The configs this device and these versions recorded for ``study``."""
        out: dict[Config, Outcome] = {}
        for r in self.db.records(problem.key):
            if r.study != study or r.device != self.device or r.versions != self.versions:
                continue
            try:
                config = Config.from_dict(r.config or {})
            except (ValueError, TypeError, KeyError):  # a config this epilab no longer runs
                continue
            out[config] = Outcome(r.status, (r.graph_ms or r.median_ms) if r.status == "ok" else None)
        return out

    def _compared(self, problem: Problem) -> dict[str, tuple[float, float, str]]:
        best = self.db.best(problem.key, self.device, self.versions)
        if best is None:
            return {}
        return like_with_like(best.record, self.db.baselines(problem.key, self.device))

    def _baselines(self, problem: Problem, problem_json: str, flops: int, nbytes: int) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.options.interpret:
            return out
        kept = {} if self.options.remeasure_baselines else self._recorded_baselines(problem)
        for library in self.options.baselines:
            if library in kept:  # like with like already: same device, same versions
                out[library] = kept[library]
                continue
            result = self.worker.run(
                {"job": "baseline", "problem": problem_json, "library": library, "seed": next(self._seeds)},
                timeout_s=max(600.0, self.options.worker_timeout_s),
            )
            if result["status"] != "ok":
                continue
            timing = _timing(result, flops, nbytes)
            err = result.get("max_rel_error")
            self.db.record_baseline(
                problem,
                self.device,
                library=library,
                timing=timing,
                max_rel_error=err if err is not None and math.isfinite(err) else None,
                versions=self.versions,
            )
            out[library] = result.get("graph_ms") or result["median_ms"]
        return out
