"""The tuning database (SQLAlchemy 2.0 ORM, alembic migrations): devices,
problems, trial records and baselines. ``TuningDB.open(path_or_url)`` is the
entry point; ``epilab db`` is its command line."""

from epilab.db.schema import DatabaseOpenError, DatabaseReadOnlyError
from epilab.db.store import TuningDB
from epilab.db.values import (
    INTERPRETER_DEVICE,
    DeviceInfo,
    Lookup,
    Record,
    Snapshot,
    Stats,
    Timing,
    Verdict,
    Versions,
    comparable_ms,
)

__all__ = [
    "INTERPRETER_DEVICE",
    "DatabaseOpenError",
    "DatabaseReadOnlyError",
    "DeviceInfo",
    "Lookup",
    "Record",
    "Snapshot",
    "Stats",
    "Timing",
    "TuningDB",
    "Verdict",
    "Versions",
    "comparable_ms",
]
