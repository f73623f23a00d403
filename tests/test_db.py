"""The tuning database: round trips, best/nearest rules, staleness, migrations,
refusals that leave files untouched, concurrency, export/import, and the CLI.

Every test runs on SQLite; with ``EPILAB_TEST_POSTGRES_URL`` set (CI starts a
server) the same tests run against PostgreSQL too.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from importlib import import_module
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from epilab.cli import app
from epilab.db import DatabaseOpenError, DeviceInfo, Timing, TuningDB, Versions
from epilab.db import schema as db_schema
from epilab.db.keys import canonical, family_key, problem_key
from epilab.db.transfer import export_json, import_json
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.templates.registry import is_current, template_hash

H200 = DeviceInfo("NVIDIA H200", "9.0", 132)
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132)
NOW = Versions("2.11.0", "3.6.0")
OLD = Versions("2.10.0", "3.5.0")
EPILOGUE = Epilogue.build([(ops.gelu_tanh(acc() + operand("bias", "row")), "bfloat16")])


def problem(m: int = 4096, n: int = 4096, k: int = 4096, *, template_hash_: str | None = None) -> Problem:
    return Problem(
        op="addmm",
        template="matmul",
        template_hash=template_hash_ or template_hash("matmul", EPILOGUE),
        dtype="bfloat16",
        layout_a="row",
        layout_b="col",
        operands=(OperandSpec("bias", "bfloat16", "vector"),),
        epilogue=EPILOGUE,
        shape=Shape(1, m, n, k),
    )


def timing(ms: float) -> Timing:
    return Timing(
        ms, ms * 0.98, ms * 1.03, "cuda-events+l2-flush", tflops=1.0 / ms, gbps=None, graph_ms=ms * 0.9
    )


def cfg(bm: int = 128, bn: int = 256, bk: int = 64, **kw) -> dict:
    return Config(bm, bn, bk, **kw).to_dict()


def ok(db: TuningDB, p: Problem, ms: float, config: dict, device=H200, versions=NOW) -> None:
    db.record_trial(
        p,
        device,
        config=config,
        status="ok",
        timing=timing(ms),
        max_rel_error=1e-3,
        versions=versions,
        study="test",
        trial_number=0,
    )


@pytest.fixture
def db(db_target):
    with TuningDB.open(db_target) as store:
        yield store


# ------------------------------------------------------------------ round trips


def test_records_round_trip(db):
    p = problem()
    ok(db, p, 0.25, cfg())
    db.record_trial(
        p,
        H200,
        config=cfg(64, 64, 64),
        status="out_of_resources",
        timing=None,
        max_rel_error=None,
        versions=NOW,
        study="test",
        trial_number=1,
        detail="shared memory 300000 > 232448",
    )
    db.record_baseline(p, H200, library="cublas", timing=timing(0.2), max_rel_error=2e-3, versions=NOW)
    records = db.records(p.key)
    assert [r.status for r in records] == ["ok", "out_of_resources"]
    first = records[0]
    assert first.config == cfg() and first.median_ms == 0.25 and first.device == H200
    assert first.versions == NOW and first.study == "test" and first.max_rel_error == 1e-3
    assert first.graph_ms == pytest.approx(0.225)
    assert records[1].detail.startswith("shared memory") and records[1].median_ms is None
    (base,) = db.baselines(p.key)
    assert base.library == "cublas" and base.median_ms == 0.2 and base.config is None
    assert db.problem_json(p.key[:10]) == (p.key, p.to_json())
    assert Problem.from_json(db.problem_json(p.key)[1]) == p


def test_a_baseline_of_any_library_name_is_kept_and_a_malformed_name_refused(db):
    """The database records a library by name (one another epilab version times too); the
    names it may take are checked, not a list of this version's."""
    p = problem()
    db.record_baseline(p, H200, library="mkl", timing=timing(0.3), max_rel_error=None, versions=NOW)
    assert [b.library for b in db.baselines(p.key)] == ["mkl"]
    for bad in ("cuBLAS 12", "", "x" * 33, "drop table;"):
        with pytest.raises(ValueError, match="is not a library's name"):
            db.record_baseline(p, H200, library=bad, timing=timing(0.3), max_rel_error=None, versions=NOW)


