"""The compile servers on this host, for ``epilab compile-server`` (``tuner/compile_server.py``
is what they are): each one's socket and status, the process that holds one, and stopping one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from epilab.tuner.compile_server import ServerUnavailable, address_dir, try_connect


def servers() -> list[tuple[Path, dict[str, Any] | None]]:
    """This user's compile servers on this host: each socket with its server's status (None: it
    did not answer, a stale socket)."""
    try:
        where = address_dir()
    except ServerUnavailable:
        return []
    found = []
    for sock in sorted(where.glob("*.sock")):
        try:
            conn = try_connect(sock, sock.with_suffix(".key"))
        except ServerUnavailable:  # alive and silent
            conn = None
        status = None
        if conn is not None:
            with contextlib.suppress(OSError, EOFError), conn:
                conn.send(("ping",))
                if conn.poll(5):
                    status = conn.recv()[1]
        found.append((sock, status))
    return found


def holder(sock: Path) -> int | None:
    """The pid of the server that holds ``sock``'s lock (alive, answering or not); None where
    none does (the socket is a killed server's)."""
    import fcntl

    try:
        fd = os.open(sock.with_suffix(".lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: a server lives
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def stop(sock: Path) -> str:
    """Make the server at ``sock`` leave now. What was done: ``"stopped"`` (it answered and was
    asked), ``"killed"`` (it holds its lock but does not answer: stopped or hung; its pool's
    processes end with it), ``"removed"`` (a killed server's socket and key, left behind),
    ``"not answering"`` (alive, and its pid unknown)."""
    try:
        conn = try_connect(sock, sock.with_suffix(".key"))
    except ServerUnavailable:  # alive and silent
        conn = None
    if conn is not None:
        with contextlib.suppress(OSError, EOFError), conn:
            conn.send(("stop",))
            conn.poll(5)
        return "stopped"
    pid = holder(sock)
    if pid is not None and pid <= 0:
        return "not answering"
    done = "removed"
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while holder(sock) is not None and time.monotonic() < end:
            time.sleep(0.05)
        done = "killed"
    for path in (sock, sock.with_suffix(".key")):
        path.unlink(missing_ok=True)
    return done
