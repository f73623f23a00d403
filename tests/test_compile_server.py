"""The compile server that the tuning commands of a host share: one per fingerprint, started
by the first command, found warm by the next, answering each batch in order, leaving when
idle; refused where its directory is not this user's alone. Its processes run a stand-in
compile here (a module of the test's), so no GPU is needed."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time

import pytest

from epilab import config
from epilab.tuner import compile_server
from epilab.tuner.compile_admin import holder, servers, stop
from epilab.tuner.compile_server import ServerPool, ServerUnavailable, compile_pool
from epilab.tuner.worker import CompilePool

STAND_IN = """
import os
import time


def compile_task(task):
    time.sleep(task["config"].get("sleep", 0.0))
    return {"status": "compiled", "pid": os.getpid(), "tag": task["config"].get("tag")}
"""
TASK = "stand_in_server:compile_task"


@pytest.fixture
def host(monkeypatch):
    """A private temporary directory (socket paths must stay short), the stand-in importable by
    the server and its processes, and every server stopped afterwards."""
    root = tempfile.mkdtemp(prefix="es", dir="/tmp")
    with open(os.path.join(root, "stand_in_server.py"), "w") as f:
        f.write(STAND_IN)
    monkeypatch.setattr(tempfile, "tempdir", root)
    monkeypatch.syspath_prepend(root)  # for a command's own pool where it falls back
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("EPILAB_COMPILE_SERVER_IDLE", "60")
    yield root
    for sock, _ in servers():
        stop(sock)
    shutil.rmtree(root, ignore_errors=True)


def _pids(results):
    return {r["pid"] for r in results}


def test_two_commands_share_one_warm_server(host):
    first = ServerPool(2, -1, task=TASK)
    try:
        results = list(first.compiled("{}", [{"sleep": 0.3, "tag": 0}, {"tag": 1}, {"tag": 2}]))
        assert [r["tag"] for r in results] == [0, 1, 2]  # in the batch's order
        assert all(r["status"] == "compiled" for r in results)
        second = ServerPool(2, -1, task=TASK)  # another command of the same fingerprint
        try:
            again = list(second.compiled("{}", [{"sleep": 0.2, "tag": 3}, {"sleep": 0.2, "tag": 4}]))
        finally:
            second.close()
        assert _pids(again) <= _pids(results) | _pids(again) and _pids(again) & _pids(results)
        [(sock, status)] = servers()
        assert status is not None and status["jobs"] == 2 and status["compiles"] == 5
        assert sock.stat().st_mode & 0o077 == 0
    finally:
        first.close()


def test_a_candidate_is_compiled_once_for_every_command_and_device_of_one_target(host):
    first, second = ServerPool(1, -1, task=TASK), ServerPool(1, -1, task=TASK)
    try:
        first.warm("{}", [{"sleep": 0.5, "tag": "next"}])  # a worker warming the next problem ...
        time.sleep(0.2)  # (the server reads each connection in a thread of its own)
        [shared] = list(second.compiled("{}", [{"sleep": 0.5, "tag": "next"}]))  # ... the other tunes
        [mine] = list(first.compiled("{}", [{"sleep": 0.5, "tag": "next"}]))  # and later, once more
        assert shared["status"] == mine["status"] == "compiled" and shared["shared"] and mine["shared"]
        assert shared["pid"] == mine["pid"]  # one process compiled it, once
        second.target = "another GPU sm80"  # another model: its own compile
        [other] = list(second.compiled("{}", [{"tag": "next"}]))
        assert other["status"] == "compiled" and "shared" not in other
        [(_, status)] = servers()
        assert status["shared"] == 2 and status["compiles"] == 3
    finally:
        first.close()
        second.close()


def test_a_shared_compile_counts_as_a_cache_hit_for_the_later_request():
    first = {
        "status": "compiled",
        "built": 2,
        "cache_hits": 1,
        "build_s": 1.5,
        "pool_phases": {"compile": 2.0},
    }
    later = compile_server.as_shared(first)
    assert later == {
        "status": "compiled",
        "built": 0,
        "cache_hits": 3,
        "build_s": 0.0,
        "pool_phases": {},
        "shared": True,
    }


def test_a_command_that_leaves_cancels_no_compile_another_waits_on(host):
    first, second = ServerPool(1, -1, task=TASK), ServerPool(1, -1, task=TASK)
    try:
        busy = [{"sleep": 1.0, "tag": "busy"}, {"tag": 1}, {"tag": 2}]  # (a process pool runs two ahead)
        first.warm("{}", busy)  # the one process is busy ...
        first.warm("{}", [{"tag": "queued"}])  # ... so this one waits in the queue
        time.sleep(0.2)
        threading.Timer(0.4, first.close).start()  # the first command ends: its queue is dropped
        [result] = list(second.compiled("{}", [{"tag": "queued"}]))
        assert result["status"] == "compiled" and result["tag"] == "queued"  # not cancelled under it
    finally:
        first.close()
        second.close()


def test_a_batch_left_unread_is_not_read_as_the_next(host):
    pool = ServerPool(2, -1, task=TASK)
    try:
        left = pool.compiled("{}", [{"tag": "old"}, {"sleep": 0.5, "tag": "old"}])
        assert next(left)["tag"] == "old"  # then abandoned, as a search stopped by a lost lease
        assert [r["tag"] for r in pool.compiled("{}", [{"tag": "new"}])] == ["new"]
    finally:
        pool.close()


def test_cancel_ends_a_batch_under_way(host):
    pool = ServerPool(1, -1, task=TASK)
    pool.start()
    try:
        batch = pool.compiled("{}", [{"sleep": 30.0}])
        threading.Timer(0.5, pool.cancel).start()
        started = time.monotonic()
        [result] = list(batch)
        assert result["status"] == "unknown" and time.monotonic() - started < 15
    finally:
        pool.close()


def test_the_server_leaves_once_idle(host, monkeypatch):
    monkeypatch.setenv("EPILAB_COMPILE_SERVER_IDLE", "1")
    pool = ServerPool(1, -1, task=TASK)
    list(pool.compiled("{}", [{"tag": 0}]))
    [(_, status)] = servers()
    assert status["clients"] == 1 and status["leaves_in_s"] is None  # not while a command is connected
    pool.close()
    end = time.monotonic() + 30
    while any(status is not None for _, status in servers()) and time.monotonic() < end:
        time.sleep(0.2)
    assert all(status is None for _, status in servers())


def test_a_command_starts_the_server_and_its_processes_before_it_needs_them(host):
    """``epilab tune`` starts them from a thread first thing (compile_server.EarlyStart), so that
    the processes' imports overlap the command's own; its tuners connect later and find them."""
    early = compile_server.EarlyStart(2, (-1,), task=TASK)
    end = time.monotonic() + 30
    while not any(s is not None and s["devices"] == [-1] for _, s in servers()):
        assert time.monotonic() < end, "the early start started no processes"
        time.sleep(0.1)
    pool = ServerPool(2, -1, task=TASK)  # the command's tuner
    try:
        assert [r["status"] for r in pool.compiled("{}", [{"tag": 0}])] == ["compiled"]
        [(_, status)] = servers()
        assert status["clients"] == 2
        early.close()  # the server counts it gone once its handler reads the end of the connection
        end = time.monotonic() + 30
        while [s and s["clients"] for _, s in servers()] != [1] and time.monotonic() < end:
            time.sleep(0.1)
        [(_, status)] = servers()
        assert status["clients"] == 1
    finally:
        pool.close()
        early.close()  # twice: nothing more


def test_the_early_start_names_only_gpus_it_can_count_without_torch(monkeypatch):
    """``epilab tune`` starts its GPU workers (from 3 GPUs up, a process a GPU) and the compile
    server's processes first thing, for the GPUs it can name without importing torch; a GPU it
    would refuse starts nothing."""
    from types import SimpleNamespace

    from epilab import cli
    from epilab.tuner import fleet_process

    servers_for, workers_for, processes_for, closing = [], [], [], []
    monkeypatch.setattr(
        compile_server,
        "EarlyStart",
        lambda jobs, devices: servers_for.append(devices) or SimpleNamespace(close=None),
    )
    monkeypatch.setattr(fleet_process, "start_early", workers_for.append)
    monkeypatch.setattr(fleet_process, "start_devices_early", processes_for.append)
    command = SimpleNamespace(call_on_close=closing.append)

    def started(*args):
        servers_for.clear()
        workers_for.clear()
        cli.tune._start_early(command, *args)
        return workers_for[:], servers_for[:]

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    with config.patch(compile_server_idle_s=60.0):
        assert started("cuda", "all", 8, False, True) == ([(0, 1)], [(0, 1)])
        assert started("cuda", "0,cuda:1", 8, False, True) == ([(0, 1)], [(0, 1)])
        assert started("cuda:1", None, 8, False, True) == ([(1,)], [(1,)])
        assert started("cuda", None, 8, False, True) == ([(0,)], [(0,)])
        assert len(closing) == 8  # what the command does not take is closed with it
        refused = [
            ("cuda", "0,2", 8, False, True),  # a GPU that is not there: the command says so
            ("cuda", "0,0", 8, False, True),
            ("cuda", "first", 8, False, True),
            ("cpu", None, 8, False, True),
            ("cuda", "0,1", 8, True, True),  # the interpreter
        ]
        assert [started(*args) for args in refused] == [([], [])] * len(refused)
        assert started("cuda", "0,1", 0, False, True) == ([(0, 1)], [])  # no compile processes
        assert started("cuda", "0,1", 8, False, False) == ([(0, 1)], [])  # --no-compile-server
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5")
    with config.patch(compile_server_idle_s=60.0):
        assert started("cuda", "all", 8, False, True) == ([], [(0, 1, 2)])
        assert processes_for == [(0, 1, 2)]  # a process a GPU, each starting its own worker
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert started("cuda", "all", 8, False, True) == ([], [])  # no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with config.patch(compile_server_idle_s=0.0):  # no server at all
        assert started("cuda", None, 8, False, True) == ([(0,)], [])


def test_a_directory_others_may_enter_is_refused(host):
    where = compile_server.address_dir()
    os.chmod(where, 0o755)
    with pytest.raises(ServerUnavailable, match="only it may enter"):
        compile_server.address_dir()
    with config.patch(compile_server_idle_s=60.0):
        fallback = compile_pool(1, -1)  # the command compiles in processes of its own, and says why
    assert isinstance(fallback, CompilePool)
    fallback.close()


def test_no_server_when_its_idle_time_is_zero(host):
    with config.patch(compile_server_idle_s=0.0):
        pool = compile_pool(1, -1)
    assert isinstance(pool, CompilePool) and servers() == []
    pool.close()


def test_the_cli_lists_and_stops_the_servers(host):
    from typer.testing import CliRunner

    from epilab.cli import app

    runner = CliRunner()
    pool = ServerPool(1, -1, task=TASK)
    try:
        served = list(pool.compiled("{}", [{"tag": 0}]))
        [(_, status)] = servers()
        shown = runner.invoke(app, ["tune", "compile-server"])
        assert shown.exit_code == 0 and str(status["pid"]) in shown.output
        assert "with its commands" in shown.output
        stopped = runner.invoke(app, ["tune", "compile-server", "--stop"])
        assert stopped.exit_code == 0 and "stopped 1 server(s)" in stopped.output
        end = time.monotonic() + 15
        while any(s is not None for _, s in servers()) and time.monotonic() < end:
            time.sleep(0.1)
        assert all(s is None for _, s in servers())
        [after] = pool.compiled("{}", [{"tag": 1}])  # its server left: compiled in the command's own
        assert after["status"] == "compiled" and after["pid"] not in _pids(served)
    finally:
        pool.close()
    assert runner.invoke(app, ["tune", "compile-server"]).output.count("stale") <= 1


def test_a_server_that_cannot_start_is_given_up_at_once(host):
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="exited with 1"):
        ServerPool(1, -1, task="no_such_module_here:compile_task")
    assert time.monotonic() - started < compile_server.START_TIMEOUT_S / 2


def test_a_socket_path_too_long_for_unix_is_refused_before_anything_starts(host, monkeypatch):
    deep = os.path.join(host, "d" * 90)
    os.mkdir(deep)
    monkeypatch.setattr(tempfile, "tempdir", deep)
    with pytest.raises(ServerUnavailable, match="too long for a Unix socket"):
        ServerPool(1, -1, task=TASK)


# -- the third round of attacks (issue 89): a client or server that never answers, the
# address taken by another user, code in the command's directory, orphans


def _server_pid() -> int:
    [(_, status)] = servers()
    assert status is not None
    return status["pid"]


def test_a_client_that_never_answers_holds_up_no_other(host, monkeypatch):
    import socket

    monkeypatch.setattr(compile_server, "HANDSHAKE_S", 1.0)
    first = ServerPool(1, -1, task=TASK)
    [(sock, _)] = servers()
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.connect(str(sock))  # and says nothing: the handshake is its own thread's, not the accept's
    try:
        started = time.monotonic()
        second = ServerPool(1, -1, task=TASK)
        try:
            assert [r["status"] for r in second.compiled("{}", [{"tag": 0}])] == ["compiled"]
        finally:
            second.close()
        assert time.monotonic() - started < 10
        assert mute.recv(1024)  # the challenge it was sent; then cut off, after HANDSHAKE_S
        mute.settimeout(10)
        while mute.recv(1024):
            pass
    finally:
        mute.close()
        first.close()


def test_a_stopped_server_is_given_up_and_the_command_compiles_on_its_own(host, monkeypatch):
    import signal

    monkeypatch.setattr(compile_server, "HANDSHAKE_S", 1.0)
    monkeypatch.setattr(compile_server, "SILENT_S", 1.0)
    pool = ServerPool(1, -1, task=TASK)
    served = list(pool.compiled("{}", [{"tag": 0}]))
    pid = _server_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        [mine] = pool.compiled("{}", [{"tag": 1}])  # silent twice SILENT_S: its own process compiles
        assert mine["status"] == "compiled" and mine["pid"] not in _pids(served)
        assert time.monotonic() - started < 15
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match="did not answer within 1 s"):
            ServerPool(1, -1, task=TASK)  # a later command gives it up at once
        with config.patch(compile_server_idle_s=60.0):
            fallback = compile_pool(1, -1)  # and compiles in processes of its own
        assert isinstance(fallback, CompilePool) and time.monotonic() - started < 10
        fallback.close()
        started = time.monotonic()
        found = servers()  # what `epilab tune compile-server` lists: it does not hang either
        assert [s for _, s in found] == [None] and time.monotonic() - started < 30
        assert holder(found[0][0]) == pid
        assert stop(found[0][0]) == "killed"  # a server that does not answer, killed by --stop
        assert servers() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        pool.close()


def test_the_address_taken_by_a_file_or_a_dangling_link_falls_back(host):
    where = os.path.join(host, f"epilab-{os.getuid()}")
    for make in (lambda: open(where, "w").close(), lambda: os.symlink(os.path.join(host, "nowhere"), where)):
        make()
        with pytest.raises(ServerUnavailable, match="not a directory of this user's"):
            compile_server.address_dir()
        with config.patch(compile_server_idle_s=60.0):
            fallback = compile_pool(1, -1)  # not FileExistsError: processes of the command's own
        assert isinstance(fallback, CompilePool)
        fallback.close()
        os.unlink(where)


def test_the_server_runs_no_module_of_the_commands_directory(host, monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "argparse.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    pool = ServerPool(1, -1, task=TASK)
    try:
        assert [r["status"] for r in pool.compiled("{}", [{"tag": 0}])] == ["compiled"]
    finally:
        pool.close()
    assert not marker.exists()


def test_a_killed_servers_processes_leave_and_stop_removes_its_socket(host):
    import signal

    pool = ServerPool(2, -1, task=TASK)
    try:
        workers = _pids(pool.compiled("{}", [{"sleep": 0.3, "tag": 0}, {"sleep": 0.3, "tag": 1}]))
        server = _server_pid()
        os.kill(server, signal.SIGKILL)
        end = time.monotonic() + 20
        while any(_alive(p) for p in workers) and time.monotonic() < end:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "the pool's processes outlived their server"
    finally:
        pool.close()
    [(sock, status)] = servers()
    assert status is None and holder(sock) is None  # stale: nobody holds its lock
    assert stop(sock) == "removed" and servers() == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
