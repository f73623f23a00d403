"""One worker of a fleet (``fleet.py``): the lease loop of one device, with its heartbeat,
and the options, events and report it shares with the command that runs it, in a thread of
the command or in a process of its own (``fleet_process.py``)."""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from epilab.config import MAX_LEASE_TTL_S
from epilab.db.leases import Lease, LeaseBoard, worker_name
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.tuner.progress import duration
from epilab.tuner.search import Outcome, TakenOver
from epilab.tuner.tune import DeviceLost, ProblemResult, Tuner
from epilab.tuner.worker import Cancelled

LEASE_LOST = "lease lost"


@dataclass(frozen=True)
class FleetOptions:
    devices: tuple[int, ...] = (0,)  # CUDA device indices (interpreter workers when interpreting)
    lease_ttl_s: float = 60.0  # a lease not renewed for this long is taken over
    poll_s: float = 5.0  # how often an idle worker looks for a problem it can take
    hook: tuple[str, str] | None = None  # passed to each Tuner's worker (tests)
    # a process a device (tuner/fleet_process.py) or threads of this one; None: processes from
    # fleet_process.PROCESSES_FROM devices up
    processes: bool | None = None
    tuner: tuple[str, str] | None = None  # a Tuner stand-in's file and class (benchmarks/fleet_load.py)

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
