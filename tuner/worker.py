"""Isolation: candidates run in a worker process that is restarted when it dies.

A ``Worker`` owns one spawned process holding the GPU (or Triton's interpreter).
Tasks go over a pipe; if the process dies (an illegal address, a segfault) the
task comes back as ``crashed``, and if it does not answer within the timeout it
is killed and the task comes back as ``timeout``; either way a fresh process is
started for the next task. A ``hook`` (a file path and function name) runs in
the worker before each task: tests use it to make a worker crash or hang.

A ``CompilePool`` runs the CPU-bound compiles of a batch of candidates in a
process pool, so the GPU worker mostly launches cached kernels; the worker takes
each candidate as soon as its compile is done, while the later ones compile.

``start_early`` starts the GPU workers of a command as it begins, before it imports torch:
a worker's own imports and CUDA context took 2.3-5.4 s of each device's first problem when
it was started with the command's tuner (RESULTS.md, 2026-11-28 and 2026-11-29, issue 45).
``Worker.for_device`` takes the one started for its device. A worker is killed when it is closed, not asked to
exit: it holds nothing to write once it has answered (its results went back, its caches are
written while a task runs), and its orderly exit (CUDA context, interpreter) took about a
second at the end of every command.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.machinery
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

PARENT_WATCH_S = 0.5  # how often a pool's process looks whether the process that started it is gone


class TuningBug(RuntimeError):
    """A task failed in a way no config should cause: stop the run and report it."""


class Cancelled(RuntimeError):
    """The worker was cancelled (Ctrl-C) while a task ran: the task has no result."""


def _ignore_interrupts() -> None:
    """Children leave Ctrl-C to the parent, which cancels them (``Worker.cancel``): a
    terminal's SIGINT reaches the whole process group, and a child that died of it
    would read as a crashed candidate."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def main_not_reimported() -> Iterator[None]:
    """Start spawned processes without re-running the user's main script in them.

    A spawned child imports the parent's ``__main__`` again (multiprocessing's "safe importing
    of the main module"), so a script that calls ``tune_model`` or ``compile(...,
    tune_missing=True)`` at its top level, without ``if __name__ == "__main__":``, would start
    workers from each worker and fail while bootstrapping. Ours need nothing from it: while
    they start, the main module's spec is named like a package's ``__main__``, which a child
    never imports (``multiprocessing.spawn._fixup_main_from_name``)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        spec = getattr(main, "__spec__", None)
        main.__spec__ = importlib.machinery.ModuleSpec("epilab.__main__", None)
        try:
            yield
        finally:
            main.__spec__ = spec


def _load_hook(hook: tuple[str, str] | None) -> Any:
    if hook is None:
        return None
    import importlib.util

    path, name = hook
    spec = importlib.util.spec_from_file_location("epilab_worker_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _serve(conn: Connection, env: dict[str, str], hook: tuple[str, str] | None, device_index: int) -> None:
    os.environ.update(env)  # before anything imports triton
    _ignore_interrupts()
    import traceback

    import epilab  # noqa: F401  (turns EPILAB_INTERPRET into TRITON_INTERPRET)
    from epilab.tuner.evaluate import run_task

    if device_index >= 0:
        import torch

        torch.cuda.set_device(device_index)
    hook_fn = _load_hook(hook)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            if hook_fn is not None:
                hook_fn(task)
            result = run_task(task)
        except BaseException as e:
            why = environment_error(e)
            if why is not None:  # the machine's fault (a cache it cannot write): the parent says so
                result = {"status": "environment", "detail": why}
            else:  # a bug: the parent raises TuningBug with this text
                result = {"status": "bug", "detail": traceback.format_exc()[-4000:]}
        conn.send(result)


_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def environment_error(e: BaseException) -> str | None:
    """One line on what in the environment stopped a task (a bad setting, a full or
    unwritable disk under the caches), or None when the task itself failed."""
    from epilab.config import SettingsError

    if isinstance(e, SettingsError):
        return str(e)
    if isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror or e}{where}"
    return None


def _env() -> dict[str, str]:
    keys = ("EPILAB_INTERPRET", "TRITON_INTERPRET", "EPILAB_CACHE_DIR", "TRITON_CACHE_DIR", "EPILAB_DB")
    return {k: os.environ[k] for k in keys if k in os.environ}


_EARLY: dict[int, Worker] = {}  # device index -> a worker started before it was asked for
_EARLY_LOCK = threading.Lock()


def start_early(device_indices: tuple[int, ...]) -> None:
    """Start a GPU worker for each of ``device_indices`` now (its process imports torch and
    makes its CUDA context while the caller does its own start-up); the Tuner of that device
    takes it (``Worker.for_device``). ``close_early`` closes those nobody took."""
    with _EARLY_LOCK:
        for index in device_indices:
            if index not in _EARLY:
                _EARLY[index] = Worker(device_index=index)


def close_early() -> None:
    """Close the workers ``start_early`` started that no Tuner took."""
    with _EARLY_LOCK:
        left = list(_EARLY.values())
        _EARLY.clear()
    for worker in left:
        worker.close()


class Worker:
    """One isolated process that evaluates tasks; see the module doc."""

    @classmethod
    def for_device(
        cls, *, timeout_s: float = 180.0, device_index: int = -1, hook: tuple[str, str] | None = None
    ) -> Worker:
        """The worker ``start_early`` started for ``device_index`` (where no ``hook`` is asked
        for and the settings it passes on are unchanged since), else a new one."""
        with _EARLY_LOCK:
            early = _EARLY.pop(device_index, None) if hook is None else None
        if early is not None and early.env == _env():
            early.timeout_s = timeout_s
            return early
        if early is not None:
            early.close()
        return cls(timeout_s=timeout_s, device_index=device_index, hook=hook)

    def __init__(
        self, *, timeout_s: float = 180.0, device_index: int = -1, hook: tuple[str, str] | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.device_index = device_index
        self.hook = hook
        self.restarts = 0
        self.cancelled = False
        self._proc: Any = None
        self._conn: Connection | None = None
        self.env: dict[str, str] = {}  # the settings passed to the process (``_env``)
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.env = _env()
        self._proc = ctx.Process(
            target=_serve, args=(child, self.env, self.hook, self.device_index), daemon=True
        )
        with main_not_reimported():
            self._proc.start()
        child.close()
        self._conn = parent

    def _restart(self) -> None:
        self.close()
        self.restarts += 1
        self._start()

    def run(self, task: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """The task's result; ``crashed``/``timeout`` when the process dies or stalls;
        raises Cancelled once ``cancel`` was called."""
        if self.cancelled or self._conn is None:
            raise Cancelled("the worker was cancelled")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        try:
            self._conn.send(task)
            ready = self._conn.poll(timeout)
        except (BrokenPipeError, EOFError, OSError):
            ready = True
        if self.cancelled:
            raise Cancelled("the worker was cancelled")
        if not ready:
            self._restart()
            return {
                "status": "timeout",
                "detail": f"no answer within {timeout:.0f} s; the worker was killed",
                "seconds": time.monotonic() - start,
            }
        try:
            result = self._conn.recv()
        except (EOFError, OSError):
            if self.cancelled:
                raise Cancelled("the worker was cancelled") from None
            self._proc.join(timeout=5)
            code = self._proc.exitcode
            self._restart()
            return {
                "status": "crashed",
                "detail": f"the worker process died (exit code {code})",
                "seconds": time.monotonic() - start,
            }
        if result.get("status") == "environment":
            from epilab.config import SettingsError

            raise SettingsError(f"evaluating a {task.get('job')} failed: {result['detail']}")
        if result.get("status") == "bug":
            raise TuningBug(f"evaluating {task.get('job')} failed unexpectedly:\n{result['detail']}")
        if result.pop("restart", False):
            self._restart()
        result["seconds"] = time.monotonic() - start
        return result

    def cancel(self) -> None:
        """Kill the process from another thread: the task it runs raises Cancelled in
        ``run``, and so does every later one."""
        self.cancelled = True
        proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()

    def close(self) -> None:
        """Kill the process (see the module doc: it has nothing left to write)."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc = None
        self._conn = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _compile_task(task: dict[str, Any]) -> dict[str, Any]:
    import epilab  # noqa: F401
    from epilab.tuner.evaluate import run_task

    try:
        return run_task(task)
    except Exception as e:  # a compile pool failure is re-tried by the GPU worker, which classifies it
        return {"status": "unknown", "detail": f"{type(e).__name__}: {e}"[:1500]}
    finally:  # the candidate's inputs: not kept on the GPU by a process that outlives the command
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


