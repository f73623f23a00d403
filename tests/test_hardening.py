"""Attacks on epilab's inputs, as a careless user or an attacker would try them: one table.

Each row is one command line run against files the row prepares, and what must come of
it: the exit status, a pattern the output must show (an ``error:`` line for a refusal),
files that must be byte-identical afterwards, files that must not exist. Every row also
checks that no traceback and no terminal control character reached the output. A new
command gets the same treatment by adding rows.

Rows marked ``unprivileged`` test permissions (a read-only file or directory): run as
root they drop the capabilities that bypass file permissions first, in a child process.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from records import record
from typer.testing import CliRunner

from epilab import config
from epilab.cli import app
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.db.models import CONTROL_CHARS, Device
from epilab.db.transfer import export_json
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.policy.suites import load_shapes
from epilab.templates.gemm.gemm_spec import Spec
from epilab.tuner.search import Budget

PROBLEM = Spec(32, 32, 32, dtype="float32").problem()
CONFIG = Config(16, 16, 16, 1, num_warps=4, num_stages=1).to_dict()
HOSTILE_NAME = "GPU\x1b[2J\x1b]0;pwned\x07 \u202egnp.exe"


# ------------------------------------------------------------------ files the rows use


def epilab_db(path: Path, problems: int = 1) -> Path:
    """An epilab database with ``problems`` problems (PROBLEM first), each with a trial and a
    baseline."""
    for m in range(32, 32 + problems):
        record(str(path), Spec(m, 32, 32, dtype="float32").problem(), CONFIG, 0.5, 0.6)
    return path


def foreign_db(path: Path, *, wal: bool = False) -> Path:
    """Another application's SQLite file (optionally in WAL mode)."""
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode = WAL")
    con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO photos (name) VALUES ('cat.png')")
    con.commit()
    con.close()
    return path


