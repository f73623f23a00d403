"""Leases: several tuning workers sharing one work list through the database.

    board = LeaseBoard(db, device, versions, ttl_s=60)
    board.enqueue(items, trials=64, since=started)     # every worker, at its start
    lease = board.take(owner)                          # one transaction; None: nothing free
    board.renew(owner)                                 # the heartbeat, every ttl/3
    board.finish(lease, owner, "done")                 # or "failed", "refused"; or release()

A lease row names a problem for one device model (name, capability, SM count) and one
pair of torch/triton versions: what a trial record is measured on, so each problem of a
work list is tuned once per such device, whichever process or host takes it. Taking
one is the queue pattern: PostgreSQL selects the first free row ``FOR UPDATE SKIP
LOCKED`` (concurrent takers skip rows being taken instead of waiting on them); SQLite
serialises the whole transaction (every write transaction is ``BEGIN IMMEDIATE``), which
is one host's worth of workers. A row is free when ``pending``, or when ``leased`` but its
holder stopped renewing it (``expires_at`` passed: the process was killed, its host died):
the next taker takes it over, and ``attempts`` counts the takes.

Which free row: problems that differ only in their sizes (a *family*: one template, dtype,
layouts, epilogue and geometry) build the same kernels, and a finished one gives the next its
warm seeds. A worker therefore takes, in the list's order, the first free problem of the family
it tuned last; else the first of a family no other worker is tuning; else the first free one.
Two GPUs tuning two of one family at once each built the family's kernels and neither started
from the other's record (RESULTS.md, 2026-11-28: 380 kernels built against 322 on one GPU).

Times come from one clock: the database server's on PostgreSQL (hosts' clocks may
disagree), the host's on SQLite (one host).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from epilab.db.fields import aware, check_str, clean_detail
from epilab.db.models import DETAIL_LEN, NAME_LEN, LeaseRecord, ProblemRow, WorkerRecord
from epilab.db.store import TuningDB
from epilab.db.values import DeviceInfo, ProblemLike, Versions

FINISHED = ("done", "failed", "refused")


@dataclass(frozen=True)
class Lease:
    """A problem this worker holds: its key, the work list's label, and how many times it
    was taken (more than 1: taken over from a worker that stopped renewing it)."""

    key: str
    label: str
    attempts: int
    previous_owner: str | None

    @property
    def taken_over(self) -> bool:
        return self.attempts > 1


def worker_name(device_label: str) -> str:
    """A worker's name: host, process and device, unique among live workers."""
    return f"{socket.gethostname()}:{os.getpid()}:{device_label}"[:NAME_LEN]


