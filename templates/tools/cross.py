"""Compiling a template's kernels for a CUDA GPU on a machine that has none.

``compile_for(problem, config)`` binds the launch on CPU tensors as if they were on a GPU of
the given compute capability and SM count (``binding.cross_binding``), renders the kernel for
CUDA and compiles it through Triton (ptxas included) for that target, launching nothing. What
comes back says what the GPU would run: registers per thread, spilled bytes, shared memory,
the SASS's opcodes and its main loops (``sass.main_loops``: their instructions, and loads an
iteration's MMAs wait for). Tests use it to check that the Gluon kernels compile, that
epilogues do not spill and that main loops do not wait for their own loads, without a GPU;
``python -m epilab.templates.tools.cross`` does the same for a list of problems and configs (JSON on
stdin), e.g. from a probe script.

Triton compiles only outside its interpreter: in a process with ``TRITON_INTERPRET=1`` (the
CPU tests) call ``compile_in_subprocess``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from epilab.templates.tools import sass

H100 = (90, 132)  # compute capability x 10, SMs
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass(frozen=True)
class Compiled:
    """One kernel compiled for a target: its name, resources and instruction mix."""

    name: str
    registers: int  # per thread (a warp-specialized kernel: its ``maxnreg``)
    stack_bytes: int
    local_bytes: int  # spills (and arrays placed in local memory)
    shared_bytes: int  # static shared memory as ptxas reports it (Triton's dynamic: ``dynamic_shared``)
    dynamic_shared: int
    num_warps: int
    opcodes: dict[str, int]  # SASS opcode -> count (MUFU, FFMA, HGMMA, ...)
    loops: tuple[sass.Loop, ...] = ()  # the main loops (innermost, issuing wgmma): ``sass.main_loops``

    @property
    def spills(self) -> bool:
        return self.local_bytes > 0 or self.stack_bytes > 0


def _tool(name: str) -> str:
    from triton import knobs

    return str(getattr(knobs.nvidia, name).path)


def _inspect(name: str, cubin: bytes, dynamic_shared: int, num_warps: int) -> Compiled:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True)
        dump = subprocess.run([_tool("cuobjdump"), "-sass", str(path)], capture_output=True, text=True)
    found = _RESOURCES.search(usage.stdout)
    if found is None:
        raise RuntimeError(
            f"cuobjdump reported no resources for {name}: {usage.stdout[-400:]}{usage.stderr[-400:]}"
        )
    regs, stack, shared, local = (int(x) for x in found.groups())
    code = sass.instructions(dump.stdout)
    opcodes = Counter(ins.opcode for ins in code)
    loops = tuple(sass.main_loops(code))
    return Compiled(name, regs, stack, local, shared, dynamic_shared, num_warps, dict(opcodes), loops)


def compile_for(
    problem: Any, config: Any, *, capability: int = H100[0], sms: int = H100[1]
) -> list[Compiled]:
    """Compile the kernels of ``problem`` tiled by ``config`` for sm_<capability> (no GPU needed).
    Raises what Triton raises for a kernel that does not compile."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    from epilab.templates.registry import bind
    from epilab.templates.runtime.binding import cross_binding
    from epilab.templates.runtime.build import interpreter_active
    from epilab.templates.verify import random_inputs

    if interpreter_active():
        raise RuntimeError("Triton is in interpreter mode in this process: use compile_in_subprocess")
    with cross_binding(sms):
        a, b, operands = random_inputs(problem, torch.device("cpu"), 0)
        bound = bind(problem, config, a, b, operands)
    if bound.kernel is None or bound.args is None:
        raise ValueError(f"{config.short()} launches more than one kernel: compile_for takes single launches")
    kernel: Any = bound.kernel
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(bound.args)
    bound_args, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    source_type = GluonASTSource if kernel.is_gluon() else ASTSource
    compiled = triton_compile(
        source_type(kernel, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    return [
        _inspect(
            kernel.fn.__name__, compiled.asm["cubin"], compiled.metadata.shared, compiled.metadata.num_warps
        )
    ]


def compile_in_subprocess(
    items: list[tuple[Any, Any]], *, capability: int = H100[0], sms: int = H100[1], timeout: float = 900
) -> list[dict[str, Any]]:
    """``compile_for`` each (problem, config) in a fresh process that does not interpret (what a
    test running under ``TRITON_INTERPRET=1`` needs): per item ``{"kernels": [...]}`` or
    ``{"error": text}``; a crash of the compiler (Triton aborts on some kernels) is an error."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EPILAB_INTERPRET")}
    request = {
        "capability": capability,
        "sms": sms,
        "items": [{"problem": p.to_json(), "config": c.to_dict()} for p, c in items],
    }
    out = []
    for item in request["items"]:  # one process each: an abort loses one answer, not all
        one = {**request, "items": [item]}
        done = subprocess.run(
            [sys.executable, "-m", "epilab.templates.tools.cross"],
            input=json.dumps(one),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if done.returncode != 0:
            out.append({"error": f"the compiler exited with {done.returncode}: {done.stderr[-2000:]}"})
        else:
            out.append(json.loads(done.stdout.strip().splitlines()[-1])[0])
    return out


def main() -> None:
    from epilab.ir.config import Config
    from epilab.ir.problem import Problem

    request = json.loads(sys.stdin.read())
    answers = []
    for item in request["items"]:
        problem = Problem.from_json(item["problem"])
        config = Config.from_dict(item["config"])
        try:
            kernels = compile_for(problem, config, capability=request["capability"], sms=request["sms"])
            answers.append({"kernels": [asdict(k) for k in kernels]})
        except Exception as e:  # reported to the caller, who decides
            answers.append({"error": f"{type(e).__name__}: {str(e)[-3000:]}"})
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
