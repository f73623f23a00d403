"""``TuningDB``: the one entry point to the tuning database.

    db = TuningDB.open()                  # EPILAB_DB, else <cache dir>/tuning.db
    db = TuningDB.open("tuned.db")        # a path: SQLite
    db = TuningDB.open("postgresql+psycopg://user@host/epilab")   # any SQLAlchemy URL

SQLite runs in WAL mode with a busy timeout; every write is one short
transaction that takes the write lock up front (``BEGIN IMMEDIATE``), so
concurrent writers queue instead of failing and readers never block writers.
Writes are upserts. Results come back as plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from epilab.db.engine import (
    is_busy,
    is_readonly,
    make_engine,
    make_parent,
    optuna_storage,
    readonly_url,
    resolve_url,
    writable,
)
from epilab.db.fields import (
    check_num,
    check_str,
    now,
)
from epilab.db.keys import family_key
from epilab.db.models import (
    COMPILE_FAILURES,
    METHOD_LEN,
    NAME_LEN,
    STATUSES,
    VERSION_LEN,
    BaselineRecord,
    Device,
    LeaseRecord,
    ProblemRow,
    TrialRecord,
    VerdictRecord,
)
from epilab.db.rows import (
    baseline_values,
    is_stale,
    pick_record,
    problem_summary,
    problem_values,
    record_of,
    records_query,
    static_m,
    static_shape,
    trial_values,
    usable_rows,
    verdict_of,
)
from epilab.db.schema import (
    DatabaseOpenError,
    DatabaseReadOnlyError,
    check_sqlite_file,
    prepare,
)
from epilab.db.values import (
    INDUCTOR_MODES,
    VERDICT_OUTCOMES,
    ConfigCheck,
    DeviceInfo,
    IsCurrent,
    Lookup,
    ProblemLike,
    Record,
    Snapshot,
    Stats,
    Timing,
    Verdict,
    Versions,
)

T = TypeVar("T")
# what identifies a measurement (the unique constraints of models.py)
IDENTITY: dict[type, tuple[str, ...]] = {
    TrialRecord: ("problem_id", "device_id", "config", "torch_version", "triton_version"),
    BaselineRecord: ("problem_id", "device_id", "library", "torch_version", "triton_version"),
    VerdictRecord: (
        "problem_id",
        "device_id",
        "cuda_graphs",
        "training",
        "inductor_mode",
        "torch_version",
        "triton_version",
    ),
}


class TuningDB:
    """Devices, problems, trial records and baselines, in SQLite or any SQLAlchemy database."""

    def __init__(
        self, engine: Engine, url: str, revision: str, full_url: URL, *, readonly: bool = False
    ) -> None:
        self.engine = engine
        self._writer = engine.execution_options(epilab_write=True)
        self.url = url  # for display: the file, or the URL with its password hidden
        self.full_url = full_url
        self.storage_url = full_url.render_as_string(hide_password=False)  # optuna's, same database
        self.revision = revision
        self.readonly = readonly

    def optuna_storage(self, *, create: bool = True) -> Any:
        """Optuna's RDB storage of the studies, in this database (``engine.optuna_storage``)."""
        return optuna_storage(self.full_url, self.url, create=create)

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, target: str | Path | None = None, *, create: bool = True) -> TuningDB:
        """Open (creating or migrating) the database at a path or URL; see the module doc.
        An SQLite file that cannot be written is opened read-only: reads work, writes raise
        DatabaseReadOnlyError. ``create=False`` (commands that only read) refuses a file that
        does not exist or is empty rather than make it a database (or its directory)."""
        url, path = resolve_url(target)
        readonly = False
        if path is not None:
            if not create and not path.exists():
                raise DatabaseOpenError(
                    f"no database at {path}; this command only reads, so none was made "
                    "(`epilab tune` or `epilab db import` make one; --db or EPILAB_DB choose it)"
                )
            if not create and path.is_file() and path.stat().st_size == 0:
                raise DatabaseOpenError(
                    f"{path} is an empty file, not an epilab database; this command only reads, "
                    "so it was left as it is (`epilab tune` or `epilab db import` make it one)"
                )
            check_sqlite_file(path)
            make_parent(path)
            if path.exists() and not writable(path):
                url, readonly = readonly_url(url, path), True
        engine = make_engine(url, readonly=readonly)
        shown = str(path) if path is not None else url.render_as_string(hide_password=True)
        try:
            with engine.execution_options(epilab_write=not readonly).begin() as conn:
                revision = prepare(conn, shown, readonly=readonly)
        except OperationalError as e:
            engine.dispose()
            if is_readonly(e):
                raise DatabaseReadOnlyError(f"cannot create or migrate {shown}: {e.orig}") from e
            raise DatabaseOpenError(f"cannot open {shown}: {e.orig}") from e
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, shown, revision, url, readonly=readonly)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- sessions
    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A session whose transaction commits on success and rolls back on error."""
        with Session(self._writer if write else self.engine, expire_on_commit=False) as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def write(self, fn: Callable[[Session], T], *, attempts: int = 5) -> T:
        """Run ``fn`` in one write transaction, retrying if the database stays busy."""
        if self.readonly:
            raise DatabaseReadOnlyError(
                f"cannot write to {self.url}: it is read-only (the file or its directory); "
                "nothing was changed"
            )
        for attempt in range(attempts):
            try:
                with self.session(write=True) as s:
                    return fn(s)
            except OperationalError as e:
                if is_readonly(e):
                    raise DatabaseReadOnlyError(f"cannot write to {self.url}: {e.orig}") from e
                if attempt + 1 == attempts or not is_busy(e):
                    raise
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- writes
    def put_problem(self, problem: ProblemLike) -> None:
        self.write(lambda s: self.problem_id(s, problem.to_json(), problem.epilogue.text(), problem.key))

    def record_trial(
        self,
        problem: ProblemLike,
        device: DeviceInfo,
        *,
        config: Mapping[str, Any],
        status: str,
        timing: Timing | None,
        max_rel_error: float | None,
        versions: Versions,
        study: str,
        trial_number: int | None = None,
        detail: str | None = None,
    ) -> None:
        """Record one measured (or failed) config; the newest measurement of a config wins."""
        row = trial_values(
            config=dict(config),
            status=status,
            timing=timing,
            max_rel_error=max_rel_error,
            versions=versions,
            study=study,
            trial_number=trial_number,
            detail=detail,
            created_at=now(),
        )
        self._upsert(problem, device, TrialRecord, row)

    def record_baseline(
        self,
        problem: ProblemLike,
        device: DeviceInfo,
        *,
        library: str,
        timing: Timing,
        max_rel_error: float | None,
        versions: Versions,
    ) -> None:
        row = baseline_values(
            library=library, timing=timing, max_rel_error=max_rel_error, versions=versions, created_at=now()
        )
        self._upsert(problem, device, BaselineRecord, row)

    def record_verdict(
        self,
        problem: ProblemLike,
        device: DeviceInfo,
        *,
        cuda_graphs: bool,
        keep: bool,
        with_ms: float,
        without_ms: float,
        context: str,
        timing_method: str,
        versions: Versions,
        inductor_mode: str = "default",
        ratio_low: float | None = None,
        ratio_high: float | None = None,
        rounds: int | None = None,
        outcome: str | None = None,
        training: bool = False,
    ) -> None:
        """Store (or replace) the verdict of ``problem`` in a model, for one CUDA-graph mode,
        Inductor mode and kind of step (``training``: forward and backward, else inference);
        with the paired ratio's interval, rounds and outcome where known."""
        if inductor_mode not in INDUCTOR_MODES:
            raise ValueError(f"inductor_mode {inductor_mode!r} is not one of {INDUCTOR_MODES}")
        if outcome is not None and outcome not in VERDICT_OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {VERDICT_OUTCOMES}")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
            raise ValueError(f"rounds {rounds!r}: give a positive int")
        row = {
            "ratio_low": check_num("ratio_low", ratio_low),
            "ratio_high": check_num("ratio_high", ratio_high),
            "rounds": rounds,
            "outcome": outcome,
            "cuda_graphs": bool(cuda_graphs),
            "training": bool(training),
            "inductor_mode": inductor_mode,
            "keep": bool(keep),
            "with_ms": check_num("with_ms", with_ms, optional=False),
            "without_ms": check_num("without_ms", without_ms, optional=False),
            "context": check_str("verdict context", context, NAME_LEN),
            "timing_method": check_str("timing method", timing_method, METHOD_LEN),
            "torch_version": check_str("torch version", versions.torch, VERSION_LEN),
            "triton_version": check_str("triton version", versions.triton, VERSION_LEN),
            "created_at": now(),
        }
        self._upsert(problem, device, VerdictRecord, row)

    def verdict(
        self,
        key: str,
        device: DeviceInfo,
        versions: Versions,
        *,
        cuda_graphs: bool,
        inductor_mode: str = "default",
        training: bool = False,
    ) -> Verdict | None:
        """The verdict of problem ``key`` measured on ``device`` with these versions, in these
        modes, in a training step (``training``) or at inference."""
        with self.session() as s:
            row = s.execute(
                select(VerdictRecord, ProblemRow.key)
                .join(ProblemRow, VerdictRecord.problem_id == ProblemRow.id)
                .join(Device, VerdictRecord.device_id == Device.id)
                .where(
                    ProblemRow.key == key,
                    Device.name == device.name,
                    Device.capability == device.capability,
                    Device.sm_count == device.sm_count,
                    VerdictRecord.cuda_graphs == bool(cuda_graphs),
                    VerdictRecord.training == bool(training),
                    VerdictRecord.inductor_mode == inductor_mode,
                    VerdictRecord.torch_version == versions.torch,
                    VerdictRecord.triton_version == versions.triton,
                )
            ).first()
        return None if row is None else verdict_of(row[0], row[1])

    def prune_stale(self, is_current: IsCurrent) -> int:
        """Delete problems whose kernels would now be rendered otherwise (with their records;
        ``is_current`` judges a stored problem's JSON); returns how many."""

        def run(s: Session) -> int:
            ids = [p.id for p in s.scalars(select(ProblemRow)) if is_stale(p, is_current)]
            for chunk in range(0, len(ids), 500):
                part = ids[chunk : chunk + 500]
                s.execute(delete(TrialRecord).where(TrialRecord.problem_id.in_(part)))
                s.execute(delete(BaselineRecord).where(BaselineRecord.problem_id.in_(part)))
                s.execute(delete(VerdictRecord).where(VerdictRecord.problem_id.in_(part)))
                s.execute(delete(LeaseRecord).where(LeaseRecord.problem_id.in_(part)))
                s.execute(delete(ProblemRow).where(ProblemRow.id.in_(part)))
            return len(ids)

        return self.write(run)

    # ------------------------------------------------------------- upserts
    def _upsert(self, problem: ProblemLike, device: DeviceInfo, model: type, row: dict[str, Any]) -> None:
        """Store ``row`` of ``model`` (a trial, baseline or verdict) for ``problem`` on
        ``device``, replacing the row of the same identity (``IDENTITY``)."""

        def run(s: Session) -> None:
            pid = self.problem_id(s, problem.to_json(), problem.epilogue.text(), problem.key)
            ids = {"problem_id": pid, "device_id": self.device_id(s, device)}
            self.upsert_measurement(s, model, {**row, **ids})

        self.write(run)

    def _insert(self, s: Session, model: type) -> Any:
        return (sqlite_insert if s.get_bind().dialect.name == "sqlite" else pg_insert)(model)

    def device_id(self, s: Session, device: DeviceInfo) -> int:
        check_str("device name", device.name, NAME_LEN)
        check_str("device capability", device.capability, 16)
        if isinstance(device.sm_count, bool) or not isinstance(device.sm_count, int) or device.sm_count <= 0:
            raise ValueError(f"device sm_count must be a positive int, got {device.sm_count!r}")
        values = {"name": device.name, "capability": device.capability, "sm_count": device.sm_count}
        s.execute(
            self._insert(s, Device)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["name", "capability", "sm_count"])
        )
        return s.scalars(select(Device.id).filter_by(**values)).one()

    def problem_id(self, s: Session, problem_json: str, epilogue_text: str, key: str | None = None) -> int:
        values = problem_values(problem_json, epilogue_text, key)
        s.execute(
            self._insert(s, ProblemRow)
            .values(**values, created_at=now())
            .on_conflict_do_nothing(index_elements=["key"])
        )
        return s.scalars(select(ProblemRow.id).where(ProblemRow.key == values["key"])).one()

    def upsert_measurement(
        self, s: Session, model: type, row: dict[str, Any], *, newer_only: bool = False
    ) -> None:
        """Insert a trial record or baseline, or update the one with the same identity
        (always, or only when ``row`` is newer: the import merge rule)."""
        stmt = self._insert(s, model).values(**row)
        keys = IDENTITY[model]
        update = {c: stmt.excluded[c] for c in row if c not in keys}
        where = model.created_at < stmt.excluded.created_at if newer_only else None
        s.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update, where=where))

    # --------------------------------------------------------------- queries
    def best(
        self,
        key: str,
        device: DeviceInfo,
        versions: Versions | None = None,
        usable: ConfigCheck | None = None,
    ) -> Lookup | None:
        """The fastest ok record of problem ``key`` on ``device``, preferring records made
        with the same torch and triton versions; records whose config ``usable`` rejects
        (one this version of the templates cannot run) are passed over."""
        with self.session() as s:
            rows = s.execute(
                records_query(TrialRecord, device).where(
                    ProblemRow.key == key, TrialRecord.status == "ok", TrialRecord.median_ms.is_not(None)
                )
            ).all()
            return pick_record(usable_rows(rows, usable), versions, exact=True)

    def lookup(
        self,
        problem: ProblemLike,
        device: DeviceInfo,
        versions: Versions | None = None,
        m: int | None = None,
        usable: ConfigCheck | None = None,
        same: Callable[[str], bool] | None = None,
    ) -> Lookup | None:
        """``best`` for the problem; else the best of another problem of the same shape,
        dtypes and layouts whose JSON ``same`` accepts (the same computation as far as
        performance goes: the caller decides, the db does not parse problems); else the
        nearest M of its family (log2 distance). ``m`` is the M to aim for when the
        problem's M is symbolic."""
        exact = self.best(problem.key, device, versions, usable)
        if exact is not None:
            return dataclasses.replace(exact, via="exact")
        text = problem.to_json()
        if same is not None:
            found = self._same_math(problem.key, text, device, versions, usable, same)
            if found is not None:
                return found
        want = m if m is not None else static_m(text)
        if want is None or want <= 0:
            return None
        with self.session() as s:
            rows = s.execute(
                records_query(TrialRecord, device).where(
                    ProblemRow.family == family_key(text),
                    ProblemRow.m.is_not(None),
                    ProblemRow.m > 0,
                    TrialRecord.status == "ok",
                    TrialRecord.median_ms.is_not(None),
                )
            ).all()
        rows = usable_rows(rows, usable)
        if not rows:
            return None
        nearest = min(abs(math.log2(r.ProblemRow.m) - math.log2(want)) for r in rows)
        close = [r for r in rows if abs(math.log2(r.ProblemRow.m) - math.log2(want)) == nearest]
        found = pick_record(close, versions, exact=False)
        return None if found is None else dataclasses.replace(found, via="family")

    def _same_math(
        self,
        key: str,
        text: str,
        device: DeviceInfo,
        versions: Versions | None,
        usable: ConfigCheck | None,
        same: Callable[[str], bool],
    ) -> Lookup | None:
        d = json.loads(text)
        shape = d["shape"]
        dims = [shape.get(name) for name in ("batch", "m", "n", "k")]
        if not all(isinstance(v, int) for v in dims):
            return None
        with self.session() as s:
            rows = s.execute(
                records_query(TrialRecord, device).where(
                    ProblemRow.key != key,
                    ProblemRow.template == d["template"],
                    ProblemRow.template_hash == d["template_hash"],
                    ProblemRow.dtype == d["dtype"],
                    ProblemRow.layout_a == d["layout_a"],
                    ProblemRow.layout_b == d["layout_b"],
                    ProblemRow.batch == dims[0],
                    ProblemRow.m == dims[1],
                    ProblemRow.n == dims[2],
                    ProblemRow.k == dims[3],
                    TrialRecord.status == "ok",
                    TrialRecord.median_ms.is_not(None),
                )
            ).all()
        verdicts: dict[str, bool] = {}
        rows = [r for r in rows if verdicts.setdefault(r.ProblemRow.json, same(r.ProblemRow.json))]
        found = pick_record(usable_rows(rows, usable), versions, exact=False)
        return None if found is None else dataclasses.replace(found, via="identity")

    def nearest(
        self,
        problem: ProblemLike,
        device: DeviceInfo,
        distance: Callable[[str], float | None],
        *,
        versions: Versions | None = None,
        usable: ConfigCheck | None = None,
        within: float = math.inf,
        limit: int = 8,
    ) -> list[Lookup]:
        """The best record of each other problem of the same template (and version) and
        input dtype on ``device`` whose JSON ``distance`` measures within ``within`` of
        ``problem`` (the caller defines the distance: the db does not parse problems),
        nearest first, at most ``limit``."""
        d = json.loads(problem.to_json())
        with self.session() as s:
            rows = s.execute(
                records_query(TrialRecord, device).where(
                    ProblemRow.key != problem.key,
                    ProblemRow.template == d["template"],
                    ProblemRow.template_hash == d["template_hash"],
                    ProblemRow.dtype == d["dtype"],
                    ProblemRow.m.is_not(None),
                    TrialRecord.status == "ok",
                    TrialRecord.median_ms.is_not(None),
                )
            ).all()
        by_problem: dict[str, list[Any]] = {}
        for row in usable_rows(rows, usable):
            by_problem.setdefault(row.ProblemRow.json, []).append(row)
        found = []
        for text, group in by_problem.items():
            far = distance(text)
            if far is None or far > within:
                continue
            best = pick_record(group, versions, exact=False)
            if best is not None:
                found.append(dataclasses.replace(best, via="transfer", distance=far, source_json=text))
        found.sort(key=lambda h: (h.distance, h.record.median_ms or math.inf))
        return found[:limit]

    def failed_compiles(
        self, problem: ProblemLike, device: DeviceInfo, triton_version: str, *, limit: int = 4000
    ) -> list[tuple[str, Record]]:
        """(problem JSON, record) of each config Triton failed to build (``compile_error``,
        ``out_of_resources``) on ``device`` with ``triton_version`` for a problem of the same
        template (and version) and input dtype, newest first, at most ``limit``: what
        ``tuner.learned`` makes its feasibility rules of."""
        d = json.loads(problem.to_json())
        with self.session() as s:
            rows = s.execute(
                records_query(TrialRecord, device)
                .where(
                    ProblemRow.template == d["template"],
                    ProblemRow.template_hash == d["template_hash"],
                    ProblemRow.dtype == d["dtype"],
                    TrialRecord.status.in_(COMPILE_FAILURES),
                    TrialRecord.triton_version == triton_version,
                )
                .order_by(TrialRecord.id.desc())
                .limit(limit)
            ).all()
        return [(r.ProblemRow.json, record_of(r)) for r in rows]

    def records(self, key: str) -> list[Record]:
        """Every trial record of a problem, fastest ok first, then failures."""
        with self.session() as s:
            rows = s.execute(records_query(TrialRecord).where(ProblemRow.key == key)).all()
        out = [record_of(r) for r in rows]
        return sorted(out, key=lambda r: (r.status != "ok", r.median_ms or math.inf))

    def baselines(self, key: str, device: DeviceInfo | None = None) -> list[Record]:
        """Baselines of a problem (on ``device`` if given), fastest first."""
        with self.session() as s:
            rows = s.execute(records_query(BaselineRecord, device).where(ProblemRow.key == key)).all()
        return sorted((record_of(r) for r in rows), key=lambda r: r.median_ms or math.inf)

    def snapshot(self) -> Snapshot:
        with self.session() as s:
            problems = {p.key: problem_summary(p) for p in s.scalars(select(ProblemRow))}
            trials = [record_of(r) for r in s.execute(records_query(TrialRecord)).all()]
            baselines = [record_of(r) for r in s.execute(records_query(BaselineRecord)).all()]
        return Snapshot(problems, trials, baselines)

    def fingerprint(self) -> str:
        """Changes whenever a trial, baseline or verdict is added, replaced or removed: part of
        the compiler's cache key, so that a compiled graph never outlives what it was decided on."""
        with self.session() as s:
            parts = [
                s.execute(select(func.count(m.id), func.max(m.id), func.max(m.created_at))).one()
                for m in (TrialRecord, BaselineRecord, VerdictRecord)
            ]
        return ";".join(f"{n}:{i}:{t}" for n, i, t in parts)

    def untuned(self, device: DeviceInfo, is_current: IsCurrent) -> list[str]:
        """Canonical JSON of every current problem with a static shape and no ok trial
        on ``device`` (problems the compiler recorded, waiting for ``epilab tune --seen``)."""
        with self.session() as s:
            tuned = (
                select(TrialRecord.problem_id)
                .join(Device, TrialRecord.device_id == Device.id)
                .where(
                    TrialRecord.status == "ok",
                    Device.name == device.name,
                    Device.capability == device.capability,
                    Device.sm_count == device.sm_count,
                )
            )
            rows = s.execute(
                select(ProblemRow)
                .where(ProblemRow.id.not_in(tuned), ProblemRow.m.is_not(None))
                .order_by(ProblemRow.id)
            ).scalars()
            return [p.json for p in rows if not is_stale(p, is_current) and static_shape(p.json)]

    def problem_json(self, key_or_prefix: str) -> tuple[str, str] | None:
        """(key, JSON) of the one problem whose key starts with ``key_or_prefix``."""
        if len(key_or_prefix) < 6:
            raise ValueError("give at least 6 characters of the problem key")
        if len(key_or_prefix) > 64 or not all(c in "0123456789abcdefABCDEF" for c in key_or_prefix):
            # (a 100k-character prefix made SQLite's LIKE fail: "pattern too complex")
            raise ValueError(
                f"a problem key is up to 64 hexadecimal characters (a sha256), got {key_or_prefix[:24]!r}"
                + ("..." if len(key_or_prefix) > 24 else "")
            )
        with self.session() as s:
            rows = s.execute(
                select(ProblemRow.key, ProblemRow.json)
                .where(ProblemRow.key.startswith(key_or_prefix.lower(), autoescape=True))
                .limit(2)
            ).all()
        if len(rows) > 1:
            raise ValueError(f"{key_or_prefix!r} matches more than one problem; give more characters")
        return (rows[0][0], rows[0][1]) if rows else None

    def list_records(
        self, *, op: str | None = None, device: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[tuple[dict[str, Any], Record]]:
        """Trial records with their problem's readable columns, newest first."""
        q = records_query(TrialRecord)
        if op:
            q = q.where(ProblemRow.op == op)
        if device:
            q = q.where(Device.name.contains(device, autoescape=True))
        if status:
            if status not in STATUSES:
                raise ValueError(f"status {status!r} is not one of {STATUSES}")
            q = q.where(TrialRecord.status == status)
        with self.session() as s:
            rows = s.execute(
                q.order_by(TrialRecord.created_at.desc(), TrialRecord.id.desc()).limit(limit)
            ).all()
        return [(problem_summary(r.ProblemRow), record_of(r)) for r in rows]

    def stats(self, is_current: IsCurrent) -> Stats:
        with self.session() as s:
            by_status = dict(
                s.execute(select(TrialRecord.status, func.count()).group_by(TrialRecord.status)).all()
            )
            problems = s.execute(select(ProblemRow.id, ProblemRow.template, ProblemRow.json)).all()
            stale_ids = {p.id for p in problems if is_stale(p, is_current)}
            stale_trials = 0
            if stale_ids:
                per_problem = s.execute(
                    select(TrialRecord.problem_id, func.count()).group_by(TrialRecord.problem_id)
                ).all()
                stale_trials = sum(n for pid, n in per_problem if pid in stale_ids)
            stale_by_template: dict[str, int] = {}
            for p in problems:
                if p.id in stale_ids:
                    stale_by_template[p.template] = stale_by_template.get(p.template, 0) + 1
            return Stats(
                url=self.url,
                revision=self.revision,
                devices=s.scalar(select(func.count()).select_from(Device)) or 0,
                problems=len(problems),
                trials_by_status={k: int(v) for k, v in sorted(by_status.items())},
                baselines=s.scalar(select(func.count()).select_from(BaselineRecord)) or 0,
                stale_problems=len(stale_ids),
                stale_trials=stale_trials,
                stale_by_template=stale_by_template,
            )


# ---------------------------------------------------------------- row values


# ------------------------------------------------------------------ helpers
