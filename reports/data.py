"""What a report shows, gathered from a database snapshot: one device, optionally
filtered to a suite or an op; plain values, no HTML (``reports.html`` renders them).

Times: each problem's best ok trial is the fastest by ``comparable_ms`` (CUDA-graph
time for kernels under 50 us, where recorded, else the events median); speedups
compare like with like against each baseline. Peaks: the device's data-sheet dense
tensor (fp16/bf16) or fp32 TFLOP/s and memory bandwidth, unless measured values are
given (``--peak-tflops``/``--peak-gbs``); "% of roofline" is the achieved rate over
min(compute peak, arithmetic intensity x bandwidth peak).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, Record, Snapshot, comparable_ms
from epilab.ir.spec import LABEL_EPILOGUE, clip
from epilab.templates.registry import KINDS
from epilab.tuner.baselines import BASELINES

# name fragment -> (dense fp16/bf16 tensor TFLOP/s, fp32 TFLOP/s, memory GB/s); first match wins
DATA_SHEET_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    ("H100 PCIe", 756.0, 51.0, 2000.0),
    ("H100", 989.4, 66.9, 3350.0),
    ("H200", 989.4, 66.9, 4800.0),
    ("A100", 312.0, 19.5, 2039.0),
)
LIBRARY_ORDER = tuple(BASELINES)
MAX_FAILURES = 500  # failed trials listed (newest first); the count covers all


@dataclass(frozen=True)
class Peaks:
    tflops: dict[str, float]  # dtype -> TFLOP/s
    gbs: float | None
    source: str

    def roofline_tflops(self, dtype: str, intensity: float) -> float | None:
        compute = self.tflops.get(dtype)
        if compute is None or self.gbs is None:
            return None
        return min(compute, intensity * self.gbs / 1e3)


@dataclass
class ProblemReport:
    key: str
    op: str
    template: str
    dtype: str
    layouts: str
    shape: str
    epilogue: str  # as users read it (``epilogue_text``)
    flops: int
    nbytes: int
    stale: bool
    best: Record | None = None
    ms: float | None = None  # comparable time of the best trial
    baselines: dict[str, float] = field(default_factory=dict)  # library -> ms, like with like
    speedups: dict[str, float] = field(default_factory=dict)  # library -> baseline ms / tuned ms
    timed_as: dict[str, str] = field(default_factory=dict)  # library -> "graph" or "events": both sides alike
    trials_ok: int = 0
    trials_failed: int = 0
    studies: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        epilogue = clip(self.epilogue, LABEL_EPILOGUE)
        return f"{self.shape} {self.dtype} {self.layouts} {epilogue} [{self.template}]"

    @property
    def library(self) -> str:
        """The vendor library its template's kind is timed against (cuBLAS, or cuDNN for
        conv2d; cuBLAS for a template this version does not know)."""
        kind = KINDS.get(self.template)
        return kind.library if kind is not None else "cublas"

    @property
    def library_speedup(self) -> float | None:
        return self.speedups.get(self.library)

    @property
    def intensity(self) -> float:
        return self.flops / max(self.nbytes, 1)

    def tflops(self, ms: float | None) -> float | None:
        return self.flops / (ms * 1e9) if ms else None

    def gbs(self, ms: float | None) -> float | None:
        return self.nbytes / (ms * 1e6) if ms else None


@dataclass(frozen=True)
class Failure:
    problem: str
    config: dict[str, Any] | None
    status: str
    detail: str
    created_at: datetime


@dataclass
class ReportData:
    db_url: str
    generated_at: datetime
    device: DeviceInfo | None
    devices: list[tuple[DeviceInfo, int]]  # every device in the database, with its trial count
    versions: list[str]
    methods: list[str]
    peaks: Peaks
    problems: list[ProblemReport]
    failures: list[Failure]
    failed_total: int
    stale_problems: int
    filters: str

    @property
    def interpreter(self) -> bool:
        """Triton's interpreter ran these: wall-clock times, no graph times, no throughput."""
        return self.device == INTERPRETER_DEVICE

    @property
    def tuned(self) -> list[ProblemReport]:
        return [p for p in self.problems if p.best is not None]

    def geomean(self, library: str) -> tuple[float, int] | None:
        vals = [p.speedups[library] for p in self.tuned if library in p.speedups]
        if not vals:
            return None
        return math.exp(sum(math.log(v) for v in vals) / len(vals)), len(vals)

    def libraries(self) -> list[str]:
        seen = {lib for p in self.problems for lib in p.baselines}
        return [lib for lib in LIBRARY_ORDER if lib in seen] + sorted(seen - set(LIBRARY_ORDER))

    def ops(self) -> dict[str, list[ProblemReport]]:
        out: dict[str, list[ProblemReport]] = defaultdict(list)
        for p in self.problems:
            out[p.op].append(p)
        return dict(sorted(out.items()))


