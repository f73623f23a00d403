"""Tuning one work list with many workers: GPUs of one host, processes, hosts.

``run_fleet`` starts one worker per device (``epilab tune --devices 0,1``), each with its
own ``Tuner``: a GPU worker process and a compile pool of ``options.jobs`` processes (per
device: size it to the host's cores). From 3 devices up each worker is a process of its own
(``fleet_process.py``: the sampler and the database work of one worker do not wait on another's
interpreter lock); fewer run as threads of this process (``FleetOptions.processes`` decides).
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

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, TuningDB, Versions
from epilab.db.leases import LeaseBoard
from epilab.ir.problem import Problem
from epilab.tuner.fleet_process import in_processes, run_processes, tuner_class
from epilab.tuner.fleet_worker import FleetOptions, FleetWorker, Listener, WorkerReport
from epilab.tuner.tune import ProblemResult, TuneOptions


@dataclass(frozen=True)
class FleetReport:
    workers: list[WorkerReport]
    interrupted: bool
    seconds: float

    @property
    def results(self) -> list[ProblemResult]:
        return [r for w in self.workers for r in w.results]


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
    by_key = {p.key: (label, p) for label, p in work}
    if in_processes(fleet):
        device, versions = _one_model(options, fleet.devices)
        _enqueue(db, device, versions, work, options, fleet, trials=trials, since=since)
        reports, interrupted = run_processes(db, by_key, options, fleet, listener, trials=trials, since=since)
    else:
        reports, interrupted = _run_threads(db, by_key, work, options, fleet, trials, since, listener)
    interrupted = interrupted or any(r.state == "interrupted" for r in reports)
    return FleetReport(reports, interrupted, time.monotonic() - started)


def _run_threads(
    db: TuningDB,
    by_key: dict[str, tuple[str, Problem]],
    work: Sequence[tuple[str, Problem]],
    options: TuneOptions,
    fleet: FleetOptions,
    trials: int,
    since: datetime,
    listener: Listener,
) -> tuple[list[WorkerReport], bool]:
    """A thread a device in this process (one device, or ``fleet.processes`` off)."""
    make = tuner_class(fleet)
    tuners = [make(db, dataclasses.replace(options, device_index=d), hook=fleet.hook) for d in fleet.devices]
    stop = threading.Event()
    changed = threading.Condition()
    interrupted = False
    workers: list[FleetWorker] = []
    try:
        device, versions = tuners[0].device, tuners[0].versions
        _same_model([(t.device_label, t.device) for t in tuners])
        board = _enqueue(db, device, versions, work, options, fleet, trials=trials, since=since)
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
    return [w.report for w in workers], interrupted


def _enqueue(
    db: TuningDB,
    device: DeviceInfo,
    versions: Versions,
    work: Sequence[tuple[str, Problem]],
    options: TuneOptions,
    fleet: FleetOptions,
    *,
    trials: int,
    since: datetime,
) -> LeaseBoard:
    """The list on the lease board (and, with ``--restart``, its old results set aside)."""
    board = LeaseBoard(db, device, versions, ttl_s=fleet.lease_ttl_s)  # one per process: stateless
    board.enqueue(work, trials=trials, since=since)  # after this, its calls name their owner
    if options.restart:
        board.restart(since)
    return board


def _one_model(options: TuneOptions, devices: Sequence[int]) -> tuple[DeviceInfo, Versions]:
    """The device and versions the workers of ``devices`` record under, read in this process
    (each worker's process reads the same); several GPU models are refused."""
    import torch
    import triton

    from epilab.policy.space import DeviceLimits

    versions = Versions(torch.__version__, triton.__version__)
    if options.interpret:
        return INTERPRETER_DEVICE, versions
    named = [(f"cuda:{d}", DeviceLimits.of(d).info) for d in devices]
    _same_model(named)
    return named[0][1], versions


def _same_model(devices: Sequence[tuple[str, DeviceInfo]]) -> None:
    if any(info != devices[0][1] for _, info in devices):
        raise ValueError(
            "--devices must name GPUs of one model: "
            + ", ".join(f"{label} is {info.name}" for label, info in devices)
        )


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
