"""The compile server the tuning commands of a host share.

Each ``epilab tune`` used to start compile processes of its own (``worker.CompilePool``: 8 per
GPU, each importing torch and Triton and creating its CUDA context), and its first problem
waited 9-11 s for them on an H100, in every command. The first command now starts this
server, detached; the later commands of the same user, epilab, Python, torch, Triton and
settings connect to it and find its processes warm. It leaves once no command has been
connected for ``settings().compile_server_idle_s`` (default 300 s; 0: no server). While it
lives, each of its processes holds a CUDA context (about 0.5 GB of GPU memory).

Where: ``<tmp>/epilab-<uid>/<fingerprint>.sock``, in a directory only this user may enter,
with a key beside it for ``multiprocessing.connection``'s HMAC handshake, so that nobody else
can hand it work. The fingerprint covers what a compile depends on: epilab's own files, the
Python, torch, Triton and the ``EPILAB_*``, ``TRITON_*`` and ``CUDA_VISIBLE_DEVICES``
settings; a changed tree gets a server of its own (the old one leaves when idle). A lock
file keeps one server per fingerprint when two commands start at once.

The protocol, pickled tuples over the connection:

    ("compile", id, device, target, problem JSON, configs)  ->  ("result", id, i, result) per
        config, in order, each as soon as it and those before it are done (``CompilePool.compiled``)
    ("warm", device, target, problem JSON, configs)  ->  nothing: compiled in the background
    ("start", device)                                ->  nothing: the device's processes start
    ("ping",)                                        ->  ("pong", {pid, clients, jobs, ...})
    ("stop",)                                        ->  the server leaves

The server keeps one process pool per device, ``jobs`` processes pinned to it, as a command's
own pool would be; a compile that takes a process down breaks that pool, whose unfinished
compiles come back ``unknown`` (the GPU worker decides), and a new pool takes the next ones.

A candidate is compiled once for a target (the device's name and compute capability): a request
for one that is being compiled, or was, shares that compile, whichever command or device of the
same model asked first. With two GPUs tuning one list, each worker warmed the next problem of
the list while the other worker was already compiling it: the 2-GPU run built 427 kernels where
one GPU built 327, and its problems waited 40% longer for compiles (RESULTS.md, 2026-11-28).
A shared result counts as a cache hit for the later requester (its build is the first's).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import itertools
import json
import logging
import multiprocessing as mp
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from epilab.tuner.worker import Cancelled, CompilePool, _compile_task, _env, _init_compile_worker, _started

SHARED_COMPILES = 8192  # candidates whose compiles a later request may share (the newest kept)
MAX_SOCKET_PATH = 100  # bytes: a Unix socket's address holds 107 on Linux (and 103 on macOS)
MAX_LOG_BYTES = 1 << 20  # the servers' log beside the socket starts again past this size
START_TIMEOUT_S = 60.0  # a server that does not answer by then is given up: the command compiles itself
HANDSHAKE_S = 5.0  # a peer that has not proven it holds the key by then is cut off (either side)
SILENT_S = 30.0  # a server silent this long is asked whether it lives; silent as long again: given up
# the parts of the package a compile runs (renders, builds, checks), fingerprinted by name, size and mtime
COMPILED_FROM = ("__init__.py", "config.py", "files.py", "ir", "templates", "tuner")


class ServerUnavailable(RuntimeError):
    """No compile server could be reached or started: the command compiles in its own pool."""


def address_dir() -> Path:
    """``<tmp>/epilab-<uid>``, made if missing; refused unless this user owns it and nobody else
    may enter it (another user's socket there could be handed our tasks, or hand us results)."""
    where = Path(tempfile.gettempdir()) / f"epilab-{os.getuid()}"
    try:
        where.mkdir(mode=0o700)
    except FileExistsError:  # ours from before, or anything another user put there: looked at below
        pass
    except OSError as e:
        why = f"cannot make {where} ({e.strerror}); set TMPDIR to a directory of this user's"
        raise ServerUnavailable(why) from e
    st = where.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServerUnavailable(
            f"{where} is not a directory of this user's that only it may enter ({_kind(st.st_mode)}, "
            f"mode {stat.S_IMODE(st.st_mode):o}, owner {st.st_uid}); remove it, set TMPDIR to another "
            "directory, or set EPILAB_COMPILE_SERVER_IDLE=0"
        )
    return where


def fingerprint() -> str:
    """What must match for a server's compiles to be this command's (see the module doc). The
    versions are the installed distributions' (torch and Triton are not imported for them: a
    command starts its server before it imports torch, ``EarlyStart``)."""
    h = hashlib.sha256(f"{sys.executable}\0{_version('torch')}\0{_version('triton')}".encode())
    for key in sorted(os.environ):
        if key.startswith(("EPILAB_", "TRITON_")) or key == "CUDA_VISIBLE_DEVICES":
            h.update(f"\0{key}={os.environ[key]}".encode())
    root = Path(__file__).resolve().parent.parent
    for part in COMPILED_FROM:
        files = [root / part] if (root / part).is_file() else sorted((root / part).rglob("*"))
        for f in files:
            if f.suffix in (".py", ".jinja") and f.is_file():
                st = f.stat()
                h.update(f"\0{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def _version(name: str) -> str:
    """The installed distribution's version, without importing it; the module's own where no
    distribution says (a source tree on the path)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return str(importlib.import_module(name).__version__)


def _paths(where: Path, print_: str) -> dict[str, Path]:
    return {ext: where / f"{print_}.{ext}" for ext in ("sock", "key", "lock", "log")}


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(mode) else "not a directory"


def try_connect(sock: Path, key_file: Path) -> Connection | None:
    """A connection to the server at ``sock`` that has proven it holds our key, and we its;
    None where there is none to connect to (not up yet, gone) or it holds another key. Raises
    ``ServerUnavailable`` where one took the connection and did not answer within
    ``HANDSHAKE_S`` (stopped or hung: waiting for it would hang the command)."""
    try:
        key = key_file.read_bytes()
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            raw.settimeout(HANDSHAKE_S)  # a full backlog (a stopped server's) blocks connect
            raw.connect(str(sock))
            raw.settimeout(None)
        except BaseException:
            raw.close()
            raise
    except OSError:
        return None
    conn = Connection(raw.detach())
    try:
        if _authenticated(conn, key, server=False):
            return conn
    except TimeoutError:
        conn.close()
        raise ServerUnavailable(
            f"the compile server at {sock} did not answer within {HANDSHAKE_S:.0f} s (stopped or hung; "
            "`epilab tune compile-server --stop` ends it)"
        ) from None
    conn.close()
    return None


def _authenticated(conn: Connection, key: bytes, *, server: bool) -> bool:
    """``multiprocessing``'s HMAC challenge each way (the server's first), within
    ``HANDSHAKE_S``: a peer that stalls is cut off (``TimeoutError``), and only the connection
    it holds waits. False where the peer failed it (another key, or it left)."""
    from multiprocessing.connection import answer_challenge, deliver_challenge

    late = threading.Event()

    def cut() -> None:
        late.set()
        _shut_down(conn)

    timer = threading.Timer(HANDSHAKE_S, cut)
    timer.start()
    try:
        if server:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
        else:
            answer_challenge(conn, key)
            deliver_challenge(conn, key)
    except (OSError, EOFError, mp.AuthenticationError):
        if late.is_set():
            raise TimeoutError from None
        return False
    finally:
        timer.cancel()
    if late.is_set():
        raise TimeoutError
    return True


def _shut_down(conn: Connection) -> None:
    """Shut ``conn``'s socket down: a thread blocked reading it wakes (a dup of it, so that the
    connection's own descriptor stays for its owner to close)."""
    unix = (socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(OSError), socket.fromfd(conn.fileno(), *unix) as dup:
        dup.shutdown(socket.SHUT_RDWR)


def connect(jobs: int, *, task: str | None = None, timeout_s: float = START_TIMEOUT_S) -> Connection:
    """A connection to this host's compile server for this command's fingerprint, started
    (detached) when none answers. ``task``: MODULE:FUNCTION its processes run instead of
    compiling (tests)."""
    paths = _paths(address_dir(), fingerprint())
    if len(os.fsencode(paths["sock"])) > MAX_SOCKET_PATH:
        raise ServerUnavailable(
            f"{paths['sock']} is too long for a Unix socket's address; set TMPDIR to a shorter directory"
        )
    conn = try_connect(paths["sock"], paths["key"])
    if conn is not None:
        return conn
    # cwd and sys.path[0] the private directory: a module in the directory the command started
    # in (an ``argparse.py``) would run inside the server, which serves later commands
    isolated = ["-P"] if sys.version_info >= (3, 11) else []
    command = [sys.executable, *isolated, "-m", "epilab.tuner.compile_server"]
    command += ["--address", str(paths["sock"]), "--jobs", str(jobs), *(["--task", task] if task else [])]
    log_file = paths["log"]
    fresh = not log_file.exists() or log_file.stat().st_size > MAX_LOG_BYTES  # (a server's lines each)
    with open(log_file, "wb" if fresh else "ab") as log:
        server = subprocess.Popen(
            command,
            cwd=paths["sock"].parent,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = try_connect(paths["sock"], paths["key"])
        if conn is not None:
            return conn
        code = server.poll()  # 0: another server of this fingerprint held the lock, and serves
        if code not in (None, 0):
            last = log_file.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise ServerUnavailable(
                f"the compile server exited with {code}: {last[0][:300]} (log: {log_file})"
            )
        time.sleep(0.05)
    raise ServerUnavailable(f"the compile server did not answer within {timeout_s:.0f} s (log: {log_file})")


class EarlyStart:
    """The server found or started, and its processes for ``devices`` asked to start, from a
    thread, while the command imports torch and opens its database: each process's imports and
    CUDA context took 5-10 s at the start of every command's first problem (RESULTS.md,
    2026-11-28, issue 45), now they overlap the command's own start-up. Nothing is reported
    here: a server that cannot start is the command's own connection's to report
    (``compile_pool`` warns and compiles in the command's processes). ``close`` when the
    command's tuners have connected."""

    def __init__(self, jobs: int, devices: tuple[int, ...], *, task: str | None = None) -> None:
        self._conn: Connection | None = None
        self._thread = threading.Thread(
            target=self._start, args=(jobs, devices, task), daemon=True, name="epilab compile server start"
        )
        self._thread.start()

    def _start(self, jobs: int, devices: tuple[int, ...], task: str | None) -> None:
        with contextlib.suppress(Exception):
            conn = connect(jobs, task=task)
            for device in devices:
                conn.send(("start", device))
            self._conn = conn

    def close(self) -> None:
        self._thread.join(timeout=START_TIMEOUT_S)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()


def device_target(device_index: int) -> str:
    """What a compile for ``device_index`` is built for (-1: the interpreter): devices of one
    name and compute capability share their compiles."""
    if device_index < 0:
        return "interpreter"
    import torch

    props = torch.cuda.get_device_properties(device_index)
    return f"{props.name} sm{props.major}{props.minor}"


def candidate_key(target: str, problem_json: str, config: dict[str, Any]) -> str:
    text = f"{target}\0{problem_json}\0{json.dumps(config, sort_keys=True)}"
    return hashlib.sha256(text.encode()).hexdigest()


def as_shared(result: dict[str, Any]) -> dict[str, Any]:
    """A compile's result for a later request that shared it: its binaries were Triton's cache
    hits to this requester, and the seconds the first request's."""
    hits = int(result.get("cache_hits", 0)) + int(result.get("built", 0))
    return {**result, "cache_hits": hits, "built": 0, "build_s": 0.0, "pool_phases": {}, "shared": True}


class ServerPool:
    """A command's handle on the host's compile server, with ``CompilePool``'s interface; where
    the server goes away, the command goes on in a pool of its own."""

    def __init__(self, jobs: int, device_index: int, *, task: str | None = None) -> None:
        self.jobs = jobs
        self.device_index = device_index
        self.target = device_target(device_index)
        self.cancelled = False
        self._task = task
        self._conn: Connection | None = connect(jobs, task=task)
        self._ids = itertools.count()
        self._local: CompilePool | None = None

    def _send(self, message: tuple) -> bool:
        if self._conn is None:
            return False
        try:
            self._conn.send(message)
            return True
        except (OSError, ValueError):  # the server left (or this handle was closed)
            self._lost()
            return False

    def _lost(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _shut_down(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _own_pool(self) -> CompilePool:
        if self._local is None:
            self._local = CompilePool(self.jobs, self.device_index, _load_task(self._task))
        return self._local

    def start(self) -> None:
        self._send(("start", self.device_index))

    def compiled(self, problem_json: str, configs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each config's compile result in order, as ``CompilePool.compiled`` gives them."""
        if self.cancelled:
            raise Cancelled("the compile pool was cancelled")
        request = next(self._ids)
        if not self._send(("compile", request, self.device_index, self.target, problem_json, configs)):
            yield from self._own_pool().compiled(problem_json, configs)
            return
        done = 0
        while done < len(configs):
            try:
                message = self._receive()
            except (EOFError, OSError, AttributeError):  # the server left, or cancel() closed it
                self._lost()
                why = "cancelled" if self.cancelled else "the compile server went away"
                yield from ({"status": "unknown", "detail": why} for _ in range(len(configs) - done))
                return
            if message is None:  # alive but silent (stopped, or hung): compiled here instead
                logging.getLogger("epilab").warning(
                    "the compile server did not answer for %.0f s: compiling in this command's own processes",
                    2 * SILENT_S,
                )
                self._lost()
                yield from self._own_pool().compiled(problem_json, configs[done:])
                return
            if message[0] == "result" and message[1] == request:  # (not a batch left unread)
                done += 1
                yield message[3]

    def _receive(self) -> tuple | None:
        """The server's next message; None where it stays silent ``SILENT_S`` after being asked
        whether it lives (a compile may take long; a server that answers is waited for)."""
        asked = False
        while True:
            if self._conn.poll(SILENT_S):  # type: ignore[union-attr]
                message = self._conn.recv()  # type: ignore[union-attr]
                if message[0] != "pong":
                    return message
                asked = False
            elif asked:
                return None
            else:
                self._conn.send(("ping",))  # type: ignore[union-attr]
                asked = True

    def warm(self, problem_json: str, configs: list[dict[str, Any]]) -> None:
        if not self.cancelled and configs:
            self._send(("warm", self.device_index, self.target, problem_json, configs))

    def close(self) -> None:
        self._lost()
        if self._local is not None:
            self._local.close()

    def cancel(self) -> None:
        """From another thread: the batch under way comes back ``unknown`` (its connection
        closed); the server cancels what this command had queued."""
        self.cancelled = True
        self._lost()
        if self._local is not None:
            self._local.cancel()


def compile_pool(jobs: int, device_index: int) -> ServerPool | CompilePool:
    """The host's compile server where it can be reached or started (and
    ``EPILAB_COMPILE_SERVER_IDLE`` is not 0), else a pool of this command's own."""
    from epilab.config import settings

    if settings().compile_server_idle_s > 0:
        try:
            return ServerPool(jobs, device_index)
        except ServerUnavailable as e:
            logging.getLogger("epilab").warning("compiling in this command's own processes: %s", e)
    return CompilePool(jobs, device_index)


# -- the server --------------------------------------------------------------------------------


class Server:
    def __init__(
        self, jobs: int, idle_s: float, task: Callable[[dict[str, Any]], dict[str, Any]], key: bytes
    ) -> None:
        self.jobs = jobs
        self.key = key
        self.idle_s = idle_s
        self.task = task
        self.pools: dict[int, ProcessPoolExecutor] = {}
        self.lock = threading.Lock()
        self.clients = 0
        self.served = 0
        self.shared = 0  # requests that shared another's compile
        self.compiles: OrderedDict[str, Future] = OrderedDict()  # candidate_key -> compile, newest last
        self.users: Counter[Future] = Counter()  # connections waiting on an unfinished compile
        self.last_seen = time.monotonic()
        self.started = time.time()

    def pool(self, device: int) -> ProcessPoolExecutor:
        with self.lock:
            pool = self.pools.get(device)
            if pool is None:
                pool = self.pools[device] = ProcessPoolExecutor(
                    max_workers=self.jobs,
                    mp_context=mp.get_context("spawn"),
                    initializer=_init_compile_worker,
                    initargs=(_env(), device, os.getpid()),
                )
            return pool

    def renew(self, device: int, broken: ProcessPoolExecutor) -> None:
        with self.lock:
            if self.pools.get(device) is broken:
                broken.shutdown(wait=False, cancel_futures=True)
                del self.pools[device]

    def submit(
        self, device: int, target: str, problem_json: str, configs: list[dict[str, Any]]
    ) -> list[tuple[Future, bool]]:
        """Each config's compile and whether it is shared: the one under way or done for the same
        candidate and target where there is one (see the module doc), else a new one on
        ``device``'s processes."""
        keys = [candidate_key(target, problem_json, c) for c in configs]
        found: dict[int, Future] = {}
        with self.lock:
            for i, key in enumerate(keys):
                future = self.compiles.get(key)
                if future is not None and _shareable(future):
                    self.compiles.move_to_end(key)
                    found[i] = future
        fresh = self._submit_new(device, problem_json, [c for i, c in enumerate(configs) if i not in found])
        for future in fresh:  # (outside the lock: a future already done calls it at once)
            future.add_done_callback(self._finished)
        new = iter(fresh)
        out: list[tuple[Future, bool]] = []
        with self.lock:
            for i, key in enumerate(keys):
                future = found.get(i) or next(new)
                if i not in found:
                    self.compiles[key] = future
                else:
                    self.shared += 1
                if not future.done():
                    self.users[future] += 1
                out.append((future, i in found))
            while len(self.compiles) > SHARED_COMPILES:
                self.compiles.popitem(last=False)
        return out

    def _submit_new(self, device: int, problem_json: str, configs: list[dict[str, Any]]) -> list[Future]:
        tasks = [{"job": "compile", "problem": problem_json, "config": c} for c in configs]
        for attempt in range(2):
            pool = self.pool(device)
            try:
                futures = [pool.submit(self.task, t) for t in tasks]
            except (BrokenProcessPool, RuntimeError):  # broken (or shut down) by an earlier compile
                self.renew(device, pool)
                if attempt:
                    raise
                continue
            for future in futures:  # the pool to renew if it breaks (a shared one may be another device's)
                future.epilab_pool = (device, pool)  # type: ignore[attr-defined]
            return futures
        raise AssertionError("unreachable")

    def _finished(self, future: Future) -> None:
        with self.lock:
            self.users.pop(future, None)

    def release(self, future: Future) -> None:
        """A connection that queued ``future`` ended: the compile is cancelled once no other
        connection waits on it."""
        with self.lock:
            if future.done() or future not in self.users:
                return
            self.users[future] -= 1
            if self.users[future] > 0:
                return
            del self.users[future]
        future.cancel()

    def serve(self, listener: Listener) -> None:
        threading.Thread(target=self._watch, daemon=True, name="idle watch").start()
        while True:
            try:
                conn = listener.accept()  # no handshake here: a client that never answers held
            except OSError:  # every later one behind it
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, max(0.05, self.idle_s / 4)))
            with self.lock:
                idle = self.clients == 0 and time.monotonic() - self.last_seen > self.idle_s
            if idle:
                self.leave()

    def leave(self) -> None:
        """End the server and its processes now."""
        for pool in list(self.pools.values()):
            for proc in list((getattr(pool, "_processes", None) or {}).values()):  # no public handle
                with contextlib.suppress(Exception):
                    proc.kill()
        os._exit(0)

    def _handle(self, conn: Connection) -> None:
        """One connection's messages; it counts as a client (keeps the server up) from its first
        request for work on, not while it only asks the status."""
        send = threading.Lock()
        queued: list[Future] = []
        counted = False
        try:
            try:
                if not _authenticated(conn, self.key, server=True):
                    return
            except TimeoutError:
                return
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return
                kind = message[0]
                if kind in ("compile", "warm", "start"):
                    with self.lock:
                        self.clients += 0 if counted else 1
                        counted, self.last_seen = True, time.monotonic()
                if kind == "compile":
                    _, request, device, target, problem_json, configs = message
                    futures = self.submit(device, target, problem_json, configs)
                    queued = [f for f in queued if not f.done()] + [f for f, _ in futures]
                    args = (conn, send, request, device, futures)
                    threading.Thread(target=self._answer, args=args, daemon=True).start()
                elif kind == "warm":
                    _, device, target, problem_json, configs = message
                    warmed = [f for f, _ in self.submit(device, target, problem_json, configs)]
                    queued = [f for f in queued if not f.done()] + warmed
                elif kind == "start":
                    pool = self.pool(message[1])
                    pool_starts = [pool.submit(_started) for _ in range(self.jobs)]
                    for f in pool_starts:
                        f.add_done_callback(self._finished)
                    with self.lock:
                        self.users.update(f for f in pool_starts if not f.done())
                    queued += pool_starts
                elif kind == "ping":
                    with send:
                        conn.send(("pong", self.status()))
                elif kind == "stop":
                    self.leave()
        finally:
            for f in queued:  # what this command queued and did not wait for: nobody will read it
                self.release(f)
            if counted:
                with self.lock:
                    self.clients -= 1
                    self.last_seen = time.monotonic()
            with contextlib.suppress(OSError):
                conn.close()

    def _answer(
        self, conn: Connection, send: threading.Lock, request: int, device: int, futures: list
    ) -> None:
        for i, (future, shared) in enumerate(futures):
            try:
                result = as_shared(future.result()) if shared else future.result()
            except BrokenProcessPool as e:
                self.renew(*getattr(future, "epilab_pool", (device, self.pools.get(device))))
                result = {"status": "unknown", "detail": str(e) or type(e).__name__}
            except Exception as e:  # cancelled, or the task raised: the GPU worker decides
                result = {"status": "unknown", "detail": f"{type(e).__name__}: {e}"[:1500]}
            self.served += 1
            try:
                with send:
                    conn.send(("result", request, i, result))
            except (OSError, ValueError):  # the command left
                return

    def status(self) -> dict[str, Any]:
        """What ``epilab tune compile-server`` shows."""
        with self.lock:
            clients = self.clients
            idle = time.monotonic() - self.last_seen
            return {
                "pid": os.getpid(),
                "clients": clients,
                "jobs": self.jobs,
                "devices": sorted(self.pools),
                "compiles": self.served,
                "shared": self.shared,
                "up_s": round(time.time() - self.started, 1),
                "leaves_in_s": None if clients else round(max(0.0, self.idle_s - idle), 1),
            }


def _shareable(future: Future) -> bool:
    """A compile a later request may share: under way, or done with a result (not cancelled,
    not broken, not ``unknown``: those are compiled again)."""
    if future.cancelled():
        return False
    if not future.done():
        return True
    return future.exception() is None and future.result().get("status") != "unknown"


def _load_task(spec: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    if not spec:
        return _compile_task
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> None:
    import fcntl

    from epilab.config import settings

    parser = argparse.ArgumentParser(description="epilab's compile server (started by epilab tune)")
    parser.add_argument("--address", required=True)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--task", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    task = _load_task(args.task)  # before listening: a server that cannot run is seen to exit
    sock = Path(args.address)
    lock = os.open(sock.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another server of this fingerprint is up (or starting): it serves
        return
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())  # for ``stop`` of a server that does not answer
    sock.unlink(missing_ok=True)  # a killed server's
    key = os.urandom(32)
    tmp = sock.with_suffix(f".key.{os.getpid()}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    listener = Listener(str(sock), family="AF_UNIX")  # each connection authenticated on its own thread
    os.chmod(sock, 0o600)
    os.replace(tmp, sock.with_suffix(".key"))
    print(f"compile server {os.getpid()} at {sock}: {args.jobs} processes a device", flush=True)
    Server(max(1, args.jobs), settings().compile_server_idle_s, task, key).serve(listener)


if __name__ == "__main__":
    main()
