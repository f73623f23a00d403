"""Replaying a launch: the compiled kernel called again with new tensors.

The backend's custom op runs the same problem many times with tensors of the
same shapes. ``Replay`` keeps what the first launch bound (every scalar
argument, the grid, Triton's compiled kernel) and, per call, only swaps the
tensor pointers (remaking TMA descriptors over them, looking up a stream-K workspace for the
call's stream) and allocates the outputs,
then calls the compiled kernel's launcher directly: the Python cost of a launch
drops from the full bind
(checks, strides, Triton's argument binding and cache lookup) to a list copy.

A replay is valid for exactly the tensors its key describes: shapes, strides,
dtypes, device and each pointer's 16-byte alignment (Triton specializes on it),
so ``replay_key`` covers all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from triton import knobs

from epilab.templates.bound import Bound


def replay_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """Everything of ``tensors`` that a compiled launch depends on, pointers aside."""
    return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors)


class Replay:
    """Launch the kernel of ``bound`` again with new inputs (same shapes and layouts)."""

    def __init__(self, bound: Bound, compiled: object, inputs: Sequence[str]) -> None:
        names = list(bound.kernel.arg_names)  # type: ignore[attr-defined]
        assert bound.args is not None and bound.grid is not None
        # tensors are swapped in per call; holding the first call's would keep their memory
        # alive (and break CUDA-graph trees, which require every pool allocation to be tracked)
        self.values = [None if isinstance(bound.args[n], torch.Tensor) else bound.args[n] for n in names]
        # a TMA descriptor holds its tensor too: remade from each call's tensor
        self.descriptors = [(names.index(d.arg), names.index(d.tensor), d) for d in bound.descriptors]
        for i, _, _ in self.descriptors:
            self.values[i] = None
        self.inputs = [names.index(n) for n in inputs]
        self.outputs = [names.index(f"out{i}_ptr") for i in range(len(bound.outs))]
        self.out_specs = [(o.shape, o.stride(), o.dtype) for o in bound.outs]
        self.grid = (*bound.grid, *(1,) * (3 - len(bound.grid)))
        self.workspace = bound.workspace  # scratch kept between calls: looked up per call and stream
        self.scratch = [names.index(n) for n in ("ws_ptr", "flags_ptr")] if self.workspace else []
        self.fills = bound.fills  # reduction outputs filled before each launch
        self.compiled = compiled

    def __call__(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        values = list(self.values)
        for i, t in zip(self.inputs, tensors, strict=True):
            values[i] = t
        device = tensors[0].device
        outs = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype in self.out_specs
        ]
        for i, o in zip(self.outputs, outs, strict=True):
            values[i] = o
        for i, value in self.fills:
            outs[i].fill_(value)
        for i, tensor, described in self.descriptors:
            values[i] = described.make(values[tensor])
        if self.workspace is not None:
            scratch = self.workspace.tensors(device)
            values[self.scratch[0]], values[self.scratch[1]] = scratch["ws_ptr"], scratch["flags_ptr"]
        k = self.compiled
        stream = torch.cuda.current_stream(device).cuda_stream
        g0, g1, g2 = self.grid
        k.run(  # type: ignore[attr-defined]
            g0,
            g1,
            g2,
            stream,
            k.function,  # type: ignore[attr-defined]
            k.packed_metadata,  # type: ignore[attr-defined]
            k.launch_metadata(self.grid, stream, *values),  # type: ignore[attr-defined]
            knobs.runtime.launch_enter_hook,
            knobs.runtime.launch_exit_hook,
            *values,
        )
        return outs