def future_db(path: Path) -> Path:
    epilab_db(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE epilab_alembic_version SET version_num = '0099_from_the_future'")
    con.commit()
    con.close()
    return path


def truncated_db(path: Path) -> Path:
    epilab_db(path, problems=60)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def corrupted_db(path: Path) -> Path:
    """Its header intact, a page in the middle overwritten."""
    epilab_db(path, problems=60)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    middle = (len(data) // page // 2) * page
    data[middle : middle + page] = bytes(range(256)) * (page // 256)
    path.write_bytes(bytes(data))
    return path


def stale_wal_db(path: Path) -> Path:
    """A restored file with another database's ``-wal`` and ``-shm`` beside it: the WAL's
    pages leave table rows that the upsert's unique index lacks (quick_check sees nothing)."""
    other = path.with_name("other.db")
    epilab_db(other, problems=3)
    con = sqlite3.connect(other)
    con.execute("PRAGMA wal_autocheckpoint = 0")
    con.execute("UPDATE epilab_trials SET median_ms = 0.25")
    con.commit()
    for suffix in ("-wal", "-shm"):  # copied while the writer has it open
        shutil.copy(other.with_name(other.name + suffix), path.with_name(path.name + suffix))
    con.close()
    for m in range(100, 102):
        record(str(path.with_name("fresh.db")), Spec(m, 32, 32, dtype="float32").problem(), CONFIG, 0.5, 0.6)
    path.with_name("fresh.db").rename(path)
    return path


def _with_sql(*statements: str) -> Callable[[Path], Path]:
    """An epilab database with SQL of someone else's in it."""

    def make(path: Path) -> Path:
        epilab_db(path)
        con = sqlite3.connect(path)
        for statement in statements:
            con.execute(statement)
        con.commit()
        con.close()
        return path

    return make


FORGING_TRIGGER = (
    "CREATE TRIGGER forge AFTER INSERT ON epilab_trials BEGIN "
    "UPDATE epilab_trials SET status = 'ok', median_ms = 1e-6 WHERE id = NEW.id; END"
)


def _newer_optuna(path: Path) -> Path:
    """Optuna's tables in the file, stamped as made by an optuna from the future."""
    import optuna

    with TuningDB.open(path) as db:
        optuna.create_study(study_name="s", storage=db.optuna_storage())
    con = sqlite3.connect(path)
    con.execute("UPDATE version_info SET schema_version = 99, library_version = '9.9.9'")
    con.execute("UPDATE alembic_version SET version_num = 'v9.9.9.a'")
    con.commit()
    con.close()
    return path


def hostile_names_db(path: Path) -> Path:
    """A database written before names were checked: a device name with escape sequences,
    one with HTML."""
    epilab_db(path)
    with TuningDB.open(path) as db, db.session(write=True) as s:
        s.query(Device).update({Device.name: HOSTILE_NAME + "<script>alert(1)</script>"})
    return path


def export_doc(tmp: Path) -> dict:
    """`epilab db export` of a small database, as a dict to spoil."""
    db_path = epilab_db(tmp / "source.db")
    with TuningDB.open(db_path) as db:
        export_json(db, tmp / "valid.json")
    return json.loads((tmp / "valid.json").read_text())


def spoiled_export(spoil: Callable[[dict], object], *, epilogue: str | None = None) -> Callable[[Path], None]:
    """An export spoiled, to import into a database of its own; ``epilogue``: the export's
    problem has this epilogue instead (its operands to spoil)."""

    def prepare(d: Path) -> None:
        if epilogue is None:
            doc = export_doc(d)
        else:
            record(
                str(d / "source.db"),
                Spec(32, 32, 32, dtype="float32", epilogue=epilogue).problem(),
                CONFIG,
                0.5,
            )
            with TuningDB.open(d / "source.db") as db:
                export_json(db, d / "valid.json")
            doc = json.loads((d / "valid.json").read_text())
        spoil(doc)
        (d / "import.json").write_text(json.dumps(doc))
        epilab_db(d / "target.db")

    return prepare


def _set_trial(key: str, value: object) -> Callable[[dict], None]:
    def spoil(doc: dict) -> None:
        doc["trials"][0][key] = value

    return spoil


def _set_config(key: str, value: object) -> Callable[[dict], None]:
    def spoil(doc: dict) -> None:
        doc["trials"][0]["config"][key] = value

    return spoil


def _set_configs(**values: object) -> Callable[[dict], None]:
    def spoil(doc: dict) -> None:
        doc["trials"][0]["config"].update(values)

    return spoil


def _problem_edited(edit: Callable[[dict], object]) -> Callable[[dict], None]:
    """The first problem's JSON edited; its key and the references to it follow, so only the
    Problem's own check can refuse it."""

    def spoil(doc: dict) -> None:
        problem = doc["problems"][0]
        d = json.loads(problem["json"])
        edit(d)
        text = json.dumps(d, sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(text.encode()).hexdigest()
        for row in (*doc["trials"], *doc["baselines"]):
            row["problem"] = key
        problem.update(json=text, key=key)

    return spoil


def _retemplated(template: str) -> Callable[[dict], None]:
    """The problem's JSON names another template."""
    return _problem_edited(lambda d: d.update(template=template))


def _operand_layout(layout: str) -> Callable[[dict], None]:
    """The bias operand's layout (a row vector's is "vector")."""
    return _problem_edited(lambda d: d["operands"][0].update(layout=layout))


def _at_revision_0007(doc: dict) -> None:
    """The file as an epilab at schema revision 0007 exported it: each problem's hash was
    its template's hash of every file then (``0008_kernel_hashes.HASHES_AT_0007``)."""
    from importlib import import_module

    at_0007 = import_module("epilab.db.migrations.versions.0008_kernel_hashes").HASHES_AT_0007
    doc["schema_revision"] = "0007"
    _problem_edited(lambda d: d.update(template_hash=at_0007[d["template"]]))(doc)


def _quantiles_reversed(doc: dict) -> None:
    trial = doc["trials"][0]
    trial["p20_ms"], trial["p80_ms"] = trial["median_ms"] * 2, trial["median_ms"] / 2


def _no_stale_problem(d: Path, output: str) -> None:
    from epilab.cli.common import is_current_now

    assert "warning" not in output
    with TuningDB.open(d / "target.db") as db:
        stats = db.stats(is_current_now)
    assert stats.problems == 1 and stats.stale_problems == 0, stats  # merged into today's problem


def _set_device_name(name: str) -> Callable[[dict], None]:
    def spoil(doc: dict) -> None:
        doc["trials"][0]["device"]["name"] = name

    return spoil


def _duplicate_trial(doc: dict) -> None:
    doc["trials"].append(dict(doc["trials"][0]))


def write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())

    return prepare


def both(*steps: Callable[[Path], object]) -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        for step in steps:
            step(d)

    return prepare


def empty_export(d: Path) -> None:
    """``empty.json``: the export of an empty database (made where the name is plain)."""
    from epilab.db.transfer import export_json

    with TuningDB.open(d / "plain" / "empty.db") as db:
        export_json(db, str(d / "empty.json"))


def at(name: str, make: Callable[[Path], Path], *args: object, **kw: object) -> Callable[[Path], Path]:
    return lambda d: make(d / name, *args, **kw)


def read_only(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).chmod(0o444)


def read_only_dir(d: Path) -> None:
    d.chmod(0o555)


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Attack:
    id: str
    argv: tuple[str, ...]  # `{d}` is the row's directory
    prepare: Callable[[Path], object] = lambda d: None
    env: Mapping[str, str] = field(default_factory=dict)  # `{d}` as in argv
    code: int = 1
    says: str = "error: "  # a pattern the output must contain
    unchanged: tuple[str, ...] = ()  # files that must be byte-identical afterwards
    absent: tuple[str, ...] = ()  # files that must not exist afterwards
    present: tuple[str, ...] = ()  # files that must exist afterwards
    check: Callable[[Path, str], None] | None = None  # anything else
    unprivileged: bool = False  # permissions must apply (dropped when running as root)
    subprocess: bool = False  # a fresh interpreter (settings read at import)


def _ok_record_of_small_problem(d: Path, output: str) -> None:
    with TuningDB.open(d / "t.db") as db:
        assert [r.status for r in db.records(Spec(16, 16, 16, dtype="float32").problem().key)] == ["ok"]


def _one_trial_stored(d: Path, output: str) -> None:
    with TuningDB.open(d / "target.db") as db:
        assert len(db.records(PROBLEM.key)) == 1  # the file's record merged with the same one


def _report_escapes_names(d: Path, output: str) -> None:
    html = (d / "r.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def import_attack(id: str, prepare: Callable[[Path], object], *, says: str, **kw: object) -> Attack:
    """`db import import.json` into target.db, which must stay byte-identical unless the
    row says otherwise (a file that imports)."""
    kw.setdefault("unchanged", () if kw.get("code", 1) == 0 else ("target.db",))
    argv = ("db", "import", "{d}/import.json", "--db", "{d}/target.db")
    return Attack(id, argv, prepare, says=says, **kw)  # type: ignore[arg-type]


SMALL_AND_HUGE = json.dumps(
    [{"m": 1 << 20, "n": 1 << 20, "k": 1 << 20}, {"m": 16, "n": 16, "k": 16, "dtype": "float32"}]
)
TUNE = ("tune", "--interpret", "--trials", "1", "--patience", "1")
DB = ("--db", "{d}/t.db")


def epilogue_attack(id: str, epilogue: str, *, says: str) -> Attack:
    """`tune` of a shapes file with one 16x16x16 problem of ``epilogue``: refused when the
    file is read, before a database is made."""
    shapes = json.dumps([{"m": 16, "n": 16, "k": 16, "epilogue": epilogue}])
    argv = (*TUNE, "--shapes", "{d}/s.json", *DB)
    return Attack(id, argv, write("s.json", shapes), says=says, absent=("t.db",))


ATTACKS = [
    # --- database paths: the name is a file name, whatever it holds
    Attack(
        "db path with ?",
        ("db", "import", "{d}/empty.json", "--db", "{d}/victim.db?scratch"),
        both(at("victim.db", epilab_db), empty_export),
        code=0,
        says="imported 0 problems",
        unchanged=("victim.db",),
        present=("victim.db?scratch",),
    ),
    Attack(
        "db path with %",
        ("db", "import", "{d}/empty.json", "--db", "{d}/pct%41.db"),
        empty_export,
        code=0,
        says="imported 0 problems",
        present=("pct%41.db",),
        absent=("pctA.db",),
    ),
    Attack(
        "db path with ? beside a foreign file",
        ("db", "import", "{d}/empty.json", "--db", "{d}/other.db?"),
        both(at("other.db", foreign_db), empty_export),
        code=0,
        says="imported 0 problems",
        unchanged=("other.db",),
        present=("other.db?",),
    ),
    Attack(
        "sqlite URL with options",
        ("db", "stats", "--db", "sqlite:///{d}/x.db?mode=memory"),
        says="takes no options",
        absent=("x.db",),
    ),
    Attack(
        "unknown database URL", ("db", "stats"), env={"EPILAB_DB": "mongodb://h/x"}, says="no database driver"
    ),
    # --- files that are not (usable) epilab databases: refused, left byte-identical
    Attack(
        "a text file as the db",
        ("db", "stats", "--db", "{d}/notes.txt"),
        write("notes.txt", "hello, not a database\n" * 10),
        says="not an SQLite database",
        unchanged=("notes.txt",),
    ),
    Attack(
        "a truncated db",
        ("db", "stats", "--db", "{d}/t.db"),
        at("t.db", truncated_db),
        says="truncated",
        unchanged=("t.db",),
    ),
    Attack(
        "a foreign SQLite db",
        ("db", "import", "{d}/valid.json", "--db", "{d}/other.db"),
        both(at("other.db", foreign_db), lambda d: export_doc(d)),
        says="not an epilab database",
        unchanged=("other.db",),
    ),
    Attack(
        "a foreign WAL-mode db",
        ("db", "stats", "--db", "{d}/other.db"),
        at("other.db", foreign_db, wal=True),
        says="not an epilab database",
        unchanged=("other.db",),
        absent=("other.db-wal", "other.db-shm"),
    ),
    Attack(
        "a db from a newer epilab",
        ("db", "prune", "--stale", "--db", "{d}/t.db"),
        at("t.db", future_db),
        says="newer epilab",
        unchanged=("t.db",),
    ),
    Attack("a directory as the db", ("db", "stats", "--db", "{d}"), says="is a directory"),
    Attack(
        "a db with damaged pages: stats",
        ("db", "stats", *DB),
        at("t.db", corrupted_db),
        says="damaged",
        unchanged=("t.db",),
    ),
    Attack(
        "a db with damaged pages: tune",
        (*TUNE, "--suite", "smoke", *DB),
        at("t.db", corrupted_db),
        says="damaged",
        unchanged=("t.db",),
    ),
    # --- issue 38: files that look like epilab databases and are not what they seem
    Attack(
        "a restored db beside another db's -wal",
        ("db", "stats", *DB),
        at("t.db", stale_wal_db),
        says="t.db is damaged .*missing from index",
        unchanged=("t.db", "t.db-wal"),
    ),
    Attack(
        "a db with a trigger that forges records: tune",
        (*TUNE, "--suite", "smoke", *DB),
        at("t.db", _with_sql(FORGING_TRIGGER)),
        says="has trigger 'forge', which epilab never creates",
        unchanged=("t.db",),
    ),
    Attack(
        "a db with a view of our tables",
        ("db", "stats", *DB),
        at("t.db", _with_sql("CREATE VIEW best AS SELECT * FROM epilab_trials")),
        says="has view 'best'",
        unchanged=("t.db",),
    ),
    # --- permissions
    Attack(
        "import into a read-only db",
        ("db", "import", "{d}/valid.json", *DB),
        both(lambda d: export_doc(d), at("t.db", epilab_db), read_only("t.db")),
        says="read-only",
        unchanged=("t.db",),
        unprivileged=True,
    ),
    Attack(
        "tune into a read-only db",
        (*TUNE, "--suite", "smoke", *DB),
        both(at("t.db", epilab_db), read_only("t.db")),
        says="read-only",
        unchanged=("t.db",),
        unprivileged=True,
    ),
    Attack(
        "stats of a db in a read-only directory",
        ("db", "stats", *DB),
        both(at("t.db", epilab_db), read_only_dir),
        code=0,
        says=r"\| problems \| 1 \|",  # the Markdown table of a pipe
        unchanged=("t.db",),
        absent=("t.db-wal", "t.db-shm"),
        unprivileged=True,
    ),
    Attack(
        "a cache dir nobody can write",
        ("demo", "--m", "8", "--n", "8", "--k", "8", "--dtype", "float32"),
        read_only_dir,
        env={"EPILAB_CACHE_DIR": "{d}"},
        says="cannot write rendered kernels under",
        unprivileged=True,
    ),
    # --- imports: refused whole, the database untouched
    import_attack(
        "import: a float in a config",
        spoiled_export(_set_config("BLOCK_M", 16.0)),
        says="BLOCK_M=16.0 is not allowed",
    ),
    import_attack(
        "import: a bool in a config",
        spoiled_export(_set_config("num_warps", True)),
        says="num_warps=True is not allowed",
    ),
    import_attack(
        "import: an unknown key",
        spoiled_export(_set_trial("owner", "root")),
        says="nothing was imported",
    ),
    import_attack(
        "import: escape sequences in a device name",
        spoiled_export(_set_device_name(HOSTILE_NAME)),
        says="printable characters",
    ),
    import_attack(
        "import: trial_number 10**30",
        spoiled_export(_set_trial("trial_number", 10**30)),
        says="trial_number must be an int",
    ),
    import_attack(
        "import: median_ms 1e999",
        spoiled_export(_set_trial("median_ms", 10**400)),
        says="median_ms must be a finite number",
    ),
    import_attack(
        "import: 100k-deep nesting",
        both(write("import.json", "[" * 100_000), at("target.db", epilab_db)),
        says="nested too deeply",
    ),
    import_attack(
        "import: not UTF-8",
        both(write("import.json", b"\xff\xfe{"), at("target.db", epilab_db)),
        says="not UTF-8 text",
    ),
    import_attack(
        "import: not JSON",
        both(write("import.json", "{'format': 'epilab-tuning-db'}"), at("target.db", epilab_db)),
        says="is not JSON",
    ),
    Attack(
        "import: a device file (/dev/zero)",
        ("db", "import", "/dev/zero", "--db", "{d}/target.db"),
        at("target.db", epilab_db),
        says="is not a regular file",
        unchanged=("target.db",),
    ),
    # --- issue 38: "ok" records a compiled model would choose and crash on; problems that lie
    import_attack(
        "import: a gemv variant on a matmul problem",
        spoiled_export(_set_config("variant", "atomic")),
        says="cannot run its problem on matmul: .*no variant 'atomic'",
    ),
    import_attack(
        "import: an epilogue subtile wider than the tile",
        spoiled_export(_set_configs(BLOCK_N=16, EPILOGUE_SUBTILE=4)),
        says="cannot run its problem on matmul",
    ),
    import_attack(
        "import: an mm problem on the conv2d template",
        spoiled_export(_retemplated("conv2d")),
        says="the conv2d template does not run mm problems",
    ),
    # --- issue 89: imports that lie
    import_attack(
        "import: a record dated 9999-12-31 (it would win every later merge)",
        spoiled_export(_set_trial("created_at", "9999-12-31T23:59:59+00:00")),
        says="is in the future",
    ),
    import_attack(
        "import: a median of 0.0 ms",
        spoiled_export(_set_trial("median_ms", 0.0)),
        says="median_ms must be more than 0",
    ),
    import_attack(
        "import: p20 above p80",
        spoiled_export(_quantiles_reversed),
        says="quantiles are out of order",
    ),
    import_attack(
        "import: an operand layout of arbitrary text",
        spoiled_export(_operand_layout("diagonal"), epilogue="bias"),
        says=r"its layout must be one of \('vector',\), not 'diagonal'",
    ),
    import_attack(
        "import: a row vector laid out as a tile",
        spoiled_export(_operand_layout("row"), epilogue="bias"),
        says="broadcast as 'row': its layout must be",
    ),
    import_attack(
        "import: version true",
        spoiled_export(lambda doc: doc.update(version=True)),
        says="has export version True",
    ),
    import_attack(
        "import: an export of schema revision 0007 (its problems current then)",
        spoiled_export(_at_revision_0007),
        code=0,
        says="imported 1 problems, 1 trial records",
        check=_no_stale_problem,
    ),
    import_attack(
        "import: a duplicated trial",
        spoiled_export(_duplicate_trial),
        code=0,
        says="imported 1 problems, 1 trial records",
        check=_one_trial_stored,
    ),
    # --- what a database holds reaches the terminal and the report as data
    Attack(
        "list: escape sequences in a stored name",
        ("db", "list", *DB),
        at("t.db", hostile_names_db),
        code=0,
        says=r"GPU\\x1b\[2J",
    ),
    Attack(
        "show: escape sequences in a stored name",
        ("db", "show", PROBLEM.key[:12], *DB),
        at("t.db", hostile_names_db),
        code=0,
        says=r"GPU\\x1b\[2J",
    ),
    Attack(
        "report: HTML in a stored name",
        ("report", *DB, "--out", "{d}/r.html"),
        at("t.db", hostile_names_db),
        code=0,
        says="wrote",
        check=_report_escapes_names,
    ),
    # --- settings: reported where used, never a traceback, never on `version`
    Attack(
        "bad EPILAB_POLICY: version",
        ("version",),
        env={"EPILAB_POLICY": "bogus"},
        code=0,
        says="epilab 0.1.0",
        subprocess=True,
    ),
    Attack(
        "bad EPILAB_POLICY: stats",
        ("db", "stats", *DB),
        env={"EPILAB_POLICY": "bogus"},
        says="EPILAB_POLICY='bogus' is not a policy",
        subprocess=True,
    ),
    Attack("bad EPILAB_LOG", ("db", "stats", *DB), env={"EPILAB_LOG": "loud"}, says="is not a log level"),
    Attack(
        "EPILAB_CACHE_DIR is a file",
        ("db", "stats"),
        write("cache", "x"),
        env={"EPILAB_CACHE_DIR": "{d}/cache", "EPILAB_DB": ""},
        says="is a file; give a directory",
    ),
    Attack(
        "EPILAB_CACHE_DIR=/proc",
        ("demo", "--m", "8", "--n", "8", "--k", "8", "--dtype", "float32"),
        env={"EPILAB_CACHE_DIR": "/proc"},
        says="cannot write rendered kernels under /proc",
    ),
    Attack(
        "demo: larger than the machine",
        ("demo", "--m", "1000000000", "--n", "8", "--k", "1000000", "--dtype", "float32"),
        says="error: out of memory",  # 4 PB: beyond any address space, so refused at once
    ),
    Attack(
        "report: a peak that is not a number",
        ("report", *DB, "--peak-tflops", "nan", "--out", "{d}/r.html"),
        at("t.db", epilab_db),
        code=2,
        says="must be a positive number",
        absent=("r.html",),
    ),
    # --- files to write
    Attack("export into a directory", ("db", "export", "{d}", *DB), says="is a directory", absent=("t.db",)),
    Attack(
        "export into a missing directory",
        ("db", "export", "{d}/nope/x.json", *DB),
        at("t.db", epilab_db),
        says="does not exist",
    ),
    Attack(
        "report into a directory",
        ("report", *DB, "--out", "{d}"),
        at("t.db", epilab_db),
        says="is a directory",
    ),
    Attack(
        "report into a missing directory",
        ("report", *DB, "--out", "{d}/nope/r.html"),
        at("t.db", epilab_db),
        says="does not exist",
    ),
    # --- shapes files and the tuner
    Attack(
        "shapes: text after the list",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write("s.json", '[{"m": 16, "n": 16, "k": 16}] and then some'),
        says="text after the list",
        absent=("t.db",),
    ),
    Attack(
        "shapes: deep nesting",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write("s.json", "[" + "[" * 100_000),
        says="nested too deeply",
        absent=("t.db",),
    ),
    Attack(
        "shapes: not UTF-8",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write("s.json", b'[{"m": 16\xff}]'),
        says="not UTF-8",
        absent=("t.db",),
    ),
    Attack(
        "shapes: a device file (/dev/zero)",
        (*TUNE, "--shapes", "/dev/zero", *DB),
        says="is not a regular file",
        absent=("t.db",),
    ),
    Attack(
        "tune: a bad --only",
        (*TUNE, "--suite", "smoke", "--only", "9", *DB),
        says="--only '9'",
        absent=("t.db",),
    ),
    Attack(
        "tune: a predicate stored as bfloat16",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write("s.json", '[{"m": 16, "n": 16, "k": 16, "dtype": "bfloat16", "epilogue": "acc > 0"}]'),
        code=0,
        says=r"16x16x16 bfloat16 row/col acc > 0 \|",  # a row of the summary: tuned, not crashed
    ),
    # --- issue 38: errors that are one line, not a traceback
    Attack(
        "EPILAB_CACHE_DIR with ~ of no user",
        ("db", "stats", *DB),
        env={"EPILAB_CACHE_DIR": "~nosuchuser/c"},
        says="EPILAB_CACHE_DIR='~nosuchuser/c': cannot expand '~'",
        subprocess=True,  # `import epilab` itself read the settings
    ),
    Attack(
        "EPILAB_DEBUG_DIR with ~ of no user",
        ("db", "stats", *DB),
        env={"EPILAB_DEBUG_DIR": "~nosuchuser/d"},
        says="EPILAB_DEBUG_DIR='~nosuchuser/d': cannot expand '~'",
        subprocess=True,
    ),
    Attack(
        "tune: a cache the worker cannot write",
        (*TUNE, "--suite", "smoke", "--only", "1", *DB),
        env={"EPILAB_CACHE_DIR": "/proc"},
        says="cannot write rendered kernels under /proc",
    ),
    Attack(
        "tune: a db whose optuna tables a newer optuna made",
        (*TUNE, "--suite", "smoke", *DB),
        at("t.db", lambda path: _newer_optuna(epilab_db(path))),
        says="need another optuna.*set up by optuna 9.9.9",
        unchanged=("t.db",),
    ),
    Attack(
        "tune: a 1x1x1 problem",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write("s.json", '[{"m": 1, "n": 1, "k": 1, "dtype": "float32"}]'),
        code=0,
        says=r"1x1x1 float32 row/col acc \|",
    ),
    Attack("tune: --model ..:x", (*TUNE, "--model", "..:x", *DB), says="give MODULE:FACTORY"),
    Attack(
        "tune: --model os:system", (*TUNE, "--model", "os:system", *DB), says="calling it failed: TypeError"
    ),
    Attack(
        "tune: a factory returning (module, str)",
        (*TUNE, "--model", "strfactory:make", *DB),
        write("strfactory.py", "import torch\n\ndef make():\n    return torch.nn.Linear(4, 4), 'str'\n"),
        env={"PYTHONPATH": "{d}"},
        says="example inputs must be tensors, got str",
        subprocess=True,
    ),
    # --- issue 89: one-line errors, and nothing made before the model is
    Attack(
        "tune: a --model factory that fails makes no database",
        (*TUNE, "--model", "os:system", *DB),
        says="calling it failed",
        absent=("t.db",),
    ),
    Attack(
        "tune: a factory of a model on the meta device",
        (*TUNE, "--model", "metafactory:make", "--input", "2x4:float32", *DB),
        write(
            "metafactory.py",
            "import torch\n\ndef make():\n    return torch.nn.Linear(4, 4, device='meta')\n",
        ),
        env={"PYTHONPATH": "{d}"},
        says="is on the meta device",
        absent=("t.db",),
        subprocess=True,
    ),
    Attack(
        "tune: --devices of a superscript two",
        (*TUNE, "--suite", "small", "--devices", "\u00b2", *DB),
        says="give 'all' or device indices",
    ),
    Attack(
        "show: a key of 100k characters",
        ("db", "show", "a" * 100_000, *DB),
        at("t.db", epilab_db),
        says="a problem key is up to 64 hexadecimal characters",
        unchanged=("t.db",),
    ),
    Attack(
        "tune: --input of 1e22 elements",
        (*TUNE, "--model", "os:getcwd", "--input", "99999999999x99999999999:bfloat16", *DB),
        says="more than any device holds",
    ),
    Attack(
        "tune: --input of a quantized dtype",
        (*TUNE, "--model", "os:getcwd", "--input", "4x16:qint8", *DB),
        says="'qint8' is not a dtype an example input can have",
    ),
    # --- issue 38: limits that agree, parsing that is strict
    epilogue_attack(
        "shapes: an epilogue of 400 operands",
        "acc + " + " + ".join(f"o{i}" for i in range(400)),
        says="canonical text of .* characters, over the 20000 a tuning database stores",
    ),
    epilogue_attack(
        "shapes: operand names that collide in the kernel",
        "acc + x_row + x_row_stride_b",
        says="operand names 'x_row' and 'x_row_stride_b' collide",
    ),
    epilogue_attack(
        "shapes: a literal beyond a float", "acc * 1e400", says="1e400 is beyond the range of a float"
    ),
    epilogue_attack(
        "shapes: an attribute given twice",
        "leaky_relu(acc, 0.1, negative_slope=0.2)",
        says="leaky_relu is given 'negative_slope' twice",
    ),
    Attack(
        "stats of an empty file",
        ("db", "stats", "--db", "{d}/empty.db"),
        write("empty.db", ""),
        says="is an empty file, not an epilab database",
        unchanged=("empty.db",),
    ),
    Attack(
        "stats through a dangling symbolic link",
        ("db", "stats", "--db", "{d}/link.db"),
        lambda d: (d / "link.db").symlink_to(d / "nowhere.db"),
        says="is a symbolic link to .*nowhere.db, which does not exist",
        absent=("nowhere.db",),
    ),
    Attack(
        "a blank --db",
        ("db", "stats", "--db", " "),
        says="the database ' ' is blank",
        check=lambda d, out: None if not Path(" ").exists() else pytest.fail("a file named ' ' was made"),
    ),
    Attack(
        "tune: a problem larger than the device",
        (*TUNE, "--shapes", "{d}/s.json", "--time-budget", "60", *DB),
        write("s.json", SMALL_AND_HUGE),
        code=0,
        says="not tuned.*too large",
        check=_ok_record_of_small_problem,
    ),
    # --- issue 88: what a user reads (a read-only command makes nothing)
    Attack(
        "stats of a database in a directory that does not exist",
        ("db", "stats", "--db", "{d}/new/dir/x.db"),
        says="no database at .*x.db; this command only reads",
        absent=("new",),
    ),
    Attack(
        "tune: one problem in two spellings",
        (*TUNE, "--shapes", "{d}/s.json", *DB),
        write(
            "s.json",
            json.dumps(
                [
                    {"m": 16, "n": 16, "k": 16, "dtype": "float32", "epilogue": "bias"},
                    {"m": 16, "n": 16, "k": 16, "dtype": "fp32", "epilogue": "bias[n] + acc"},
                ]
            ),
        ),
        code=0,
        says="1 entry of the list is a problem listed before",
        check=lambda d, out: None if "other workers" not in out else pytest.fail(out),
    ),
    Attack(
        "list of a database that does not exist",
        ("db", "list", "--db", "{d}/x.db"),
        says="no database at",
        absent=("x.db",),
    ),
]


# ------------------------------------------------------------------ running a row


def _sha(path: Path) -> str:
    """A file's bytes; a SQLite database's rows where it has a write-ahead log. When the last
    connection closes, SQLite checkpoints the log into the main file: its bytes change, no row
    does (whether that happens before this reads depends on when a connection pool is
    collected, which made the byte check fail on some machines and not others)."""
    data = path.read_bytes()
    if data.startswith(b"SQLite format 3\x00") and path.with_name(path.name + "-wal").exists():
        try:  # read-only: it neither checkpoints nor leaves files of its own
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                data = "\n".join(con.iterdump()).encode()
            finally:
                con.close()
        except sqlite3.DatabaseError:
            pass  # not readable as a database: its bytes
    return hashlib.sha256(data).hexdigest()


def _invoke(argv: list[str], env: dict[str, str]) -> tuple[int, str, str | None]:
    """Run the command line in this process: (exit status, output, an unexpected exception)."""
    from epilab.cli import console

    config._current = None  # settings follow this row's environment
    width, console.width = console.width, 200  # table cells unfolded, for `says`
    try:
        result = CliRunner().invoke(app, argv, env=env)
    finally:
        config._current = None
        console.width = width
    exc = result.exception
    unexpected = None if exc is None or isinstance(exc, SystemExit) else repr(exc)
    return result.exit_code, result.output, unexpected


def _subprocess(argv: list[str], env: dict[str, str]) -> tuple[int, str, str | None]:
    full = {**os.environ, **env}
    for k, v in env.items():
        if v == "":
            full.pop(k, None)
    done = subprocess.run(
        [sys.executable, "-m", "epilab.cli", *argv], env=full, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr, None


_DAC_CAPABILITIES = (1 << 1) | (1 << 2) | (1 << 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _drop_dac_capabilities() -> bool:
    """Make permissions apply to this (root) process: False where the kernel refuses."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    data[0].effective &= ~_DAC_CAPABILITIES & 0xFFFFFFFF
    data[0].permitted &= ~_DAC_CAPABILITIES & 0xFFFFFFFF
    return libc.capset(ctypes.byref(header), data) == 0


def _unprivileged(argv: list[str], env: dict[str, str]) -> tuple[int, str, str | None]:
    """``_invoke`` where file permissions apply: as is for a user, in a child process without
    the capabilities that let root ignore them otherwise."""
    if os.geteuid() != 0:
        return _invoke(argv, env)
    read, write_ = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop, run, send the outcome back, leave without cleanup
        try:
            outcome = _invoke(argv, env) if _drop_dac_capabilities() else (-1, "capset refused", None)
        except BaseException as e:
            outcome = (-2, "", repr(e))
        with os.fdopen(write_, "wb") as f:
            pickle.dump(outcome, f)
        os._exit(0)
    os.close(write_)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    outcome = pickle.loads(data)
    if outcome[0] == -1:
        pytest.skip("running as root, and the kernel did not let the test drop CAP_DAC_OVERRIDE")
    return outcome


@pytest.fixture
def row_dir():
    """A directory for one row, which even a read-only row's cleanup can remove."""
    d = Path(tempfile.mkdtemp(prefix="epilab-attack-"))
    yield d
    for p in [d, *d.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack(attack: Attack, row_dir: Path):
    d = row_dir
    attack.prepare(d)
    before = {name: _sha(d / name) for name in attack.unchanged}
    argv = [a.format(d=d) for a in attack.argv]
    env = {k: v.format(d=d) for k, v in attack.env.items()}
    run = _subprocess if attack.subprocess else _unprivileged if attack.unprivileged else _invoke
    code, output, unexpected = run(argv, env)
    assert unexpected is None, f"{attack.id}: {unexpected}\n{output}"
    assert "Traceback" not in output, output
    assert code == attack.code, f"exit status {code}, not {attack.code}:\n{output}"
    flowed = re.sub(r"\s+", " ", output)  # a table's cells may wrap
    assert re.search(attack.says, output) or re.search(attack.says, flowed), (
        f"/{attack.says}/ not in:\n{output}"
    )
    shown = [c for c in CONTROL_CHARS.findall(output) if c not in "\n\t"]
    assert not shown, f"control characters reached the terminal: {shown!r}"
    for name, sha in before.items():
        assert _sha(d / name) == sha, f"{name} was changed"
    for name in attack.absent:
        assert not (d / name).exists(), f"{name} was left behind"
    for name in attack.present:
        assert (d / name).exists(), f"{name} was not written"
    if attack.check is not None:
        attack.check(d, output)


# ------------------------------------------------------------------ the same, below the CLI


def test_config_accepts_only_exact_values():
    for bad in ({"BLOCK_M": 16.0}, {"num_warps": 4.0}, {"num_stages": True}, {"variant": 1}):
        with pytest.raises(ValueError, match="is not allowed"):
            Config.from_dict({**CONFIG, **bad})
    with pytest.raises(ValueError, match="is not allowed"):
        Config(16.0, 16, 16, num_warps=4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be an object"):
        Config.from_dict([16, 16, 16])  # type: ignore[arg-type]
    assert Config.from_dict(CONFIG).to_dict() == CONFIG


def test_the_db_reader_passes_over_configs_this_version_cannot_run(tmp_path):
    """A record stored before configs were checked (floats, from an import) must not be
    picked: the next usable one is."""
    path = str(tmp_path / "t.db")
    record(path, PROBLEM, CONFIG, 2.0)
    record(path, PROBLEM, {**CONFIG, "BLOCK_N": 32}, 1.0)
    with TuningDB.open(path) as db, db.session(write=True) as s:
        from epilab.db.models import TrialRecord

        row = s.query(TrialRecord).filter(TrialRecord.median_ms == 1.0).one()
        row.config = row.config.replace('"BLOCK_N":32', '"BLOCK_N":32.0')
    with TuningDB.open(path) as db:
        assert db.best(PROBLEM.key, INTERPRETER_DEVICE).record.config["BLOCK_N"] == 32.0  # fastest
        hit = db.lookup(PROBLEM, INTERPRETER_DEVICE, usable=Config.is_valid)
        assert hit is not None and hit.record.config == CONFIG


def test_a_path_is_a_file_name_whatever_it_holds(tmp_path):
    for name in ("a?b.db", "pct%41.db", "hash#x.db", "sp ace.db"):
        with TuningDB.open(tmp_path / name) as db:
            db.put_problem(PROBLEM)
        assert (tmp_path / name).exists(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a?b.db", "pct%41.db", "hash#x.db", "sp ace.db"]
    )


def test_optuna_waits_for_a_lock_as_long_as_epilab_does(tmp_path):
    """Another process holding the write lock for longer than SQLite's default 5 s must
    make the tuner's study wait, not crash."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "t.db"
    with TuningDB.open(path) as db:
        storage = db.optuna_storage()
        optuna.create_study(study_name="warm", storage=storage)
        locked, release = threading.Event(), threading.Event()

        def hold_the_lock() -> None:
            con = sqlite3.connect(path, isolation_level=None)
            con.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait()
            time.sleep(6.0)
            con.execute("COMMIT")
            con.close()

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        locked.wait()
        release.set()
        start = time.monotonic()
        study = optuna.create_study(study_name="during-the-lock", storage=storage)
        waited = time.monotonic() - start
        holder.join()
        assert study.study_name == "during-the-lock" and waited > 5.0


def test_shapes_files_parse_in_linear_time(tmp_path):
    """1.2 MB took 13 s when every object counted the newlines from the start. Judged by how
    the time grows (4x the objects: 4x linear, 16x quadratic), not by a wall-clock bound that
    a loaded CI machine missed; the better of two runs each."""

    def parse_time(count):
        objs = [{"m": i % 4000 + 1, "n": 64, "k": 64} for i in range(count)]
        path.write_text("[\n" + ",\n".join(json.dumps(o) for o in objs) + "\n]\n")
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            specs = load_shapes(path)
            best = min(best, time.perf_counter() - start)
        assert len(specs) == count and specs[-1].m == objs[-1]["m"]
        return best

    path = tmp_path / "s.json"
    small, large = parse_time(10_000), parse_time(40_000)
    assert large < 8 * small, (small, large)
    path.write_text('[\n{"m": 1, "n": 1, "k": 1},\n\n{"m": 0, "n": 1, "k": 1}]')
    with pytest.raises(ValueError, match=r"s\.json:4: m must be"):
        load_shapes(path)


def test_launch_refuses_outputs_that_overlap():
    from epilab.api.matmul import simple_epilogue
    from epilab.templates.gemm.matmul import make_problem
    from epilab.templates.registry import launch

    with config.patch(interpret=True):
        a, b = torch.randn(16, 16), torch.randn(16, 16)
        ep, ops_ = simple_epilogue(a, b)
        problem = make_problem(a, b, ep, ops_)
        cfg = Config(16, 16, 16, 1, num_warps=1, num_stages=1)
        with pytest.raises(ValueError, match="shares memory with input 0"):
            launch(problem, cfg, a, b, ops_, out=(a,))
        overlapping = torch.empty(16 + 15).as_strided((16, 16), (1, 1))
        with pytest.raises(ValueError, match="overlaps itself"):
            launch(problem, cfg, a, b, ops_, out=(overlapping,))
        out = torch.empty(16, 16)
        (got,) = launch(problem, cfg, a, b, ops_, out=(out,))
        assert got is out and torch.allclose(out, a @ b, atol=1e-4)


def test_matmul_refuses_inputs_that_require_grad():
    import epilab

    a, b = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16)
    with config.patch(interpret=True):
        with pytest.raises(NotImplementedError, match="no backward, and a require"):
            epilab.matmul(a, b)
        with torch.no_grad():
            assert torch.allclose(epilab.matmul(a, b), a.detach() @ b, atol=1e-4)


def test_a_worker_out_of_memory_is_a_recorded_failure_not_the_end_of_the_run():
    """Below the tuner's up-front refusal, a task whose tensors do not fit comes back as
    out_of_resources (the problem's fault, not the config's), never as a bug."""
    from epilab.tuner.evaluate import run_task

    huge = Spec(1 << 20, 1 << 20, 1 << 20, dtype="float32").problem()
    with config.patch(interpret=True):
        result = run_task({"job": "candidate", "problem": huge.to_json(), "config": CONFIG, "seed": 0})
    assert result["status"] == "out_of_resources" and "out of memory" in result["detail"], result


# ------------------------------------------------------------------ second round (issue 38)


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize(
    "name,fn",
    [
        ("clamp with a NaN bound", lambda y: torch.clamp(y, min=-1.0, max=math.nan)),
        ("hardtanh with a NaN bound", lambda y: F.hardtanh(y, min_val=math.nan, max_val=1.0)),
        ("tanh of tiny values", lambda y: torch.tanh(y * 1e-8)),
        ("a predicate as bfloat16", lambda y: (y > 0).to(torch.bfloat16)),
        ("a predicate as fp8", lambda y: (y > 0).to(torch.float8_e4m3fn)),
    ],
)
def test_compiled_epilogues_match_eager_at_the_edges(tmp_path, name, fn):
    """Under ``always`` no tuner's float64 check stands between a rule's form and the user:
    the compiled model must give eager's NaNs, tiny values and predicates (items 1 and 2)."""
    x, w = torch.randn(64, 32), torch.randn(32, 32)

    def model(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fn(a @ b)

    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    with torch.no_grad():
        got = torch.compile(model, backend="epilab", options=options)(x, w)
        want = model(x, w)
    import epilab

    assert [d.template for d in epilab.explain()] == ["matmul"], name
    assert got.dtype == want.dtype
    got, want = got.double(), want.double()
    assert torch.equal(got.isnan(), want.isnan()), f"{name}: {int(want.isnan().sum())} NaNs in eager"
    finite = ~want.isnan()
    if finite.any():  # to the matmul's own rounding (eager sums in another order)
        assert rel_error(got[finite], want[finite]) < 1e-5, name


def test_the_text_limit_is_the_databases():
    from epilab.db.models import EPILOGUE_LEN
    from epilab.ir.epilogue import MAX_TEXT_CHARS

    assert MAX_TEXT_CHARS == EPILOGUE_LEN


def test_operand_names_are_matched_whole():
    from epilab.ir.epilogue import check_operand_name

    assert check_operand_name("bias") == "bias"
    for bad in ("bias\n", "bias\n\n", "b ias", "1x", "for"):
        with pytest.raises(ValueError, match="is not allowed"):
            check_operand_name(bad)


@pytest.mark.parametrize(
    "env,want",
    [
        ({"HOME": ""}, "pwd"),  # not /.cache/epilab
        ({"HOME": "relative/home"}, "pwd"),
        ({"HOME": "/h", "XDG_CACHE_HOME": "relative/cache"}, "/h/.cache/epilab"),  # the XDG spec
        ({"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/epilab"),
        ({"HOME": "/h", "EPILAB_CACHE_DIR": "  "}, "/h/.cache/epilab"),
    ],
)
def test_the_cache_dir_is_absolute_whatever_home_and_xdg_say(env, want):
    import pwd

    got = config.from_env(env)
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert str(got.cache_dir) == (f"{home}/.cache/epilab" if want == "pwd" else want)
    assert got.db == str(got.cache_dir / "tuning.db")
    assert config.from_env({**env, "EPILAB_DB": " "}).db == got.db  # blank: the default, no file " "


def test_one_problem_the_database_cannot_store_does_not_stop_the_others(tmp_path, monkeypatch):
    """A problem the database refuses to store (its own checks: a limit of another version)
    is reported as refused and the run goes on (before, 0 of 4 problems were tuned)."""
    from epilab.tuner.tune import TuneOptions, Tuner

    bad, good = Spec(24, 16, 16, dtype="float32"), Spec(16, 16, 16, dtype="float32")
    with TuningDB.open(tmp_path / "t.db") as db, config.patch(interpret=True):
        store = db.put_problem

        def put_problem(problem):
            if problem.key == bad.problem().key:
                raise ValueError("epilogue is longer than 20000 characters")
            store(problem)

        monkeypatch.setattr(db, "put_problem", put_problem)
        with Tuner(db, TuneOptions(interpret=True, jobs=1, budget=Budget(trials=1, patience=1))) as tuner:
            refused = tuner.tune(bad)
            done = tuner.tune(good)
    assert refused.refused == "not stored: epilogue is longer than 20000 characters"
    assert done.refused is None and done.best is not None


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    """A write that fails (no space left) names no file of its own: the error says which."""
    import errno

    from epilab import files
    from epilab.cli import user_error

    class Full:
        def __init__(self, fd, *args, **kw):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", Full)
    target = tmp_path / "report.html"
    with pytest.raises(OSError) as caught:
        files.write_text_atomic(target, "<html>")
    assert user_error(caught.value) == f"No space left on device: {target}"
    assert list(tmp_path.iterdir()) == []  # and its temporary file is gone
