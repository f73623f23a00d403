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
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine, create_engine, delete, event, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from epilab.config import settings
from epilab.db.keys import canonical, family_key, problem_key
from epilab.db.models import (
    CONTROL_CHARS,
    DETAIL_LEN,
    EPILOGUE_LEN,
    LIBRARIES,
    METHOD_LEN,
    NAME_LEN,
    STATUSES,
    STUDY_LEN,
    VERSION_LEN,
    BaselineRecord,
    Device,
    LeaseRecord,
    ProblemRow,
    TrialRecord,
    VerdictRecord,
)
from epilab.db.schema import (
    DatabaseOpenError,
    DatabaseReadOnlyError,
    check_sqlite_file,
    prepare,
    readonly_uri,
)

T = TypeVar("T")
# how a check in context ended (tuner/model.py; only "faster" keeps the template)
VERDICT_OUTCOMES = ("faster", "not faster", "undecided", "slower than inductor")
INDUCTOR_MODES = ("default", "max-autotune")  # what a verdict's aten alternative was compiled with
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
BUSY_TIMEOUT_MS = 60_000
# (a record's config) -> whether this epilab can run it (templates.problem.Config.is_valid)
ConfigCheck = Callable[[Mapping[str, Any]], bool]
# whether a stored problem (its canonical JSON) is current: its kernels rendered as when recorded
IsCurrent = Callable[[str], bool]


class ProblemLike(Protocol):
    """What the db needs of a problem (epilab.ir.problem.Problem fits)."""

    @property
    def key(self) -> str: ...

    def to_json(self) -> str: ...

    @property
    def epilogue(self) -> Any: ...  # has .text()


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    capability: str  # "9.0"
    sm_count: int

    @classmethod
    def of_cuda(cls, device: object) -> DeviceInfo:
        """How the database names a CUDA device (a torch.device or index)."""
        import torch

        props = torch.cuda.get_device_properties(device)  # type: ignore[arg-type]
        return cls(props.name, f"{props.major}.{props.minor}", props.multi_processor_count)


# How the database names Triton's interpreter, where interpreter-mode runs record their trials.
INTERPRETER_DEVICE = DeviceInfo("Triton interpreter (CPU)", "interpreter", 1)


@dataclass(frozen=True)
class Timing:
    """A measured time: median and spread in ms, and how it was measured."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    method: str
    tflops: float | None = None
    gbps: float | None = None
    graph_ms: float | None = None  # per call under CUDA-graph replay, for short kernels


@dataclass(frozen=True)
class Versions:
    torch: str
    triton: str


@dataclass(frozen=True)
class Record:
    """A trial record (``config`` set) or a baseline (``library`` set), as read back."""

    problem_key: str
    device: DeviceInfo
    status: str
    config: dict[str, Any] | None
    library: str | None
    median_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    graph_ms: float | None
    tflops: float | None
    gbps: float | None
    max_rel_error: float | None
    timing_method: str
    versions: Versions
    study: str | None
    trial_number: int | None
    detail: str | None
    created_at: datetime


def comparable_ms(r: Record, other: Record | None = None) -> float:
    """A record's time to compare with ``other``'s: CUDA-graph times when both have them
    (the tuner replays every candidate and baseline in a graph; records made before it did
    have graph times only under 50 us), else the events median: never one of each."""
    if r.graph_ms is not None and (other is None or other.graph_ms is not None):
        return r.graph_ms
    return float(r.median_ms or 0.0)


@dataclass(frozen=True)
class Snapshot:
    """Everything in the database, read in three queries (reports)."""

    problems: dict[str, dict[str, Any]]  # key -> readable columns and "json"
    trials: list[Record]
    baselines: list[Record]


@dataclass(frozen=True)
class Lookup:
    """The answer to 'what is best for this problem': exact, or a fallback from the family."""

    record: Record
    exact: bool  # False: taken from another problem (of the same identity, or family at another M)
    m: int | None  # M of the problem the record belongs to
    same_versions: bool
    via: str = ""  # "exact", "identity" (the same math), "family" (another M), "transfer" (nearest)
    distance: float | None = None  # "transfer": the caller's distance to the record's problem
    source_json: str | None = None  # "transfer": the problem the record was tuned for

    @property
    def fallback(self) -> bool:
        return not self.exact


@dataclass(frozen=True)
class Verdict:
    """A template's problem checked inside a compiled model (``tuner/model.py``)."""

    problem_key: str
    keep: bool  # the model was faster with the template (by the confidence rule, since 0006)
    with_ms: float
    without_ms: float
    context: str  # the model it was measured in
    cuda_graphs: bool
    inductor_mode: str  # "default" or "max-autotune"
    timing_method: str
    versions: Versions
    created_at: datetime
    training: bool = False  # measured in a training step (forward and backward; revision 0007)
    # the paired ratio without/with: its interval, rounds, and the outcome (VERDICT_OUTCOMES);
    # None for verdicts recorded before revision 0006
    ratio_low: float | None = None
    ratio_high: float | None = None
    rounds: int | None = None
    outcome: str | None = None

    def describe(self) -> str:
        mode = "under CUDA graphs" if self.cuda_graphs else "per call"
        if self.inductor_mode != "default":
            mode += f", Inductor {self.inductor_mode}"
        if self.training:
            mode = f"a training step, {mode}"
        text = (
            f"checked in {self.context} ({mode}): {self.with_ms:.4g} ms with the template, "
            f"{self.without_ms:.4g} ms without"
        )
        if self.ratio_low is not None and self.ratio_high is not None:
            text += f" (speedup [{self.ratio_low:.3f}, {self.ratio_high:.3f}] over {self.rounds} rounds)"
        return text

    def why_not(self) -> str:
        """Why the problem goes to the aten op, where ``keep`` is False."""
        if self.outcome == "not faster" and self.ratio_high is not None and self.ratio_high >= 1.0:
            return "the model is not faster with it by the margin"
        return {
            "undecided": "no significant difference within the rounds' budget: the aten op is kept",
            "slower than inductor": "the model with its kept templates was not faster than Inductor",
        }.get(self.outcome or "", "the model is faster without it")


