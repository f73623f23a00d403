"""SQLAlchemy 2.0 typed ORM models of the tuning database (schema at head).

Two concepts kept apart, as TVM keeps Workload and TuningRecord: a *problem*
(what is computed: key = sha256 of its canonical JSON, plus readable columns)
and the *measurements* of it on a device (trial records of our configs, and
baselines of libraries). The db stores problems as JSON and readable columns
without importing epilab's Problem type. Every change here needs a migration in
``db/migrations/versions``.
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

STATUSES = ("ok", "compile_error", "out_of_resources", "incorrect", "timeout", "crashed")
COMPILE_FAILURES = ("compile_error", "out_of_resources")  # Triton refused to build the kernel
# a baseline's library, by name: the tuner's (``tuner/baselines.BASELINES``), or one an older or
# newer epilab recorded ("eager": plain eager torch, from older databases and benchmark scripts)
LIBRARY_NAME = re.compile(r"[a-z][a-z0-9_.+-]{0,31}")

# bounds on strings (checked on import and write; the columns are sized to them)
NAME_LEN = 128
VERSION_LEN = 64
METHOD_LEN = 64
STUDY_LEN = 128
DETAIL_LEN = 2000
KEY_LEN = 64
EPILOGUE_LEN = 20_000  # canonical epilogue text (templates.epilogue.MAX_TEXT_CHARS, checked where made)
# characters no stored name may hold, and none may reach a terminal raw: C0 and C1 controls
# (escape sequences), DEL, and the Unicode line separators and bidirectional overrides
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class Base(DeclarativeBase):
    pass


class Device(Base):
    __tablename__ = "epilab_devices"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    capability: Mapped[str] = mapped_column(String(16))  # "9.0"
    sm_count: Mapped[int] = mapped_column(Integer)
    __table_args__ = (UniqueConstraint("name", "capability", "sm_count", name="uq_epilab_devices_identity"),)


class ProblemRow(Base):
    __tablename__ = "epilab_problems"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(KEY_LEN), unique=True)
    # key without M (revision 0002; nullable in the schema because it was added to existing rows)
    family: Mapped[str] = mapped_column(String(KEY_LEN), index=True, nullable=True)
    json: Mapped[str] = mapped_column(Text)
    op: Mapped[str] = mapped_column(String(32))
    template: Mapped[str] = mapped_column(String(64))
    template_hash: Mapped[str] = mapped_column(String(KEY_LEN))
    dtype: Mapped[str] = mapped_column(String(16))
    layout_a: Mapped[str] = mapped_column(String(16))
    layout_b: Mapped[str] = mapped_column(String(16))
    precision: Mapped[str] = mapped_column(String(16))
    epilogue: Mapped[str] = mapped_column(Text)  # canonical text
    batch: Mapped[int | None] = mapped_column(Integer)  # None where the dim is symbolic
    m: Mapped[int | None] = mapped_column(Integer)
    n: Mapped[int | None] = mapped_column(Integer)
    k: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    trials: Mapped[list[TrialRecord]] = relationship(back_populates="problem", cascade="all, delete-orphan")
    baselines: Mapped[list[BaselineRecord]] = relationship(
        back_populates="problem", cascade="all, delete-orphan"
    )


class _Timed:
    """Columns shared by trial records and baselines."""

    median_ms: Mapped[float | None] = mapped_column(Float)
    p20_ms: Mapped[float | None] = mapped_column(Float)
    p80_ms: Mapped[float | None] = mapped_column(Float)
    graph_ms: Mapped[float | None] = mapped_column(Float)  # CUDA-graph replay, short kernels (0003)
    tflops: Mapped[float | None] = mapped_column(Float)
    gbps: Mapped[float | None] = mapped_column(Float)
    max_rel_error: Mapped[float | None] = mapped_column(Float)
    timing_method: Mapped[str] = mapped_column(String(METHOD_LEN))
    torch_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    triton_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class TrialRecord(_Timed, Base):
    __tablename__ = "epilab_trials"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("epilab_problems.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("epilab_devices.id", ondelete="CASCADE"))
    config: Mapped[str] = mapped_column(Text)  # canonical JSON of a validated Config
    status: Mapped[str] = mapped_column(String(20))
    study: Mapped[str] = mapped_column(String(STUDY_LEN))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(Text)  # error text of a failed trial

    problem: Mapped[ProblemRow] = relationship(back_populates="trials")
    device: Mapped[Device] = relationship()
    __table_args__ = (
        UniqueConstraint(
            "problem_id",
            "device_id",
            "config",
            "torch_version",
            "triton_version",
            name="uq_epilab_trials_identity",
        ),
        Index("ix_epilab_trials_lookup", "problem_id", "device_id", "status", "median_ms"),
    )


class BaselineRecord(_Timed, Base):
    __tablename__ = "epilab_baselines"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("epilab_problems.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("epilab_devices.id", ondelete="CASCADE"))
    library: Mapped[str] = mapped_column(String(32))

    problem: Mapped[ProblemRow] = relationship(back_populates="baselines")
    device: Mapped[Device] = relationship()
    __table_args__ = (
        UniqueConstraint(
            "problem_id",
            "device_id",
            "library",
            "torch_version",
            "triton_version",
            name="uq_epilab_baselines_identity",
        ),
    )


class VerdictRecord(Base):
    """Whether a template kept its promise inside a compiled model (revision 0004; its
    interval, rounds and outcome: 0006; whether it was a training step: 0007): the model timed
    with the template on its problem and with that problem left to Inductor
    (``model_tuning/tune.py``). The compiler reads the newest verdict of its problem for its
    device, versions, CUDA-graph mode, Inductor mode (what the aten op becomes: cuBLAS, or
    Inductor's max-autotune choice) and kind of graph (inference, or a training step's
    forward and backward); ``keep`` False sends the problem to the aten op."""

    __tablename__ = "epilab_verdicts"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("epilab_problems.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("epilab_devices.id", ondelete="CASCADE"))
    cuda_graphs: Mapped[bool] = mapped_column(Boolean)  # the mode it was measured in: CUDA graphs or not
    inductor_mode: Mapped[str] = mapped_column(String(32))  # ... and Inductor's: "default", "max-autotune"
    # revision 0007: measured in a training step (forward and backward), not at inference
    training: Mapped[bool] = mapped_column(Boolean, server_default=false())
    keep: Mapped[bool] = mapped_column(Boolean)
    with_ms: Mapped[float] = mapped_column(Float)  # the model's time with the template
    without_ms: Mapped[float] = mapped_column(Float)  # ... and with the problem on the aten op
    # revision 0006: the paired ratio without/with (its interval), its rounds and the outcome
    ratio_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    ratio_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    rounds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
    context: Mapped[str] = mapped_column(String(NAME_LEN))  # the model it was measured in
    timing_method: Mapped[str] = mapped_column(String(METHOD_LEN))
    torch_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    triton_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    problem: Mapped[ProblemRow] = relationship()
    device: Mapped[Device] = relationship()
    __table_args__ = (
        UniqueConstraint(
            "problem_id",
            "device_id",
            "cuda_graphs",
            "training",
            "inductor_mode",
            "torch_version",
            "triton_version",
            name="uq_epilab_verdicts_identity",
        ),
    )


class LeaseRecord(Base):
    """One problem of a shared work list, for one device model and versions (revision 0005).

    Workers (``tuner/fleet.py``) take a ``pending`` lease, or a ``leased`` one whose holder
    stopped renewing it (``expires_at`` passed), in one transaction; the holder renews
    ``expires_at`` while it tunes and marks the lease ``done`` (``trials`` is the trial budget
    it was done for), ``failed`` or ``refused`` (too large for the device) when it ends."""

    __tablename__ = "epilab_leases"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("epilab_problems.id", ondelete="CASCADE"))
    device_id: Mapped[int] = mapped_column(ForeignKey("epilab_devices.id", ondelete="CASCADE"))
    torch_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    triton_version: Mapped[str] = mapped_column(String(VERSION_LEN))
    state: Mapped[str] = mapped_column(String(16))  # pending, leased, done, failed or refused
    owner: Mapped[str | None] = mapped_column(String(NAME_LEN))  # the worker holding (or last held) it
    label: Mapped[str] = mapped_column(String(NAME_LEN))  # the problem as the work list names it
    trials: Mapped[int] = mapped_column(Integer)  # the trial budget asked (done: the one it was done for)
    attempts: Mapped[int] = mapped_column(Integer)  # how many times it was taken
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    detail: Mapped[str | None] = mapped_column(Text)  # why it failed or was refused
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    problem: Mapped[ProblemRow] = relationship()
    device: Mapped[Device] = relationship()
    __table_args__ = (
        UniqueConstraint(
            "problem_id", "device_id", "torch_version", "triton_version", name="uq_epilab_leases_identity"
        ),
        Index("ix_epilab_leases_state", "device_id", "state", "expires_at"),
    )


class WorkerRecord(Base):
    """A tuning worker (one GPU of one ``epilab tune`` process), for ``epilab tune status``
    (revision 0005)."""

    __tablename__ = "epilab_workers"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)  # host:pid:device
    host: Mapped[str] = mapped_column(String(NAME_LEN))
    pid: Mapped[int] = mapped_column(Integer)
    device_id: Mapped[int] = mapped_column(ForeignKey("epilab_devices.id", ondelete="CASCADE"))
    device_label: Mapped[str] = mapped_column(String(32))  # cuda:1, interpreter
    state: Mapped[str] = mapped_column(String(16))  # running, finished, interrupted, lost or failed
    problems: Mapped[int] = mapped_column(Integer)  # leases it finished
    trials: Mapped[int] = mapped_column(Integer)  # trials it evaluated
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    detail: Mapped[str | None] = mapped_column(Text)  # why it stopped, when not finished

    device: Mapped[Device] = relationship()