def _bytes_moved(records: list[Record]) -> int:
    """The problem's bytes (A, B, operands, outputs once), as the tuner recorded them with
    each time (GB/s x ms); 0 when no record has them."""
    for r in records:
        if r.gbps and r.median_ms:
            return round(r.gbps * r.median_ms * 1e6)
    return 0


def shape_text(summary: dict[str, Any]) -> str:
    """As ``suites.shape_label`` shows it (in its kind's terms: a convolution in its own)."""
    from epilab.ir.problem import Problem
    from epilab.policy.suites import shape_label

    try:
        return shape_label(Problem.from_json(summary["json"]))
    except (KeyError, ValueError, TypeError):  # an older or foreign record: its GEMM view
        pass
    b, m, n, k = ("?" if d is None else d for d in summary["shape"])
    return f"{m}x{n}x{k}" if b == 1 else f"{b}x{m}x{n}x{k}"


def epilogue_text(summary: dict[str, Any]) -> str:
    """The problem's epilogue as every table shows it (``Problem.epilogue_text``); an older or
    foreign record's stored text where its JSON does not read."""
    from epilab.ir.problem import Problem

    try:
        return Problem.from_json(summary["json"]).epilogue_text()
    except (KeyError, ValueError, TypeError):
        return str(summary.get("epilogue", ""))


def _flops(summary: dict[str, Any]) -> int:
    """2 x BMNK for each of the problem's GEMMs (a dual's two: its kind's accumulators); 0 for
    a shape not static."""
    dims = summary["shape"]
    if not all(isinstance(d, int) for d in dims):
        return 0
    kind = KINDS.get(summary["template"])
    return 2 * math.prod(dims) * (kind.accumulators if kind is not None else 1)


def _pick_device(
    snapshot: Snapshot, name: str | None
) -> tuple[DeviceInfo | None, list[tuple[DeviceInfo, int]]]:
    counts = Counter(r.device for r in snapshot.trials)
    for r in snapshot.baselines:
        counts.setdefault(r.device, 0)
    devices = counts.most_common()
    if name is not None:
        matching = [d for d, _ in devices if name.lower() in d.name.lower()]
        if not matching:
            known = ", ".join(sorted({d.name for d, _ in devices})) or "none"
            raise ValueError(f"no device named like {name!r} in the database (devices: {known})")
        return matching[0], devices
    real = [d for d, _ in devices if d != INTERPRETER_DEVICE]
    return (real or [d for d, _ in devices] or [None])[0], devices