def test_same_config_twice_keeps_the_newest_measurement(db):
    p = problem()
    ok(db, p, 0.30, cfg())
    ok(db, p, 0.27, cfg())
    (record,) = db.records(p.key)
    assert record.median_ms == 0.27


def test_best_is_fastest_ok_preferring_same_versions(db):
    p = problem()
    ok(db, p, 0.30, cfg(128, 128, 64))
    ok(db, p, 0.20, cfg(128, 256, 64), versions=OLD)  # faster, but older torch/triton
    db.record_trial(
        p,
        H200,
        config=cfg(64, 64, 64),
        status="incorrect",
        timing=timing(0.01),
        max_rel_error=0.5,
        versions=NOW,
        study="test",
    )
    ok(db, p, 0.10, cfg(64, 128, 64), device=H100)  # another device
    best = db.best(p.key, H200, NOW)
    assert best.exact and best.same_versions and best.record.config == cfg(128, 128, 64)
    anyver = db.best(p.key, H200)  # no versions given: fastest wins
    assert anyver.record.config == cfg(128, 256, 64) and not anyver.same_versions
    assert db.best(p.key, DeviceInfo("NVIDIA A100", "8.0", 108)) is None
    assert db.best(problem(m=17).key, H200) is None


def test_nearest_m_on_a_log2_scale_is_a_marked_fallback(db):
    for m, ms in ((128, 0.05), (1024, 0.1), (8192, 0.5)):
        ok(db, problem(m=m), ms, cfg(m // 8 if m < 1024 else 128))
    near = db.lookup(problem(m=2000), H200, NOW)  # log2: 1024 is 0.97 away, 8192 is 2.03
    assert near.fallback and near.m == 1024 and near.record.config == cfg(128)
    assert db.lookup(problem(m=300), H200).m == 128  # 300/128 = 2.3x, 1024/300 = 3.4x
    exact = db.lookup(problem(m=8192), H200)
    assert exact.exact and exact.m == 8192
    assert db.lookup(problem(m=2000, n=2048), H200) is None  # other N: another family
    from epilab.ir.problem import symbol

    dynamic = problem(m=symbol("s0"))
    assert db.lookup(dynamic, H200, m=6000).m == 8192
    assert db.lookup(dynamic, H200) is None  # no M to aim for


def test_stale_records_are_listed_never_used_and_pruned(db):
    old = problem(template_hash_="0" * 64)
    ok(db, old, 0.1, cfg())
    current = problem()
    assert old.key != current.key
    assert db.lookup(current, H200) is None  # the old-template record is never an answer
    ok(db, current, 0.3, cfg())
    stats = db.stats(is_current)
    assert (stats.problems, stats.stale_problems, stats.stale_trials) == (2, 1, 1)
    assert stats.stale_by_template == {"matmul": 1} and stats.trials_by_status == {"ok": 2}
    assert db.prune_stale(is_current) == 1
    assert db.records(old.key) == [] and len(db.records(current.key)) == 1
    assert db.stats(is_current).stale_problems == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(status="fine"),
        dict(study=""),
        dict(study="x" * 500),
        dict(timing=None),
        dict(max_rel_error=float("nan")),
        dict(trial_number=-1),
        dict(timing=Timing(-1.0, 0, 0, "events")),
    ],
)
def test_bad_records_are_refused(db, bad):
    args = dict(config=cfg(), status="ok", timing=timing(0.1), max_rel_error=1e-3, versions=NOW, study="s")
    with pytest.raises(ValueError):
        db.record_trial(problem(), H200, **{**args, **bad})
    assert db.records(problem().key) == []


# ------------------------------------------------------------------ schema


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _url(target: str) -> str:
    return target if "://" in target else f"sqlite:///{target}"


