"""Opening a database safely: what a file is, which schema revision it holds,
and migrating it to ours with alembic.

A database is one of: new (no tables), ours at a revision we know (migrated in
place to head, every row kept), ours from a newer epilab (refused), or
something else (refused). Refusals happen after reading only, so the file is
left exactly as it was. SQLite files are inspected through a read-only
connection before anything (WAL mode included) may write to them.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote, urlencode

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, inspect, text

MIGRATIONS = Path(__file__).parent / "migrations"
TABLES = frozenset(
    {
        "epilab_devices",
        "epilab_problems",
        "epilab_trials",
        "epilab_baselines",
        "epilab_verdicts",
        "epilab_leases",
        "epilab_workers",
    }
)
# Our own alembic version table, so that optuna's storage (which keeps its studies
# in the same database, with an alembic_version table of its own) can live beside us.
VERSION_TABLE = "epilab_alembic_version"
SQLITE_MAGIC = b"SQLite format 3\x00"


class DatabaseOpenError(RuntimeError):
    """The target cannot be used as an epilab database; it was not modified."""


class DatabaseReadOnlyError(DatabaseOpenError):
    """The database can be read but not written (file or directory permissions)."""


def wal_mode(header: bytes) -> bool:
    """Whether an SQLite file header says the file is in WAL mode (bytes 18-19 are 2)."""
    return header[18:20] == b"\x02\x02"


def readonly_uri(path: Path, header: bytes) -> tuple[str, dict[str, str]]:
    """(URI, options) of a read-only SQLite connection to ``path``, creating no file beside it.

    The path is percent-encoded, so that ``?``, ``#`` or ``%`` in a file name stay part of
    the name. ``immutable=1`` (no locks, no ``-shm``) where a read-only connection would
    otherwise create ``-wal``/``-shm`` files: a WAL-mode file without a ``-wal`` (no
    connection has it open, nothing is pending: immutable reads the whole truth), or one in
    a directory we cannot write to (where no one else can make a ``-wal`` either). With a
    ``-wal`` present another process may be writing, and a plain read-only connection
    shares its locks.
    """
    options = {"mode": "ro"}
    if wal_mode(header):
        wal = path.with_name(path.name + "-wal")
        if not wal.exists() or not os.access(path.parent, os.W_OK):
            options["immutable"] = "1"
    return "file:" + quote(str(path.absolute()), safe="/"), options


def _alembic_config(connection: Connection | None = None) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}


def classify(where: str, tables: set[str], revision: str | None) -> str:
    """'new', 'current' or 'old' (to migrate); raises DatabaseOpenError otherwise.

    Tables of others (optuna's studies, for one) may share a database with ours
    once ours exist; a database that has tables but no epilab schema version is
    someone else's and is refused.
    """
    if revision is None:
        if tables:
            raise DatabaseOpenError(
                f"{where} is not an epilab database (it has tables {sorted(tables)[:8]} but no epilab "
                "schema version); it was left untouched"
            )
        return "new"
    if revision not in known_revisions():
        raise DatabaseOpenError(
            f"{where} was written by a newer epilab (schema revision {revision!r}; this epilab knows up "
            f"to {head_revision()!r}); upgrade epilab to use it. The database was left untouched"
        )
    if revision == head_revision() and not tables >= TABLES:
        raise DatabaseOpenError(
            f"{where} has epilab schema {revision!r} but lacks tables {sorted(TABLES - tables)}; "
            "it was left untouched"
        )
    return "current" if revision == head_revision() else "old"


def check_sqlite_file(path: Path) -> None:
    """Refuse files that are not SQLite, are truncated, or hold someone else's schema."""
    if not path.exists() or path.stat().st_size == 0:
        return
    if path.is_dir():
        raise DatabaseOpenError(f"{path} is a directory, not a database file")
    with path.open("rb") as f:
        header = f.read(100)
    if not header.startswith(SQLITE_MAGIC):
        raise DatabaseOpenError(
            f"{path} is not an SQLite database (it does not start with the SQLite header); "
            "it was left untouched"
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size_valid = header[24:28] == header[92:96]
    # With a non-empty WAL beside it, a checkpoint may be extending the file right now.
    wal = path.with_name(path.name + "-wal")
    quiet = not wal.exists() or wal.stat().st_size == 0
    if len(header) < 100 or (size_valid and quiet and path.stat().st_size < pages * page_size):
        raise DatabaseOpenError(
            f"{path} is a truncated SQLite file ({path.stat().st_size} bytes, its header says "
            f"{pages * page_size}); it was left untouched"
        )
    uri, options = readonly_uri(path, header)
    try:
        conn = sqlite3.connect(f"{uri}?{urlencode(options)}", uri=True)
        try:
            schema = conn.execute("SELECT type, name FROM sqlite_master").fetchall()
            tables = {name for kind, name in schema if kind == "table"}
            foreign = sorted(f"{kind} {name!r}" for kind, name in schema if kind in ("trigger", "view"))
            revision = None
            if VERSION_TABLE in tables:
                row = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
                revision = row[0] if row else None
            # every page read, every index matched against its table: a file damaged inside is
            # refused before anything writes to it. quick_check does not match indexes, and a
            # stale -wal of another database beside a restored file leaves table rows its
            # indexes lack (the upsert's unique index then lets duplicates in). The cost: about
            # 6 ms a MB (0.37 s for 60 MB), against quick_check's 1.5.
            problems = [r[0] for r in conn.execute("PRAGMA integrity_check(3)")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        raise DatabaseOpenError(f"{path} is damaged or not a database ({e}); it was left untouched") from e
    if problems != ["ok"]:
        raise DatabaseOpenError(
            f"{path} is damaged ({'; '.join(p[:120] for p in problems)}); it was left untouched. "
            "Restore it from a copy or an `epilab db export`"
        )
    classify(str(path), tables, revision)
    if foreign and VERSION_TABLE in tables:  # epilab creates neither: they run on our writes
        raise DatabaseOpenError(
            f"{path} has {', '.join(foreign[:4])}, which epilab never creates (a trigger runs on "
            "every write, and could forge records); it was left untouched. Drop them, or "
            "`epilab db export` from a copy and import into a new database"
        )


def prepare(conn: Connection, where: str, *, readonly: bool = False) -> str:
    """Create or migrate the schema on ``conn`` (inside its transaction); returns the revision.
    A read-only database must be at our revision already."""
    if conn.dialect.name == "postgresql":  # one creator/migrator at a time
        conn.execute(text("SELECT pg_advisory_xact_lock(7140514)"))
    tables = set(inspect(conn).get_table_names())
    revision = None
    if VERSION_TABLE in tables:
        revision = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    state = classify(where, tables, revision)
    if state != "current" and readonly:
        raise DatabaseReadOnlyError(
            f"{where} is read-only and {'empty' if state == 'new' else f'at schema {revision!r}'}; "
            f"epilab needs schema {head_revision()!r}: open it once where it can be written"
        )
    if state != "current":
        try:
            command.upgrade(_alembic_config(conn), "head")
        except CommandError as e:
            raise DatabaseOpenError(f"could not migrate {where}: {e}") from e
    return head_revision()


def stamp_and_upgrade_to(conn: Connection, revision: str) -> None:
    """Migrate ``conn`` to a given revision (tests build old databases with this)."""
    command.upgrade(_alembic_config(conn), revision)


def downgrade_to(conn: Connection, revision: str) -> None:
    """Migrate ``conn`` back to an older revision (tests check the way down with this)."""
    command.downgrade(_alembic_config(conn), revision)
