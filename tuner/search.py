"""The search loop: an optuna study per (problem, device), asked in batches.

Each dimension of the template's search space is an ordinal optuna parameter
(the index into its tuple of values), sampled by multivariate TPE; a dimension
that does not apply to the values drawn before it (the kind's ``applies``:
the matmul's persistent knobs for its other variants) is not sampled and keeps its default, so
the sampler models a conditional space instead of proposing dead combinations. Proposals
that are infeasible never reach ``evaluate``: they are told as failed trials, which TPE
leaves out of its model, and do not count as trials (told a penalty value instead, they
filled TPE's "bad" half with configs that were never run: in the landscape test 8 of 20
seeds came within 3% of the optimum in 64 trials; failed, 12 of 20, the worst 1.12x).
Proposals are asked of an in-memory copy of the study (``_proposer``); only measured trials
are added to the stored one. Infeasible and repeated proposals were trials of the stored
study before: a depthwise convolution's space, mostly infeasible at a small output, wrote
hundreds of failed trials per batch through the database (each ask reading them all back),
and one such problem of an MBConv stage stalled ``tune --model`` for over ten minutes on an
H100. Proposals already measured in this study are told their old value; once TPE has
proposed ``TPE_PROPOSALS`` (4) per batch slot without a new one (it settles on what it measured;
at 50 a slot, each ask costing 25 ms of TPE, one batch spent 10 s asking), the rest are
drawn at random, so a search stops "exhausted" only when draws find no feasible config left
to measure (before, TPE alone stopped a resumed 20-trial study at 16). The study is seeded
with known-good configs (``enqueue_trial``) when it is new (the records' first:
``nearest.warm_seeds``), and stops at the trial budget (counted over the whole study, so a
resumed run finishes what an interrupted one began), the time budget, after ``patience``
evaluated trials without a better one, or once the best runs at the device's roofline
(``policy/roofline.py``). ``evaluate`` is injected: the tuner passes GPU evaluation, tests pass
a cost model.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import optuna

from epilab.ir.config import Config

# catch_warnings swaps the process's filters: threads (tuner/fleet.py) take turns
_WARNINGS = threading.Lock()
PENALTY = 1e3  # told for configs that failed to run (objective is log10 of ms)
STATUS_ATTR = "epilab_status"
TPE_PROPOSALS = 4  # per batch slot, before the search draws at random
RANDOM_DRAWS = 4000  # a space with fewer untried feasible configs than this finds them all


@dataclass(frozen=True)
class Outcome:
    status: str  # ok, compile_error, out_of_resources, incorrect, timeout, crashed
    ms: float | None = None


@dataclass(frozen=True)
class Budget:
    trials: int = 64
    seconds: float = 90.0
    patience: int = 24
    batch: int = 8


@dataclass(frozen=True)
class SearchResult:
    best: Config | None
    best_ms: float | None
    evaluated: int  # trials evaluated in the whole study
    new: int  # of those, evaluated by this call
    stopped_by: str  # trials, time, patience, exhausted, roofline


Applies = Callable[[str, Mapping[str, object]], bool]


def _decode(space: dict[str, tuple[int, ...]], params: Mapping[str, int]) -> Config:
    """The config of a trial's parameters (a dimension it did not sample keeps its default)."""
    return Config(**{name: values[params.get(name, 0)] for name, values in space.items()})


def _encode(space: dict[str, tuple[int, ...]], config: Config, applies: Applies) -> dict[str, int]:
    params: dict[str, int] = {}
    chosen: dict[str, object] = {}
    for name, values in space.items():
        chosen[name] = getattr(config, name)
        if applies(name, chosen):
            params[name] = values.index(chosen[name])
    return params


def in_space(space: dict[str, tuple[int, ...]], config: Config) -> bool:
    """Whether every value of ``config`` is one the space has (another problem's or device's
    config may not be: a block size beyond this problem's padded dims)."""
    return all(getattr(config, name) in values for name, values in space.items())


def _ask(study: optuna.Study, space: dict[str, tuple[int, ...]], applies: Applies) -> optuna.Trial:
    """A new trial with the dimensions that apply sampled, in the space's order."""
    trial = study.ask()
    chosen: dict[str, object] = {}
    for name, values in space.items():
        if applies(name, chosen):
            chosen[name] = values[trial.suggest_int(name, 0, len(values) - 1)]
        else:
            chosen[name] = values[0]
    return trial


