"""Tuning one work list with many workers: GPUs of one host, processes, hosts.

``run_fleet`` starts one worker thread per device of this process (``epilab tune
--devices 0,1``), each with its own ``Tuner``: a GPU worker process and a compile pool
of ``options.jobs`` processes (per device: size it to the host's cores).
Every worker, in this process or another one pointed at the same database, takes
problems from the database's leases (``db/leases.py``): the database is the queue, so
three processes on one host or eight hosts on one PostgreSQL server share the list the
same way, and each problem is tuned once per device model and versions.

A worker renews its lease from a heartbeat thread every third of the lease time. If
it is killed, its lease expires and the next free worker takes the problem over: the
study is made whole first (``search.adopt``: the dead runner's unfinished trials are
failed, trials recorded but not told are adopted), so at most the trial under way is
lost. A worker whose device stops answering gives its lease back and stops; the
others go on. Ctrl-C cancels every worker at once: the trials under way are dropped
(nothing half-measured is recorded), leases are given back, and the same command
resumes. A worker with nothing left to take waits while other workers hold problems of
its list, so that it takes over theirs if they die; it ends when every problem of the
list is finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from epilab.config import MAX_LEASE_TTL_S
from epilab.db import TuningDB
from epilab.db.leases import Lease, LeaseBoard, worker_name
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.tuner.progress import duration
from epilab.tuner.search import Outcome, TakenOver
from epilab.tuner.tune import DeviceLost, ProblemResult, TuneOptions, Tuner
from epilab.tuner.worker import Cancelled

LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class FleetOptions:
    devices: tuple[int, ...] = (0,)  # CUDA device indices (interpreter workers when interpreting)
    lease_ttl_s: float = 60.0  # a lease not renewed for this long is taken over
    poll_s: float = 5.0  # how often an idle worker looks for a problem it can take
    hook: tuple[str, str] | None = None  # passed to each Tuner's worker (tests)

    def __post_init__(self) -> None:
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices must be distinct device indices, got {self.devices}")
        if not self.lease_ttl_s > 0 or not self.poll_s > 0:
            raise ValueError("the lease time and the poll interval must be positive")
        if not self.lease_ttl_s <= MAX_LEASE_TTL_S:
            raise ValueError(
                f"the lease time must be at most {MAX_LEASE_TTL_S:.0f} s (a day), got "
                f"{self.lease_ttl_s!r:.20}: a killed worker's problems would wait that long for another"
            )


@dataclass(frozen=True)
class Event:
    """What a worker tells the caller's progress display (from the worker's thread)."""

    what: str  # start, trial, end, waiting (for others' leases), stopped
    worker: str  # the device label: cuda:1
    label: str = ""
    key: str = ""
    done: int = 0  # trials of the problem so far
    best_ms: float | None = None
    result: ProblemResult | None = None
    detail: str | None = None  # why a worker stopped; "taken over" on a start


@dataclass
class WorkerReport:
    name: str
    device_label: str
    state: str = "running"  # finished, interrupted, lost, failed
    results: list[ProblemResult] = field(default_factory=list)
    taken_over: int = 0  # problems it took from a worker that had stopped renewing them
    detail: str | None = None
    error: BaseException | None = None  # a bug, raised again by run_fleet's caller


@dataclass(frozen=True)
class FleetReport:
    workers: list[WorkerReport]
    interrupted: bool
    seconds: float

    @property
    def results(self) -> list[ProblemResult]:
        return [r for w in self.workers for r in w.results]


Listener = Callable[[Event], None]


class FleetWorker:
    """One device's lease loop (see the module doc); ``run`` is the thread's body."""

    def __init__(
        self,
        tuner: Tuner,
        board: LeaseBoard,
        work: dict[str, tuple[str, Problem]],
        *,
        stop: threading.Event,
        changed: threading.Condition,
        listener: Listener,
        poll_s: float,
    ) -> None:
        self.tuner = tuner
        self.board = board
        self.work = work
        self.stop = stop
        self.changed = changed  # notified when a worker of this process ends or gives back a lease
        self.listener = listener
        self.poll_s = poll_s
        self.name = worker_name(tuner.device_label)
        self.report = WorkerReport(self.name, tuner.device_label)
        self._last: str | None = None  # the key of the problem it tuned last (the board prefers its family)
        self._lease: Lease | None = None
        self._lost: Lease | None = None
        self._lock = threading.Lock()
        self.ended = threading.Event()  # set when run() has ended, its lease given back or finished

    def run(self) -> None:
        self.board.register(self.name, self.tuner.device_label)
        beating = threading.Event()
        heart = threading.Thread(
            target=self._heartbeat, args=(beating,), daemon=True, name=f"{self.name} beat"
        )
        heart.start()
        try:
            self._loop()
            if self.report.state == "running":
                self.report.state = "interrupted" if self.stop.is_set() else "finished"
        except BaseException as e:  # a bug (its lease is marked failed): the caller raises it
            self.report.state, self.report.error = "failed", e
            self.report.detail = traceback.format_exc()[-1500:]
        finally:
            beating.set()
            heart.join(timeout=10)
            with contextlib.suppress(Exception):  # the row's last word; the database may be gone
                self._beat()
            try:
                self.listener(Event("stopped", self.tuner.device_label, detail=self.report.detail))
            finally:
                self.ended.set()

    def _loop(self) -> None:
        waiting = False
        while not self.stop.is_set():
            lease = self.board.take(self.name, after=self._last)
            if lease is None:
                wait = self.board.held_elsewhere(self.name)
                if wait is None:
                    return  # every problem of the list is finished
                if not waiting:  # said once a wait, not on every poll
                    waiting = True
                    soonest = "now" if wait <= 0 else f"in {duration(wait)}"
                    why = (
                        "the rest of the list is leased to other workers; the soonest lease ends "
                        f"{soonest} unless its worker renews it (then this worker takes it over)"
                    )
                    self.listener(Event("waiting", self.tuner.device_label, detail=why))
                with self.changed:  # woken at once by this process's workers, else polls for others'
                    if not self.stop.is_set():
                        self.changed.wait(min(max(wait, 0.2), self.poll_s))
                continue
            waiting = False
            with self._lock:
                self._lease, self._lost = lease, None
            self._last = lease.key
            try:
                if self.stop.is_set():
                    self.board.release(lease, self.name, "interrupted before it started")
                    return
                if not self._tune(lease):
                    return
            except BaseException:  # a bug: this problem failed; another run may try it again
                self.board.finish(lease, self.name, "failed", traceback.format_exc()[-1500:])
                raise
            finally:
                with self._lock:
                    self._lease = None
                with self.changed:
                    self.changed.notify_all()

    def _tune(self, lease: Lease) -> bool:
        """Tune the leased problem; False when this worker must stop (Ctrl-C, its device lost)."""
        label, problem = self.work[lease.key]
        device = self.tuner.device_label
        self.report.taken_over += lease.taken_over
        detail = f"taken over from {lease.previous_owner}" if lease.previous_owner else None
        self.listener(Event("start", device, label, lease.key, detail=detail))

        def on_trial(done: int, _config: Config, _outcome: Outcome, best_ms: float | None) -> None:
            self.listener(Event("trial", device, label, lease.key, done=done, best_ms=best_ms))

        try:
            result = self.tuner.tune_problem(
                problem,
                label,
                on_trial,
                exclusive=True,
                stop=self._lease_lost,
                holds=lambda: self._holds(lease),
                restart=self.tuner.options.restart and lease.attempts == 1,
                upcoming=self._after(lease.key),
            )
        except TakenOver as e:  # paused past the lease: the trial is dropped, the worker goes on
            self.listener(Event("end", device, label, lease.key, detail=f"{LEASE_LOST}: {e}"))
            return True
        except Cancelled:
            self.board.release(lease, self.name, "interrupted (Ctrl-C)")
            self.report.state = "interrupted"
            self.stop.set()
            return False
        except DeviceLost as e:
            self.board.release(lease, self.name, str(e))
            self.report.state, self.report.detail = "lost", str(e)
            return False
        if result.stopped_by == LEASE_LOST:  # another worker took it over: it finishes it
            self.listener(Event("end", device, label, lease.key, result=result, detail=LEASE_LOST))
            return True
        state = "refused" if result.refused is not None else "done"
        self.board.finish(lease, self.name, state, result.refused)
        self.report.results.append(result)
        self.listener(Event("end", device, label, lease.key, result=result))
        return True

    def _after(self, key: str, count: int = 1) -> list[Problem]:
        """The problems this worker likely tunes after ``key``, whose seeds compile meanwhile: the
        later ones of its family (the board gives it those first), else the next of the list."""
        keys = list(self.work)
        later = keys[keys.index(key) + 1 :] if key in self.work else []
        mine = self.board.family_of(key)
        same = [k for k in later if self.board.family_of(k) == mine]
        return [self.work[k][1] for k in (same or later)[:count]]

    def _holds(self, lease: Lease) -> bool:
        """Whether this worker still holds ``lease``, asked of the database before a trial is
        recorded (the heartbeat thread may not have run since a pause); renewing it if so."""
        try:
            held = self.board.renew(self.name, lease)
        except Exception:  # the database is unreachable for now: the heartbeat decides
            return True
        if not held:
            with self._lock:
                self._lost = lease
        return held

    def _lease_lost(self) -> str | None:
        with self._lock:
            return LEASE_LOST if self._lost is not None and self._lost == self._lease else None

    def _heartbeat(self, beating: threading.Event) -> None:
        while not beating.wait(self.board.ttl.total_seconds() / 3):
            with self._lock:
                lease = self._lease
            try:
                if not self.board.renew(self.name, lease):
                    with self._lock:
                        self._lost = lease
                self._beat()
            except Exception:  # the database is unreachable for now: try again next beat
                continue

    def _beat(self) -> None:
        self.board.beat(
            self.name,
            problems=len(self.report.results),
            trials=self.tuner.evaluated,
            state=self.report.state,
            detail=self.report.detail,
        )


def run_fleet(
    db: TuningDB,
    work: Sequence[tuple[str, Problem]],
    options: TuneOptions,
    fleet: FleetOptions,
    *,
    trials: int,
    listener: Listener = lambda event: None,
) -> FleetReport:
    """Tune ``work`` (label, problem) with one worker per device of ``fleet``, sharing the
    list with every other process pointed at ``db``; see the module doc. Ctrl-C here
    cancels the workers and returns a report marked interrupted."""
    started = time.monotonic()
    since = datetime.now(timezone.utc)
    tuners = [Tuner(db, dataclasses.replace(options, device_index=d), hook=fleet.hook) for d in fleet.devices]
    stop = threading.Event()
    changed = threading.Condition()
    interrupted = False
    workers: list[FleetWorker] = []
    try:
        device, versions = tuners[0].device, tuners[0].versions
        if any(t.device != device for t in tuners):
            raise ValueError(
                "--devices must name GPUs of one model: "
                + ", ".join(f"{t.device_label} is {t.device.name}" for t in tuners)
            )
        board = LeaseBoard(db, device, versions, ttl_s=fleet.lease_ttl_s)  # one per process: stateless
        board.enqueue(work, trials=trials, since=since)  # after this, its calls name their owner
        if options.restart:
            board.restart(since)
        by_key = {p.key: (label, p) for label, p in work}
        workers = [
            FleetWorker(t, board, by_key, stop=stop, changed=changed, listener=listener, poll_s=fleet.poll_s)
            for t in tuners
        ]
        threads = [threading.Thread(target=w.run, name=w.name, daemon=True) for w in workers]
        for th in threads:
            th.start()
        try:
            # Events, not Thread.join: a join interrupted by Ctrl-C can mark its thread dead
            # while it still runs (CPython gh-90882, up to 3.11), and the process then exited
            # before the workers gave their leases back (seen in CI: a lease left held).
            while not all(w.ended.is_set() for w in workers):
                for w in workers:
                    w.ended.wait(timeout=0.2)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            with changed:
                changed.notify_all()
            for t in tuners:
                t.cancel()
            for w in workers:  # each gives its lease back, then says it ended
                w.ended.wait(timeout=60)
    finally:  # at once: each GPU worker's exit (its CUDA context) takes about a second
        closing = [threading.Thread(target=t.close, name=f"close {t.device_label}") for t in tuners]
        for th in closing:
            th.start()
        for th in closing:
            th.join()
    interrupted = interrupted or any(w.report.state == "interrupted" for w in workers)
    return FleetReport([w.report for w in workers], interrupted, time.monotonic() - started)


def parse_devices(text: str, count: int) -> tuple[int, ...]:
    """``--devices``: 'all' (every one of ``count`` devices) or distinct indices '0,1,3'."""
    if text.strip() == "all":
        if count <= 0:
            raise ValueError("--devices all: this host has no CUDA device")
        return tuple(range(count))
    picked: list[int] = []
    for part in text.split(","):
        part = part.strip().removeprefix("cuda:")
        if not (part.isascii() and part.isdigit()):  # '²' is a digit to Python, not to int()
            raise ValueError(f"--devices {text!r}: give 'all' or device indices such as 0,1,3")
        index = int(part)
        if index >= count:
            raise ValueError(f"--devices {text!r}: device {index} does not exist ({count} device(s))")
        if index in picked:
            raise ValueError(f"--devices {text!r}: device {index} is named twice")
        picked.append(index)
    return tuple(picked)
