"""The ``epilab`` torch.compile backend: Inductor with epilab's pass installed.

    torch.compile(model, backend="epilab")                       # EPILAB_POLICY, EPILAB_DB
    torch.compile(model, backend="epilab", mode="max-autotune",
                  options={"policy": "always", "db": "tuning.db", "epilogue_fusion": True})
    epilab.compile(model, db="tuning.db", policy="auto", tune_missing=True)

``options`` takes epilab's own keys (``policy``, ``db``, ``tune_missing``,
``progress``, ``mode``; and, for ``model_tuning/tune.py``'s measurements, ``exclude``: problem keys to leave
to the aten op, ``verdicts``: False to ignore the verdicts recorded from models, ``cuda_graphs``:
decide as under CUDA graphs where the caller replays the compiled step in one itself,
``kernels``: False to run every chosen template through the custom op ``epilab::template_call``
instead of as Inductor's own kernel launches, ``compiler/emit.py``; ``switches``: a
``compiler/switch.Switches`` whose flags choose at run time, per problem, between each
template and its aten path (never cached); under Inductor's C++
wrapper, which cannot call the op, a template that cannot be a kernel leaves its group to the
aten op) and any Inductor option; ``mode`` is Inductor's (``reduce-overhead``
gives CUDA graphs). torch 2.11 refuses ``mode=`` and ``options=`` together, so
the mode may also go in ``options``. Everything else is Inductor's ``compile_fx``, with the pass as
``post_grad_custom_post_pass`` (after a user's own, if one is set).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import triton

from epilab.config import POLICIES, settings
from epilab.db import DeviceInfo, TuningDB, Versions
from epilab.db.engine import resolve_url
from epilab.ir.problem import Problem
from epilab.templates.runtime.build import interpreter_active

if TYPE_CHECKING:
    from epilab.compiler import replay
    from epilab.compiler.switch import Switches

log = logging.getLogger("epilab.compiler")
EPILAB_OPTIONS = (
    "policy",
    "db",
    "tune_missing",
    "mode",
    "exclude",
    "verdicts",
    "progress",
    "cuda_graphs",
    "kernels",
    "switches",
)
# a switched compile (``compiler/switch.py``) is never cached: its flags are this process's tensors
SWITCHED_PATCHES = {"fx_graph_cache": False}
TUNERS_GROUP = "epilab.compile_tuners"  # who tunes a problem now (tune_missing): tuner/on_compile.py

_dbs: dict[str, tuple[TuningDB, tuple[int, int] | None]] = {}  # with its file's identity


def epilab_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """The backend Dynamo calls (registered as ``epilab``)."""
    from torch import _TorchCompileInductorWrapper
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    opts = dict(options or {})
    ours = {k: opts.pop(k) for k in EPILAB_OPTIONS if k in opts}
    mode = ours.get("mode", mode)  # torch.compile refuses mode= beside options= (torch <= 2.11)
    policy = _policy(ours.get("policy"))
    patches = dict(_TorchCompileInductorWrapper(mode, opts, None).config)
    if policy == "never":
        return compile_fx(gm, example_inputs, config_patches=patches)
    from epilab.compiler import explain, replay
    from epilab.compiler.graph_pass import ChainedPass, EpilabPass

    cuda_graphs = bool(patches.get("triton.cudagraphs", inductor_config.triton.cudagraphs))
    cuda_graphs = bool(ours.get("cuda_graphs", cuda_graphs))  # the caller replays the step itself
    tune_missing = bool(ours.get("tune_missing", False))
    progress = bool(ours.get("progress", True))
    context, facts = _context(policy, ours.get("db"), tune_missing, cuda_graphs, example_inputs, progress)
    context.exclude = _keys(ours.get("exclude", ()))
    context.verdicts = bool(ours.get("verdicts", True))
    context.emit = "kernels" if bool(ours.get("kernels", True)) else "op"
    context.switches = _switches(ours.get("switches"))
    if context.switches is not None:  # its flags are this process's tensors: never cached
        patches |= SWITCHED_PATCHES
    if patches.get("cpp_wrapper", inductor_config.cpp_wrapper):
        # torch's C++ wrapper cannot call our op (torch 2.11 to 2.13): it writes the op's JSON
        # into C string literals unescaped, and takes its list of outputs for one tensor (a
        # segfault); a template that cannot be a kernel leaves its group to aten, as in a package
        context.emit = "kernels_only"
    autotune = patches.get("max_autotune", inductor_config.max_autotune) or patches.get(
        "max_autotune_gemm", inductor_config.max_autotune_gemm
    )
    context.inductor_mode = "max-autotune" if autotune else "default"
    context.training = _training(gm, example_inputs)
    facts += (
        f"|exclude={sorted(context.exclude)}|verdicts={context.verdicts}|{context.inductor_mode}"
        f"|training={context.training}|emit={context.emit}"
        f"|switches={None if context.switches is None else id(context.switches)}"
    )
    key = replay.graph_key(gm, example_inputs, facts)
    entry = replay.load(key)
    if entry is None or not entry.reusable:
        entry = replay.Entry()
    if context.tune is not None:
        context.tune = _counted(context.tune, entry)
    served = inductor_config.force_disable_caches or context.switches is not None
    kept = None if served else (key, entry)  # nothing is served warm
    ours_pass = EpilabPass(context, facts + f"|decided={entry.nonce}", kept)
    user_pass = patches.get("post_grad_custom_post_pass", inductor_config.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = (
        ours_pass if user_pass is None else ChainedPass(user_pass, ours_pass)
    )
    compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if not ours_pass.ran:  # served by Inductor's caches: report what was decided on that graph
        explain.record([dataclasses.replace(d, replayed=True) for d in entry.decisions])
        _record_again(context.db, entry.problems)
    return compiled


def _record_again(db: TuningDB | None, problems: Sequence[str]) -> None:
    """The problems a cold compile of a graph served warm recorded (``replay.Entry``), recorded
    in ``db``: a fresh database where the earlier one was learns them too."""
    if db is None or not problems:
        return
    try:
        for text in problems:
            db.put_problem(Problem.from_json(text))
    except Exception as e:  # a read-only or busy database must not fail the compile
        log.warning("could not record the problems of a graph served warm in %s: %s", db.url, e)


def _training(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> bool:
    """Whether this graph is compiled for a training step: AOTAutograd's own rule (grad mode
    on and some input, parameters included, requiring grad), so that its forward and backward
    graphs follow the verdicts measured in training steps."""
    if not torch.is_grad_enabled():
        return False
    inputs = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return any(t.requires_grad for t in (*inputs, *gm.parameters()))


def _counted(tune: Callable[[Problem], None], entry: replay.Entry) -> Callable[[Problem], None]:
    def counted(problem: Problem) -> None:
        entry.tuned += 1
        tune(problem)

    return counted


def compile(
    model: Any,
    *,
    db: str | Path | None = None,
    policy: str | None = None,
    tune_missing: bool = False,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    progress: bool = True,
    **compile_kwargs: Any,
) -> Any:
    """``torch.compile(model, backend="epilab", ...)`` with epilab's knobs as arguments.

    ``db``: the tuning database (path or URL; default ``EPILAB_DB``); ``policy``:
    auto, always or never (default ``EPILAB_POLICY``); ``tune_missing``: tune
    problems without records now, with a small budget, and store them; ``progress``: report
    that tuning on stderr (``tuner/progress.py``).
    """
    opts = dict(options or {})
    if db is not None:
        opts["db"] = str(db)
    if policy is not None:
        opts["policy"] = _policy(policy)
    if tune_missing:
        opts["tune_missing"] = True
    if not progress:
        opts["progress"] = False
    if mode is not None and opts:
        opts["mode"] = mode
        mode = None
    return torch.compile(model, backend="epilab", mode=mode, options=opts or None, **compile_kwargs)


def _policy(value: object) -> str:
    policy = settings().policy if value is None else str(value).lower()
    if policy not in POLICIES:
        raise ValueError(f"epilab policy {value!r} is not one of {POLICIES}")
    return policy


def _keys(value: object) -> frozenset[str]:
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"epilab option exclude takes a list of problem keys, got {value!r:.80}")
    return frozenset(value)


def _switches(value: object) -> Switches | None:
    from epilab.compiler.switch import Switches

    if value is None or isinstance(value, Switches):
        return value
    raise ValueError(f"epilab option switches takes an epilab.compiler.switch.Switches, got {value!r:.80}")


def _device(example_inputs: Sequence[object]) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return x.device
    return torch.device("cpu")


def _context(
    policy: str,
    db_target: object,
    tune_missing: bool,
    cuda_graphs: bool,
    example_inputs: Sequence[object],
    progress: bool = True,
) -> tuple[Any, str]:
    from epilab.compiler.decide import Context
    from epilab.db import INTERPRETER_DEVICE

    device = _device(example_inputs)
    info: DeviceInfo | None
    if device.type == "cuda":
        info, target = DeviceInfo.of_cuda(device), "cuda"
    elif settings().interpret and interpreter_active():
        info, target = INTERPRETER_DEVICE, "interpreter"
    else:
        info, target = None, None
    versions = Versions(torch.__version__, triton.__version__)
    db, error = (None, "CPU tensors") if info is None else _open_db(str(db_target or settings().db))
    tune = None
    if tune_missing and db is not None and info is not None:
        tune = _tune_now(db, device, target == "interpreter", progress)
    context = Context(policy, info, target, versions, db, error, tune, cuda_graphs)
    fingerprint = "" if db is None else f"{db.url}|{db.fingerprint()}"
    facts = f"{policy}|{info}|{target}|{versions}|{fingerprint}|{error}|{tune_missing=}|{cuda_graphs=}"
    return context, facts


def _open_db(target: str) -> tuple[TuningDB | None, str | None]:
    """The tuning database, opened once per process, and again where its file was deleted or
    replaced since (its engine read a file no longer there: "no such table"); a database that
    cannot be opened leaves decisions to the rules for unrecorded problems (and is logged)."""
    _, path = resolve_url(target)
    have = _dbs.get(target)
    if have is not None:
        db, identity = have
        if identity == _identity(path):
            return db, None
        del _dbs[target]
        db.close()
    try:
        db = TuningDB.open(target)
        _dbs[target] = (db, _identity(path))
        return db, None
    except Exception as e:  # unreadable, locked, newer schema: compile without records
        log.warning("epilab: tuning database %s unavailable, deciding without it: %s", target, e)
        return None, f"{type(e).__name__}: {e}"


def _identity(path: Path | None) -> tuple[int, int] | None:
    """Which file ``path`` is now (device and inode; None where there is none, or a server's)."""
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_dev, st.st_ino)


def _tune_now(
    db: TuningDB, device: torch.device, interpret: bool, progress: bool
) -> Callable[[Problem], None]:
    """A function that tunes one problem now and stores it: the tuner's, found through the
    entry point ``epilab.compile_tuners`` (``tuner/on_compile.py``), so that the compiler
    imports nothing of the tuner."""
    from importlib.metadata import entry_points

    found = {e.name: e for e in entry_points(group=TUNERS_GROUP)}
    if "epilab" not in found:
        raise RuntimeError(
            f"tune_missing needs epilab's tuner, registered as the entry point {TUNERS_GROUP!r}, "
            "which this installation lacks: reinstall epilab (pip install epilab, or pip install -e .)"
        )
    return found["epilab"].load()(db, device, interpret, progress)
