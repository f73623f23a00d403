"""A process a device for ``run_fleet`` (``epilab tune --devices 0,1,...``).

Each device's lease loop (``fleet.FleetWorker``) runs in a spawned process of its own, with
its own ``Tuner`` (its GPU worker and compile pool, as in a one-device run), its own
connection to the database and its own interpreter: the optuna sampler (~44 ms of Python a
trial) and the database work of one worker no longer wait on another's interpreter lock. In
one process a problem cost 2.65x one worker's at 4 workers and 5.83x at 8
(``benchmarks/fleet_load.py``, RESULTS.md 2026-12-07 (third)).

What the threads shared, the processes share through multiprocessing: ``stop`` (an Event:
Ctrl-C, or a worker cancelled) and ``changed`` (a Condition: a worker that ends or gives a
problem back wakes the waiting ones at once). Each worker's events come to the parent on one
queue, and the parent calls the listener with them from its own thread; a worker's report
comes last. The children ignore SIGINT (a terminal sends it to the whole group): the parent
sets ``stop``, each child cancels its tuner and gives its lease back. A child whose parent
dies stops the same way. A child that dies without a report is reported ``lost``: its lease
runs out and another worker takes the problem over, as after any killed worker.

The device processes start before their work is known (``start_devices_early``, from the
first lines of ``epilab tune --devices``): each starts its GPU worker (``worker.start_early``),
imports the tuner (torch among it) and waits for its work on a pipe, so that the command's
own imports, its database and its work list overlap theirs. This module imports no torch.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epilab.tuner.worker import _ignore_interrupts, _load_hook, close_early, main_not_reimported, start_early

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from epilab.db import TuningDB
    from epilab.tuner.fleet_worker import FleetOptions, WorkerReport
    from epilab.tuner.tune import TuneOptions

REPORT_WAIT_S = 60.0  # after Ctrl-C, how long a worker may take to give its lease back
DEAD_GRACE_S = 2.0  # a child found dead: how long its report may still be on its way


# Processes from 3 devices up (``FleetOptions.processes`` None). At 2 workers threads cost a
# problem 1.06-1.14x one worker's (RESULTS.md 2026-12-07 (fourth)) and processes were no faster
# on 2 GPUs (1.58x against 1.66x, 2026-11-28), while each process adds its own start-up to the
# command's fixed part, which caps 2 GPUs; at 4, threads cost 1.34-1.53x and processes 1.02-1.09x.
PROCESSES_FROM = 3


def in_processes(fleet: FleetOptions) -> bool:
    """Whether ``run_fleet`` runs a process a device: several devices, and processes asked for
    (or ``PROCESSES_FROM`` devices or more). Every database ``TuningDB`` opens is one other
    processes can open too (an in-memory SQLite is refused)."""
    wanted = len(fleet.devices) >= PROCESSES_FROM if fleet.processes is None else fleet.processes
    return wanted and len(fleet.devices) > 1


def tuner_class(fleet: FleetOptions) -> type:
    """The ``Tuner``, or the stand-in ``fleet.tuner`` names (a file and a class: benchmarks)."""
    if fleet.tuner is None:
        from epilab.tuner.tune import Tuner

        return Tuner
    return _load_hook(fleet.tuner)


@dataclass
class _Devices:
    """Device processes started, waiting for their work on ``inboxes``."""

    devices: tuple[int, ...]
    interpret: bool
    procs: list[Any]
    inboxes: list[Any]  # the parent's end of a pipe to each
    stop: Any  # multiprocessing Event
    changed: Any  # multiprocessing Condition
    events: Any  # multiprocessing Queue

    @classmethod
    def start(cls, devices: tuple[int, ...], interpret: bool) -> _Devices:
        ctx = mp.get_context("spawn")
        stop, changed, events = ctx.Event(), ctx.Condition(), ctx.Queue()
        pipes = [ctx.Pipe(duplex=False) for _ in devices]
        procs = [
            ctx.Process(
                target=_serve_device,
                args=(i, device, interpret, receive, stop, changed, events),
                name=f"epilab fleet {device}",
            )
            for i, (device, (receive, _)) in enumerate(zip(devices, pipes, strict=True))
        ]
        with main_not_reimported():
            for p in procs:
                p.start()
        for receive, _ in pipes:
            receive.close()
        return cls(devices, interpret, procs, [send for _, send in pipes], stop, changed, events)

    def close(self) -> None:
        """Tell processes that got no work to end (an empty message), and wait for them."""
        for inbox in self.inboxes:
            with contextlib.suppress(OSError):
                inbox.send_bytes(b"")
            inbox.close()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():  # it did not end after its report: its leases run out
                p.kill()
                p.join(timeout=5)


_EARLY: _Devices | None = None
_EARLY_LOCK = threading.Lock()


def start_early_for(devices: tuple[int, ...]) -> Callable[[], None]:
    """What ``epilab tune`` starts first for GPUs ``devices``: their GPU workers, or from
    ``PROCESSES_FROM`` GPUs up their device processes; returns what closes those nobody took."""
    if len(devices) < PROCESSES_FROM:
        start_early(devices)
        return close_early
    start_devices_early(devices)
    return close_devices_early


def start_devices_early(devices: tuple[int, ...], *, interpret: bool = False) -> list[int]:
    """Start the device processes of ``devices`` now (GPUs, or interpreter workers); their
    pids. ``run_processes`` gives them their work, ``close_devices_early`` ends them if it
    never does."""
    global _EARLY
    with _EARLY_LOCK:
        if _EARLY is None:
            _EARLY = _Devices.start(devices, interpret)
        return [p.pid for p in _EARLY.procs]


def close_devices_early() -> None:
    global _EARLY
    with _EARLY_LOCK:
        started, _EARLY = _EARLY, None
    if started is not None:
        started.close()


def _take_devices(devices: tuple[int, ...], interpret: bool) -> _Devices:
    """The processes started early for these devices, else new ones."""
    global _EARLY
    with _EARLY_LOCK:
        started, _EARLY = _EARLY, None
    if started is not None and (started.devices, started.interpret) == (devices, interpret):
        return started
    if started is not None:
        started.close()
    return _Devices.start(devices, interpret)


def run_processes(
    db: TuningDB,
    work: dict[str, Any],
    options: TuneOptions,
    fleet: FleetOptions,
    listener: Callable[[Any], None],
    *,
    trials: int,
    since: datetime,
) -> tuple[list[WorkerReport], bool]:
    """Run a ``FleetWorker`` in a process of its own for each device of ``fleet`` on the list
    the caller enqueued (each process's board reads it again: ``enqueue`` with the caller's
    ``trials`` and ``since`` adds nothing); their reports, in device order, and whether Ctrl-C
    stopped them."""
    started = _take_devices(fleet.devices, options.interpret)
    payload = pickle.dumps((db.storage_url, work, options, fleet, trials, since))
    for inbox in started.inboxes:
        inbox.send_bytes(payload)
    kind = "interpreter" if options.interpret else "cuda"
    parent = _Parent(started.procs, [f"{kind}:{d}" for d in fleet.devices], started.events, listener)
    interrupted = False
    try:
        try:
            parent.collect(deadline=None)
        except KeyboardInterrupt:
            interrupted = True
            started.stop.set()
            with started.changed:
                started.changed.notify_all()
            parent.collect(deadline=time.monotonic() + REPORT_WAIT_S)
    finally:
        started.close()
    return [parent.report(i) for i in range(len(started.procs))], interrupted


class _Parent:
    """The parent's side: the workers' events passed on, their reports kept."""

    def __init__(self, procs: list[Any], labels: list[str], events: Any, listener: Callable[[Any], None]):
        self.procs, self.labels, self.events, self.listener = procs, labels, events, listener
        self.reports: dict[int, WorkerReport] = {}
        self.finished: dict[int, list[Any]] = {i: [] for i in range(len(procs))}  # as its events told
        self._dead_since: dict[int, float] = {}

    def collect(self, *, deadline: float | None) -> None:
        """Pass the workers' events to the listener until every worker has reported (or died
        without a report: ``lost``), or the deadline passed."""
        while len(self.reports) < len(self.procs):
            if deadline is not None and time.monotonic() > deadline:
                return
            try:
                what, index, item = self.events.get(timeout=0.2)
            except queue.Empty:
                self._find_dead()
                continue
            if what == "report":
                self.reports[index] = item
                continue
            if item.what == "end" and item.result is not None and item.detail is None:
                self.finished[index].append(item.result)
            self.listener(item)

    def _find_dead(self) -> None:
        now = time.monotonic()
        for i, p in enumerate(self.procs):
            if i in self.reports or p.is_alive():
                continue
            if now - self._dead_since.setdefault(i, now) > DEAD_GRACE_S:  # its report is not on its way
                self.reports[i] = self.report(i)
                self.listener(_stopped(self.labels[i], self.reports[i].detail))

    def report(self, index: int) -> WorkerReport:
        """The worker's own report, or one saying it was lost, with the problems it finished."""
        if index in self.reports:
            return self.reports[index]
        from epilab.tuner.fleet_worker import WorkerReport

        proc, label = self.procs[index], self.labels[index]
        why = f"its process ended (exit code {proc.exitcode}) before it reported; its problem is taken over"
        name = f"{socket.gethostname()}:{proc.pid}:{label}"
        return WorkerReport(name, label, state="lost", results=self.finished[index], detail=why)