def family(problem: ProblemLike) -> str:
    """The problem without its sizes (``shape``): problems of one family build the same kernels
    (Triton specialises on a size only through its divisibility) and seed each other's studies."""
    spec = json.loads(problem.to_json())
    spec.pop("shape", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def db_now(s: Session) -> datetime:
    """The one clock of the leases (see the module doc)."""
    if s.get_bind().dialect.name == "postgresql":
        return aware(s.scalar(select(func.now())))
    return datetime.now(timezone.utc)


class LeaseBoard:
    """The leases of one device model and versions in one database; see the module doc."""

    def __init__(self, db: TuningDB, device: DeviceInfo, versions: Versions, *, ttl_s: float = 60.0) -> None:
        if not ttl_s > 0:
            raise ValueError(f"the lease time must be positive, got {ttl_s} s")
        self.db = db
        self.device = device
        self.versions = versions
        self.ttl = timedelta(seconds=ttl_s)
        self._ids: list[int] = []  # the work list's problem ids, in order
        self._device_id = -1  # the device's row, known once enqueue() ran
        self._problems: dict[str, ProblemLike] = {}
        self._family: dict[int, str] = {}  # problem id -> its family (see the module doc)
        self._key_family: dict[str, str] = {}

    # ------------------------------------------------------------ the list
    def enqueue(
        self, items: Sequence[tuple[str, ProblemLike]], *, trials: int, since: datetime | None = None
    ) -> None:
        """Add the work list's problems (label, problem) as ``pending`` where no lease exists
        yet. A lease finished before ``since`` (this run's start) is opened again when it
        failed, or when it was done for a smaller trial budget than ``trials``; with
        ``restart``, every finished one is (the caller deletes the studies)."""
        self._problems = {p.key: p for _, p in items}

        def run(s: Session) -> tuple[int, list[int]]:
            device_id = self.db.device_id(s, self.device)
            now = db_now(s)
            ids = []
            for label, p in items:
                pid = self.db.problem_id(s, p.to_json(), p.epilogue.text(), p.key)
                ids.append(pid)
                row = {
                    "problem_id": pid,
                    "device_id": device_id,
                    "torch_version": self.versions.torch,
                    "triton_version": self.versions.triton,
                    "state": "pending",
                    "label": check_str("label", label[:NAME_LEN], NAME_LEN),
                    "trials": trials,
                    "attempts": 0,
                    "created_at": now,
                }
                s.execute(
                    self.db._insert(s, LeaseRecord)
                    .values(**row)
                    .on_conflict_do_nothing(
                        index_elements=["problem_id", "device_id", "torch_version", "triton_version"]
                    )
                )
            reopen = (LeaseRecord.state == "failed") | (
                (LeaseRecord.state == "done") & (LeaseRecord.trials < trials)
            )
            finished_before = LeaseRecord.finished_at < (since or now)
            s.execute(
                update(LeaseRecord)
                .where(self._mine(device_id, ids), reopen, finished_before)
                .values(state="pending", trials=trials, owner=None, detail=None, attempts=0)
                .execution_options(synchronize_session=False)
            )
            return device_id, ids

        self._device_id, self._ids = self.db.write(run)
        self._key_family = {p.key: family(p) for _, p in items}
        self._family = {pid: self._key_family[p.key] for pid, (_, p) in zip(self._ids, items, strict=True)}

    def restart(self, since: datetime) -> int:
        """``--restart``: open again the list's leases finished before ``since``, and count
        every lease not held as never taken, so that its first taker in this run (``attempts``
        1) starts its study over while a taker-over (2 and more) keeps what this run recorded;
        returns how many."""

        def run(s: Session) -> int:
            finished = LeaseRecord.state.in_(FINISHED) & (LeaseRecord.finished_at < since)
            result = s.execute(
                update(LeaseRecord)
                .where(self._mine(self._device_id, self._ids), finished | (LeaseRecord.state == "pending"))
                .values(state="pending", owner=None, detail=None, attempts=0)
                .execution_options(synchronize_session=False)
            )
            return int(result.rowcount or 0)

        return self.db.write(run)

    def _mine(self, device_id: int, ids: Sequence[int]) -> Any:
        return (
            (LeaseRecord.device_id == device_id)
            & (LeaseRecord.torch_version == self.versions.torch)
            & (LeaseRecord.triton_version == self.versions.triton)
            & LeaseRecord.problem_id.in_(list(ids))
        )

    def problem(self, key: str) -> ProblemLike:
        return self._problems[key]

    def family_of(self, key: str) -> str | None:
        """The family (see the module doc) of a problem of the list, once ``enqueue`` ran."""
        return self._key_family.get(key)

    # ------------------------------------------------------------ one lease
    def take(self, owner: str, *, after: str | None = None) -> Lease | None:
        """A free problem of the list, now leased to ``owner`` (``after``: the key of the problem
        it tuned last), chosen as the module doc says; None when none is free."""
        last = self.family_of(after) if after is not None else None

        def run(s: Session) -> Lease | None:
            now = db_now(s)
            free = (LeaseRecord.state == "pending") | (
                (LeaseRecord.state == "leased") & (LeaseRecord.expires_at < now)
            )
            held = s.scalars(
                select(LeaseRecord.problem_id).where(
                    self._mine(self._device_id, self._ids),
                    LeaseRecord.state == "leased",
                    LeaseRecord.expires_at >= now,
                    LeaseRecord.owner != owner,
                )
            ).all()
            busy = {self._family.get(pid) for pid in held}
            choices = [
                [pid for pid, f in self._family.items() if f == last],
                [pid for pid, f in self._family.items() if f not in busy],
                self._ids,
            ]
            for ids in (ids for ids in choices if ids):
                row = s.execute(
                    select(LeaseRecord, ProblemRow.key)
                    .join(ProblemRow, LeaseRecord.problem_id == ProblemRow.id)
                    .where(self._mine(self._device_id, ids), free)
                    .order_by(LeaseRecord.id)
                    .limit(1)
                    .with_for_update(skip_locked=True, of=LeaseRecord)
                ).first()
                if row is not None:
                    break
            else:
                return None
            lease, key = row
            previous = lease.owner if lease.state == "leased" else None
            lease.state, lease.owner = "leased", owner
            lease.attempts += 1
            lease.heartbeat_at, lease.expires_at = now, now + self.ttl
            lease.started_at = lease.started_at or now
            lease.finished_at, lease.detail = None, None
            return Lease(key, lease.label, lease.attempts, previous)

        return self.db.write(run)

    def renew(self, owner: str, lease: Lease | None) -> bool:
        """Push the expiry of ``owner``'s lease on; False when it holds it no longer (it
        stalled past the expiry and another worker took the problem over)."""
        if lease is None:
            return True

        def run(s: Session) -> bool:
            now = db_now(s)
            result = s.execute(
                update(LeaseRecord)
                .where(self._held(lease, owner))
                .values(heartbeat_at=now, expires_at=now + self.ttl)
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)

        return self.db.write(run)

    def finish(self, lease: Lease, owner: str, state: str, detail: str | None = None) -> bool:
        """End ``owner``'s lease as done, failed or refused; False when it no longer held it."""
        if state not in FINISHED:
            raise ValueError(f"a lease ends as one of {FINISHED}, not {state!r}")

        def run(s: Session) -> bool:
            result = s.execute(
                update(LeaseRecord)
                .where(self._held(lease, owner))
                .values(state=state, finished_at=db_now(s), expires_at=None, detail=_detail(detail))
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)

        return self.db.write(run)

    def release(self, lease: Lease, owner: str, detail: str | None = None) -> bool:
        """Give ``owner``'s lease back untuned (Ctrl-C, a lost device): the next taker gets it
        at once."""

        def run(s: Session) -> bool:
            result = s.execute(
                update(LeaseRecord)
                .where(self._held(lease, owner))
                .values(state="pending", expires_at=None, detail=_detail(detail))
                .execution_options(synchronize_session=False)
            )
            return bool(result.rowcount)

        return self.db.write(run)

    def _held(self, lease: Lease, owner: str) -> Any:
        pid = select(ProblemRow.id).where(ProblemRow.key == lease.key).scalar_subquery()
        return (
            self._mine(self._device_id, self._ids)
            & (LeaseRecord.problem_id == pid)
            & (LeaseRecord.owner == owner)
            & (LeaseRecord.state == "leased")
        )

    def held_elsewhere(self, owner: str) -> float | None:
        """Seconds until the soonest expiry of a list lease others hold (0 when one has
        expired), or None when no other worker holds one: the list is finished."""
        with self.db.session() as s:
            now = db_now(s)
            soonest = s.scalar(
                select(func.min(LeaseRecord.expires_at)).where(
                    self._mine(self._device_id, self._ids),
                    LeaseRecord.state.in_(("leased", "pending")),
                    (LeaseRecord.owner != owner) | LeaseRecord.owner.is_(None),
                )
            )
            pending = s.scalar(
                select(func.count()).where(
                    self._mine(self._device_id, self._ids),
                    LeaseRecord.state == "pending",
                )
            )
        if pending:
            return 0.0
        if soonest is None:
            return None
        return max(0.0, (aware(soonest) - now).total_seconds())

    # ------------------------------------------------------------ workers
    def register(self, name: str, device_label: str) -> None:
        """Add (or restart) the worker row ``name``."""

        def run(s: Session) -> None:
            now = db_now(s)
            values = {
                "host": socket.gethostname()[:NAME_LEN],
                "pid": os.getpid(),
                "device_id": self.db.device_id(s, self.device),
                "device_label": device_label[:32],
                "state": "running",
                "problems": 0,
                "trials": 0,
                "started_at": now,
                "heartbeat_at": now,
                "detail": None,
            }
            stmt = self.db._insert(s, WorkerRecord).values(name=name, **values)
            s.execute(stmt.on_conflict_do_update(index_elements=["name"], set_=values))

        self.db.write(run)

    def beat(
        self, name: str, *, problems: int, trials: int, state: str = "running", detail: str | None = None
    ) -> None:
        """The worker's heartbeat, with its counts (and its end: ``state`` other than running)."""

        def run(s: Session) -> None:
            s.execute(
                update(WorkerRecord)
                .where(WorkerRecord.name == name)
                .values(
                    heartbeat_at=db_now(s),
                    problems=problems,
                    trials=trials,
                    state=state,
                    detail=_detail(detail),
                )
                .execution_options(synchronize_session=False)
            )

        self.db.write(run)


def _detail(text: str | None) -> str | None:
    return None if text is None else clean_detail(text[-DETAIL_LEN:])


# ---------------------------------------------------------------- status


@dataclass(frozen=True)
class LeaseView:
    label: str
    key: str
    device: str
    state: str
    owner: str | None
    attempts: int
    heartbeat_age_s: float | None  # seconds since its holder last renewed it
    expires_in_s: float | None  # negative: expired, the next taker takes it over
    detail: str | None


@dataclass(frozen=True)
class WorkerView:
    name: str
    device: str  # the device label and model: cuda:1 (NVIDIA H200)
    state: str  # running, finished, interrupted, lost, failed; "silent" when running but not beating
    heartbeat_age_s: float
    problems: int
    trials: int
    trials_per_hour: float | None
    detail: str | None


@dataclass(frozen=True)
class FleetStatus:
    """What ``epilab tune status`` shows: the leases by state, the ones held or failed,
    every worker and its heartbeat, and the throughput of the finished work."""

    counts: dict[str, int]  # lease state -> how many
    active: list[LeaseView]  # leased (and expired) ones
    failed: list[LeaseView]
    workers: list[WorkerView]
    problems_per_hour: float | None  # done leases over the span from the first start to the last end
    trials_per_hour: float | None  # trials recorded in that span
    span_s: float | None
    older_workers: int = 0  # workers that ended over ``recent_s`` ago, not listed


def fleet_status(db: TuningDB, *, silent_after_s: float = 180.0, recent_s: float = 86400.0) -> FleetStatus:
    """The state of every lease in ``db``, and of the workers that beat in the last
    ``recent_s`` or say they are running; a running worker that has not beaten for
    ``silent_after_s`` is shown as ``silent`` (killed, or its host is down)."""
    from epilab.db.models import Device, TrialRecord

    with db.session() as s:
        now = db_now(s)
        rows = s.execute(select(LeaseRecord, ProblemRow.key, Device.name).join(ProblemRow).join(Device)).all()
        workers = s.execute(
            select(WorkerRecord, Device.name).join(Device, WorkerRecord.device_id == Device.id)
        ).all()
        done = [lease for lease, _, _ in rows if lease.state == "done" and lease.finished_at is not None]
        first = min((aware(x.started_at) for x in done if x.started_at is not None), default=None)
        last = max((aware(x.finished_at) for x in done if x.finished_at is not None), default=None)
        trials = None
        if first is not None and last is not None and last > first:
            trials = s.scalar(
                select(func.count()).where(TrialRecord.created_at >= first, TrialRecord.created_at <= last)
            )

    def age(t: datetime | None) -> float | None:
        return None if t is None else (now - aware(t)).total_seconds()

    def view(lease: LeaseRecord, key: str, device: str) -> LeaseView:
        expires = None if lease.expires_at is None else -(age(lease.expires_at) or 0.0)
        return LeaseView(
            lease.label,
            key,
            device,
            lease.state,
            lease.owner,
            lease.attempts,
            age(lease.heartbeat_at),
            expires,
            lease.detail,
        )

    counts: dict[str, int] = {}
    for lease, _, _ in rows:
        counts[lease.state] = counts.get(lease.state, 0) + 1
    span = None if first is None or last is None else (last - first).total_seconds()
    hours = None if not span else span / 3600
    worker_views = []
    older = 0
    for w, device in workers:
        beat = age(w.heartbeat_at) or 0.0
        if w.state != "running" and beat > recent_s:
            older += 1
            continue
        lived = (aware(w.heartbeat_at) - aware(w.started_at)).total_seconds() / 3600
        state = "silent" if w.state == "running" and beat > silent_after_s else w.state
        worker_views.append(
            WorkerView(
                w.name,
                f"{w.device_label} ({device})",
                state,
                beat,
                w.problems,
                w.trials,
                w.trials / lived if lived > 0 else None,
                w.detail,
            )
        )
    return FleetStatus(
        counts=counts,
        active=[view(*r) for r in rows if r[0].state == "leased"],
        failed=[view(*r) for r in rows if r[0].state == "failed"],
        workers=sorted(worker_views, key=lambda w: (w.state != "running", w.name)),
        problems_per_hour=None if not hours else len(done) / hours,
        trials_per_hour=None if not hours or trials is None else trials / hours,
        span_s=span,
        older_workers=older,
    )
