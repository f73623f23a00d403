"""Checking templates in the model they run in: the verdicts of ``tune --model`` (step 4 of
``model_tuning/tune.py``).

An isolated kernel timing cannot see what Inductor fuses around the op a template replaces (a
residual add folded into the next norm, cuBLASLt's bias+GELU epilogue); the compiled model
can. Per Inductor mode (default, max-autotune):

1. **One switched compile.** The model is compiled once with every template the records choose
   able to run either its template or its aten path, by its problem's flag
   (``compiler/switch.py``). Every variant below is a setting of the flags, timed in paired
   interleaved rounds (``model_tuning/interleave.py``): no compile per variant.
2. **Skipped problems.** The model's time with every template is taken once. A problem's
   potential is what its sites could change at most: per site, twice its recorded aten time
   (the library's GEMM, and as much again for the pointwise work the template absorbs, a pass
   over the output the GEMM wrote), and per call one kernel launch of host time
   (``PER_CALL_SITE_MS``). The problems of least potential whose potentials together stay
   under ``margin`` of the model's time are skipped: even run in no time at all they could not
   move the model by the margin. Their aten op is kept and the verdict says so ("skipped").
3. **Groups, bisected on a loss.** Every other template is judged at once: the model with all
   of them against the model with none (the rule of ``model_tuning/significance.py``: faster by
   ``margin`` at ``confidence``). A group found faster is kept whole. A group not found faster
   whose interval reaches below 1 (the model may be slower with it: a loser may hide in it) is
   split, each part judged against the templates kept so far, down to single templates: in
   two halves of about equal potential, or straight into its templates one by one once it
   has ``SINGLES_AT`` or fewer (never more comparisons than halving, fewer where all lose).
   A group whose interval stays at or above 1 (a gain, too small to decide) is rejected
   whole, as its halves' smaller gains would be.
4. **Against Inductor.** The model compiled with the kept templates only (no switches: what a
   later compile gives) is timed against Inductor by the same rule; unless it is faster, every
   template kept is rejected ("slower than inductor"). Where rejecting a template brings
   another problem in (a norm folded only where its projections have templates), that compile
   shows it, and the new problems are judged in a switched compile of their own (at most
   ``max_passes`` times).

Each verdict is stored (``TuningDB.record_verdict``); later compiles in that mode follow it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from epilab.compiler.graph_pass import SWITCHED
from epilab.compiler.switch import Switches
from epilab.db import TuningDB, comparable_ms
from epilab.db.values import FASTER_TOGETHER, SKIPPED
from epilab.ir.problem import Problem
from epilab.model_tuning import significance as sig
from epilab.model_tuning.interleave import Comparison, Timer, Variant
from epilab.model_tuning.variants import (
    Compiles,
    ModelOptions,
    compared,
    cuda_graphs,
    epilab_options,
    inductor_mode,
    inductor_options,
)

if TYPE_CHECKING:
    from epilab.tuner.tune import Tuner


class ModelReport(Protocol):
    """What the check writes into ``model_tuning/report.ModelReport``."""

    label: str
    verdicts: list[dict[str, Any]]
    compiling: dict[str, float]
    compiles: dict[str, int]


STEP = "context check"
PER_CALL_SITE_MS = 0.005  # per call: the host time of one kernel launch a site could save
SINGLES_AT = 4  # a suspected group this small is judged template by template, not halved


@dataclass
class Judged:
    """One problem's verdict before it is stored: kept or not, by which comparison."""

    keep: bool
    outcome: str
    why: str
    comparison: Comparison | None = None  # None where skipped
    model_ms: float = 0.0  # the model's time with every template (a skipped problem's times)


