"""Where a database is and how it is opened: URLs and paths, the engine (SQLite in WAL mode
with a busy timeout, or any SQLAlchemy URL), and which errors mean busy, a race or read-only."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from epilab.config import settings
from epilab.db.schema import (
    DatabaseOpenError,
    readonly_uri,
)

BUSY_TIMEOUT_MS = 60_000
# PostgreSQL ends a session left idle inside a transaction this long: a process stopped
# between a statement and its commit (SIGSTOP, a paused VM, a stalled host) would hold its
# row locks for ever, and every worker would skip or wait on its lease. Ours last
# milliseconds; the default lease time is 60 s.
STALLED_TRANSACTION_MS = 30_000


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
        path = file_path(text)
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
    path = file_path(url.database)
    return url.set(database=str(path)), path


def file_path(text: str) -> Path:
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


def writable(path: Path) -> bool:
    """Whether SQLite can write ``path``: the file, and its directory (for the journal)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def readonly_url(url: URL, path: Path) -> URL:
    with path.open("rb") as f:
        uri, options = readonly_uri(path, f.read(100))
    return url.set(database=uri, query={"uri": "true", **options})


def connect_args(url: URL) -> dict[str, Any]:
    """The driver's connection arguments: SQLite waits ``BUSY_TIMEOUT_MS`` for a lock."""
    return {"timeout": BUSY_TIMEOUT_MS / 1000} if url.get_backend_name() == "sqlite" else {}


def make_engine(url: URL, *, readonly: bool = False) -> Engine:
    try:
        engine = create_engine(url, connect_args=connect_args(url))
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
        def _on_connect(dbapi_conn: Any, record_of: Any) -> None:
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

    elif url.get_backend_name() == "postgresql":
        end_stalled_transactions(engine)
    return engine


def end_stalled_transactions(engine: Engine) -> None:
    """Have the server end this engine's sessions left idle inside a transaction for
    ``STALLED_TRANSACTION_MS`` (their locks released; the stalled process gets an error when
    it wakes). Set per session, committed: the pool's rollback would undo it otherwise; not a
    startup option, which connection poolers refuse."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record_of: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET idle_in_transaction_session_timeout = {int(STALLED_TRANSACTION_MS)}")
        dbapi_conn.commit()

    engine.dispose()  # connections made before this (optuna's, at its start) get it too


def make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseOpenError(f"cannot create the directory of {path}: {e.strerror}") from e


def is_busy(e: OperationalError) -> bool:
    text = str(e.orig).lower()
    return "locked" in text or "busy" in text or "deadlock" in text or "could not serialize" in text


def is_race(e: DBAPIError) -> bool:
    """Whether ``e`` is another process creating the same tables, or holding the lock."""
    return is_busy(e) or "already exists" in str(e.orig).lower()


def is_readonly(e: OperationalError) -> bool:
    text = str(e.orig).lower()
    return "readonly database" in text or "read-only" in text


def optuna_storage(full_url: URL, shown: str, *, create: bool = True) -> Any:
    """Optuna's RDB storage of the studies in the database at ``full_url`` (``shown`` in
    errors), waiting for locks as long as epilab's own writes do (optuna's default is
    SQLite's 5 s, then a crash)."""
    import optuna
    from sqlalchemy.exc import IntegrityError

    for attempt in range(6):
        try:
            storage = optuna.storages.RDBStorage(
                full_url.render_as_string(hide_password=False),
                engine_kwargs={"connect_args": connect_args(full_url)},
                skip_table_creation=not create,
            )
            if full_url.get_backend_name() == "postgresql":
                end_stalled_transactions(storage.engine)
            return storage
        except RuntimeError as e:  # its tables were set up by another optuna version
            if "compatible with the table schema" not in str(e):
                raise
            raise DatabaseOpenError(
                f"the optuna studies in {shown} need another optuna: {' '.join(str(e).split())} "
                f"(this epilab runs optuna {optuna.__version__}); the database was left untouched"
            ) from None
        except DBAPIError as e:
            # Processes started together race to create optuna's tables and its version
            # row ("UNIQUE constraint failed: alembic_version.version_num", "table already
            # exists"); the loser finds them made when it tries again.
            if attempt == 5 or not (isinstance(e, IntegrityError) or is_race(e)):
                raise
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")
