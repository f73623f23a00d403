"""What ``epilab tune`` tunes and where: the (label, problem) work of a built-in suite, a
shapes file or the problems the compiler recorded (those no record serves yet, ``unserved``),
cut to ``--only``; the GPUs ``--device`` and ``--devices`` name; and each problem's share of
``--total-time``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, TuningDB
from epilab.ir.problem import Problem, identity_key_of
from epilab.policy.suites import load_shapes, problem_label
from epilab.policy.suites import suite as builtin_suite
from epilab.templates.registry import is_current, superseded, twins
from epilab.tuner.fleet import parse_devices
from epilab.tuner.fleet_worker import FleetOptions

Work = list[tuple[str, Problem]]


class DeviceSpecError(ValueError):
    """A ``--device`` that names no device torch can parse."""


@dataclass(frozen=True)
class Listed:
    """A list's work, each problem once, and how many entries repeated a problem listed
    before (the same problem written another way)."""

    work: Work
    repeated: int


def only(text: str, count: int) -> list[int]:
    """0-based indices from ``--only``'s 1-based selection like '1-3,7'."""
    picked: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--only {text!r}: use 1-based numbers and ranges such as 1-3,7")
        first, last = int(lo), int(hi or lo)
        if not 1 <= first <= last <= count:
            raise ValueError(f"--only {text!r}: the list has problems 1..{count}")
        picked += [i - 1 for i in range(first, last + 1) if i - 1 not in picked]
    return picked


def listed_work(suite: str | None, shapes: str | None, selection: str | None) -> Listed:
    """(label, problem) of every problem of a built-in suite or a shapes file, and of each
    twin (the same computation on another template), each once, cut to ``selection``."""
    specs = builtin_suite(suite) if suite is not None else load_shapes(shapes) if shapes else []
    work = [
        (spec.label() if i == 0 else f"{spec.label()} [{p.template}]", p)
        for spec in specs
        for i, p in enumerate(twins(spec.problem()))
    ]
    first: dict[str, tuple[str, Problem]] = {}
    for label, p in work:
        first.setdefault(p.key, (label, p))
    unique = list(first.values())
    repeated = len(specs) - len({spec.problem().key for spec in specs})
    picked = unique if selection is None else [unique[i] for i in only(selection, len(unique))]
    return Listed(picked, repeated)


def seen_work(store: TuningDB, where: DeviceInfo, selection: str | None) -> Work:
    """(label, problem) of every problem the compiler recorded that nothing serves on
    ``where`` yet (no record of its own or of the same math), cut to ``selection``."""
    recorded = [Problem.from_json(text) for text in store.untuned(where, is_current)]
    work = [(problem_label(p), p) for p in unserved(store, where, recorded)]
    return work if selection is None else [work[i] for i in only(selection, len(work))]


def unserved(store: TuningDB, device: DeviceInfo, problems: Sequence[Problem]) -> list[Problem]:
    """The problems that no record serves yet: one per performance identity, and none whose
    math another problem's records already cover (``Problem.identity``). Records of
    another M (a family fallback) do not count: the problem is tuned. A problem whose twin's
    kind always runs it far faster (``registry.superseded``: a depthwise convolution's implicit
    GEMM) is left to that twin."""
    out, identities = [], set()
    for problem in problems:
        identity = problem.identity_key
        if identity in identities or superseded(problem):
            continue
        identities.add(identity)
        hit = store.lookup(problem, device, same=lambda t, identity=identity: identity_key_of(t) == identity)
        if hit is None or hit.via not in ("exact", "identity"):
            out.append(problem)
    return out


def tune_devices(
    device: str, devices: str | None, lease_ttl: float, interpret: bool
) -> tuple[int, FleetOptions]:
    """The device index to tune on and the fleet's (workers on ``devices``), after checking
    that a GPU is there (or switching to the interpreter for ``interpret``)."""
    import torch

    if interpret:
        os.environ["EPILAB_INTERPRET"] = os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise ValueError(
            "no CUDA device: epilab tune times kernels on a GPU. Use --interpret for a "
            "correctness-only dry run in Triton's interpreter (timings are not GPU times)"
        )
    try:
        device_index = 0 if interpret else torch.device(device).index or 0
    except RuntimeError as e:  # torch's words for a device string it cannot parse
        raise DeviceSpecError(str(e)) from None
    if not interpret and device_index >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    count = torch.cuda.device_count() if not interpret else max(1, os.cpu_count() or 1)  # a worker a core
    fleet = FleetOptions(
        devices=parse_devices(devices, count) if devices is not None else (device_index,),
        lease_ttl_s=lease_ttl,
    )
    return device_index, fleet


def tuned_on(fleet: FleetOptions, interpret: bool) -> DeviceInfo:
    """The device whose records serve a problem: the fleet's first GPU, or the interpreter."""
    return INTERPRETER_DEVICE if interpret else DeviceInfo.of_cuda(fleet.devices[0])


def shared_time(options: Any, jobs: Work, gpus: int) -> Any:
    """``options`` (``TuneOptions``) with each job's share of the time left before
    ``--total-time``'s deadline, on ``gpus`` workers."""
    if options.deadline is None or all(p.key in options.seconds_for for _, p in jobs):
        return options  # no total time, or shared already (tune --model's default: model_tuning/tune.py)
    import torch

    from epilab.tuner.total_time import spread

    name = "interpreter" if options.interpret else torch.cuda.get_device_name(options.device_index)
    shares = spread(options.deadline, [p for _, p in jobs], name, gpus=gpus)
    return dataclasses.replace(options, seconds_for={**options.seconds_for, **shares})
