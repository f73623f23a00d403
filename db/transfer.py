"""Export and import of a tuning database as JSON.

Format (``format: "epilab-tuning-db"``, ``version: 1``)::

    {"format": ..., "version": 1, "exported_at": ISO time, "schema_revision": ...,
     "problems": [{"key", "json", "epilogue"}],
     "trials":   [{"problem", "device": {"name", "capability", "sm_count"}, "config", "status",
                   "median_ms", "p20_ms", "p80_ms", "graph_ms" (may be absent), "tflops", "gbps",
                   "max_rel_error", "timing_method", "torch_version", "triton_version", "study",
                   "trial_number", "detail", "created_at"}],
     "baselines": [{"problem", "device", "library", <the same timing fields>, "created_at"}]}

Import validates every row before writing any (each problem's key against the sha256 of
its JSON; the JSON through the caller's parser, which gives it back as this epilab writes
it: a problem exported by an older epilab, its operands' broadcast still called ``kind``,
is stored under its key of today, and its records with it; configs through the caller's validator, which
admits only values of the search space; known statuses and libraries; bounded
strings; finite non-negative numbers; no unknown keys). Invalid input raises a
ValueError naming each bad row and writes nothing. Valid rows are merged in one
transaction. Merge rule: a record is identified by (problem, device, config or
library, torch version, triton version); when both sides have it, the one with
the later ``created_at`` wins, and on a tie the existing row stays. Re-importing
the same file is therefore a no-op.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from epilab.db.fields import check_str
from epilab.db.keys import canonical, problem_key
from epilab.db.models import NAME_LEN, BaselineRecord, Device, ProblemRow, TrialRecord
from epilab.db.rows import baseline_values, problem_values, trial_values
from epilab.db.store import TuningDB
from epilab.db.values import DeviceInfo, Timing, Versions
from epilab.files import read_text_bounded, write_text_atomic

FORMAT = "epilab-tuning-db"
VERSION = 1
MAX_ERRORS_SHOWN = 20

_TIMED = (
    "median_ms",
    "p20_ms",
    "p80_ms",
    "graph_ms",
    "tflops",
    "gbps",
    "max_rel_error",
    "timing_method",
    "torch_version",
    "triton_version",
    "created_at",
)
TRIAL_FIELDS = frozenset(
    ("problem", "device", "config", "status", "study", "trial_number", "detail", *_TIMED)
)
BASELINE_FIELDS = frozenset(("problem", "device", "library", *_TIMED))
PROBLEM_FIELDS = frozenset(("key", "json", "epilogue"))
OPTIONAL_FIELDS = frozenset(("graph_ms",))  # absent from files written before schema 0003

# (problem JSON) -> (its canonical JSON as this epilab writes it, canonical epilogue text);
# raises ValueError when invalid
ProblemParser = Callable[[str], tuple[str, str]]
# (config dict, the JSON of the problem it must run, or None) -> canonical config dict;
# raises ValueError when invalid, or when the problem's template cannot run it
ConfigValidator = Callable[[Mapping[str, Any], str | None], Mapping[str, Any]]


@dataclass(frozen=True)
class ImportReport:
    problems: int
    trials: int
    baselines: int


def export_json(db: TuningDB, path: str | Path) -> dict[str, int]:
    """Write the whole database to ``path``; returns the row counts."""
    with db.session() as s:
        problems = [
            {"key": p.key, "json": p.json, "epilogue": p.epilogue}
            for p in s.scalars(select(ProblemRow).order_by(ProblemRow.key))
        ]
        trials = [
            _row_out(r, p, d)
            for r, p, d in s.execute(
                select(TrialRecord, ProblemRow, Device).join(ProblemRow).join(Device).order_by(TrialRecord.id)
            )
        ]
        baselines = [
            _row_out(r, p, d)
            for r, p, d in s.execute(
                select(BaselineRecord, ProblemRow, Device)
                .join(ProblemRow)
                .join(Device)
                .order_by(BaselineRecord.id)
            )
        ]
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "schema_revision": db.revision,
        "problems": problems,
        "trials": trials,
        "baselines": baselines,
    }
    write_text_atomic(path, json.dumps(doc, indent=1, allow_nan=False))
    return {"problems": len(problems), "trials": len(trials), "baselines": len(baselines)}


def import_json(
    db: TuningDB, path: str | Path, *, parse_problem: ProblemParser, validate_config: ConfigValidator
) -> ImportReport:
    """Validate all of ``path``, then merge it in one transaction (see the module doc)."""
    path = Path(path)
    try:
        doc = json.loads(read_text_bounded(path, "epilab export"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be an epilab export") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not an epilab export (format must be {FORMAT!r})")
    if type(doc.get("version")) is not int or doc["version"] != VERSION:  # (true == 1 in Python)
        raise ValueError(f"{path} has export version {doc.get('version')!r}; this epilab reads {VERSION}")
    errors: list[str] = []
    problems = _checked_problems(doc.get("problems"), parse_problem, errors)
    trials = _checked_rows(
        doc.get("trials"),
        "trials",
        TRIAL_FIELDS,
        problems,
        errors,
        lambda r: _trial(r, validate_config, problems[r["problem"]]["json"]),
    )
    baselines = _checked_rows(doc.get("baselines"), "baselines", BASELINE_FIELDS, problems, errors, _baseline)
    if errors:
        shown = "\n  ".join(errors[:MAX_ERRORS_SHOWN])
        more = f"\n  ... and {len(errors) - MAX_ERRORS_SHOWN} more" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise ValueError(f"{path}: {len(errors)} invalid row(s); nothing was imported:\n  {shown}{more}")

    trials, baselines = _newest(trials, "config"), _newest(baselines, "library")

    def run(s: Session) -> ImportReport:
        ids = {
            key: db.problem_id(s, values["json"], values["epilogue"], values["key"])
            for key, values in problems.items()
        }
        for model, rows in ((TrialRecord, trials), (BaselineRecord, baselines)):
            for device, key, row in rows:
                full = {**row, "problem_id": ids[key], "device_id": db.device_id(s, device)}
                db.upsert_measurement(s, model, full, newer_only=True)
        return ImportReport(len(problems), len(trials), len(baselines))

    return db.write(run)


# ------------------------------------------------------------------ checking


def _checked_problems(items: Any, parse: ProblemParser, errors: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(items, list):
        errors.append("problems: must be a list")
        return out
    for i, item in enumerate(items):
        where = f"problems[{i}]"
        try:
            _check_keys(item, PROBLEM_FIELDS, where)
            if not isinstance(item["json"], str) or len(item["json"]) > 200_000:
                raise ValueError("json must be a string of at most 200000 characters")
            key = problem_key(item["json"])
            if key != item["key"]:
                raise ValueError(
                    f"key {str(item['key'])[:16]!r}... does not match its JSON (sha256 {key[:16]}...)"
                )
            now, text = parse(item["json"])
            out[key] = problem_values(now, text)  # under the export's key: its rows name it
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as e:
            errors.append(f"{where}: {e}")
    return out


def _checked_rows(
    items: Any,
    name: str,
    fields: frozenset[str],
    problems: Mapping[str, Any],
    errors: list[str],
    convert: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[tuple[DeviceInfo, str, dict[str, Any]]]:
    out = []
    if not isinstance(items, list):
        errors.append(f"{name}: must be a list")
        return out
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        try:
            _check_keys(item, fields, where)
            if item["problem"] not in problems:
                raise ValueError(
                    f"problem {str(item['problem'])[:16]!r} is not among the file's valid problems"
                )
            out.append((_device(item["device"]), item["problem"], convert(item)))
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            errors.append(f"{where}: {e}")
    return out


def _newest(
    rows: list[tuple[DeviceInfo, str, dict[str, Any]]], what: str
) -> list[tuple[DeviceInfo, str, dict[str, Any]]]:
    """One row per record identity (the file may repeat one): the newest, as the merge rule
    would keep; so the counts reported are the records written."""
    kept: dict[tuple[Any, ...], tuple[DeviceInfo, str, dict[str, Any]]] = {}
    for device, key, row in rows:
        identity = (device, key, row[what], row["torch_version"], row["triton_version"])
        if identity not in kept or kept[identity][2]["created_at"] < row["created_at"]:
            kept[identity] = (device, key, row)
    return list(kept.values())


def _check_keys(item: Any, fields: frozenset[str], where: str) -> None:
    if not isinstance(item, dict):
        raise ValueError("must be an object")
    extra, missing = set(item) - fields, fields - set(item) - OPTIONAL_FIELDS
    if extra or missing:
        raise ValueError(f"unexpected keys {sorted(extra)[:5]}, missing keys {sorted(missing)[:5]}")


def _device(d: Any) -> DeviceInfo:
    if not isinstance(d, dict) or set(d) != {"name", "capability", "sm_count"}:
        raise ValueError("device must be {name, capability, sm_count}")
    if (
        isinstance(d["sm_count"], bool)
        or not isinstance(d["sm_count"], int)
        or not 0 < d["sm_count"] < 100_000
    ):
        raise ValueError(f"device sm_count must be a positive int, got {d['sm_count']!r:.40}")
    return DeviceInfo(
        check_str("device name", d["name"], NAME_LEN),
        check_str("device capability", d["capability"], 16),
        d["sm_count"],
    )


def _timing(r: dict[str, Any]) -> Timing | None:
    if r["median_ms"] is None:
        return None
    return Timing(
        r["median_ms"],
        r["p20_ms"],
        r["p80_ms"],
        r["timing_method"],
        r["tflops"],
        r["gbps"],
        graph_ms=r.get("graph_ms"),
    )


def _created(r: dict[str, Any]) -> datetime:
    if not isinstance(r["created_at"], str) or len(r["created_at"]) > 40:
        raise ValueError("created_at must be an ISO 8601 time")
    return datetime.fromisoformat(r["created_at"])


def _trial(r: dict[str, Any], validate_config: ConfigValidator, problem_json: str) -> dict[str, Any]:
    """An "ok" record's config must run its problem (a lookup would choose it); a failed
    one's is the record of a failure, checked as a config only."""
    if not isinstance(r["config"], dict):
        raise ValueError("config must be an object")
    config = dict(validate_config(r["config"], problem_json if r["status"] == "ok" else None))
    return trial_values(
        config=config,
        status=r["status"],
        timing=_timing(r),
        max_rel_error=r["max_rel_error"],
        versions=Versions(r["torch_version"], r["triton_version"]),
        study=r["study"],
        trial_number=r["trial_number"],
        detail=r["detail"],
        created_at=_created(r),
    )


def _baseline(r: dict[str, Any]) -> dict[str, Any]:
    timing = _timing(r)
    if timing is None:
        raise ValueError("a baseline needs median_ms")
    return baseline_values(
        library=r["library"],
        timing=timing,
        max_rel_error=r["max_rel_error"],
        versions=Versions(r["torch_version"], r["triton_version"]),
        created_at=_created(r),
    )


def _row_out(r: Any, p: ProblemRow, d: Device) -> dict[str, Any]:
    out: dict[str, Any] = {
        "problem": p.key,
        "device": {"name": d.name, "capability": d.capability, "sm_count": d.sm_count},
    }
    if isinstance(r, TrialRecord):
        out.update(
            config=json.loads(r.config),
            status=r.status,
            study=r.study,
            trial_number=r.trial_number,
            detail=r.detail,
        )
    else:
        out["library"] = r.library
    for f in _TIMED:
        out[f] = getattr(r, f)
    created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=timezone.utc)
    out["created_at"] = created.isoformat()
    return out


__all__ = ["FORMAT", "ImportReport", "canonical", "export_json", "import_json"]
