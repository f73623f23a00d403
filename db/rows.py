"""Rows from values and values from rows: the columns of a problem, trial and baseline row as
the store writes them, and records, lookups and summaries as it reads them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select

from epilab.db.fields import (
    aware,
    check_num,
    check_str,
    clean_detail,
    now,
)
from epilab.db.keys import canonical, family_key, problem_key
from epilab.db.models import (
    EPILOGUE_LEN,
    LIBRARY_NAME,
    METHOD_LEN,
    STATUSES,
    STUDY_LEN,
    VERSION_LEN,
    Device,
    ProblemRow,
    TrialRecord,
    VerdictRecord,
)
from epilab.db.values import (
    ConfigCheck,
    DeviceInfo,
    IsCurrent,
    Lookup,
    Record,
    Timing,
    Verdict,
    Versions,
)


def problem_values(problem_json: str, epilogue_text: str, key: str | None = None) -> dict[str, Any]:
    """Columns of a problem row from its canonical JSON; checks the key matches."""
    d = json.loads(problem_json)
    if canonical(d) != problem_json:
        raise ValueError("problem JSON is not in canonical form (sorted keys, no spaces)")
    computed = problem_key(problem_json)
    if key is not None and key != computed:
        raise ValueError(f"problem key {key[:16]}... does not match its JSON (sha256 {computed[:16]}...)")
    shape = d["shape"]
    return {
        "key": computed,
        "family": family_key(problem_json),
        "json": problem_json,
        "op": check_str("op", d["op"], 32),
        "template": check_str("template", d["template"], 64),
        "template_hash": check_str("template_hash", d["template_hash"], 64),
        "dtype": check_str("dtype", d["dtype"], 16),
        "layout_a": check_str("layout_a", d["layout_a"], 16),
        "layout_b": check_str("layout_b", d["layout_b"], 16),
        "precision": check_str("precision", d.get("precision", "ieee"), 16),
        "epilogue": check_str("epilogue", epilogue_text, EPILOGUE_LEN),
        **{dim: shape[dim] if isinstance(shape[dim], int) else None for dim in ("batch", "m", "n", "k")},
    }


def trial_values(
    *,
    config: dict[str, Any],
    status: str,
    timing: Timing | None,
    max_rel_error: float | None,
    versions: Versions,
    study: str,
    trial_number: int | None,
    detail: str | None,
    created_at: datetime,
) -> dict[str, Any]:
    """Checked columns of a trial record (config must already be validated by its template)."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {STATUSES}")
    if status == "ok" and (timing is None or max_rel_error is None):
        raise ValueError("an ok trial needs its timing and its error against the reference")
    if trial_number is not None and (
        isinstance(trial_number, bool) or not isinstance(trial_number, int) or not 0 <= trial_number < 2**31
    ):
        raise ValueError(f"trial_number must be an int in 0..2**31-1, got {trial_number!r:.40}")
    if detail is not None:
        if not isinstance(detail, str):
            raise ValueError(f"detail must be a string, got {type(detail).__name__}")
        detail = clean_detail(detail)
    return {
        "config": canonical(config),
        "status": status,
        "study": check_str("study", study, STUDY_LEN),
        "trial_number": trial_number,
        "detail": detail,
        **_timed_values(timing, max_rel_error, versions, created_at),
    }


def baseline_values(
    *, library: str, timing: Timing, max_rel_error: float | None, versions: Versions, created_at: datetime
) -> dict[str, Any]:
    if not isinstance(library, str) or not LIBRARY_NAME.fullmatch(library):
        raise ValueError(
            f"library {library!r:.60} is not a library's name (lowercase letters, digits and _.+-, "
            "32 at most: cublas, cudnn, inductor, ...)"
        )
    if timing is None:
        raise ValueError("a baseline needs its timing")
    return {"library": library, **_timed_values(timing, max_rel_error, versions, created_at)}


FUTURE_SLACK = timedelta(days=1)  # clocks of a fleet's hosts may disagree; a record from later is not


def _timed_values(
    timing: Timing | None, max_rel_error: float | None, versions: Versions, created_at: datetime
) -> dict[str, Any]:
    t = timing
    if t is not None:
        _check_timing(t)
    created = aware(created_at).astimezone(timezone.utc)
    if created > now() + FUTURE_SLACK:
        # the newer record wins a merge: one from the future would win every later one
        raise ValueError(f"created_at {created.isoformat()} is in the future")
    return {
        "median_ms": check_num("median_ms", t.median_ms if t else None),
        "p20_ms": check_num("p20_ms", t.p20_ms if t else None),
        "p80_ms": check_num("p80_ms", t.p80_ms if t else None),
        "graph_ms": check_num("graph_ms", t.graph_ms if t else None),
        "tflops": check_num("tflops", t.tflops if t else None),
        "gbps": check_num("gbps", t.gbps if t else None),
        "max_rel_error": check_num("max_rel_error", max_rel_error),
        "timing_method": check_str("timing method", t.method if t else "none", METHOD_LEN),
        "torch_version": check_str("torch version", versions.torch, VERSION_LEN),
        "triton_version": check_str("triton version", versions.triton, VERSION_LEN),
        "created_at": created,
    }