@dataclass(frozen=True)
class Stats:
    url: str
    revision: str
    devices: int
    problems: int
    trials_by_status: dict[str, int]
    baselines: int
    stale_problems: int
    stale_trials: int
    stale_by_template: dict[str, int]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def check_str(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or CONTROL_CHARS.search(value):
        raise ValueError(
            f"{name} must be a non-empty string of at most {limit} printable characters, got {value!r:.80}"
        )
    return value


def _clean_detail(detail: str) -> str:
    """A failure's text (a compiler's message, a traceback) as stored: its start, with lines
    and tabs kept and every other control character (a colour code, an escape) replaced."""
    return CONTROL_CHARS.sub(
        lambda m: m[0] if m[0] in "\n\t" else "\N{REPLACEMENT CHARACTER}", detail[:DETAIL_LEN]
    )


def _check_num(name: str, value: object, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except OverflowError:  # an int beyond float's range
        number = None
    if number is None or not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r:.80}")
    return number


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def resolve_url(target: str | Path | None) -> tuple[URL, Path | None]:
    """The one place where a path or URL becomes a database URL: (SQLAlchemy URL, SQLite
    file or None); None means the default (EPILAB_DB, else the cache dir).

    A path is a file name, whatever characters it holds (``?``, ``%``, ``#`` stay in the
    name; the URL is built, never formatted from text). An SQLite URL names a file and takes
    no options: ``?mode=...`` or ``?uri=true`` would make SQLite open something other than
    the file checked before opening.
    """
    target = settings().db if target is None else target
    text = str(target)
    if not text.strip():
        raise DatabaseOpenError(f"the database {text!r} is blank; give a file path or a database URL")
    if "://" not in text:
        path = _file_path(text)
        return URL.create("sqlite", database=str(path)), path
    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as e:
        raise DatabaseOpenError(f"{text!r} is not a database URL ({e})") from e
    if url.get_backend_name() != "sqlite":
        return url, None
    if url.query:
        raise DatabaseOpenError(
            f"{url.render_as_string()!r}: an SQLite URL takes no options ({sorted(url.query)}); "
            "give the file's path (or sqlite:///path) alone"
        )
    if not url.database or url.database == ":memory:":
        raise DatabaseOpenError(
            f"{text!r} names no file: an in-memory database would keep no records; give a path"
        )
    path = _file_path(url.database)
    return url.set(database=str(path)), path


def _file_path(text: str) -> Path:
    """The absolute path of an SQLite file named ``text``: ``~`` expanded; a dangling
    symbolic link refused (SQLite would create a database wherever it points)."""
    try:
        path = Path(text).expanduser()
    except RuntimeError as e:  # ~nosuchuser
        raise DatabaseOpenError(f"{text!r}: cannot expand '~' ({e}); give an absolute path") from None
    if path.is_symlink() and not path.exists():
        raise DatabaseOpenError(
            f"{text} is a symbolic link to {os.readlink(path)}, which does not exist; "
            "point it at a database, or give the file's own path"
        )
    return path.resolve()


def _writable(path: Path) -> bool:
    """Whether SQLite can write ``path``: the file, and its directory (for the journal)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _readonly_url(url: URL, path: Path) -> URL:
    with path.open("rb") as f:
        uri, options = readonly_uri(path, f.read(100))
    return url.set(database=uri, query={"uri": "true", **options})


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
        """Optuna's RDB storage of the studies, in this database, waiting for locks as long
        as epilab's own writes do (optuna's default is SQLite's 5 s, then a crash)."""
        import optuna
        from sqlalchemy.exc import IntegrityError

        for attempt in range(6):
            try:
                return optuna.storages.RDBStorage(
                    self.storage_url,
                    engine_kwargs={"connect_args": _connect_args(self.full_url)},
                    skip_table_creation=not create,
                )
            except RuntimeError as e:  # its tables were set up by another optuna version
                if "compatible with the table schema" not in str(e):
                    raise
                raise DatabaseOpenError(
                    f"the optuna studies in {self.url} need another optuna: {' '.join(str(e).split())} "
                    f"(this epilab runs optuna {optuna.__version__}); the database was left untouched"
                ) from None
            except DBAPIError as e:
                # Processes started together race to create optuna's tables and its version
                # row ("UNIQUE constraint failed: alembic_version.version_num", "table already
                # exists"); the loser finds them made when it tries again.
                if attempt == 5 or not (isinstance(e, IntegrityError) or _is_race(e)):
                    raise
                time.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, target: str | Path | None = None, *, empty_file: bool = True) -> TuningDB:
        """Open (creating or migrating) the database at a path or URL; see the module doc.
        An SQLite file that cannot be written is opened read-only: reads work, writes raise
        DatabaseReadOnlyError. ``empty_file=False`` (commands that only read) refuses an
        existing empty file rather than make it a database."""
        url, path = resolve_url(target)
        readonly = False
        if path is not None:
            if not empty_file and path.is_file() and path.stat().st_size == 0:
                raise DatabaseOpenError(
                    f"{path} is an empty file, not an epilab database; this command only reads, "
                    "so it was left as it is (`epilab tune` or `epilab db import` make it one)"
                )
            check_sqlite_file(path)
            _make_parent(path)
            if path.exists() and not _writable(path):
                url, readonly = _readonly_url(url, path), True
        engine = _engine(url, readonly=readonly)
        shown = str(path) if path is not None else url.render_as_string(hide_password=True)
        try:
            with engine.execution_options(epilab_write=not readonly).begin() as conn:
                revision = prepare(conn, shown, readonly=readonly)
        except OperationalError as e:
            engine.dispose()
            if _is_readonly(e):
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
                if _is_readonly(e):
                    raise DatabaseReadOnlyError(f"cannot write to {self.url}: {e.orig}") from e
                if attempt + 1 == attempts or not _is_busy(e):
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
            created_at=_now(),
        )

        def run(s: Session) -> None:
            pid = self.problem_id(s, problem.to_json(), problem.epilogue.text(), problem.key)
            self.upsert_measurement(
                s, TrialRecord, {**row, "problem_id": pid, "device_id": self.device_id(s, device)}
            )

        self.write(run)

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
            library=library, timing=timing, max_rel_error=max_rel_error, versions=versions, created_at=_now()
        )

        def run(s: Session) -> None:
            pid = self.problem_id(s, problem.to_json(), problem.epilogue.text(), problem.key)
            self.upsert_measurement(
                s, BaselineRecord, {**row, "problem_id": pid, "device_id": self.device_id(s, device)}
            )

        self.write(run)

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
            "ratio_low": _check_num("ratio_low", ratio_low),
            "ratio_high": _check_num("ratio_high", ratio_high),
            "rounds": rounds,
            "outcome": outcome,
            "cuda_graphs": bool(cuda_graphs),
            "training": bool(training),
            "inductor_mode": inductor_mode,
            "keep": bool(keep),
            "with_ms": _check_num("with_ms", with_ms, optional=False),
            "without_ms": _check_num("without_ms", without_ms, optional=False),
            "context": check_str("verdict context", context, NAME_LEN),
            "timing_method": check_str("timing method", timing_method, METHOD_LEN),
            "torch_version": check_str("torch version", versions.torch, VERSION_LEN),
            "triton_version": check_str("triton version", versions.triton, VERSION_LEN),
            "created_at": _now(),
        }

        def run(s: Session) -> None:
            pid = self.problem_id(s, problem.to_json(), problem.epilogue.text(), problem.key)
            self.upsert_measurement(
                s, VerdictRecord, {**row, "problem_id": pid, "device_id": self.device_id(s, device)}
            )

        self.write(run)

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
        if row is None:
            return None
        v = row[0]
        return Verdict(
            problem_key=row[1],
            keep=v.keep,
            with_ms=v.with_ms,
            without_ms=v.without_ms,
            context=v.context,
            cuda_graphs=v.cuda_graphs,
            inductor_mode=v.inductor_mode,
            timing_method=v.timing_method,
            versions=Versions(v.torch_version, v.triton_version),
            created_at=_aware(v.created_at),
            ratio_low=v.ratio_low,
            ratio_high=v.ratio_high,
            rounds=v.rounds,
            outcome=v.outcome,
            training=v.training,
        )

    def prune_stale(self, is_current: IsCurrent) -> int:
        """Delete problems whose kernels would now be rendered otherwise (with their records;
        ``is_current`` judges a stored problem's JSON); returns how many."""

        def run(s: Session) -> int:
            ids = [p.id for p in s.scalars(select(ProblemRow)) if _is_stale(p, is_current)]
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
            .values(**values, created_at=_now())
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
                _records_query(TrialRecord, device).where(
                    ProblemRow.key == key, TrialRecord.status == "ok", TrialRecord.median_ms.is_not(None)
                )
            ).all()
            return _pick(_usable(rows, usable), versions, exact=True)

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
        want = m if m is not None else _static_m(text)
        if want is None or want <= 0:
            return None
        with self.session() as s:
            rows = s.execute(
                _records_query(TrialRecord, device).where(
                    ProblemRow.family == family_key(text),
                    ProblemRow.m.is_not(None),
                    ProblemRow.m > 0,
                    TrialRecord.status == "ok",
                    TrialRecord.median_ms.is_not(None),
                )
            ).all()
        rows = _usable(rows, usable)
        if not rows:
            return None
        nearest = min(abs(math.log2(r.ProblemRow.m) - math.log2(want)) for r in rows)
        close = [r for r in rows if abs(math.log2(r.ProblemRow.m) - math.log2(want)) == nearest]
        found = _pick(close, versions, exact=False)
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
                _records_query(TrialRecord, device).where(
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
        found = _pick(_usable(rows, usable), versions, exact=False)
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
                _records_query(TrialRecord, device).where(
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
        for row in _usable(rows, usable):
            by_problem.setdefault(row.ProblemRow.json, []).append(row)
        found = []
        for text, group in by_problem.items():
            far = distance(text)
            if far is None or far > within:
                continue
            best = _pick(group, versions, exact=False)
            if best is not None:
                found.append(dataclasses.replace(best, via="transfer", distance=far, source_json=text))
        found.sort(key=lambda h: (h.distance, h.record.median_ms or math.inf))
        return found[:limit]

    def records(self, key: str) -> list[Record]:
        """Every trial record of a problem, fastest ok first, then failures."""
        with self.session() as s:
            rows = s.execute(_records_query(TrialRecord).where(ProblemRow.key == key)).all()
        out = [_record(r) for r in rows]
        return sorted(out, key=lambda r: (r.status != "ok", r.median_ms or math.inf))

    def baselines(self, key: str, device: DeviceInfo | None = None) -> list[Record]:
        """Baselines of a problem (on ``device`` if given), fastest first."""
        with self.session() as s:
            rows = s.execute(_records_query(BaselineRecord, device).where(ProblemRow.key == key)).all()
        return sorted((_record(r) for r in rows), key=lambda r: r.median_ms or math.inf)

    def snapshot(self) -> Snapshot:
        with self.session() as s:
            problems = {p.key: _problem_summary(p) for p in s.scalars(select(ProblemRow))}
            trials = [_record(r) for r in s.execute(_records_query(TrialRecord)).all()]
            baselines = [_record(r) for r in s.execute(_records_query(BaselineRecord)).all()]
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
            return [p.json for p in rows if not _is_stale(p, is_current) and _static_shape(p.json)]

    def problem_json(self, key_or_prefix: str) -> tuple[str, str] | None:
        """(key, JSON) of the one problem whose key starts with ``key_or_prefix``."""
        if len(key_or_prefix) < 6:
            raise ValueError("give at least 6 characters of the problem key")
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
        q = _records_query(TrialRecord)
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
        return [(_problem_summary(r.ProblemRow), _record(r)) for r in rows]

    def stats(self, is_current: IsCurrent) -> Stats:
        with self.session() as s:
            by_status = dict(
                s.execute(select(TrialRecord.status, func.count()).group_by(TrialRecord.status)).all()
            )
            problems = s.execute(select(ProblemRow.id, ProblemRow.template, ProblemRow.json)).all()
            stale_ids = {p.id for p in problems if _is_stale(p, is_current)}
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
        detail = _clean_detail(detail)
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
    if library not in LIBRARIES:
        raise ValueError(f"library {library!r} is not one of {LIBRARIES}")
    if timing is None:
        raise ValueError("a baseline needs its timing")
    return {"library": library, **_timed_values(timing, max_rel_error, versions, created_at)}


def _timed_values(
    timing: Timing | None, max_rel_error: float | None, versions: Versions, created_at: datetime
) -> dict[str, Any]:
    t = timing
    return {
        "median_ms": _check_num("median_ms", t.median_ms if t else None),
        "p20_ms": _check_num("p20_ms", t.p20_ms if t else None),
        "p80_ms": _check_num("p80_ms", t.p80_ms if t else None),
        "graph_ms": _check_num("graph_ms", t.graph_ms if t else None),
        "tflops": _check_num("tflops", t.tflops if t else None),
        "gbps": _check_num("gbps", t.gbps if t else None),
        "max_rel_error": _check_num("max_rel_error", max_rel_error),
        "timing_method": check_str("timing method", t.method if t else "none", METHOD_LEN),
        "torch_version": check_str("torch version", versions.torch, VERSION_LEN),
        "triton_version": check_str("triton version", versions.triton, VERSION_LEN),
        "created_at": _aware(created_at).astimezone(timezone.utc),
    }


# ------------------------------------------------------------------ helpers


def _connect_args(url: URL) -> dict[str, Any]:
    """The driver's connection arguments: SQLite waits ``BUSY_TIMEOUT_MS`` for a lock."""
    return {"timeout": BUSY_TIMEOUT_MS / 1000} if url.get_backend_name() == "sqlite" else {}


def _engine(url: URL, *, readonly: bool = False) -> Engine:
    try:
        engine = create_engine(url, connect_args=_connect_args(url))
    except NoSuchModuleError as e:
        raise DatabaseOpenError(
            f"{url.render_as_string()!r}: no database driver for {url.drivername!r}; epilab keeps its "
            "records in SQLite (a path) or PostgreSQL (postgresql+psycopg://user@host/db)"
        ) from e
    except ImportError as e:
        raise DatabaseOpenError(
            f"{url.render_as_string()!r}: the driver {e.name!r} is not installed "
            "(for PostgreSQL: pip install 'epilab[postgres]')"
        ) from e
    if url.get_backend_name() == "sqlite":

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # transactions are begun below, not by the driver
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not readonly:  # switching to WAL writes the header
                cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            write = conn.get_execution_options().get("epilab_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write and not readonly else "BEGIN")

    return engine


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseOpenError(f"cannot create the directory of {path}: {e.strerror}") from e


def _is_busy(e: OperationalError) -> bool:
    text = str(e.orig).lower()
    return "locked" in text or "busy" in text or "deadlock" in text or "could not serialize" in text


def _is_race(e: DBAPIError) -> bool:
    """Whether ``e`` is another process creating the same tables, or holding the lock."""
    return _is_busy(e) or "already exists" in str(e.orig).lower()


def _is_readonly(e: OperationalError) -> bool:
    text = str(e.orig).lower()
    return "readonly database" in text or "read-only" in text


def _is_stale(p: Any, is_current: IsCurrent) -> bool:
    return not is_current(p.json)


def _static_m(problem_json: str) -> int | None:
    m = json.loads(problem_json)["shape"]["m"]
    return m if isinstance(m, int) else None


def _static_shape(problem_json: str) -> bool:
    return all(isinstance(v, int) for v in json.loads(problem_json)["shape"].values())


def _records_query(model: type, device: DeviceInfo | None = None) -> Any:
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


def _record(row: Any) -> Record:
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
        created_at=_aware(r.created_at),
    )


def _usable(rows: list[Any], usable: ConfigCheck | None) -> list[Any]:
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


def _pick(rows: list[Any], versions: Versions | None, *, exact: bool) -> Lookup | None:
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
    return Lookup(record=_record(best), exact=exact, m=best.ProblemRow.m, same_versions=same(best))


def _problem_summary(p: ProblemRow) -> dict[str, Any]:
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
