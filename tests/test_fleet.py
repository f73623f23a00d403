"""Many workers, one work list: leases in the database (db/leases.py), the study made
whole after a killed runner (search.adopt), and ``epilab tune`` processes started
together on one database, one of them killed with SIGKILL, one interrupted with Ctrl-C,
one whose device disappears (tuner/fleet.py).

Every test runs on an SQLite file; with ``EPILAB_TEST_POSTGRES_URL`` set (CI starts a
server) on PostgreSQL too. The processes tune in Triton's interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from epilab.cli import app
from epilab.db import INTERPRETER_DEVICE, TuningDB, Versions
from epilab.db import engine as db_engine
from epilab.db.leases import LeaseBoard, fleet_status
from epilab.db.models import LeaseRecord, WorkerRecord
from epilab.ir.config import Config
from epilab.policy.suites import load_shapes
from epilab.templates.registry import twins
from epilab.tuner.fleet import parse_devices
from epilab.tuner.fleet_worker import FleetOptions
from epilab.tuner.search import STATUS_ATTR, Budget, Outcome, adopt, make_study, search

NOW = Versions("2.11.0", "3.6.0")
TRIALS = 4


def _problems(count: int) -> list[dict]:
    """``count`` small matmul problems of a shapes file, none alike and none with a twin
    (a GEMV-shaped problem would be tuned as a second problem too)."""
    return [{"m": 24 + 8 * i, "n": 24, "k": 16, "dtype": "float32", "epilogue": "none"} for i in range(count)]


def _shapes_file(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "shapes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _problems(count)))
    return path


def _work(tmp_path: Path, count: int) -> list:
    work = [(spec.label(), spec.problem()) for spec in load_shapes(str(_shapes_file(tmp_path, count)))]
    assert all(twins(p) == [p] for _, p in work)
    return work


def _board(target: str, items: list, *, ttl: float = 60.0, trials: int = TRIALS) -> LeaseBoard:
    board = LeaseBoard(TuningDB.open(target), INTERPRETER_DEVICE, NOW, ttl_s=ttl)
    board.enqueue(items, trials=trials)
    return board


# ------------------------------------------------------------------ leases


def test_each_problem_is_leased_to_one_worker_and_a_held_one_is_waited_for(db_target, tmp_path):
    items = _work(tmp_path, 3)
    a, b = _board(db_target, items), _board(db_target, items)
    taken = [a.take("a"), b.take("b"), a.take("a")]
    assert sorted(lease.key for lease in taken) == sorted(p.key for _, p in items)
    assert all(lease.attempts == 1 and not lease.taken_over for lease in taken)
    assert a.take("a") is None and b.take("b") is None
    assert 0 < a.held_elsewhere("a") <= 60  # b holds one: a waits to take it over if b dies
    assert b.finish(taken[1], "b", "done")
    assert a.held_elsewhere("a") is None  # a holds the rest itself
    assert not b.finish(taken[0], "b", "done")  # not b's to finish
    for lease in (taken[0], taken[2]):
        assert a.finish(lease, "a", "done")
    assert b.held_elsewhere("b") is None
    assert fleet_status(a.db).counts == {"done": 3}


def test_an_expired_lease_is_taken_over_and_its_old_holder_loses_it(db_target, tmp_path):
    items = _work(tmp_path, 1)
    a, b = _board(db_target, items, ttl=0.5), _board(db_target, items, ttl=0.5)
    first = a.take("a")
    assert first is not None and b.take("b") is None
    assert a.renew("a", first)
    time.sleep(0.8)  # a stopped renewing (killed, or stalled)
    second = b.take("b")
    assert second is not None and second.key == first.key
    assert second.attempts == 2 and second.taken_over and second.previous_owner == "a"
    assert not a.renew("a", first)  # a learns it lost the lease ...
    assert not a.finish(first, "a", "done")  # ... and cannot end it
    assert b.finish(second, "b", "done")


def test_a_renewal_stopped_before_its_commit_is_ended_and_the_lease_taken_over(
    pg_target, tmp_path, monkeypatch
):
    """A worker stopped between its renewal's UPDATE and the commit held the lease row's lock
    for ever: every other worker skipped the row and waited (the likely cause of the SIGSTOP
    test below hanging for 600 s in CI once). The server ends the stalled session; its owner's
    commit fails, and it has lost the lease."""
    items = _work(tmp_path, 1)
    a, b = _board(pg_target, items, ttl=0.5), _board(pg_target, items, ttl=0.5)
    # Only a's sessions get the short timeout, and only once the boards are open: opening
    # (schema checks between statements) on a loaded 2-core CI host idled past 1 s once.
    monkeypatch.setattr(db_engine, "STALLED_TRANSACTION_MS", 1000)
    a.db.engine.dispose()  # a's next connections are made with the short timeout
    first = a.take("a")
    stalled = a.db.session(write=True)
    session = stalled.__enter__()
    session.execute(
        sa.update(LeaseRecord).where(a._held(first, "a")).values(expires_at=sa.func.now())
    )  # the row is locked until a commit that does not come
    deadline = time.monotonic() + 30
    while (second := b.take("b")) is None:
        assert time.monotonic() < deadline, "the stalled transaction still locks the lease"
        time.sleep(0.2)
    assert second.taken_over and second.previous_owner == "a"
    with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction"):
        stalled.__exit__(None, None, None)
    assert not a.renew("a", first)
    assert b.finish(second, "b", "done")
    with a.db.optuna_storage().engine.connect() as conn:  # optuna's sessions, in the same database
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "1s"


def test_released_failed_and_smaller_budget_leases_open_again(db_target, tmp_path):
    items = _work(tmp_path, 3)
    board = _board(db_target, items)
    leases = [board.take("a") for _ in items]
    board.release(leases[0], "a", "interrupted")
    board.finish(leases[1], "a", "failed", "a bug")
    board.finish(leases[2], "a", "done")
    assert board.take("b").key == leases[0].key  # given back: taken at once
    assert board.take("b") is None  # the failed one waits for the next command
    again = _board(db_target, items)  # the next command, same budget
    assert again.take("c").key == leases[1].key
    assert again.take("c") is None  # done for this budget
    more = _board(db_target, items, trials=TRIALS + 4)  # a larger budget opens the done one
    assert more.take("d").key == leases[2].key


def _families(tmp_path: Path, order: str, n: int = 24) -> tuple[list, dict[str, str]]:
    """Problems of two families (A: no epilogue, B: relu), m 24 and 32 each, listed in ``order``
    ("A1 A2 B1 B2"); returns the work and the name of each key."""
    rows = {
        f"{f}{i}": {"m": 16 + 8 * i, "n": n, "k": 16, "dtype": "float32", "epilogue": ep}
        for f, ep in (("A", "none"), ("B", "relu(acc)"))
        for i in (1, 2)
    }
    path = tmp_path / "families.jsonl"
    path.write_text("".join(json.dumps(rows[name]) + "\n" for name in order.split()))
    work = [(spec.label(), spec.problem()) for spec in load_shapes(str(path))]
    return work, {p.key: name for name, (_, p) in zip(order.split(), work, strict=True)}


def test_a_worker_takes_its_family_next_and_leaves_a_family_another_is_tuning(db_target, tmp_path):
    """Problems that differ only in size build the same kernels: two workers tuning two of them
    at once each built them (db/leases.py's module doc)."""
    items, name = _families(tmp_path, "A1 A2 B1 B2")
    a, b = _board(db_target, items), _board(db_target, items)
    first = a.take("a")
    assert name[first.key] == "A1"
    other = b.take("b")
    assert name[other.key] == "B1"  # not A2: a is tuning family A
    a.finish(first, "a", "done")
    second = a.take("a", after=first.key)
    assert name[second.key] == "A2"
    b.finish(other, "b", "done")
    assert name[b.take("b", after=other.key).key] == "B2"
    a.finish(second, "a", "done")
    assert a.take("a", after=second.key) is None

    items, name = _families(tmp_path, "A1 B1 A2", n=32)
    solo, last, order = _board(db_target, items), None, []
    while (lease := solo.take("solo", after=last)) is not None:
        order.append(name[lease.key])
        solo.finish(lease, "solo", "done")
        last = lease.key
    assert order == ["A1", "A2", "B1"]  # its family first, then the list's order

    items, name = _families(tmp_path, "B1 B2", n=40)  # one family: the second worker still works
    c, d = _board(db_target, items), _board(db_target, items)
    assert {name[c.take("c").key], name[d.take("d").key]} == {"B1", "B2"}


def test_workers_racing_for_leases_take_each_problem_once(db_target, tmp_path):
    items = _work(tmp_path, 24)
    boards = [_board(db_target, items) for _ in range(4)]
    taken: list[tuple[str, str]] = []
    lock = threading.Lock()

    def take_all(board: LeaseBoard, name: str) -> None:
        while (lease := board.take(name)) is not None:
            with lock:
                taken.append((lease.key, name))
            board.finish(lease, name, "done")

    threads = [threading.Thread(target=take_all, args=(b, f"w{i}")) for i, b in enumerate(boards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    keys = Counter(key for key, _ in taken)
    assert len(keys) == 24 and set(keys.values()) == {1}, keys
    assert fleet_status(boards[0].db).counts == {"done": 24}


def test_lease_time_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="lease time must be positive"):
        LeaseBoard(TuningDB.open(tmp_path / "x.db"), INTERPRETER_DEVICE, NOW, ttl_s=0)


@pytest.mark.parametrize("ttl", [1e9, 1e12, float("inf")])
def test_lease_time_is_at_most_a_day(ttl):
    """A killed worker's problem waited out its lease: 31 years at 1e9 s (and 1e11 s killed
    the heartbeat thread, inf and 1e12 failed after the database was made)."""
    with pytest.raises(ValueError, match="at most 86400 s"):
        FleetOptions(lease_ttl_s=ttl)
    out = CliRunner().invoke(app, ["tune", "--suite", "small", "--interpret", "--lease-ttl", str(ttl)])
    assert out.exit_code == 2 and "--lease-ttl" in out.output


def test_interpreter_workers_are_at_most_one_a_cpu_core():
    from epilab.tuner.work import tune_devices

    _, fleet = tune_devices("cuda:0", "all", 60.0, True)
    assert len(fleet.devices) == max(1, os.cpu_count() or 1)  # not 64 on a 2-core machine


def test_a_worker_says_what_it_waits_for(db_target, tmp_path):
    """The rest of the list leased to a worker that no longer renews: this one says so, waits
    out the lease, takes the problem over and tunes it."""
    import torch
    import triton

    from epilab.tuner.fleet import run_fleet
    from epilab.tuner.tune import TuneOptions

    items = _work(tmp_path, 1)
    gone = LeaseBoard(
        TuningDB.open(db_target),
        INTERPRETER_DEVICE,
        Versions(torch.__version__, triton.__version__),
        ttl_s=600.0,
    )
    gone.enqueue(items, trials=1)
    lease = gone.take("gone")
    assert lease is not None  # and renewed once more only, just before its worker was killed
    events = []

    def listen(event):  # the lease runs out once this worker has said it waits: no race with
        events.append(event)  # a slow start (a 2 s lease ran out first on a loaded CI machine)
        if event.what == "waiting":
            gone.ttl = timedelta(milliseconds=1)
            assert gone.renew("gone", lease)

    options = TuneOptions(budget=Budget(trials=1, batch=1), interpret=True, jobs=0, baselines=(), warm=False)
    with TuningDB.open(db_target) as db:
        report = run_fleet(
            db, items, options, FleetOptions(lease_ttl_s=2.0, poll_s=0.2), trials=1, listener=listen
        )
    waiting = [e for e in events if e.what == "waiting"]
    assert len(waiting) == 1 and "leased to other workers" in waiting[0].detail, events
    assert [r.key for r in report.results] == [items[0][1].key]


@pytest.mark.parametrize(
    ("text", "count", "want"),
    [("all", 3, (0, 1, 2)), ("0,2", 3, (0, 2)), ("cuda:1", 2, (1,)), (" 1 , 0 ", 2, (1, 0))],
)
def test_devices_are_parsed(text, count, want):
    assert parse_devices(text, count) == want


@pytest.mark.parametrize(
    ("text", "count", "error"),
    [
        ("0,0", 2, "named twice"),
        ("3", 2, "does not exist"),
        ("gpu0", 2, "device indices"),
        ("\u00b2", 2, "device indices"),  # a superscript two: a digit to str.isdigit, not to int
        ("all", 0, "no CUDA"),
    ],
)
def test_bad_devices_are_explained(text, count, error):
    with pytest.raises(ValueError, match=error):
        parse_devices(text, count)


# ------------------------------------------------------------------ a study made whole

SPACE = {"BLOCK_M": (16, 32, 64), "BLOCK_N": (16, 32), "num_warps": (4, 8)}


def _config(bm: int, bn: int, w: int) -> Config:
    return Config(bm, bn, 16, num_warps=w)


def test_adopt_fails_a_dead_runners_trials_and_adopts_recorded_ones(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = {"BLOCK_M": (16, 32, 64), "BLOCK_N": (16, 32), "BLOCK_K": (16,), "num_warps": (4, 8)}
    study = make_study("s", storage, restart=False)
    study.ask()  # a runner asked and was killed before telling
    recorded = {
        Config(32, 16, 16, num_warps=8): Outcome("ok", 0.5),
        Config(64, 32, 16, num_warps=4): Outcome("incorrect"),
    }
    stale, adopted = adopt(study, space, recorded, lambda name, chosen: True)
    assert (stale, adopted) == (1, 2)
    states = Counter(t.state for t in study.trials)
    assert states == {optuna.trial.TrialState.FAIL: 1, optuna.trial.TrialState.COMPLETE: 2}
    assert adopt(study, space, recorded, lambda name, chosen: True) == (0, 0)  # nothing twice
    evaluated: list[Config] = []

    def evaluate(configs):
        for c in configs:
            evaluated.append(c)
            yield Outcome("ok", 1.0 + c.BLOCK_M / 100)

    result = search(
        study,
        space,
        evaluate=evaluate,
        infeasible=lambda c: None,
        budget=Budget(trials=5, seconds=60, patience=50, batch=2),
        applies=lambda name, chosen: True,
    )
    assert not set(evaluated) & set(recorded)  # adopted: never measured again
    assert result.evaluated == 5 and len(evaluated) == 3  # and counted against the budget
    assert result.best == Config(32, 16, 16, num_warps=8) and result.best_ms == pytest.approx(0.5)
    assert all(t.user_attrs.get(STATUS_ATTR) for t in study.trials if t.state.name == "COMPLETE")


# ------------------------------------------------------------------ processes

# Runs `epilab tune` with a hook in its candidate worker: every candidate task is logged
# (pid, problem, config) before it runs; MODE decides what else happens (see the tests).
DRIVER = textwrap.dedent("""
    import dataclasses, sys
    import epilab.tuner.work as work
    import epilab.tuner.worker as worker

    hook = (sys.argv[1], "hook")
    init, devices = worker.Worker.__init__, work.tune_devices

    def hooked(self, **kw):
        kw["hook"] = hook
        init(self, **kw)

    def fleet_hooked(*args, **kw):  # --devices: the hook travels to each device's process
        index, fleet = devices(*args, **kw)
        return index, dataclasses.replace(fleet, hook=hook, processes=True if len(fleet.devices) > 1 else None)

    worker.Worker.__init__ = hooked
    work.tune_devices = fleet_hooked
    from epilab.cli import app

    app(sys.argv[2:], prog_name="epilab")
""")

HOOK = textwrap.dedent("""
    import json, os, time
    LOG, MODE, MARK = {log!r}, {mode!r}, {mark!r}
    seen = [0]

    def hook(task):
        gone = MARK + ".gone"
        if MODE == "lose-device" and os.path.exists(gone):
            os._exit(3)  # every task, the probe too: the device is gone
        if task["job"] != "candidate":
            return
        if MODE == "bug":
            raise KeyError("a bug in the worker")
        seen[0] += 1
        with open(LOG, "a") as f:
            f.write(json.dumps([os.getpid(), json.loads(task["problem"])["shape"], task["config"]]) + "\\n")
        if seen[0] == 3 and MODE in ("hang", "slow", "cut"):
            try:  # the first worker process at its third trial (several with --devices)
                mark = os.open(MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(mark, f"{{os.getppid()}} {{os.getpid()}}".encode())  # its device process, itself
            os.close(mark)  # the trial under way: the test kills, pauses or interrupts now
            # "cut" waits for Ctrl-C: longer than a loaded host (tests in parallel) lets the test sleep
            time.sleep({{"hang": 60, "slow": 2, "cut": 30}}[MODE])
        if seen[0] == 3 and MODE == "lose-device":
            open(gone, "w").close()
            os._exit(3)
""")


def _start(tmp_path: Path, name: str, target: str, shapes: Path, mode: str, *extra: str) -> subprocess.Popen:
    hook = tmp_path / f"hook_{name}.py"
    hook.write_text(
        HOOK.format(log=str(tmp_path / "tasks.log"), mode=mode, mark=str(tmp_path / f"{name}.mark"))
    )
    args = ["tune", "--shapes", str(shapes), "--interpret", "--trials", str(TRIALS), "--patience", "100"]
    args += ["--time-budget", "600", "--db", target, "--lease-ttl", "8", "--json", *extra]
    env = {**os.environ, "EPILAB_INTERPRET": "1", "TRITON_INTERPRET": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(hook), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: killed with its worker
    )


def _wait_for(path: Path, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, [p.communicate()[1][-3000:] for p in dead]
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _tasks(tmp_path: Path) -> list[tuple[int, str, str]]:
    path = tmp_path / "tasks.log"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [
        (pid, json.dumps(shape, sort_keys=True), json.dumps(cfg, sort_keys=True)) for pid, shape, cfg in rows
    ]


def _records(target: str, work: list) -> dict[str, list]:
    with TuningDB.open(target) as db:
        return {p.key: db.records(p.key) for _, p in work}


def test_three_processes_share_a_list_and_one_killed_loses_only_its_trial(db_target, tmp_path):
    shapes = _shapes_file(tmp_path, 6)
    work = _work(tmp_path, 6)
    procs = [
        _start(tmp_path, n, db_target, shapes, m) for n, m in (("p1", "log"), ("p2", "log"), ("p3", "hang"))
    ]
    _wait_for(tmp_path / "p3.mark", procs)  # p3 is in the middle of its third trial
    os.killpg(procs[2].pid, signal.SIGKILL)
    procs[2].wait(timeout=30)
    done = [_finish(p) for p in procs[:2]]
    for rc, _, err in done:
        assert rc == 0, err[-3000:]
    tuned = [r["key"] for _, out, _ in done for r in json.loads(out)]
    assert sorted(tuned) == sorted(p.key for _, p in work)  # every problem once, by p1 or p2 ...
    with TuningDB.open(db_target) as db:
        status = fleet_status(db)
    assert status.counts == {"done": 6} and not status.active  # ... no lease stuck
    records = _records(db_target, work)
    assert all(
        len(r) == TRIALS and all(x.status == "ok" for x in r) for r in records.values()
    )  # no trial lost
    evaluations = Counter((shape, cfg) for _, shape, cfg in _tasks(tmp_path))
    twice = [k for k, n in evaluations.items() if n > 1]
    assert len(twice) <= 1, twice  # at most the trial p3 was killed in was measured again
    assert sum(evaluations.values()) <= 6 * TRIALS + 1
    assert sorted(w.state for w in status.workers) == ["finished", "finished", "running"]  # p3 never ended
    with TuningDB.open(db_target) as db, db.session() as session:
        attempts = sorted(session.scalars(sa.select(LeaseRecord.attempts)))
    assert attempts == [1, 1, 1, 1, 1, 2]  # p3's problem was taken over once


def test_ctrl_c_keeps_every_recorded_trial_and_the_same_command_resumes(db_target, tmp_path):
    shapes = _shapes_file(tmp_path, 2)
    work = _work(tmp_path, 2)
    proc = _start(tmp_path, "p1", db_target, shapes, "cut")
    _wait_for(tmp_path / "p1.mark", [proc])
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C in the middle of the third trial
    rc, _, err = _finish(proc)
    assert rc == 130, err[-3000:]
    assert "interrupted" in err
    before = _tasks(tmp_path)
    kept = _records(db_target, work)
    assert sum(len(r) for r in kept.values()) == 2  # the two trials finished, not the one cut off
    with TuningDB.open(db_target) as db:
        assert fleet_status(db).counts == {"pending": 2}  # given back, nothing stuck
    rc, out, err = _finish(_start(tmp_path, "p2", db_target, shapes, "log"))
    assert rc == 0, err[-3000:]
    assert len(json.loads(out)) == 2
    records = _records(db_target, work)
    assert all(len(r) == TRIALS for r in records.values())
    evaluations = Counter((shape, cfg) for _, shape, cfg in _tasks(tmp_path))
    assert sum(evaluations.values()) == len(before) + 2 * TRIALS - 2  # only the cut-off trial again
    assert max(evaluations.values()) <= 2


def test_a_worker_paused_past_its_lease_drops_its_trial_and_goes_on(db_target, tmp_path):
    """SIGSTOP in the middle of a trial, past the lease time: another worker takes the problem
    over and finishes it; resumed, the paused worker records nothing of the trial it was in
    (the budget holds: never TRIALS + 1 records) and ends cleanly (issue 38, item 5)."""
    shapes = _shapes_file(tmp_path, 2)
    work = _work(tmp_path, 2)
    paused = _start(tmp_path, "p1", db_target, shapes, "slow")
    _wait_for(tmp_path / "p1.mark", [paused])  # its third trial is under way
    os.killpg(paused.pid, signal.SIGSTOP)
    try:
        rc, _, err = _finish(_start(tmp_path, "p2", db_target, shapes, "log"))  # takes over after 8 s
        assert rc == 0, err[-3000:]
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    rc, _, err = _finish(paused)
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err and "lease lost" in err
    records = _records(db_target, work)
    assert [len(r) for r in records.values()] == [TRIALS, TRIALS], {k[:8]: len(r) for k, r in records.items()}
    with TuningDB.open(db_target) as db:
        assert fleet_status(db).counts == {"done": 2}


def test_a_worker_whose_device_disappears_stops_cleanly_and_its_problem_is_finished(db_target, tmp_path):
    shapes = _shapes_file(tmp_path, 2)
    work = _work(tmp_path, 2)
    rc, _, err = _finish(_start(tmp_path, "p1", db_target, shapes, "lose-device"))
    assert rc == 1, err[-3000:]
    assert "every device of this process was lost" in err and "Traceback" not in err
    records = _records(db_target, work)
    assert sum(len(r) for r in records.values()) == 2  # the trial the device died in is not recorded
    assert all(x.status == "ok" for r in records.values() for x in r)
    with TuningDB.open(db_target) as db:
        status = fleet_status(db)
    assert status.counts == {"pending": 2}
    assert [w.state for w in status.workers] == ["lost"]
    rc, _, err = _finish(_start(tmp_path, "p2", db_target, shapes, "log"))
    assert rc == 0, err[-3000:]
    assert all(len(r) == TRIALS for r in _records(db_target, work).values())


def test_tune_status_shows_the_work(tmp_path):
    target = str(tmp_path / "t.db")
    work = _work(tmp_path, 3)
    board = _board(target, work)
    held = board.take("host:1:cuda:0")
    board.register("host:1:cuda:0", "cuda:0")
    failed = board.take("host:1:cuda:0")
    board.finish(failed, "host:1:cuda:0", "failed", "Traceback ...\nTuningBug: boom")
    result = CliRunner().invoke(app, ["tune", "status", "--db", target])
    assert result.exit_code == 0, result.output
    assert "1 pending, 1 leased, 0 done, 1 failed" in result.output
    assert held is not None and work[0][0] in result.output
    assert "TuningBug: boom" in result.output and "host:1:cuda:0" in result.output
    data = json.loads(CliRunner().invoke(app, ["tune", "status", "--db", target, "--json"]).output)
    assert data["counts"] == {"leased": 1, "failed": 1, "pending": 1}
    assert data["workers"][0]["state"] == "running"
    board.register("old:2:cuda:0", "cuda:0")  # a worker that ended two days ago is counted, not listed
    board.beat("old:2:cuda:0", problems=1, trials=4, state="finished")
    with board.db.session(write=True) as session:
        session.execute(
            sa.update(WorkerRecord)
            .where(WorkerRecord.name == "old:2:cuda:0")
            .values(heartbeat_at=datetime.now(timezone.utc) - timedelta(days=2))
        )
    status = fleet_status(board.db)
    assert status.older_workers == 1 and [w.name for w in status.workers] == ["host:1:cuda:0"]


def test_a_finished_list_is_skipped_a_larger_budget_resumes_and_restart_starts_over(tmp_path):
    shapes = str(_shapes_file(tmp_path, 1))
    target = str(tmp_path / "t.db")
    base = ["tune", "--shapes", shapes, "--interpret", "--patience", "100", "--db", target, "--json"]

    def tune(*extra: str) -> list[dict]:
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    first = tune("--trials", "2")
    assert [(r["trials"], r["new_trials"]) for r in first] == [(2, 2)]
    assert tune("--trials", "2") == []  # done for this budget: nothing to do
    assert [(r["trials"], r["new_trials"]) for r in tune("--trials", "3")] == [(3, 1)]  # resumed
    assert [(r["trials"], r["new_trials"]) for r in tune("--trials", "3", "--restart")] == [(3, 3)]


def test_a_bug_fails_its_problem_and_stops_with_a_traceback(tmp_path):
    target = str(tmp_path / "t.db")
    rc, _, err = _finish(_start(tmp_path, "p1", target, _shapes_file(tmp_path, 2), "bug"))
    assert rc == 1 and "TuningBug" in err and "a bug in the worker" in err
    with TuningDB.open(target) as db:
        status = fleet_status(db)
    assert status.counts == {"failed": 1, "pending": 1}  # nothing left leased
    assert "a bug in the worker" in status.failed[0].detail
    assert [w.state for w in status.workers] == ["failed"]


# ------------------------------------------------------------------ a process a device


def test_workers_are_processes_from_three_devices_up_or_as_asked():
    from epilab.tuner.fleet_process import in_processes

    assert not in_processes(FleetOptions(devices=(0,)))
    assert not in_processes(FleetOptions(devices=(0, 1)))
    assert in_processes(FleetOptions(devices=(0, 1, 2)))
    assert in_processes(FleetOptions(devices=(0, 1), processes=True))
    assert not in_processes(FleetOptions(devices=(0, 1, 2, 3), processes=False))
    assert not in_processes(FleetOptions(devices=(0,), processes=True))


def test_several_devices_are_processes_of_their_own_that_share_the_list(db_target, tmp_path):
    """``run_fleet`` with two devices: each worker a spawned process (its own interpreter lock),
    every problem tuned once, the workers' events brought to this process's listener."""
    from epilab.tuner.fleet import run_fleet
    from epilab.tuner.fleet_process import close_devices_early, start_devices_early
    from epilab.tuner.tune import TuneOptions

    work = _work(tmp_path, 4)
    options = TuneOptions(budget=Budget(trials=2, batch=1), interpret=True, jobs=0, baselines=(), warm=False)
    events = []
    unused = start_devices_early((0, 1, 2), interpret=True)
    assert start_devices_early((0, 1, 2), interpret=True) == unused  # started once
    close_devices_early()  # never given work: they end
    for pid in unused:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    early = start_devices_early((0, 1), interpret=True)  # as `epilab tune --devices 0,1` does first
    with TuningDB.open(db_target) as db:
        report = run_fleet(
            db,
            work,
            options,
            FleetOptions(devices=(0, 1), poll_s=0.5, processes=True),
            trials=2,
            listener=events.append,
        )
        status = fleet_status(db)
    pids = [int(w.name.split(":")[1]) for w in report.workers]
    assert pids == early and os.getpid() not in pids  # a process each, those started early
    assert [w.state for w in report.workers] == ["finished", "finished"] and not report.interrupted
    assert sorted(r.key for r in report.results) == sorted(p.key for _, p in work)  # each once
    assert status.counts == {"done": 4}
    ends = [e for e in events if e.what == "end"]
    assert sorted(e.key for e in ends) == sorted(p.key for _, p in work)
    assert all(e.result is not None and e.result.evaluated == 2 for e in ends)
    assert {e.worker for e in events if e.what == "start"} <= {"interpreter:0", "interpreter:1"}


def test_devices_in_processes_stop_on_ctrl_c_and_survive_a_killed_one(db_target, tmp_path):
    """``epilab tune --devices 0,1``: Ctrl-C (SIGINT to the whole process group, as a terminal
    sends it) stops both device processes, the trial under way unrecorded and every lease given
    back; the same command resumes, and when one device's process is killed the other takes
    its problem over once its lease runs out (8 s)."""
    shapes = _shapes_file(tmp_path, 3)
    work = _work(tmp_path, 3)
    proc = _start(tmp_path, "p1", db_target, shapes, "cut", "--devices", "0,1")
    _wait_for(tmp_path / "p1.mark", [proc])
    os.killpg(proc.pid, signal.SIGINT)
    rc, _, err = _finish(proc)
    assert rc == 130 and "interrupted" in err, err[-3000:]
    with TuningDB.open(db_target) as db:
        assert fleet_status(db).counts == {"pending": 3}  # given back by both processes
    kept = sum(len(r) for r in _records(db_target, work).values())
    assert kept < 3 * TRIALS  # the cut trial is not among them

    proc = _start(tmp_path, "p2", db_target, shapes, "hang", "--devices", "0,1")
    _wait_for(tmp_path / "p2.mark", [proc])
    device_process, its_worker = map(int, (tmp_path / "p2.mark").read_text().split())
    os.kill(device_process, signal.SIGKILL)
    os.kill(its_worker, signal.SIGKILL)
    rc, out, err = _finish(proc)
    assert rc == 0, err[-3000:]
    assert "exit code -9" in err  # the killed device's worker is said to be lost
    assert sorted(r["key"] for r in json.loads(out)) == sorted(p.key for _, p in work)
    assert all(
        len(r) == TRIALS and all(x.status == "ok" for x in r) for r in _records(db_target, work).values()
    )
    with TuningDB.open(db_target) as db:
        assert fleet_status(db).counts == {"done": 3}
