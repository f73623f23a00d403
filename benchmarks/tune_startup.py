"""Where ``epilab tune`` spends its start-up: the wall time at each step of the command until its
first lease is taken, then the process leaves (nothing is tuned; give it a throwaway database:
the lease it took stays held).

    python3 benchmarks/tune_startup.py tune --suite quick,llm,conv --devices 0,1 --db /tmp/s.db --json

The arguments after the script's name are ``epilab``'s. Each step's line gives the seconds since
the script started and, in brackets, the step's own: the early start of the GPU workers and the
compile server (``cli._start_early``), the device checks that import torch and the tuner's
modules (``cli._tune_devices``), the problem list, the database, each device's ``Tuner`` and
the lease board's list. Run it from cold caches (its own ``TRITON_CACHE_DIR`` and
``EPILAB_CACHE_DIR``) to see a first command's start-up; a compile server it starts stays for
``EPILAB_COMPILE_SERVER_IDLE`` seconds (set it low). What is measured is one command's wall
time on its host: the GPU workers and compile processes it starts import torch at the same time.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

STARTED = time.perf_counter()
MARKS: list[tuple[float, str]] = []


def mark(what: str) -> None:
    MARKS.append((time.perf_counter() - STARTED, what))


def timed(owner: Any, name: str, then: Callable[[], None] = lambda: None) -> None:
    """Mark the end of each call of ``owner.name`` with its own seconds; then call ``then``."""
    inner = getattr(owner, name)
    label = f"{owner.__name__}.{name}" if isinstance(owner, type) else name

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        out = inner(*args, **kwargs)
        mark(f"{label} ({time.perf_counter() - began:.2f} s)")
        then()
        return out

    setattr(owner, name, wrapper)


def after_device_checks() -> None:
    """Once the device checks have imported the tuner's modules (as the command does, in its
    order): time each ``Tuner`` and the lease board's list, and leave at the first lease."""
    from epilab.db import leases
    from epilab.tuner import tune

    if getattr(leases.LeaseBoard, "timed", False):
        return
    leases.LeaseBoard.timed = True  # type: ignore[attr-defined]
    timed(tune.Tuner, "__init__")
    timed(leases.LeaseBoard, "enqueue")
    take = leases.LeaseBoard.take

    def first_take(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = take(self, *args, **kwargs)
        mark("first lease taken")
        for seconds, what in MARKS:
            print(f"{seconds:7.2f} s  {what}", file=sys.stderr, flush=True)
        os._exit(0)  # the workers, compile processes and database go with the process
        return out

    leases.LeaseBoard.take = first_take


def main() -> None:
    from epilab import cli

    mark("import epilab.cli")
    for name in ("_start_early", "_listed_work", "_open_db"):
        timed(cli, name)
    timed(cli, "_tune_devices", then=after_device_checks)
    cli.app(prog_name="epilab", args=sys.argv[1:])


if __name__ == "__main__":
    main()