def _check_timing(t: Timing) -> None:
    """A measured time is more than 0 (a time of 0 was never measured: it would win every
    lookup), and its quantiles in order: p20 <= median <= p80."""
    for name in ("median_ms", "p20_ms", "p80_ms", "graph_ms"):
        value = check_num(name, getattr(t, name))
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be more than 0 (a measured time), got {value!r}")
    if not t.p20_ms <= t.median_ms <= t.p80_ms:
        raise ValueError(
            f"the quantiles are out of order: p20 {t.p20_ms!r:.12} <= median {t.median_ms!r:.12} <= "
            f"p80 {t.p80_ms!r:.12} must hold"
        )


def is_stale(p: Any, is_current: IsCurrent) -> bool:
    return not is_current(p.json)


def static_m(problem_json: str) -> int | None:
    m = json.loads(problem_json)["shape"]["m"]
    return m if isinstance(m, int) else None


def static_shape(problem_json: str) -> bool:
    return all(isinstance(v, int) for v in json.loads(problem_json)["shape"].values())


def records_query(model: type, device: DeviceInfo | None = None) -> Any:
    q = (
        select(model, ProblemRow, Device)
        .join(ProblemRow, model.problem_id == ProblemRow.id)
        .join(Device, model.device_id == Device.id)
    )
    if device is not None:
        q = q.where(
            Device.name == device.name,
            Device.capability == device.capability,
            Device.sm_count == device.sm_count,
        )
    return q


def record_of(row: Any) -> Record:
    r, p, d = row
    is_trial = isinstance(r, TrialRecord)
    return Record(
        problem_key=p.key,
        device=DeviceInfo(d.name, d.capability, d.sm_count),
        status=r.status if is_trial else "ok",
        config=json.loads(r.config) if is_trial else None,
        library=None if is_trial else r.library,
        median_ms=r.median_ms,
        p20_ms=r.p20_ms,
        p80_ms=r.p80_ms,
        graph_ms=r.graph_ms,
        tflops=r.tflops,
        gbps=r.gbps,
        max_rel_error=r.max_rel_error,
        timing_method=r.timing_method,
        versions=Versions(r.torch_version, r.triton_version),
        study=r.study if is_trial else None,
        trial_number=r.trial_number if is_trial else None,
        detail=r.detail if is_trial else None,
        created_at=aware(r.created_at),
    )


def usable_rows(rows: list[Any], usable: ConfigCheck | None) -> list[Any]:
    if usable is None:
        return rows
    out = []
    for row in rows:
        try:
            config = json.loads(row[0].config)
        except ValueError:
            continue
        if isinstance(config, dict) and usable(config):
            out.append(row)
    return out


def pick_record(rows: list[Any], versions: Versions | None, *, exact: bool) -> Lookup | None:
    if not rows:
        return None

    def same(row: Any) -> bool:
        r = row[0]
        return versions is not None and (r.torch_version, r.triton_version) == (
            versions.torch,
            versions.triton,
        )

    def timed(row: Any) -> tuple[bool, float]:  # like with like: graph times before events
        r = row[0]
        return (r.graph_ms is None, r.graph_ms if r.graph_ms is not None else r.median_ms)

    best = min(rows, key=lambda row: (not same(row), *timed(row), row[0].id))
    return Lookup(record=record_of(best), exact=exact, m=best.ProblemRow.m, same_versions=same(best))


def problem_summary(p: ProblemRow) -> dict[str, Any]:
    return {
        "key": p.key,
        "op": p.op,
        "template": p.template,
        "dtype": p.dtype,
        "layouts": f"{p.layout_a}/{p.layout_b}",
        "shape": [p.batch, p.m, p.n, p.k],
        "epilogue": p.epilogue,
        "template_hash": p.template_hash,
        "json": p.json,  # the whole problem (a convolution's geometry, for its label)
    }


def verdict_of(v: VerdictRecord, key: str) -> Verdict:
    """The verdict a stored row says, for problem ``key``."""
    return Verdict(
        problem_key=key,
        keep=v.keep,
        with_ms=v.with_ms,
        without_ms=v.without_ms,
        context=v.context,
        cuda_graphs=v.cuda_graphs,
        inductor_mode=v.inductor_mode,
        timing_method=v.timing_method,
        versions=Versions(v.torch_version, v.triton_version),
        created_at=aware(v.created_at),
        ratio_low=v.ratio_low,
        ratio_high=v.ratio_high,
        rounds=v.rounds,
        outcome=v.outcome,
        training=v.training,
    )