class CompilePool:
    """Processes that compile candidates (no launches) ahead of the GPU worker."""

    def __init__(
        self, jobs: int, device_index: int, task: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> None:
        self.jobs = jobs
        self.device_index = device_index
        self.task = task or _compile_task  # a module-level function (tests pass a stand-in)
        self.cancelled = False
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.jobs,
            mp_context=mp.get_context("spawn"),
            initializer=_init_compile_worker,
            initargs=(_env(), self.device_index, os.getpid()),
        )

    def compiled(self, problem_json: str, configs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Each config's compile result, in the order of ``configs``, as soon as it is done:
        every compile is submitted at once, and the caller checks and times a candidate on the
        GPU while the later ones still compile (waiting for the whole batch first, MobileNet's
        ``tune --model`` spent 52 of its 94 s of tuning in compiles, none of them overlapped).
        A compile that takes its process down ends the pool: the rest come back ``unknown``
        (the GPU worker decides) and a new pool takes the next batch."""
        tasks = [{"job": "compile", "problem": problem_json, "config": c} for c in configs]
        done = 0
        try:
            if self.cancelled:
                raise Cancelled("the compile pool was cancelled")
            with main_not_reimported():  # the pool starts its processes as tasks are submitted
                results = self._pool.map(self.task, tasks)
            for result in results:
                done += 1
                yield result
        except Exception as e:
            rest = len(configs) - done
            if self.cancelled:
                yield from ({"status": "unknown", "detail": "cancelled"} for _ in range(rest))
                return
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            yield from ({"status": "unknown", "detail": str(e) or type(e).__name__} for _ in range(rest))

    def start(self) -> None:
        """Start the processes now (a no-op task each), so that their imports of torch and
        Triton overlap what the caller does before its first batch (a model's compile, the
        database), not the first problem's compiles."""
        with main_not_reimported():
            for _ in range(self.jobs):
                self._pool.submit(_started)

    def warm(self, problem_json: str, configs: list[dict[str, Any]]) -> None:
        """Compile ``configs`` in the background, results unread: Triton's cache keeps the
        binaries, so a later ``compiled`` of them (the next problem's seeds, while this one
        is searched) loads them. Queued behind the compiles submitted before; a pool that
        broke in the meantime drops them."""
        if self.cancelled:
            return
        with main_not_reimported(), contextlib.suppress(RuntimeError):  # (a pool shut down)
            for config in configs:
                self._pool.submit(self.task, {"job": "compile", "problem": problem_json, "config": config})

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def cancel(self) -> None:
        """Stop the compiles under way (another thread waits on them): their processes are
        killed, the batch comes back ``unknown`` and the GPU worker, cancelled too, ends it."""
        self.cancelled = True
        processes = list((getattr(self._pool, "_processes", None) or {}).values())  # no public handle
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.kill()


def _init_compile_worker(env: dict[str, str], device_index: int, parent: int) -> None:
    os.environ.update(env)
    _ignore_interrupts()
    _leave_with(parent)
    import epilab.tuner.evaluate  # noqa: F401  (torch, Triton and the templates: once, at start)

    if device_index >= 0:
        import torch

        torch.cuda.set_device(device_index)


def _leave_with(parent: int) -> None:
    """End this process once ``parent`` (the pid that started it) is gone: a pool's processes
    outlived a command or compile server killed with SIGKILL, each holding a CUDA context. A
    thread watches the parent (Linux's ``PR_SET_PDEATHSIG`` fires when the *thread* that
    started a process ends, and a pool starts its processes from whichever thread submits)."""
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="epilab parent watch").start()


def _started() -> None:
    """``CompilePool.start``'s task: nothing, once the process is up."""
