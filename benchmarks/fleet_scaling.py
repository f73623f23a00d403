"""Tuning throughput with 1 and with N GPUs of one host, where the time goes, whether the
best configs agree, and two processes on one PostgreSQL database with one of them killed.

    python3 benchmarks/fleet_scaling.py run --gpus 1 --out DIR           # GPU 0, run "1"
    python3 benchmarks/fleet_scaling.py run --gpus 2 --out DIR           # GPUs 0,1, run "2"
    python3 benchmarks/fleet_scaling.py run --gpus 1 --devices 1 --name 1b --out DIR
    python3 benchmarks/fleet_scaling.py compare DIR --runs 1,2,1b        # the tables
    python3 benchmarks/fleet_scaling.py hosts --out DIR                  # PostgreSQL, one killed
    python3 benchmarks/fleet_scaling.py hosts --out DIR --db DIR/p.db --one-host --kill-after -1 --name 2p

``run`` tunes the suites (default ``quick,llm,conv``) with one ``epilab tune --suite
quick,llm,conv --devices ...`` command into a new SQLite database ``DIR/fleet-NAME.db``, from
cold kernel caches (its own ``EPILAB_CACHE_DIR`` and ``TRITON_CACHE_DIR``, hence its own compile
server: a run that found another run's compiled kernels would be faster for that alone), after
an untimed ``import torch, epilab...`` that warms the host's file cache for every run alike. It
writes the command's ``--json`` results, its wall time, and the leases' timeline read back from
the database (who tuned what, from when to when). Problems per hour are the problems over the
command's wall time, start-up included.

``compare`` reads runs: problems per hour against the first run; where the wall time of each
went (start-up until the first lease, the workers' tuning and their first problems, each
worker idle at the list's end while another finishes, the command's end); the fixed part
(start-up, end, each worker's cold first problem) against the divisible rest, and the ratio each
run would reach were the first run's divisible seconds divided exactly by its workers; and per
problem, each run's best time over the first run's. Two runs of one GPU give the run-to-run noise
those ratios are judged against.

``hosts`` starts a PostgreSQL server (``.ci/start-postgres``; the binaries of the ``pgserver``
wheel where the host has none) and two ``epilab tune`` processes on it, one per GPU, each with
caches of its own as two hosts would have. Once the second has finished some problems and holds
another, it is killed with SIGKILL (its GPU worker too), and started again later. The check,
from the database: every problem done once, none left held, none lost; the killed problem taken
over (attempts 2) and no problem with more trials recorded than its budget and the killed trial.
The second ``hosts`` line above runs the two GPUs as two processes of one host (one SQLite file,
one compile server, nobody killed), written as run ``2p``: beside run ``2`` (one process, a
worker thread per GPU), it shows what one process's interpreter lock costs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select

from epilab.db import TuningDB
from epilab.db.fields import aware
from epilab.db.leases import fleet_status
from epilab.db.models import LeaseRecord, ProblemRow, TrialRecord
from epilab.ir.config import config_text

ROOT = Path(__file__).resolve().parents[1]


def _tune_command(
    suites: str, devices: str, trials: int, jobs: int, db: str, args: argparse.Namespace
) -> list[str]:
    cmd = [sys.executable, "-m", "epilab.cli", "tune", "--suite", suites, "--devices", devices]
    cmd += ["--jobs", str(jobs), "--trials", str(trials), "--time-budget", "600", "--patience", "1000"]
    cmd += ["--db", db, "--json"]
    return cmd + (["--interpret"] if args.interpret else [])


def _cold_env(cache: Path) -> dict[str, str]:
    shutil.rmtree(cache, ignore_errors=True)
    return {
        **os.environ,
        "EPILAB_CACHE_DIR": str(cache / "epilab"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }


def _stop(proc: subprocess.Popen, limit: float | None) -> int:
    """Wait for ``proc`` (its own process group) for ``limit`` seconds, then kill the group."""
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124


def _warm_imports(env: dict[str, str]) -> float:
    """Import what ``epilab tune`` imports once, untimed by the run: the host's file cache then
    holds torch's libraries for every run alike (the first command on a fresh machine reads
    them from disk, and only whichever run came first would pay that). Compiles nothing: the
    kernel caches stay cold."""
    began = time.monotonic()
    code = "import torch, triton, optuna, sqlalchemy, alembic, epilab.cli, epilab.tuner.tune"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.monotonic() - began


def timeline(db_target: str, since: datetime) -> list[dict]:
    """Every lease of the database: label, owner, state, attempts, and its start and end in
    seconds after ``since`` (the database's clock: the host's on SQLite)."""
    with TuningDB.open(db_target) as db, db.session() as s:
        rows = s.execute(
            select(
                ProblemRow.key,
                LeaseRecord.label,
                LeaseRecord.owner,
                LeaseRecord.state,
                LeaseRecord.attempts,
                LeaseRecord.started_at,
                LeaseRecord.finished_at,
            )
            .join_from(LeaseRecord, ProblemRow, LeaseRecord.problem_id == ProblemRow.id)
            .order_by(LeaseRecord.id)
        ).all()

    def at(t: datetime | None) -> float | None:
        return None if t is None else (aware(t) - since).total_seconds()

    return [
        {
            "key": key,
            "label": label,
            "owner": owner,
            "state": state,
            "attempts": attempts,
            "start_s": at(started),
            "end_s": at(finished),
        }
        for key, label, owner, state, attempts, started, finished in rows
    ]


def run(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or str(args.gpus)
    devices = args.devices or ",".join(str(i) for i in range(args.gpus))
    if len(devices.split(",")) != args.gpus:
        raise SystemExit(f"--devices {devices} names {len(devices.split(','))} GPUs, --gpus says {args.gpus}")
    env = _cold_env(Path(f"/tmp/fleet-scaling-cache-{name}"))
    db = out / f"fleet-{name}.db"
    db.unlink(missing_ok=True)
    cmd = _tune_command(args.suites, devices, args.trials, args.jobs, str(db), args)
    warm_s = _warm_imports(env) if args.warm else None
    since = datetime.now(timezone.utc)
    start = time.monotonic()
    with (out / f"results-{name}.json").open("w") as so, (out / f"tune-{name}.err").open("w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env, start_new_session=True)
        rc = _stop(proc, args.limit)
    wall = time.monotonic() - start
    meta = {"name": name, "gpus": args.gpus, "devices": devices, "trials": args.trials, "suites": args.suites}
    meta["warm_imports_s"] = warm_s
    meta |= {"seconds": wall, "rc": rc, "command": " ".join(cmd[1:]), "leases": timeline(str(db), since)}
    (out / f"run-{name}.json").write_text(json.dumps(meta, indent=1))
    print(
        f"run {name}: {args.suites} on GPU(s) {devices}, {args.trials} trials: rc {rc}, {wall:.1f} s",
        flush=True,
    )


def _load(out: Path, name: str) -> tuple[dict, dict[str, dict]]:
    meta = json.loads((out / f"run-{name}.json").read_text())
    if meta["rc"] != 0:
        print(f"note: run {name} ended with status {meta['rc']}")
    return meta, {r["key"]: r for r in _json_list(out / f"results-{name}.json")}


def where_time_went(meta: dict) -> dict[str, float]:
    """The run's wall time split: start-up until the first lease was taken, the span of the
    leases, the command's end after the last one; per worker its tuning, its first problem
    (cold: the part of a worker's start a fleet pays once, however many GPUs) and its idle
    time at the list's end (the last lease's end minus the worker's own last end), as means
    over the workers."""
    leases = [x for x in meta["leases"] if x["start_s"] is not None and x["end_s"] is not None]
    if not leases:
        return {}
    first = min(x["start_s"] for x in leases)
    last = max(x["end_s"] for x in leases)
    by_owner: dict[str, list[dict]] = {}
    for x in leases:
        by_owner.setdefault(x["owner"], []).append(x)
    busy = [sum(x["end_s"] - x["start_s"] for x in xs) for xs in by_owner.values()]
    tail = [last - max(x["end_s"] for x in xs) for xs in by_owner.values()]
    firsts = [min(xs, key=lambda x: x["start_s"]) for xs in by_owner.values()]
    return {
        "startup_s": first,
        "first_problem_s": statistics.mean(x["end_s"] - x["start_s"] for x in firsts),
        "span_s": last - first,
        "end_s": meta["seconds"] - last,
        "workers": len(by_owner),
        "busy_s": statistics.mean(busy),
        "tail_idle_s": statistics.mean(tail),
        "longest_problem_s": max(x["end_s"] - x["start_s"] for x in leases),
    }


def compare(args: argparse.Namespace) -> None:
    names = args.runs.split(",")
    runs = {n: _load(args.out, n) for n in names}
    base_meta, base = runs[names[0]]
    base_rate = len(base) / base_meta["seconds"] * 3600
    print("| run | GPUs | problems | wall s | problems/hour | vs run " + names[0] + " |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, (meta, results) in runs.items():
        rate = len(results) / meta["seconds"] * 3600
        cells = f"{len(results)} | {meta['seconds']:.1f} | {rate:.0f} | {rate / base_rate:.2f}x"
        print(f"| {n} | {meta['gpus']} | {cells} |")
    print(
        "\n| run | start-up s | leases' span s | command's end s | per worker: tuning s "
        "| first problem s | idle at the end s | longest problem s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, (meta, _) in runs.items():
        w = where_time_went(meta)
        if w:
            print(
                f"| {n} | {w['startup_s']:.1f} | {w['span_s']:.1f} | {w['end_s']:.1f} | {w['busy_s']:.1f} "
                f"| {w['first_problem_s']:.1f} | {w['tail_idle_s']:.1f} | {w['longest_problem_s']:.1f} |"
            )
    _phase_sums(runs)
    _fixed_part(runs)
    for n in names[1:]:
        _best_ratios(names[0], base, n, runs[n][1], args.rows)


def _phase_sums(runs: dict[str, tuple[dict, dict[str, dict]]]) -> None:
    """Each run's problems' own seconds, summed, and where they went: what more workers add per
    problem (the same problems should cost the same seconds however many GPUs share them)."""
    shown = ("compile", "launch", "timing", "search", "baselines", "database")
    print("\n| run | problems' seconds, summed | " + " | ".join(shown) + " | other | kernels built |")
    print("|---|---:|" + "---:|" * (len(shown) + 2))
    for n, (_, results) in runs.items():
        total = sum(r["seconds"] for r in results.values())
        phases = {k: sum(r["phases"].get(k, 0.0) for r in results.values()) for k in shown}
        other = sum(sum(r["phases"].values()) for r in results.values()) - sum(phases.values())
        built = sum(int(r["compiles"].get("built", 0)) for r in results.values())
        cells = " | ".join(f"{phases[k]:.1f}" for k in shown)
        print(f"| {n} | {total:.1f} | {cells} | {other:.1f} | {built} |")


def _fixed_part(runs: dict[str, tuple[dict, dict[str, dict]]]) -> None:
    """What more GPUs cannot divide: start-up, the command's end and each worker's cold first
    problem (its seconds over the run's median problem; the workers pay theirs at once). The
    rest of the wall is the divisible part. "If divided" is the ratio a run would reach over
    the first one had the first run's divisible seconds been divided by its workers exactly,
    with its own fixed part: above the measured ratio, the problems cost more with more GPUs;
    at it, the fixed part is the cap."""
    names = list(runs)
    parts = {n: _split(meta) for n, (meta, _) in runs.items()}
    print(
        "\n| run | workers | start-up s | end s | cold first problem s (over the median) "
        "| fixed s | divisible s | vs run " + names[0] + " | if divided |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_wall = runs[names[0]][0]["seconds"]
    base_divisible = parts[names[0]]["divisible_s"] if parts[names[0]] else None
    for n, part in parts.items():
        if not part:
            continue
        wall = runs[n][0]["seconds"]
        ideal = (
            "-"
            if base_divisible is None
            else f"{base_wall / (part['fixed_s'] + base_divisible / part['workers']):.2f}x"
        )
        print(
            f"| {n} | {part['workers']} | {part['startup_s']:.1f} | {part['end_s']:.1f} "
            f"| {part['cold_s']:.1f} | {part['fixed_s']:.1f} | {part['divisible_s']:.1f} "
            f"| {base_wall / wall:.2f}x | {ideal} |"
        )


def _split(meta: dict) -> dict[str, float]:
    """``_fixed_part``'s numbers of one run (empty without leases)."""
    w = where_time_went(meta)
    if not w:
        return {}
    leases = [x for x in meta["leases"] if x["start_s"] is not None and x["end_s"] is not None]
    median = statistics.median(x["end_s"] - x["start_s"] for x in leases)
    cold = max(0.0, w["first_problem_s"] - median)
    fixed = w["startup_s"] + w["end_s"] + cold
    return {
        "workers": w["workers"],
        "startup_s": w["startup_s"],
        "end_s": w["end_s"],
        "cold_s": cold,
        "fixed_s": fixed,
        "divisible_s": meta["seconds"] - fixed,
    }


def _best_ratios(base_name: str, base: dict, name: str, other: dict, rows: int) -> None:
    ratios = {
        key: other[key]["best_ms"] / r["best_ms"]
        for key, r in base.items()
        if key in other and r["best_ms"] and other[key]["best_ms"]
    }
    if not ratios:
        print(f"\nno problem was tuned by both run {base_name} and run {name}")
        return
    values = sorted(ratios.values())
    within = [sum(abs(v - 1) <= x for v in values) for x in (0.02, 0.03, 0.05)]
    same = sum(config_text(base[k]["best"]) == config_text(other[k]["best"]) for k in ratios)
    print(
        f"\nbest time, run {name} over run {base_name}, {len(values)} problems: median "
        f"{statistics.median(values):.3f}, range {values[0]:.3f}-{values[-1]:.3f}; within 2%/3%/5%: "
        f"{within[0]}/{within[1]}/{within[2]}; same best config: {same}"
    )
    print(f"\n| problem | run {base_name} ms | config | run {name} ms | config | ratio |")
    print("|---|---:|---|---:|---|---:|")
    for key, ratio in sorted(ratios.items(), key=lambda kv: -abs(kv[1] - 1))[:rows]:
        a, b = base[key], other[key]
        print(
            f"| {a['label']} | {a['best_ms']:.4f} | {config_text(a['best']) or '-'} | {b['best_ms']:.4f} "
            f"| {config_text(b['best']) or '-'} | {ratio:.3f} |"
        )


# ---------------------------------------------------------------- two "hosts", one killed
def _postgres_env(port: int) -> dict[str, str]:
    """``.ci/start-postgres``'s environment: the ``pgserver`` wheel's binaries where the host
    has no PostgreSQL of its own (the GPU hosts have none; pip installs the wheel offline)."""
    env = dict(os.environ, PGPORT=str(port))
    if "PG_BINDIR" not in env and not list(Path("/usr/lib/postgresql").glob("*/bin")):
        found = importlib.util.find_spec("pgserver")  # only its binaries: not imported
        if found is None or not found.submodule_search_locations:
            raise SystemExit("no PostgreSQL here: install it, or the pgserver wheel, or set PG_BINDIR")
        env["PG_BINDIR"] = str(Path(found.submodule_search_locations[0]) / "pginstall" / "bin")
    return env


def start_postgres(port: int) -> tuple[str, str]:
    """(URL, directory) of a throwaway server."""
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "start-postgres")],
        env=_postgres_env(port),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"PostgreSQL did not start:\n{done.stderr[-2000:]}")
    pgdir = next(line[6:] for line in done.stderr.splitlines() if line.startswith("PGDIR="))
    return done.stdout.strip(), pgdir