def check_in_context(
    store: TuningDB,
    tuner: Tuner,
    modes: Sequence[str],
    options: ModelOptions,
    report: ModelReport,
    timers: dict[str, Timer],
    say: Callable[[str], None],
    compiles: Compiles,
) -> None:
    """Verdicts for the templates the records choose in each of ``modes`` (see the module's
    text); the modes of one Inductor mode share its switched compile and its Inductor. Each
    mode's model with its kept templates is left in ``compiles`` as the epilab compile of that
    mode wherever it is what a later compile gives (for the measurement)."""
    by_inductor: dict[str, list[str]] = {}
    for mode in modes:
        by_inductor.setdefault(inductor_mode(mode), []).append(mode)
    for group in by_inductor.values():
        _Check(store, tuner, options, report, say, compiles).run(group, timers)


class _Check:
    def __init__(
        self,
        store: TuningDB,
        tuner: Tuner,
        options: ModelOptions,
        report: ModelReport,
        say: Callable[[str], None],
        compiles: Compiles,
    ) -> None:
        self.store, self.tuner, self.compiles = store, tuner, compiles
        self.options, self.report, self.say = options, report, say
        self.work = compiles.work

    def compiled(self, name: str, mode: str, how: dict[str, Any]) -> Variant:
        return self.compiles.get(self.report, STEP, name, mode, how)

    def switched(self, mode: str, rejected: Sequence[str]) -> tuple[Variant, Switches]:
        """The model with every chosen template switchable, ``rejected`` ones left out; decided
        as under CUDA graphs (a template the launch-bound rules would hold back per call is
        checked too: the compiler applies those rules before any verdict)."""
        switches = Switches()
        how = epilab_options(self.store, mode, verdicts=False, exclude=list(rejected), switches=switches)
        how["options"]["cuda_graphs"] = True
        return self.compiled("epilab switched", mode, how), switches

    def run(self, modes: list[str], timers: dict[str, Timer]) -> None:
        shared = self.switched(modes[0], [])
        for mode in modes:
            self.run_mode(mode, shared, timers[mode])

    def run_mode(self, mode: str, shared: tuple[Variant, Switches], timer: Timer) -> None:
        judged: dict[str, Judged] = {}
        labels: dict[str, str] = {}
        fixed: set[str] = set()  # chosen, but a site of theirs could not be switched
        (model, switches), passes = shared, 0
        final: Variant | None = None
        while True:
            passes += 1
            sites = _sites(model)
            unswitched = set(_chosen(model)) - set(sites) - fixed
            if unswitched:
                fixed |= unswitched
                self.say(f"{mode}: {len(unswitched)} problem(s) could not be switched: not checked")
            labels |= {k: f"{d.anchor} {d.shape}" for k, ds in sites.items() for d in ds[:1]}
            keys = [k for k in sites if k not in judged]
            if keys:
                kept = [k for k in sites if judged.get(k) is not None and judged[k].keep]
                judged |= self.judge(mode, model, switches, keys, kept, sites, timer)
            rejected = [k for k, j in judged.items() if not j.keep]
            final = self.compiled(
                "epilab kept", mode, epilab_options(self.store, mode, verdicts=False, exclude=rejected)
            )
            new = [k for k in _chosen(final) if k not in judged and k not in fixed]
            if not new:
                break
            if passes >= self.options.max_passes:
                self.say(f"{mode}: {len(new)} problem(s) a rejection brought in left unchecked (max passes)")
                break
            self.say(f"{mode}: rejecting brought in {len(new)} other problem(s); checking them")
            model, switches = self.switched(mode, rejected)
        if not judged:
            self.say(f"{mode}: no template chosen; nothing to check")
            if not fixed:  # no template at all: what a later compile gives
                self.compiles.keep("epilab", epilab_options(self.store, mode), final)
            return
        against = None
        if any(j.keep for j in judged.values()):
            theirs = self.compiled("inductor", mode, inductor_options(mode))
            kept = sum(j.keep for j in judged.values())
            self.say(f"{mode}: timing the model with its {kept} kept template(s) against Inductor")
            against = Comparison(ours=final, theirs=theirs, key="inductor")
            compared([against], self.options, timer)
        for key, j in judged.items():
            self.store_verdict(mode, key, labels.get(key, ""), j, against)
        self.compiles.changed()
        if not fixed and (against is None or against.outcome == sig.FASTER):
            # the verdicts just stored choose what ``final`` runs: it is the later compile
            self.compiles.keep("epilab", epilab_options(self.store, mode), final)

    def judge(
        self,
        mode: str,
        model: Variant,
        switches: Switches,
        keys: list[str],
        kept: list[str],
        sites: dict[str, list[Any]],
        timer: Timer,
    ) -> dict[str, Judged]:
        """Verdicts for ``keys`` in the switched ``model``, ``kept`` switched on throughout."""
        variants: dict[frozenset[str], Variant] = {}

        def variant(on: frozenset[str]) -> Variant:
            if on not in variants:
                variants[on] = Variant(_name(on), mode, switches.running(on, model.fn), 0.0, model.decisions)
            return variants[on]

        every = variant(frozenset([*kept, *keys]))
        model_ms = timer(every.name, every.fn).median_ms
        per_call = 0.0 if cuda_graphs(mode) else PER_CALL_SITE_MS
        potential = {k: self.potential(k, len(sites[k]), per_call) for k in keys}
        skipped = negligible(potential, self.options.margin * model_ms)
        out = {
            k: Judged(
                False, SKIPPED, _skip_why(potential[k], model_ms, self.options.margin), model_ms=model_ms
            )
            for k in skipped
        }
        if skipped:
            self.say(
                f"{mode}: {len(skipped)} problem(s) skipped: together too small a share to move the model"
            )
        order = sorted((k for k in keys if k not in skipped), key=lambda k: -_known(potential[k]))
        level = [tuple(order)] if order else []
        on = set(kept)
        while level:
            base = frozenset(on)
            comparisons = [
                Comparison(ours=variant(base | set(g)), theirs=variant(base), key=g[0]) for g in level
            ]
            sizes = "+".join(str(len(g)) for g in level)
            self.say(
                f"{mode}: timing the model with and without {sizes} template(s) in {len(level)} group(s)"
            )
            compared(comparisons, self.options, timer)
            later = []
            for g, c in zip(level, comparisons, strict=True):
                if c.outcome == sig.FASTER:
                    on |= set(g)
                    outcome = sig.FASTER if len(g) == 1 else FASTER_TOGETHER
                    why = (
                        "faster with it"
                        if len(g) == 1
                        else f"faster with it and the {len(g) - 1} others of its group"
                    )
                    out |= {k: Judged(True, outcome, why, c) for k in g}
                elif len(g) > 1 and _loss_suspected(c):
                    later += split(g)
                else:
                    why = _why(c) + ("" if len(g) == 1 else f" (judged in a group of {len(g)})")
                    out |= {k: Judged(False, c.outcome, why, c) for k in g}
            level = later
        return out

    def potential(self, key: str, sites: int, per_call_ms: float) -> float | None:
        """What ``sites`` sites of ``key`` could change of the model's time at most (the
        module's text), from its recorded baselines; None where none is recorded."""
        found = self.store.problem_json(key)
        if found is None:
            return None
        bases = [b for b in self.store.baselines(key, self.tuner.device) if b.median_ms]
        if not bases:
            return None
        aten = min(comparable_ms(b) for b in bases)
        return sites * (2.0 * aten + per_call_ms)

    def store_verdict(self, mode: str, key: str, label: str, j: Judged, against: Comparison | None) -> None:
        c, ok, outcome, why = j.comparison, j.keep, j.outcome, j.why
        if ok and against is not None and against.outcome != sig.FASTER:
            ok, c, outcome = False, against, "slower than inductor"
            why = "the model with its kept templates was not faster than Inductor"
            if against.outcome == sig.UNDECIDED:
                why += " (undecided within the rounds' budget)"
        if c is not None:
            assert c.interval is not None
            with_ms, without_ms = statistics.median(c.ours_ms), statistics.median(c.theirs_ms)
            ratio: dict[str, Any] | None = c.interval.to_dict()
            low, high, rounds = c.interval.low, c.interval.high, c.rounds
        else:
            with_ms = without_ms = j.model_ms
            ratio, low, high, rounds = None, None, None, None
        problem = Problem.from_json(self.store.problem_json(key)[1])  # type: ignore[index]
        self.store.record_verdict(
            problem,
            self.tuner.device,
            cuda_graphs=cuda_graphs(mode),
            inductor_mode=inductor_mode(mode),
            training=self.work.train,
            keep=ok,
            with_ms=with_ms,
            without_ms=without_ms,
            ratio_low=low,
            ratio_high=high,
            rounds=rounds,
            outcome=outcome,
            context=self.report.label[:128],
            timing_method="model, paired interleaved rounds, median (in_context.py)",
            versions=self.tuner.versions,
        )
        self.report.verdicts.append(
            {
                "mode": mode,
                "problem": key,
                "label": label,
                "keep": ok,
                "outcome": outcome,
                "with_ms": with_ms,
                "without_ms": without_ms,
                "ratio": ratio,
                "rounds": rounds,
                "why": why,
            }
        )