def test_database_from_the_first_revision_is_migrated_keeping_rows(db_target):
    path = db_target
    engine = sa.create_engine(_url(db_target))
    p = problem(m=512)
    with engine.begin() as conn:
        db_schema.stamp_and_upgrade_to(conn, "0001")
        cols = {c["name"] for c in sa.inspect(conn).get_columns("epilab_problems")}
        assert "family" not in cols
        now = datetime(2026, 1, 2, tzinfo=timezone.utc)
        conn.execute(
            sa.text(
                "INSERT INTO epilab_devices (id, name, capability, sm_count) VALUES (1, 'NVIDIA H200', '9.0', 132)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO epilab_problems (id, key, json, op, template, template_hash, dtype, layout_a, layout_b, precision,"
                " epilogue, batch, m, n, k, created_at) VALUES (1, :key, :json, 'addmm', 'matmul', :h, 'bfloat16',"
                " 'row', 'col', 'ieee', :ep, 1, 512, 4096, 4096, :now)"
            ),
            dict(key=p.key, json=p.to_json(), h=p.template_hash, ep=p.epilogue.text(), now=now),
        )
        for i, ms in enumerate((0.3, 0.2)):
            conn.execute(
                sa.text(
                    "INSERT INTO epilab_trials (problem_id, device_id, config, status, study, trial_number, median_ms, p20_ms,"
                    " p80_ms, max_rel_error, timing_method, torch_version, triton_version, created_at) VALUES (1, 1,"
                    " :config, 'ok', 'old', :i, :ms, :ms, :ms, 0.001, 'events', '2.10', '3.5', :now)"
                ),
                dict(
                    config=json.dumps(cfg(64 * (i + 1)), sort_keys=True, separators=(",", ":")),
                    i=i,
                    ms=ms,
                    now=now,
                ),
            )
    engine.dispose()
    with TuningDB.open(path) as db:
        assert db.revision == db_schema.head_revision() == "0009"
        assert all(r.graph_ms is None for r in db.records(p.key))  # 0003 added it empty
        assert db.verdict(p.key, H200, Versions("2.10", "3.5"), cuda_graphs=False) is None  # 0004: none yet
        assert len(db.records(p.key)) == 2
        assert db.best(p.key, H200).record.median_ms == 0.2
        near = db.lookup(problem(m=600), H200)  # needs the family column filled by the migration
        assert near is not None and near.m == 512
    with TuningDB.open(path) as db:  # opening a current database again changes nothing
        assert len(db.records(p.key)) == 2


def test_verdicts_of_revision_0006_become_inference_verdicts_beside_training_ones(db_target):
    """0007 adds ``training`` to a verdict's identity: a database of 0006 keeps its verdicts as
    inference ones, a training step's verdict of the same problem is stored beside them, and
    going back to 0006 keeps the inference ones."""
    p = problem()

    def verdict(db: TuningDB, keep: bool, **training: bool) -> None:
        db.record_verdict(
            p, H200, cuda_graphs=False, keep=keep, with_ms=1.0, without_ms=1.2, context="gpt2",
            timing_method="model", versions=NOW, **training,
        )  # fmt: skip

    with TuningDB.open(db_target) as db:
        verdict(db, True)
    engine = sa.create_engine(_url(db_target))
    with engine.begin() as conn:
        db_schema.downgrade_to(conn, "0006")
        assert "training" not in {c["name"] for c in sa.inspect(conn).get_columns("epilab_verdicts")}
    engine.dispose()
    with TuningDB.open(db_target) as db:
        assert db.revision == "0009"
        got = db.verdict(p.key, H200, NOW, cuda_graphs=False)
        assert got is not None and got.keep and not got.training
        assert db.verdict(p.key, H200, NOW, cuda_graphs=False, training=True) is None
        verdict(db, False, training=True)  # beside it, not in its place
        assert db.verdict(p.key, H200, NOW, cuda_graphs=False).keep
        got = db.verdict(p.key, H200, NOW, cuda_graphs=False, training=True)
        assert not got.keep and "a training step, per call" in got.describe()
    engine = sa.create_engine(_url(db_target))
    with engine.begin() as conn:
        db_schema.downgrade_to(conn, "0006")
        rows = conn.execute(sa.text("SELECT keep FROM epilab_verdicts")).all()
    engine.dispose()
    assert [bool(r[0]) for r in rows] == [True]