def peaks_for(device: DeviceInfo | None, tflops: float | None = None, gbs: float | None = None) -> Peaks:
    sheet = next((row for row in DATA_SHEET_PEAKS if device and row[0] in device.name), None)
    half = tflops if tflops is not None else (sheet[1] if sheet else None)
    fp32 = sheet[2] if sheet else None
    table = {k: v for k, v in (("float16", half), ("bfloat16", half), ("float32", fp32)) if v is not None}
    bw = gbs if gbs is not None else (sheet[3] if sheet else None)
    given = [w for w, v in (("TFLOP/s", tflops), ("GB/s", gbs)) if v is not None]
    source = (
        f"{' and '.join(given)} as given (measured)" + (", the rest from the data sheet" if sheet else "")
        if given
        else (f"data sheet of the {sheet[0]}" if sheet else "unknown for this device")
    )
    return Peaks(table, bw, source)


def collect(
    snapshot: Snapshot,
    *,
    db_url: str,
    is_current: Callable[[str], bool],
    device: str | None = None,
    keys: Iterable[str] | None = None,
    op: str | None = None,
    filters: str = "",
    peak_tflops: float | None = None,
    peak_gbs: float | None = None,
) -> ReportData:
    """The report of one device (the named one, else the one with most trials that is not
    the interpreter), restricted to ``keys`` (a suite) and/or ``op`` when given."""

    chosen, devices = _pick_device(snapshot, device)
    wanted = set(keys) if keys is not None else None
    trials: dict[str, list[Record]] = defaultdict(list)
    for r in snapshot.trials:
        if r.device == chosen:
            trials[r.problem_key].append(r)
    bases: dict[str, list[Record]] = defaultdict(list)
    for r in snapshot.baselines:
        if r.device == chosen:
            bases[r.problem_key].append(r)
    problems, failures = [], []
    for key in sorted(set(trials) | set(bases)):
        summary = snapshot.problems[key]
        if (wanted is not None and key not in wanted) or (op and summary["op"] != op):
            continue
        p = ProblemReport(
            key=key,
            op=summary["op"],
            template=summary["template"],
            dtype=summary["dtype"],
            layouts=summary["layouts"],
            shape=shape_text(summary),
            epilogue=epilogue_text(summary),
            flops=_flops(summary),
            nbytes=_bytes_moved(trials[key] + bases[key]),
            stale=not is_current(summary["json"]),
        )
        ok = [r for r in trials[key] if r.status == "ok" and r.median_ms]
        p.trials_ok, p.trials_failed = len(ok), len(trials[key]) - len(ok)
        p.studies = tuple(sorted({r.study for r in trials[key] if r.study}))
        for r in trials[key]:
            if r.status != "ok":
                failures.append(Failure(p.label, r.config, r.status, r.detail or "", r.created_at))
        if ok:
            p.best = min(ok, key=comparable_ms)
            p.ms = comparable_ms(p.best)
        fastest: dict[str, Record] = {}
        for b in bases[key]:
            if b.median_ms and (b.library not in fastest or b.median_ms < fastest[b.library].median_ms):
                fastest[str(b.library)] = b
        for lib, b in fastest.items():
            p.baselines[lib] = comparable_ms(b, p.best)
            if p.best is not None:
                p.speedups[lib] = p.baselines[lib] / comparable_ms(p.best, b)
                both_graphs = p.best.graph_ms is not None and b.graph_ms is not None
                p.timed_as[lib] = "graph" if both_graphs else "events"
        problems.append(p)
    failures.sort(key=lambda f: f.created_at, reverse=True)
    records = [r for r in snapshot.trials + snapshot.baselines if r.device == chosen]
    return ReportData(
        db_url=db_url,
        generated_at=datetime.now(timezone.utc),
        device=chosen,
        devices=devices,
        versions=sorted({f"torch {r.versions.torch}, triton {r.versions.triton}" for r in records}),
        methods=sorted({re.sub(r"\b\d+\b", "N", r.timing_method) for r in records if r.median_ms}),
        peaks=peaks_for(chosen, peak_tflops, peak_gbs),
        problems=problems,
        failures=failures[:MAX_FAILURES],
        failed_total=len(failures),
        stale_problems=sum(p.stale for p in problems),
        filters=filters,
    )