def negligible(potential: dict[str, float | None], budget_ms: float) -> set[str]:
    """The problems of least potential whose potentials together stay under ``budget_ms``
    (None: unknown, never skipped)."""
    out, total = set(), 0.0
    for key in sorted(potential, key=lambda k: _known(potential[k])):
        p = potential[key]
        if p is None or total + p >= budget_ms:
            break
        total += p
        out.add(key)
    return out


def split(group: Sequence[str]) -> list[tuple[str, ...]]:
    """``group`` (ordered by potential, largest first) split for its next comparisons: one by
    one where it has ``SINGLES_AT`` templates or fewer (a group of 4 whose every template
    loses costs 4 comparisons so, 2 + 4 halved; one loser among them 4, 2 + 2 halved), else
    in two of about equal potential."""
    if len(group) <= SINGLES_AT:
        return [(k,) for k in group]
    return [tuple(group[0::2]), tuple(group[1::2])]


def _known(p: float | None) -> float:
    return float("inf") if p is None else p


def _loss_suspected(c: Comparison) -> bool:
    """The model may be slower with the group: its interval reaches below 1 (or is unknown)."""
    return c.interval is None or c.interval.low is None or c.interval.low < 1.0


def _skip_why(potential: float | None, model_ms: float, margin: float) -> str:
    share = 0.0 if potential is None or model_ms <= 0 else potential / model_ms
    return (
        f"skipped: its sites could change at most {share:.2%} of the model's {model_ms:.4g} ms, and "
        f"with the other skipped ones less than the {margin:.0%} margin: the aten op is kept"
    )


def _why(c: Comparison) -> str:
    if c.outcome == sig.UNDECIDED:
        return "undecided within the rounds' budget: the aten op kept"
    assert c.interval is not None and c.interval.high is not None
    return "faster without it" if c.interval.high < 1.0 else "no gain as large as the margin"


def _name(on: frozenset[str]) -> str:
    """A switched variant's name: the problems (key prefixes) whose templates it runs."""
    return "epilab switched on: " + (" ".join(sorted(k[:12] for k in on)) or "none")


def _chosen(v: Variant) -> dict[str, list[Any]]:
    """The problems given a template in ``v``'s compile, with their sites' decisions."""
    out: dict[str, list[Any]] = {}
    for d in v.decisions:
        if d.template and d.problem_key:
            out.setdefault(d.problem_key, []).append(d)
    return out


def _sites(v: Variant) -> dict[str, list[Any]]:
    """The problems whose every site in ``v``'s switched compile can be switched."""
    return {k: ds for k, ds in _chosen(v).items() if all(SWITCHED in d.runs_as for d in ds)}


__all__ = ["Judged", "check_in_context", "negligible", "split"]