def test_revision_0008_rekeys_current_problems_by_their_kernels_and_keeps_their_records(db_target):
    """0008 keys problems by what their kernels are made of: a problem current under 0007
    (its template's 0007 hash) gets its kernel hash, key and family with its trials kept; a
    stale one stays stale; going back to 0007 restores the 0007 hashes."""

    at_0007 = import_module("epilab.db.migrations.versions.0008_kernel_hashes").HASHES_AT_0007
    p, stale = problem(), problem(m=512, template_hash_="0" * 64)
    with TuningDB.open(db_target) as db:
        ok(db, p, 0.2, cfg())
        ok(db, stale, 0.3, cfg())
    engine = sa.create_engine(_url(db_target))
    with engine.begin() as conn:
        db_schema.downgrade_to(conn, "0007")
        rows = dict(conn.execute(sa.text("SELECT m, template_hash FROM epilab_problems")).all())
    engine.dispose()
    assert rows == {4096: at_0007["matmul"], 512: "0" * 64}
    with TuningDB.open(db_target) as db:
        assert db.revision == "0009"
        assert [r.median_ms for r in db.records(p.key)] == [0.2]  # the same key as before, its trial kept
        assert db.lookup(p, H200).record.median_ms == 0.2
        assert db.stats(is_current).stale_problems == 1 and len(db.records(stale.key)) == 1


def _legacy(problem_json: str) -> str:
    """The problem's JSON as epilab wrote it before revision 0009: operands' ``kind``."""
    d = json.loads(problem_json)
    assert import_module("epilab.db.migrations.versions.0009_operand_broadcast").renamed(
        d, "broadcast", "kind"
    )
    return canonical(d)


def test_revision_0009_names_the_operands_broadcast_and_keeps_their_records(db_target):
    """0009 stores an operand's row/col/tile/scalar as ``broadcast``: a problem of 0008 (its
    JSON, key, family and text saying ``kind``) gets the JSON and key epilab computes now,
    with its trials; going back to 0008 gives the old JSON and key back."""
    p = problem()
    with TuningDB.open(db_target) as db:
        ok(db, p, 0.2, cfg())
    old = _legacy(p.to_json())
    assert old != p.to_json() and '"kind":"row"' in old and Problem.from_json(old) == p
    engine = sa.create_engine(_url(db_target))
    with engine.begin() as conn:
        db_schema.downgrade_to(conn, "0008")
        row = conn.execute(sa.text("SELECT key, json, family, epilogue FROM epilab_problems")).one()
    engine.dispose()
    assert (row.key, row.json, row.family) == (problem_key(old), old, family_key(old))
    assert "operand[kind=row,name=bias]" in row.epilogue
    with TuningDB.open(db_target) as db:
        assert db.revision == "0009"
        assert [r.median_ms for r in db.records(p.key)] == [0.2] and db.records(problem_key(old)) == []
        assert db.lookup(problem(m=600), H200).record.median_ms == 0.2  # its family, too
    engine = sa.create_engine(_url(db_target))
    with engine.connect() as conn:
        text = conn.execute(sa.text("SELECT epilogue FROM epilab_problems")).scalar()
    engine.dispose()
    assert text == p.epilogue.text() and "operand[broadcast=row,name=bias]" in text


def test_an_export_from_before_0009_imports_under_todays_keys(db, tmp_path):
    _filled(db)
    path = tmp_path / "old.json"
    export_json(db, path)
    doc = json.loads(path.read_text())
    renamed = {}
    for item in doc["problems"]:
        item["json"] = _legacy(item["json"])
        renamed[item["key"]] = item["key"] = problem_key(item["json"])
        item["epilogue"] = item["epilogue"].replace("operand[broadcast=", "operand[kind=")
    for row in doc["trials"] + doc["baselines"]:
        row["problem"] = renamed[row["problem"]]
    path.write_text(json.dumps(doc))
    keys = [problem(m=m).key for m in (128, 1024)]
    with TuningDB.open(tmp_path / "other.db") as other:
        report = import_json(other, path, parse_problem=_parse_problem, validate_config=_validate_config)
        assert (report.problems, report.trials, report.baselines) == (2, 5, 2)
        assert _snapshot(other, keys) == _snapshot(db, keys)


