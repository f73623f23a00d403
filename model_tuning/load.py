"""The model of ``tune --model`` and its example inputs: a factory named ``module:function``
loaded, the inputs made from ``--input SHAPE:DTYPE`` (or given by the factory), the model
cast (``--dtype``) and put on the device."""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epilab.ir.dtypes import canonical_dtype

# integer dtypes an example input may have (token ids, masks); quantized dtypes are not inputs
INTEGER_INPUTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
MAX_INPUT_ELEMENTS = 1 << 40
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ModelSpecError(ValueError):
    """A ``--model`` or ``--input`` the command line cannot use: what was wrong, what is accepted."""


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    high: int | None = None  # integer inputs: values in [0, high)

    def make(self, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return torch.randn(self.shape, generator=generator, dtype=torch.float32).to(device, self.dtype)
        return torch.randint(0, self.high or 2, self.shape, generator=generator).to(device, self.dtype)


def parse_input(text: str) -> InputSpec:
    """``8x1024x1024:bfloat16``, ``4x128:int64:32000`` (integers in [0, 32000))."""
    parts = text.strip().split(":")
    usage = "give SHAPE:DTYPE such as 8x1024x1024:bfloat16, or 8x128:int64:VOCAB for token ids"
    if len(parts) not in (2, 3) or not re.fullmatch(r"\d+(x\d+)*", parts[0]):
        raise ModelSpecError(f"--input {text!r}: {usage}")
    shape = tuple(int(d) for d in parts[0].split("x"))
    if not all(shape):
        raise ModelSpecError(f"--input {text!r}: every dimension must be positive")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise ModelSpecError(
            f"--input {text!r}: {math.prod(shape):.3g} elements, more than any device holds "
            f"(at most {MAX_INPUT_ELEMENTS:.3g})"
        )
    dtype = getattr(torch, canonical_dtype(parts[1].strip().lower()), None)
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype in INTEGER_INPUTS):
        raise ModelSpecError(
            f"--input {text!r}: {parts[1]!r} is not a dtype an example input can have: a float dtype "
            "such as bfloat16, or one of " + ", ".join(str(d).removeprefix("torch.") for d in INTEGER_INPUTS)
        )
    if len(parts) == 3:
        if dtype.is_floating_point or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ModelSpecError(
                f"--input {text!r}: only integer inputs take an upper bound (a positive int)"
            )
        return InputSpec(shape, dtype, int(parts[2]))
    return InputSpec(shape, dtype)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def load_factory(target: str) -> Callable[[], Any]:
    """``pkg.module:factory`` (the current directory is importable, as for ``python -m``)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not _MODULE_NAME.fullmatch(module_name) or not attr.isidentifier():
        raise ModelSpecError(
            f"--model {target!r}: give MODULE:FACTORY, a dotted module name (mymodels/gpt.py under "
            "the current directory is mymodels.gpt) and a function of it, e.g. mymodels.gpt:build"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # not found, or the module itself failed as it was imported
        raise ModelSpecError(f"--model {target!r}: cannot import {module_name!r}: {one_line(e)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"--model {target!r}: {module_name} has no callable {attr!r}")
    return factory


# the dtypes a model's tensors are cast between; float8 (scaled weights) and integers never are
CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def parse_dtype(text: str) -> torch.dtype:
    """``--dtype``: one of ``CASTABLE`` (or an alias: bf16, fp16, half, fp32, fp64)."""
    dtype = getattr(torch, canonical_dtype(text.strip().lower()), None)
    if dtype not in CASTABLE:
        raise ModelSpecError(
            f"--dtype {text!r}: cast the model to one of "
            + ", ".join(str(d).removeprefix("torch.") for d in CASTABLE)
            + " (float8 and integer tensors are never cast)"
        )
    return dtype


def cast_model(model: torch.nn.Module, dtype: torch.dtype | None, floating: torch.dtype | None) -> None:
    """Cast ``model``'s parameters and buffers of a ``CASTABLE`` dtype, in place: to ``dtype``
    where given (``--dtype``); else to ``floating`` (the first floating input's dtype) only
    where some floating parameter differs from it (a float32 factory run on bfloat16
    inputs), never where they already match (a float32 scale beside float8 weights stays)."""
    target = dtype
    if target is None and floating in CASTABLE:
        params = [p for p in model.parameters() if p.dtype in CASTABLE]
        if any(p.dtype != floating for p in params):
            target = floating
    if target is not None:
        model._apply(lambda t: t.to(target) if t.dtype in CASTABLE else t)


def build_model(
    target: str,
    inputs: Sequence[str],
    device: torch.device,
    seed: int = 0,
    dtype: str | None = None,
    train: bool = False,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """The model of ``--model`` and its example inputs (``--input``, or what the factory
    returns beside the model), on ``device``, cast by ``cast_model`` (``dtype``: ``--dtype``),
    in train mode for a training step (``--train``: dropout and batch statistics as training
    runs them), else in eval mode. Returns (model, inputs, label)."""
    specs = [parse_input(t) for t in inputs]
    cast_to = parse_dtype(dtype) if dtype is not None else None
    torch.manual_seed(seed)
    factory = load_factory(target)
    try:
        made = factory()
    except Exception as e:  # a factory that takes arguments (os:system), or one that fails
        raise ModelSpecError(f"--model {target!r}: calling it failed: {one_line(e)}") from None
    given: tuple[torch.Tensor, ...] = ()
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made, given = made[0], tuple(made[1]) if isinstance(made[1], (list, tuple)) else (made[1],)
        odd = [type(t).__name__ for t in given if not isinstance(t, torch.Tensor)]
        if odd:
            raise ModelSpecError(
                f"--model {target!r}: the factory's example inputs must be tensors, got {', '.join(odd[:3])}"
            )
    if not isinstance(made, torch.nn.Module):
        raise ModelSpecError(
            f"--model {target!r}: the factory returned {type(made).__name__}; return an nn.Module "
            "(or a tuple (module, example inputs))"
        )
    if not specs and not given:
        raise ModelSpecError(f"--model {target!r}: give the example inputs with --input SHAPE:DTYPE")
    generator = torch.Generator().manual_seed(seed)
    try:
        made_inputs = (s.make(device, generator) for s in specs) if specs else (t.to(device) for t in given)
        example = tuple(made_inputs)
    except (RuntimeError, MemoryError) as e:  # out of memory, mostly
        raise ModelSpecError(f"--model {target!r}: cannot make the example inputs: {one_line(e)}") from None
    floating = next((t.dtype for t in example if t.dtype.is_floating_point), None)
    if any(t.is_meta for t in (*made.parameters(), *made.buffers(), *given)):
        raise ModelSpecError(
            f"--model {target!r}: the factory's model (or its inputs) is on the meta device: its weights "
            "hold no data to time or check; materialize them (to_empty and an init, or a checkpoint)"
        )
    try:
        model = made.to(device)
    except (RuntimeError, MemoryError) as e:  # the device out of memory
        why = one_line(e)
        raise ModelSpecError(f"--model {target!r}: cannot move the model to {device}: {why}") from None
    cast_model(model, cast_to, floating)
    shapes = ",".join(
        "x".join(map(str, t.shape)) + f":{str(t.dtype).removeprefix('torch.')}" for t in example
    )
    return model.train(train), example, f"{target} {shapes}"