def _owned(db: TuningDB, pid: int) -> tuple[int, bool]:
    """How many leases the process ``pid`` of this host finished, and whether it holds one."""
    prefix = f"{socket.gethostname()}:{pid}:"
    with db.session() as s:
        rows = s.execute(select(LeaseRecord.owner, LeaseRecord.state)).all()
    mine = [state for owner, state in rows if owner and owner.startswith(prefix)]
    return sum(state == "done" for state in mine), "leased" in mine


def hosts(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    url, pgdir = (args.db, None) if args.db else start_postgres(args.port)
    try:
        _hosts(args, out, url)
    finally:
        if pgdir is not None:
            stop = ["bash", str(ROOT / ".ci" / "start-postgres"), "stop", pgdir]
            subprocess.run(stop, env=_postgres_env(args.port), check=False)


def _hosts(args: argparse.Namespace, out: Path, url: str) -> None:
    devices = args.devices.split(",")
    caches = ["one" if args.one_host else d for d in devices]  # one host: one compile server and cache
    envs = [_cold_env(Path(f"/tmp/fleet-hosts-cache-{c}")) for c in caches]
    ttl = ["--lease-ttl", str(args.lease_ttl)]
    cmds = [[*_tune_command(args.suites, d, args.trials, args.jobs, url, args), *ttl] for d in devices]
    since = datetime.now(timezone.utc)
    start = time.monotonic()
    events: list[str] = []

    def launch(i: int, tag: str) -> subprocess.Popen:
        so = (out / f"hosts-{tag}.json").open("w")
        se = (out / f"hosts-{tag}.err").open("w")
        events.append(f"{time.monotonic() - start:.1f} s: started {tag} on GPU {devices[i]}")
        return subprocess.Popen(cmds[i], stdout=so, stderr=se, env=envs[i], start_new_session=True)

    procs = {f"host{i}": launch(i, f"host{i}") for i in range(len(devices))}
    victim = procs[f"host{len(devices) - 1}"]
    killed_at = None
    with TuningDB.open(url) as db:
        while args.kill_after >= 0 and killed_at is None and victim.poll() is None:
            finished, holds = _owned(db, victim.pid)
            if finished >= args.kill_after and holds:
                time.sleep(args.kill_delay)  # into the problem's trials
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()
                killed_at = time.monotonic() - start
                events.append(
                    f"{killed_at:.1f} s: killed host{len(devices) - 1} (SIGKILL) after {finished} problems"
                )
            time.sleep(0.5)
    if killed_at is not None and args.restart_after >= 0:
        time.sleep(args.restart_after)
        procs["restarted"] = launch(len(devices) - 1, "restarted")
    rcs = {tag: _stop(p, args.limit) for tag, p in procs.items() if p is not victim or killed_at is None}
    wall = time.monotonic() - start
    events.append(f"{wall:.1f} s: all ended, status {rcs}")
    check = hosts_check(url, args.trials)
    report = {"url": url.rsplit("@", 1)[-1], "commands": [" ".join(c[1:]) for c in cmds], "events": events}
    report |= {"seconds": wall, "killed_at_s": killed_at, "check": check, "leases": timeline(url, since)}
    (out / "hosts.json").write_text(json.dumps(report, indent=1, default=str))
    if args.name:  # the processes' results as one run, for ``compare``
        results = [r for tag in procs for r in _json_list(out / f"hosts-{tag}.json")]
        (out / f"results-{args.name}.json").write_text(json.dumps(results))
        meta = {"name": args.name, "gpus": len(devices), "devices": args.devices, "trials": args.trials}
        meta |= {"suites": args.suites, "seconds": wall, "rc": max(rcs.values(), default=0)}
        meta |= {"command": report["commands"], "leases": report["leases"]}
        (out / f"run-{args.name}.json").write_text(json.dumps(meta, indent=1, default=str))
    print("\n".join(events))
    print("\n| check | value |\n|---|---|")
    for k, v in check.items():
        print(f"| {k} | {v} |")


def _json_list(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return json.loads(text) if text.strip() else []  # (a killed process printed nothing)


def hosts_check(url: str, trials: int) -> dict[str, object]:
    """What the database says of the list after the run (see the module doc)."""
    with TuningDB.open(url) as db:
        status = fleet_status(db)
        with db.session() as s:
            leases = s.execute(
                select(LeaseRecord.problem_id, LeaseRecord.state, LeaseRecord.attempts, LeaseRecord.owner)
            ).all()
            per_problem = Counter(s.scalars(select(TrialRecord.problem_id)).all())
    done = [x for x in leases if x.state == "done"]
    counts = [per_problem[x.problem_id] for x in leases]
    return {
        "problems": len(leases),
        "lease states": dict(Counter(x.state for x in leases)),
        "left held (leased)": sum(x.state == "leased" for x in leases),
        "attempts (count of leases by attempts)": dict(sorted(Counter(x.attempts for x in leases).items())),
        "problems with no trial recorded": sum(per_problem[x.problem_id] == 0 for x in done),
        f"problems with more than {trials} + 1 trials": sum(
            per_problem[x.problem_id] > trials + 1 for x in leases
        ),
        "trials recorded (min..max per problem)": f"{min(counts, default=0)}..{max(counts, default=0)}",
        "workers": ", ".join(
            f"{w.name.split(':', 1)[1]} {w.state} ({w.problems} problems)" for w in status.workers
        ),
        "done by worker": dict(Counter(x.owner.split(":", 1)[1] for x in done if x.owner)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, required=True)
    common.add_argument("--suites", default="quick,llm,conv", help="built-in suites, tuned by one command")
    common.add_argument("--trials", type=int, default=12)
    common.add_argument("--jobs", type=int, default=8, help="compile processes per GPU")
    common.add_argument(
        "--limit", type=float, default=600, help="seconds a command may take (then it is killed)"
    )
    common.add_argument("--interpret", action="store_true", help="a CPU dry run of this script (not timings)")
    r = sub.add_parser("run", parents=[common], help="tune the suites on N GPUs with one command")
    r.add_argument("--gpus", type=int, required=True)
    r.add_argument("--devices", help="which GPUs (default 0..N-1)")
    r.add_argument("--name", help="the run's name in DIR (default: N)")
    r.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="skip the untimed import that warms the host's file cache before the command",
    )
    c = sub.add_parser("compare", help="the tables of runs")
    c.add_argument("out", type=Path)
    c.add_argument("--runs", default="1,2", help="run names, the first one the base")
    c.add_argument("--rows", type=int, default=12, help="problems listed per pair, the farthest from 1 first")
    h = sub.add_parser("hosts", parents=[common], help="two processes on one PostgreSQL database, one killed")
    h.add_argument("--devices", default="0,1", help="one process per GPU named; the last one is killed")
    h.add_argument("--db", help="a database to use instead of starting a PostgreSQL server (a URL or path)")
    h.add_argument(
        "--one-host",
        action="store_true",
        help="the processes share caches and a compile server, as processes of one host do",
    )
    h.add_argument("--name", help="also write the processes' results as run NAME, for compare")
    h.add_argument("--port", type=int, default=54329)
    h.add_argument("--lease-ttl", type=float, default=20.0)
    h.add_argument(
        "--kill-after",
        type=int,
        default=8,
        help="problems the last process finishes before it is killed (<0: none is killed)",
    )
    h.add_argument("--kill-delay", type=float, default=1.0, help="seconds into its next problem")
    h.add_argument(
        "--restart-after", type=float, default=5.0, help="seconds until it starts again (<0: never)"
    )
    args = parser.parse_args()
    {"run": run, "compare": compare, "hosts": hosts}[args.what](args)


if __name__ == "__main__":
    main()