def _stopped(label: str, detail: str | None) -> Any:
    from epilab.tuner.fleet_worker import Event

    return Event("stopped", label, detail=detail)


def _serve_device(
    index: int, device: int, interpret: bool, inbox: Any, stop: Any, changed: Any, events: Any
) -> None:
    """A child's body: its GPU worker started and the tuner imported, then one device's lease
    loop on the work that comes on ``inbox``, its events and report sent to the parent."""
    _ignore_interrupts()
    start_early((-1 if interpret else device,))  # its imports overlap this process's
    import dataclasses

    from epilab.db import TuningDB
    from epilab.db.leases import LeaseBoard, worker_name
    from epilab.tuner.fleet_worker import FleetWorker, WorkerReport

    try:
        payload = inbox.recv_bytes()
    except EOFError:  # the parent is gone
        payload = b""
    if not payload:
        close_early()
        return
    url, work, options, fleet, trials, since = pickle.loads(payload)
    label = f"{'interpreter' if interpret else 'cuda'}:{device}"
    report = WorkerReport(worker_name(label), label, state="failed")
    tuner = None
    try:
        with TuningDB.open(url) as db:
            tuner = tuner_class(fleet)(db, dataclasses.replace(options, device_index=device), hook=fleet.hook)
            board = LeaseBoard(db, tuner.device, tuner.versions, ttl_s=fleet.lease_ttl_s)
            board.enqueue(list(work.values()), trials=trials, since=since)
            worker = FleetWorker(
                tuner,
                board,
                work,
                stop=stop,
                changed=changed,
                listener=lambda e: events.put(("event", index, e)),
                poll_s=fleet.poll_s,
            )
            watcher = threading.Thread(target=_cancel_on_stop, args=(stop, worker, tuner), daemon=True)
            watcher.start()
            worker.run()
            report = worker.report
    except BaseException as e:  # before its loop ran (the database, the device): a bug's report
        report.error, report.detail = e, traceback.format_exc()[-1500:]
    finally:
        if tuner is not None:
            with contextlib.suppress(Exception):
                tuner.close()
        close_early()  # a worker its tuner did not take (a hook asked for another)
    events.put(("report", index, _picklable(report)))
    events.close()
    events.join_thread()


def _cancel_on_stop(stop: Any, worker: Any, tuner: Any) -> None:
    """Cancel the tuner once ``stop`` is set (Ctrl-C in the parent, another worker cancelled)
    or the parent is gone, unless the worker has ended."""
    parent = os.getppid()
    while not worker.ended.is_set():
        if stop.wait(0.2) or os.getppid() != parent:
            stop.set()
            tuner.cancel()
            return


def _picklable(report: WorkerReport) -> WorkerReport:
    """The report, its error replaced by a RuntimeError with its traceback where the error
    itself cannot cross to the parent."""
    if report.error is None:
        return report
    try:
        pickle.loads(pickle.dumps(report.error))
    except Exception:
        report.error = RuntimeError(report.detail or repr(report.error))
    return report