def adopt(
    study: optuna.Study,
    space: dict[str, tuple[int, ...]],
    recorded: Mapping[Config, Outcome],
    applies: Applies,
) -> tuple[int, int]:
    """Make ``study`` whole again after its last runner was killed; (stale, adopted).

    Only for a study this process holds alone (a leased problem): its ``RUNNING`` trials are
    a dead runner's proposals, told ``FAIL`` so the constant liar stops counting them, and
    every config ``recorded`` in the tuning database for this study that the study lacks
    (measured and recorded, killed before ``tell``) is added as a finished trial: it is not
    measured again, and it counts against the trial budget."""
    stale = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        stale += 1
    have = {
        _decode(space, t.params)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get(STATUS_ATTR) not in (None, "infeasible", "repeat")
    }
    distributions = {name: optuna.distributions.IntDistribution(0, len(v) - 1) for name, v in space.items()}
    adopted = 0
    for config, outcome in recorded.items():
        if config in have or not in_space(space, config):
            continue
        params = _encode(space, config, applies)
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={n: distributions[n] for n in params},
                value=_value(outcome),
                user_attrs={STATUS_ATTR: outcome.status},
            )
        )
        adopted += 1
    return stale, adopted


def _proposer(study: optuna.Study) -> optuna.Study:
    """An in-memory study with ``study``'s sampler and its finished trials: what ``search``
    asks for proposals, so that infeasible and repeated ones never touch the storage."""
    proposer = optuna.create_study(sampler=study.sampler, direction="minimize")
    proposer.add_trials(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    return proposer


def _draw(
    space: dict[str, tuple[int, ...]], applies: Applies, rng: random.Random, wanted: Callable[[Config], bool]
) -> Config | None:
    """A config ``wanted`` accepts, drawn uniformly dimension by dimension (those that apply)
    as TPE's first trials are; None when ``RANDOM_DRAWS`` draws found none."""
    for _ in range(RANDOM_DRAWS):
        chosen: dict[str, object] = {}
        for name, values in space.items():
            chosen[name] = rng.choice(values) if applies(name, chosen) else values[0]
        config = Config(**chosen)  # type: ignore[arg-type]
        if wanted(config):
            return config
    return None


def _value(outcome: Outcome) -> float:
    ok = outcome.status == "ok" and outcome.ms is not None and outcome.ms > 0
    return math.log10(outcome.ms) if ok and outcome.ms is not None else PENALTY


class TakenOver(RuntimeError):
    """Another runner took the study over (``adopt``) while this one measured a trial: the
    trial is no longer this runner's to record or tell."""


def _resumed(
    study: optuna.Study, space: dict[str, tuple[int, ...]]
) -> tuple[dict[Config, float], Config | None, float]:
    """What a study measured before (the configs and their values), its best config and value."""
    seen: dict[Config, float] = {}
    best: Config | None = None
    best_value = math.inf
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.user_attrs.get(STATUS_ATTR) in (None, "infeasible", "repeat"):  # (stored by older epilabs)
            continue
        config = _decode(space, t.params)
        seen[config] = t.value
        if t.value < best_value:
            best, best_value = config, t.value
    return seen, best, best_value


def _spent(
    budget: Budget,
    measured: int,
    elapsed: float,
    since_best: int,
    best_value: float,
    good_enough_ms: float | None,
) -> str | None:
    """Which budget is spent (trials, time, patience, or a best time at the roofline), or None."""
    if measured >= budget.trials:
        return "trials"
    if elapsed >= budget.seconds:
        return "time"
    if since_best >= budget.patience:
        return "patience"
    if good_enough_ms is not None and best_value < PENALTY and 10**best_value <= good_enough_ms:
        return "roofline"
    return None


def _draw_batch(
    proposer: optuna.Study,
    space: dict[str, tuple[int, ...]],
    applies: Applies,
    rng: random.Random,
    seen: dict[Config, float],
    infeasible: Callable[[Config], str | None],
    budget: Budget,
) -> list[tuple[optuna.Trial, Config]]:
    """The next batch of new feasible configs the proposer asks for (infeasible ones told as
    failed, repeats told their value); drawn at random once TPE keeps proposing what it
    measured; fewer (or none) when the space has no more."""
    batch: list[tuple[optuna.Trial, Config]] = []
    proposals = 0
    want = min(budget.batch, budget.trials - len(seen))
    while len(batch) < want:
        proposals += 1
        if proposals > TPE_PROPOSALS * budget.batch:  # TPE proposes what it measured: draw at random
            taken = {*seen, *(c for _, c in batch)}
            drawn = _draw(
                space, applies, rng, lambda c, taken=taken: c not in taken and infeasible(c) is None
            )
            if drawn is None:
                break
            proposer.enqueue_trial(_encode(space, drawn, applies))
        trial = _ask(proposer, space, applies)
        config = _decode(space, trial.params)
        if infeasible(config) is not None:  # failed, not a value: TPE models feasible trials only
            proposer.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif config in seen or any(config == c for _, c in batch):
            proposer.tell(trial, seen.get(config, PENALTY))
        else:
            batch.append((trial, config))
    return batch


def search(
    study: optuna.Study,
    space: dict[str, tuple[int, ...]],
    *,
    evaluate: Callable[[list[Config]], Iterable[Outcome]],
    infeasible: Callable[[Config], str | None],
    budget: Budget,
    seeds: Sequence[Config] = (),
    clock: Callable[[], float] = time.monotonic,
    on_trial: Callable[[Config, Outcome, Config | None, float | None], None] | None = None,
    applies: Applies,
    stop: Callable[[], str | None] = lambda: None,
    good_enough_ms: float | None = None,
) -> SearchResult:
    """Run (or resume) ``study`` until a budget is spent; see the module doc. ``evaluate``
    may yield its outcomes one at a time: each is told as it comes, so a run killed in the
    middle of a batch keeps the trials it finished. ``stop`` says why to stop early (checked
    between batches), or None; a best time at or under ``good_enough_ms`` stops it too
    ("roofline": ``policy/roofline.py``)."""
    seen, best, best_value = _resumed(study, space)
    proposer = _proposer(study)
    if not study.trials:
        for c in seeds:
            if in_space(space, c) and infeasible(c) is None:
                proposer.enqueue_trial(_encode(space, c, applies), skip_if_exists=True)
    rng = random.Random(len(seen))  # the draws of a resumed study differ from the first run's
    start = clock()
    new = 0
    since_best = 0
    while True:
        stopped_by = (
            _spent(budget, len(seen), clock() - start, since_best, best_value, good_enough_ms) or stop()
        )
        if stopped_by is not None:
            break
        batch = _draw_batch(proposer, space, applies, rng, seen, infeasible, budget)
        if not batch:
            stopped_by = "exhausted"
            break
        outcomes = evaluate([c for _, c in batch])
        for (trial, config), outcome in zip(batch, outcomes, strict=True):
            value = _value(outcome)
            proposer.tell(trial, value)
            study.add_trial(
                optuna.trial.create_trial(
                    params=trial.params,
                    distributions=trial.distributions,
                    value=value,
                    user_attrs={STATUS_ATTR: outcome.status},
                )
            )
            seen[config] = value
            new += 1
            if value < best_value:
                best, best_value, since_best = config, value, 0
            else:
                since_best += 1
            if on_trial is not None:  # a study whose trials all failed so far has no best time
                on_trial(
                    config, outcome, best, None if best is None or best_value >= PENALTY else 10**best_value
                )
    best_ms = None if best is None or best_value >= PENALTY else 10**best_value
    return SearchResult(best if best_ms is not None else None, best_ms, len(seen), new, str(stopped_by))


def make_study(
    name: str, storage: str | optuna.storages.BaseStorage | None, *, restart: bool, seed: int = 0
) -> optuna.Study:
    """Create or load the study ``name``; ``restart`` deletes an existing one first."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if restart and storage is not None:
        with contextlib.suppress(KeyError):  # nothing to delete
            optuna.delete_study(study_name=name, storage=storage)
    with _WARNINGS, warnings.catch_warnings():  # group=True is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            multivariate=True, group=True, seed=seed, n_startup_trials=8, constant_liar=True
        )
    return optuna.create_study(
        study_name=name, storage=storage, sampler=sampler, direction="minimize", load_if_exists=True
    )
