"""``epilab tune status`` (the work lists and workers of a database) and ``epilab tune
compile-server`` (the compile processes the commands of a host share)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Annotated

import typer

from epilab.cli.common import DbOption, JsonOption, open_db, print_json, print_rows, printable

if TYPE_CHECKING:
    from epilab.db.leases import FleetStatus


def tune_compile_server(
    stop_them: Annotated[
        bool, typer.Option("--stop", help="stop them now (their compiles are lost)")
    ] = False,
) -> None:
    """This user's compile servers on this host (the processes `epilab tune` compiles in, shared by
    its commands): each one's pid, the commands connected, its processes and compiles, and when
    it leaves if no command comes."""
    from epilab.tuner.compile_admin import holder, servers, stop

    found = servers()
    if not found:
        typer.echo("no compile server is running")
        return
    rows = []
    done: Counter[str] = Counter()
    for sock, status in found:
        if stop_them:
            done[stop(sock)] += 1
        if status is None:
            pid = holder(sock)
            if pid is None:
                rows.append([sock.stem, "-", "-", "-", "-", "-", "stale: its server is gone"])
            else:
                shown = str(pid) if pid > 0 else "?"
                rows.append([sock.stem, shown, "-", "-", "-", "-", "not answering (stopped or hung)"])
            continue
        leaves = status["leaves_in_s"]
        rows.append(
            [
                sock.stem,
                str(status["pid"]),
                str(status["clients"]),
                f"{status['jobs']} x {len(status['devices'])} device(s)",
                str(status["compiles"]),
                f"{status['up_s']:.0f} s",
                "with its commands" if leaves is None else f"in {leaves:.0f} s",
            ]
        )
    headers = ["fingerprint", "pid", "commands", "processes", "compiles", "up", "leaves"]
    print_rows("compile servers", headers, rows)
    if stop_them:
        said = {
            "stopped": "stopped {} server(s)",
            "killed": "killed {} server(s) that did not answer",
            "removed": "removed {} stale socket(s)",
            "not answering": "left {} server(s) that do not answer and whose pid is unknown",
        }
        typer.echo("; ".join(said[k].format(n) for k, n in done.items()))


def tune_status(
    db: DbOption = None,
    silent_after: Annotated[
        float, typer.Option(min=1, help="seconds without a heartbeat after which a worker shows as silent")
    ] = 180.0,
    json_out: JsonOption = False,
) -> None:
    """The shared tuning work in a database: problems pending, leased, done, failed or
    refused; the leases held (who, last heartbeat, expiry); every worker and its heartbeat;
    the throughput of the finished work."""
    from epilab.db.leases import fleet_status

    with open_db(db) as store:
        status = fleet_status(store, silent_after_s=silent_after)
    if json_out:
        print_json(status)
        return
    order = ("pending", "leased", "done", "failed", "refused")
    counts = ", ".join(f"{status.counts.get(k, 0)} {k}" for k in order)
    typer.echo(f"problems: {counts}")
    if status.problems_per_hour is not None:
        trials = "" if status.trials_per_hour is None else f", {status.trials_per_hour:.0f} trials/hour"
        typer.echo(
            f"throughput: {status.problems_per_hour:.1f} problems/hour{trials} "
            f"(done problems over {status.span_s:.0f} s from the first start to the last end)"
        )

    _print_fleet_tables(status)
    if status.older_workers:
        typer.echo(f"({status.older_workers} worker(s) that ended over a day ago not shown)")
    if not status.counts and not status.workers:
        typer.echo(f"no shared tuning work recorded in {printable(store.url)}")


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} s"


def _print_fleet_tables(status: FleetStatus) -> None:
    """``tune status``'s tables: the leases held, the failed problems, the workers."""
    if status.active:
        print_rows(
            "leased problems",
            ["problem", "device", "worker", "takes", "last heartbeat", "expires in"],
            [
                [
                    printable(v.label),
                    printable(v.device),
                    printable(v.owner or "-"),
                    str(v.attempts),
                    _secs(v.heartbeat_age_s) + " ago",
                    _secs(v.expires_in_s),
                ]
                for v in status.active
            ],
        )
    if status.failed:
        print_rows(
            "failed problems",
            ["problem", "device", "worker", "why"],
            [
                [
                    printable(v.label),
                    printable(v.device),
                    printable(v.owner or "-"),
                    printable((v.detail or "").strip().splitlines()[-1:][0] if v.detail else ""),
                ]
                for v in status.failed
            ],
        )
    if status.workers:
        print_rows(
            "workers",
            ["worker", "device", "state", "last heartbeat", "problems", "trials", "trials/hour", "note"],
            [
                [
                    printable(w.name),
                    printable(w.device),
                    w.state,
                    _secs(w.heartbeat_age_s) + " ago",
                    str(w.problems),
                    str(w.trials),
                    "-" if w.trials_per_hour is None else f"{w.trials_per_hour:.0f}",
                    printable((w.detail or "")[:120]),
                ]
                for w in status.workers
            ],
        )
