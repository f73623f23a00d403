"""Config transfer: a problem without a record of its own takes the config of the nearest
recorded problem of its template, where measurement says that carries over.

The distance between problems ``p`` and ``q`` (``distance``) is defined only between
problems of one template (and template version), input dtype, precision and op kind
(2-D or batched; a convolution also keeps its kernel geometry but for the image size)::

    |log2 Bp/Bq| + |log2 Mp/Mq| + |log2 Np/Nq| + |log2 Kp/Kq|       size, as tile counts scale
  + LAYOUT_STEP * (number of A/B layouts that differ)              another load pattern
  + |log2 (epilogue bytes per element of p / of q)|                epilogue cost

where the epilogue's bytes per output element are what it reads (each tile operand's
element size) and writes (each output's element size); vectors and scalars are free.
A doubling of one dimension is 1; the same shape with a bias+residual epilogue instead
of a bare store is log2(4/2) = 1 in bf16 (the bias is a vector: free).

A transferred config is checked for feasibility on the new problem (``policy.space.
infeasible``: the template's rules, block sizes against the padded dims, shared memory
and registers of the device). ``benchmarks/transfer.py`` measured how well configs carry
(tuned-exact against transferred on the held-out half of the ``llm`` and ``quick``
suites; RESULTS.md, "Config transfer"): under ``auto`` a transferred config is used only
within ``MAX_DISTANCE``, and only where the source record beat its own baselines by
``MIN_SPEEDUP`` (the loss a transfer may bring, measured, on top of winning at all).
"""

from __future__ import annotations

import json
import math
from typing import Any

from epilab.db import DeviceInfo, Record, TuningDB, Versions
from epilab.ir.config import Config
from epilab.ir.dtypes import itemsize
from epilab.ir.problem import Problem
from epilab.policy.space import HOPPER, DeviceLimits, infeasible
from epilab.templates.registry import is_current, kind_of

LAYOUT_STEP = 1.0
# under auto: farther records are not used; the held-out problems within 2.0 lost at most 1.9%
# to their own tuned config (6 problems; within 4.0, 9 problems, also 1.9%; one at 5.1 lost
# 6%: RESULTS.md, "Config transfer")
MAX_DISTANCE = 2.0
MIN_SPEEDUP = 1.05  # under auto: the source record's margin over its best baseline (> the loss, with noise)
# a new study's warm start (``warm_seeds``): the best configs of this many nearest records, the
# farthest within WARM_DISTANCE (a seed costs a trial of the budget and is measured, never kept
# unmeasured as a transfer is: farther than MAX_DISTANCE is allowed), and the nearest one's
# next NEAREST_RUNNERS_UP configs
WARM_SEEDS = 4
WARM_DISTANCE = 6.0
NEAREST_RUNNERS_UP = 2
GEOMETRY_STEP = 2.0  # seeds only: a config of another op kind or convolution geometry


def epilogue_bytes(problem: Problem) -> int:
    """Bytes the epilogue moves per output element: tile operands read, outputs written."""
    broadcasts = dict(problem.epilogue.operands)
    read = sum(
        itemsize(o.dtype) for o in problem.operands if broadcasts[o.name] not in ("row", "col", "scalar")
    )
    return read + sum(itemsize(o.dtype) for o in problem.epilogue.outputs)


def _comparable(p: Problem, q: Problem) -> bool:
    """Whether ``p`` and ``q`` have one template, both current (their hashes are of the
    kernels rendered now; they differ where the epilogues do), one dtype and precision."""
    if (p.template, p.dtype, p.precision) != (q.template, q.dtype, q.precision):
        return False
    return is_current(p.to_json()) and is_current(q.to_json())


def distance(p: Problem, q: Problem, *, loose: bool = False) -> float | None:
    """How far ``q``'s config is carried to reach ``p`` (see the module's text); None where
    no transfer is defined (another template, dtype, precision or op kind). ``loose`` (a warm
    start's seeds, which are measured before anything is kept) also measures across op kinds
    and convolution geometries, at ``GEOMETRY_STEP`` more."""
    if not (p.shape.is_static() and q.shape.is_static()) or not _comparable(p, q):
        return None
    kind = kind_of(p)
    same = kind.transfer_key(p) == kind.transfer_key(q)
    if not (same or loose):
        return None
    dims = ("batch", "m", "n", "k")
    a = [max(int(getattr(p.shape, d)), 1) for d in dims]
    b = [max(int(getattr(q.shape, d)), 1) for d in dims]
    size = sum(abs(math.log2(x / y)) for x, y in zip(a, b, strict=True))
    layouts = (p.layout_a != q.layout_a) + (p.layout_b != q.layout_b)
    cost = abs(math.log2(epilogue_bytes(p) / epilogue_bytes(q)))
    return size + LAYOUT_STEP * layouts + cost + (0.0 if same else GEOMETRY_STEP)


def distance_to(problem: Problem, *, loose: bool = False) -> Any:
    """``distance`` from stored problem JSON to ``problem`` (for ``TuningDB.nearest``)."""

    def of(text: str) -> float | None:
        try:
            return distance(problem, Problem.from_json(text), loose=loose)
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            return None  # a problem this version cannot read

    return of


def warm_seeds(db: TuningDB, problem: Problem, device: DeviceInfo, versions: Versions) -> list[Config]:
    """Configs a new study of ``problem`` tries before the kind's own seeds: the best config
    of the same problem on each other device (fastest device record first), then the best of
    each of the ``WARM_SEEDS`` nearest recorded problems on ``device`` (by the ``loose``
    ``distance``, within ``WARM_DISTANCE``), nearest first, the nearest one's next
    ``NEAREST_RUNNERS_UP`` configs right after its best. Duplicates are dropped; the search
    checks each for feasibility on this device before it is run."""
    out: list[Config] = []

    def add(d: dict[str, Any] | None) -> None:
        if d is not None and Config.is_valid(d) and Config.from_dict(d) not in out:
            out.append(Config.from_dict(d))

    mine = problem.key
    others: dict[DeviceInfo, Record] = {}
    for r in db.records(mine):  # fastest ok first
        if r.status == "ok" and r.config is not None and r.device != device:
            others.setdefault(r.device, r)
    for r in sorted(others.values(), key=lambda r: r.graph_ms or r.median_ms or math.inf):
        add(r.config)
    near = distance_to(problem, loose=True)
    for i, hit in enumerate(
        db.nearest(problem, device, near, versions=versions, within=WARM_DISTANCE, limit=WARM_SEEDS)
    ):
        add(hit.record.config)
        if i == 0:  # the nearest problem's runners-up too: its measured neighbourhood
            ranked = [r for r in db.records(hit.record.problem_key) if r.status == "ok"]
            for r in [r for r in ranked if r.device == device][1 : NEAREST_RUNNERS_UP + 1]:
                add(r.config)
    return out


def limits_of(device: DeviceInfo) -> DeviceLimits:
    """The limits the feasibility rules need, for a device the database names."""
    smem = HOPPER.smem_bytes
    try:
        import torch

        if device.capability != "interpreter" and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                if props.name == device.name:
                    smem = getattr(props, "shared_memory_per_block_optin", 0) or smem
                    break
    except RuntimeError:  # no driver: keep Hopper's figure
        pass
    return DeviceLimits(device.name, device.capability, device.sm_count, int(smem))


def why_not(problem: Problem, config: Config, device: DeviceInfo) -> str | None:
    """Why a transferred ``config`` cannot run ``problem`` on ``device``, or None."""
    return infeasible(problem, config, limits_of(device))