def test_database_from_a_newer_epilab_is_refused_untouched(db_target):
    with TuningDB.open(db_target) as db:
        ok(db, problem(), 0.1, cfg())
    engine = sa.create_engine(_url(db_target))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE epilab_alembic_version SET version_num = '0099_from_the_future'"))
    engine.dispose()
    before = _sha(Path(db_target)) if "://" not in db_target else None
    with pytest.raises(DatabaseOpenError, match="newer epilab"):
        TuningDB.open(db_target)
    if before is not None:
        assert _sha(Path(db_target)) == before
    engine = sa.create_engine(_url(db_target))
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT version_num FROM epilab_alembic_version")).scalar()
            == "0099_from_the_future"
        )
        assert conn.execute(sa.text("SELECT count(*) FROM epilab_trials")).scalar() == 1
    engine.dispose()


def test_files_that_are_not_epilab_databases_are_refused_untouched(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database\n" * 10)
    truncated = tmp_path / "truncated.db"
    with TuningDB.open(truncated) as db:
        for m in range(1, 400):
            ok(db, problem(m=m), 0.1, cfg())
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    for extra in ("-wal", "-shm"):
        Path(str(truncated) + extra).unlink(missing_ok=True)
    other = tmp_path / "other.db"
    con = __import__("sqlite3").connect(other)
    con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO photos (name) VALUES ('cat.png')")
    con.commit()
    con.close()
    for path, match in ((text, "not an SQLite database"), (truncated, "truncated"), (other, "not an epilab")):
        before = _sha(path)
        with pytest.raises(DatabaseOpenError, match=match):
            TuningDB.open(path)
        assert _sha(path) == before, path
    with pytest.raises(DatabaseOpenError, match="not a database URL"):
        TuningDB.open("postgresql+psycopg://user@host:notaport/x")


def test_optuna_studies_can_share_the_database(db_target):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with TuningDB.open(db_target) as db:
        ok(db, problem(), 0.1, cfg())
    study = optuna.create_study(study_name="s", storage=_url(db_target))
    study.optimize(lambda trial: trial.suggest_int("x", 0, 3), n_trials=2)
    with TuningDB.open(db_target) as db:  # optuna's tables (and its alembic_version) beside ours
        assert len(db.records(problem().key)) == 1
    assert len(optuna.load_study(study_name="s", storage=_url(db_target)).trials) == 2


# ------------------------------------------------------------------ concurrency

_WRITER = textwrap.dedent("""
    import hashlib, json, sys
    from epilab.db import DeviceInfo, Timing, TuningDB, Versions

    class Ep:
        def text(self):
            return "%0 = acc; out %0 bfloat16"

    class P:
        def __init__(self, m):
            self._json = json.dumps({"dtype": "bfloat16", "epilogue": {"nodes": [["acc", [], {}]],
                "outputs": [[0, "bfloat16"]]}, "layout_a": "row", "layout_b": "row", "op": "mm",
                "operands": [], "precision": "ieee", "shape": {"batch": 1, "k": 64, "m": m, "n": 64},
                "template": "matmul", "template_hash": "a" * 64}, sort_keys=True, separators=(",", ":"))
            self.key = hashlib.sha256(self._json.encode()).hexdigest()
            self.epilogue = Ep()
        def to_json(self):
            return self._json

    target, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    db = TuningDB.open(target)
    for i in range(count):
        config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1, "num_warps": 4,
                  "num_stages": 1 + i % 7, "variant": "default"}
        db.record_trial(P(1 + i // 7), DeviceInfo("GPU-%d" % worker, "9.0", 132), config=config, status="ok",
                        timing=Timing(1.0, 1.0, 1.0, "events"), max_rel_error=0.0, versions=Versions("t", "t"),
                        study="w%d" % worker, trial_number=i)
    db.close()
""")


def test_eight_processes_write_1600_records_without_lock_errors(db_target):
    TuningDB.open(db_target).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, db_target, str(w), "200"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(8)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc == 0, err
        assert "locked" not in err
    with TuningDB.open(db_target) as db:
        stats = db.stats(is_current)
    assert stats.trials_by_status == {"ok": 1600} and stats.devices == 8


# ------------------------------------------------------------------ export / import


def _parse_problem(text: str) -> tuple[str, str]:
    p = Problem.from_json(text)
    return p.to_json(), p.epilogue.text()


def _validate_config(d, problem_json):
    return Config.from_dict(d).to_dict()


def _filled(db: TuningDB) -> None:
    for m in (128, 1024):
        ok(db, problem(m=m), 0.1 * m / 128, cfg())
        ok(db, problem(m=m), 0.2 * m / 128, cfg(64, 64, 64))
        db.record_baseline(
            problem(m=m), H200, library="inductor", timing=timing(0.15), max_rel_error=2e-3, versions=NOW
        )
    db.record_trial(
        problem(m=128),
        H200,
        config=cfg(256, 256, 128),
        status="compile_error",
        timing=None,
        max_rel_error=None,
        versions=NOW,
        study="test",
        detail="out of registers",
    )


def _snapshot(db: TuningDB, keys) -> list:
    return [(r.config, r.status, r.median_ms, r.created_at) for k in keys for r in db.records(k)] + [
        (b.library, b.median_ms, b.created_at) for k in keys for b in db.baselines(k)
    ]


def test_export_import_round_trip_is_idempotent(db, tmp_path):
    _filled(db)
    keys = [problem(m=m).key for m in (128, 1024)]
    exported = tmp_path / "export.json"
    assert export_json(db, exported) == {"problems": 2, "trials": 5, "baselines": 2}
    with TuningDB.open(tmp_path / "copy.db") as other:
        report = import_json(other, exported, parse_problem=_parse_problem, validate_config=_validate_config)
        assert (report.problems, report.trials, report.baselines) == (2, 5, 2)
        assert _snapshot(other, keys) == _snapshot(db, keys)
        import_json(other, exported, parse_problem=_parse_problem, validate_config=_validate_config)
        assert _snapshot(other, keys) == _snapshot(db, keys)
        again = tmp_path / "again.json"
        export_json(other, again)
        strip = lambda d: {k: v for k, v in json.loads(d).items() if k != "exported_at"}  # noqa: E731
        assert strip(again.read_text()) == strip(exported.read_text())


def test_exports_from_before_the_graph_time_column_still_import(db, tmp_path):
    _filled(db)
    path = tmp_path / "old.json"
    export_json(db, path)
    doc = json.loads(path.read_text())
    for row in doc["trials"] + doc["baselines"]:
        del row["graph_ms"]
    path.write_text(json.dumps(doc))
    with TuningDB.open(tmp_path / "other.db") as other:
        report = import_json(other, path, parse_problem=_parse_problem, validate_config=_validate_config)
        assert report.trials == 5 and all(r.graph_ms is None for r in other.records(problem(m=128).key))


def test_import_merge_rule_newer_record_wins(db, tmp_path):
    p = problem()
    ok(db, p, 0.30, cfg())
    path = tmp_path / "e.json"
    export_json(db, path)
    doc = json.loads(path.read_text())
    (row,) = doc["trials"]
    created = datetime.fromisoformat(row["created_at"])

    def timed(ms: float) -> dict:
        return {"median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.03}

    older = {**row, **timed(0.99), "created_at": (created - timedelta(days=1)).isoformat()}
    newer = {**row, **timed(0.11), "created_at": (created + timedelta(hours=1)).isoformat()}
    for variant, expected in ((older, 0.30), (newer, 0.11)):
        path.write_text(json.dumps({**doc, "trials": [variant]}))
        import_json(db, path, parse_problem=_parse_problem, validate_config=_validate_config)
        assert db.records(p.key)[0].median_ms == expected


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d["trials"][0]["config"].update(BLOCK_M="64"), r"trials\[0\]: config BLOCK_M='64'"),
        (lambda d: d["trials"][1]["config"].update(BLOCK_N=10**12), r"trials\[1\]: config BLOCK_N="),
        (lambda d: d["trials"][0]["config"].update(evil="__import__('os')"), r"unknown config field"),
        (lambda d: d["trials"][2].update(extra=1), r"trials\[2\]: unexpected keys \['extra'\]"),
        (lambda d: d["trials"][0].update(status="fast"), r"status 'fast'"),
        (lambda d: d["trials"][0].update(study="x" * 10_000), r"study must be"),
        (lambda d: d["trials"][0].update(median_ms="0.1"), r"median_ms must be"),
        (lambda d: d["trials"][0].update(trial_number=True), r"trial_number"),
        (lambda d: d["trials"][0]["device"].update(sm_count="132"), r"sm_count"),
        (lambda d: d["baselines"][0].update(library="cuBLAS 12"), r"baselines\[0\]: library 'cuBLAS 12'"),
        (lambda d: d["problems"][0].update(key="f" * 64), r"problems\[0\]: key"),
        (
            lambda d: d["problems"][1].update(json=d["problems"][1]["json"].replace('"m":', '"m" :')),
            r"problems\[1\]",
        ),
        (lambda d: d.update(version=2), r"export version 2"),
        (lambda d: d.update(format="something-else"), r"not an epilab export"),
    ],
    ids=[
        "config-str",
        "config-huge",
        "config-extra",
        "row-extra",
        "status",
        "long-string",
        "number-str",
        "bool-int",
        "device",
        "library",
        "problem-key",
        "problem-json",
        "version",
        "format",
    ],
)
def test_malicious_import_is_rejected_whole(db, tmp_path, mutate, match):
    _filled(db)
    good = tmp_path / "good.json"
    export_json(db, good)
    doc = json.loads(good.read_text())
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with TuningDB.open(tmp_path / "target.db") as target:
        with pytest.raises(ValueError, match=match):
            import_json(target, bad, parse_problem=_parse_problem, validate_config=_validate_config)
        stats = target.stats(is_current)
        assert (stats.problems, sum(stats.trials_by_status.values()), stats.baselines) == (0, 0, 0)


