"""The build cache: rendered source -> file under the cache dir -> imported kernel.

Triton reads a kernel's source from its file, so rendered text is written to
``<cache_dir>/kernels/<aa>/<sha256>.py`` (atomically: a temporary file and a
rename, so concurrent processes never see half a file) and imported from there.
The key is the hash of the source itself and of the target, so nothing that
changes the code can hit a stale entry. The interpreter target decorates the
module's ``@triton.jit`` functions as interpreted functions (Triton decides
that at decoration time), which is why it is part of the key.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any

import triton
import triton.language

from epilab.config import SettingsError, settings
from epilab.templates.runtime.render import TARGETS, Target

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def source_key(source: str, target: Target) -> str:
    return hashlib.sha256(f"{target}\0{triton.__version__}\0{source}".encode()).hexdigest()


def _write_once(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_or_explain(path: Path, text: str, variable: str, where: Path) -> None:
    try:
        _write_once(path, text)
    except OSError as e:
        raise SettingsError(
            f"cannot write rendered kernels under {where} ({e.strerror}); set {variable} to a "
            "directory this user can write"
        ) from e


def interpreter_active() -> bool:
    """Whether this process runs Triton in its interpreter.

    Triton decides that once, when ``triton.language`` is imported (its own
    helpers such as ``tl.zeros`` are jitted then), so it follows the environment
    at start-up: ``TRITON_INTERPRET=1``, which ``import epilab`` sets from
    ``EPILAB_INTERPRET=1`` when Triton is not imported yet.
    """
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.zeros, InterpretedFunction)


def build(source: str, *, target: Target) -> ModuleType:
    """Import ``source`` as a module (cached in memory and on disk)."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not one of {TARGETS}")
    key = source_key(source, target)
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        conf = settings()
        path = conf.kernel_dir / key[:2] / f"{key}.py"
        _write_or_explain(path, source, "EPILAB_CACHE_DIR", conf.kernel_dir)
        if conf.debug_dir is not None:
            _write_or_explain(conf.debug_dir / f"{key[:16]}.py", source, "EPILAB_DEBUG_DIR", conf.debug_dir)
        spec = importlib.util.spec_from_file_location(f"epilab_kernel_{key[:24]}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = target == "interpreter"
            spec.loader.exec_module(module)
        _modules[key] = module
        return module


def with_constexprs(kernel: Any, names: Collection[str], *, target: Target) -> Any:
    """``kernel`` built again with its parameters ``names`` declared ``tl.constexpr``: a call
    that passes those arguments the same value every time (a launch emitted for static
    shapes passes its sizes and strides so) gets a kernel with them folded in and fewer
    arguments to launch. Parameters already annotated are left as they are; ``kernel`` itself
    where none is left to change."""
    fn = kernel.fn
    path = Path(fn.__code__.co_filename)
    source = path.read_text()
    tree = ast.parse(source)
    defs = [d for d in tree.body if isinstance(d, ast.FunctionDef) and d.name == fn.__name__]
    if len(defs) != 1:
        raise ValueError(f"{path} does not define one function {fn.__name__}")
    params = [a for a in defs[0].args.args if a.annotation is None and a.arg in names]
    if not params:
        return kernel
    if fn.__globals__.get("tl") is not triton.language:
        raise ValueError(f"{path} does not import triton.language as tl")
    lines = [line.encode() for line in source.splitlines(keepends=True)]  # ast's offsets count bytes
    for a in sorted(params, key=lambda a: (a.lineno, a.col_offset), reverse=True):
        assert a.end_lineno is not None and a.end_col_offset is not None
        line, at = lines[a.end_lineno - 1], a.end_col_offset
        lines[a.end_lineno - 1] = line[:at] + b": tl.constexpr" + line[at:]
    return getattr(build(b"".join(lines).decode(), target=target), fn.__name__)