def test_import_of_non_json_is_a_clear_error(db, tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\x00\x01 not json")
    with pytest.raises(ValueError, match="not JSON"):
        import_json(db, path, parse_problem=_parse_problem, validate_config=_validate_config)


# ------------------------------------------------------------------ CLI

runner = CliRunner()


def test_cli_db_commands(db_target, tmp_path, monkeypatch):
    import epilab.cli

    monkeypatch.setattr(epilab.cli.console, "width", 200)
    with TuningDB.open(db_target) as db:
        _filled(db)
        ok(db, problem(template_hash_="1" * 64), 0.5, cfg())
    args = ["--db", db_target]
    result = runner.invoke(app, ["db", "stats", *args])
    assert result.exit_code == 0, result.output
    assert "stale problems" in result.output and "prune --stale" in result.output
    stats = json.loads(runner.invoke(app, ["db", "stats", *args, "--json"]).output)
    assert stats["problems"] == 3 and stats["stale_problems"] == 1
    listed = runner.invoke(app, ["db", "list", *args, "--status", "ok"])
    assert listed.exit_code == 0 and "128x256x64" in listed.output and "NVIDIA H200" in listed.output
    rows = json.loads(runner.invoke(app, ["db", "list", *args, "--json", "--limit", "2"]).output)
    assert len(rows) == 2 and rows[0]["record"]["status"] in ("ok", "compile_error")
    key = problem(m=128).key
    shown = runner.invoke(app, ["db", "show", key[:8], *args])
    assert shown.exit_code == 0 and "inductor" in shown.output and "compile_error" in shown.output
    assert json.loads(runner.invoke(app, ["db", "show", key, *args, "--json"]).output)["key"] == key
    out = tmp_path / "dump.json"
    assert runner.invoke(app, ["db", "export", str(out), *args]).exit_code == 0
    copy = str(tmp_path / "copy.db")
    imported = runner.invoke(app, ["db", "import", str(out), "--db", copy])
    assert (
        imported.exit_code == 0 and "imported 3 problems, 6 trial records and 2 baselines" in imported.output
    )
    pruned = runner.invoke(app, ["db", "prune", "--stale", *args])
    assert pruned.exit_code == 0 and "removed 1 stale problem" in pruned.output
    assert runner.invoke(app, ["db", "prune", *args]).exit_code == 1
    assert runner.invoke(app, ["db", "list", *args, "--status", "great"]).exit_code == 1
    assert runner.invoke(app, ["db", "show", "zzzzzzzz", *args]).exit_code == 1


def test_cli_db_refuses_a_non_database(tmp_path):
    path = tmp_path / "readme.txt"
    path.write_text("just text")
    result = runner.invoke(app, ["db", "stats", "--db", str(path)])
    assert result.exit_code == 1 and "not an SQLite database" in result.output
    assert path.read_text() == "just text"


def test_default_location_follows_epilab_db(tmp_path, monkeypatch):
    from epilab import config

    with config.patch(db=str(tmp_path / "via-env.db")), TuningDB.open() as db:
        assert db.url.endswith("via-env.db")
    assert (tmp_path / "via-env.db").exists()


def test_cli_shows_database_strings_as_data(tmp_path, monkeypatch):
    import epilab.cli

    monkeypatch.setattr(epilab.cli.console, "width", 200)
    path = str(tmp_path / "t.db")
    with TuningDB.open(path) as db:
        ok(db, problem(), 0.1, cfg(), device=DeviceInfo("[bold red]GPU[/]", "9.0", 1))
    result = runner.invoke(app, ["db", "list", "--db", path])
    assert result.exit_code == 0 and "[bold red]GPU[/]" in result.output


# ------------------------------------------------------------------ verdicts and transfer


def test_verdicts_are_kept_per_mode_and_versions_replaced_and_pruned(db):
    p = problem()

    def verdict(keep: bool, graphs: bool, with_ms: float = 1.0) -> None:
        db.record_verdict(
            p,
            H200,
            cuda_graphs=graphs,
            keep=keep,
            with_ms=with_ms,
            without_ms=1.2,
            context="gpt2 8x256x768",
            timing_method="model",
            versions=NOW,
        )

    before = db.fingerprint()
    verdict(False, graphs=False)
    assert db.fingerprint() != before  # compiled graphs decided before the verdict are not reused
    verdict(True, graphs=True)
    got = db.verdict(p.key, H200, NOW, cuda_graphs=False)
    assert got is not None and not got.keep and got.context == "gpt2 8x256x768"
    assert "per call" in got.describe() and "1 ms with the template" in got.describe()
    assert db.verdict(p.key, H200, NOW, cuda_graphs=True).keep
    assert db.verdict(p.key, H200, OLD, cuda_graphs=False) is None
    assert db.verdict(p.key, DeviceInfo("NVIDIA H100", "9.0", 132), NOW, cuda_graphs=False) is None
    verdict(True, graphs=False, with_ms=0.9)  # measured again: replaced, not added
    got = db.verdict(p.key, H200, NOW, cuda_graphs=False)
    assert got.keep and got.with_ms == 0.9
    with pytest.raises(ValueError, match="with_ms"):
        db.record_verdict(
            p, H200, cuda_graphs=False, keep=True, with_ms=float("nan"), without_ms=1.0,
            context="m", timing_method="model", versions=NOW,
        )  # fmt: skip
    assert db.prune_stale(lambda problem_json: False) >= 1
    assert db.verdict(p.key, H200, NOW, cuda_graphs=False) is None


def test_nearest_records_come_by_the_callers_distance(db):
    target = problem(m=1024, n=4096, k=4096)
    near, far = problem(m=2048, n=4096, k=4096), problem(m=1024, n=16384, k=4096)
    other_version = problem(m=1024, n=4096, k=2048, template_hash_="0" * 64)
    for p, ms in ((near, 0.5), (far, 0.4), (other_version, 0.1)):
        ok(db, p, ms, cfg())
        ok(db, p, ms * 2, cfg(64, 64, 64))
    ok(db, target, 0.3, cfg(), device=DeviceInfo("NVIDIA H100", "9.0", 132))  # another device

    def dist(text: str) -> float:
        s = json.loads(text)["shape"]
        return abs(s["m"] - 1024) / 1024 + abs(s["n"] - 4096) / 4096 + abs(s["k"] - 4096) / 4096

    found = db.nearest(target, H200, dist)
    assert [h.distance for h in found] == [1.0, 3.0] and found[0].via == "transfer"
    assert found[0].record.median_ms == 0.5 and found[0].record.config == cfg()  # each problem's best
    assert json.loads(found[0].source_json)["shape"]["m"] == 2048
    assert [h.distance for h in db.nearest(target, H200, dist, within=2.0)] == [1.0]
    assert db.nearest(target, H200, lambda text: None) == []
