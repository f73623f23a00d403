"""A launch with every argument fixed (``Bound``), its tensor-descriptor arguments
(``Described``) and the scratch memory kernels keep between calls (``Workspace``): what a
kind's ``bind`` returns, below the rendering and building that make its kernel."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

Launch = tuple[object, tuple[int, ...], Mapping[str, object]]  # a jitted kernel, its grid, its arguments


@dataclass(frozen=True)
class Bound:
    """A launch with every argument fixed: ``run()`` launches it again (for timing and
    CUDA graphs, with no per-call Python beyond Triton's launcher); ``compile()``
    compiles it without launching."""

    outs: tuple[torch.Tensor, ...]
    run: Callable[[], object]  # returns Triton's compiled kernel when it launched one
    compile: Callable[[], None]
    kernel: object = None  # the jitted kernel, and its arguments and grid (None: no launch)
    args: Mapping[str, object] | None = None
    grid: tuple[int, ...] | None = None
    descriptors: tuple[Described, ...] = ()  # TMA descriptor arguments: remade for new tensors
    workspace: Workspace | CallScratch | None = None  # scratch arguments (stream-K, split tails)
    fills: tuple[tuple[int, float], ...] = ()  # outputs filled before each launch (atomic statistics)
    steps: tuple[Launch, ...] = ()  # a call of several launches (two-pass split-K): each, in order
    zeroed: tuple[str, ...] = ()  # scratch arguments that must be zero at a launch (it leaves them so)

    @property
    def launches(self) -> tuple[Launch, ...]:
        """Every launch of the call, in order, each with arguments that run it again as it is
        (after ``fills``): what a compiled graph launches in its place (``compiler/emit.py``).
        Empty where the call does more than launch kernels (ordered statistics sum their
        partials with torch; a trivial call launches nothing)."""
        if self.steps:
            return self.steps
        if self.kernel is None or self.args is None or self.grid is None:
            return ()
        return ((self.kernel, self.grid, self.args),)


@dataclass(frozen=True)
class Described:
    """A tensor-descriptor argument of a launch: made from tensor argument ``tensor`` (over
    its last two dims swapped when ``transposed``) with ``block`` tiles; a Gluon kernel's descriptors also
    carry the shared-memory ``layout`` of their tiles."""

    arg: str
    tensor: str
    transposed: bool
    block: tuple[int, ...]
    layout: object = None  # a Gluon NVMMASharedLayout, or None for Triton's descriptors

    def make(self, t: torch.Tensor) -> object:
        t = t.transpose(-1, -2) if self.transposed else t
        if self.layout is None:
            return TensorDescriptor.from_tensor(t, list(self.block))
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        return GluonDescriptor.from_tensor(t, list(self.block), self.layout)


@dataclass(frozen=True)
class Workspace:
    """Scratch memory a kernel keeps between calls: ``programs`` x ``elements`` fp32 partial
    sums (``ws_ptr``) and one int32 flag a program (``flags_ptr``) that every launch leaves
    at zero, so it is zeroed once, not per call. One buffer per device and stream (kernels on
    one stream run one after the other; on two streams they could run at once), grown when
    a kernel needs more and never freed: a captured CUDA graph may hold its address. It is
    allocated on a side stream, outside any CUDA-graph memory pool that the calling stream
    allocates to; while the stream is being captured a missing buffer is made for that call
    alone (its zeroing is captured with it)."""

    programs: int
    elements: int

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        key = (device, None if stream is None else stream.cuda_stream)
        have = _scratch.get(key)
        size = self.programs * self.elements
        if have is not None and have[0].numel() >= size and have[1].numel() >= self.programs:
            return {"ws_ptr": have[0], "flags_ptr": have[1]}
        size = max(size, 0 if have is None else have[0].numel())
        programs = max(self.programs, 0 if have is None else have[1].numel())
        if stream is None:
            made = _allocate(size, programs, device)
        elif torch.cuda.is_current_stream_capturing():
            return dict(zip(("ws_ptr", "flags_ptr"), _allocate(size, programs, device), strict=True))
        else:
            side = torch.cuda.Stream(device)
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                made = _allocate(size, programs, device)
            stream.wait_stream(side)
        if have is not None:
            _retired.append(have)  # a CUDA graph may still launch kernels on it
        _scratch[key] = made
        return {"ws_ptr": made[0], "flags_ptr": made[1]}


@dataclass(frozen=True)
class CallScratch:
    """Scratch made anew for each call: ``programs`` int32 flags, zeroed, and ``programs`` x
    ``elements`` fp32 partial sums (``ws_ptr``, ``flags_ptr``, as ``Workspace`` gives them).
    Nothing outlives the call, so a CUDA-graph tree's warm-up (whose every allocation on the
    thread goes to the graph's pool, where a buffer kept between calls is an untracked live
    tensor) and its recording each make their own, and calls on two streams never share one.
    It costs an allocation and a fill a call; an empty one (``programs`` 0) costs nothing."""

    programs: int
    elements: int

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        if self.programs == 0:  # zero-size tensors hold no memory: kept
            if device not in _empty:
                _empty[device] = _allocate(0, 0, device)
            ws, flags = _empty[device]
        else:
            ws, flags = _allocate(self.programs * self.elements, self.programs, device)
        return {"ws_ptr": ws, "flags_ptr": flags}


def _allocate(size: int, programs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(size, dtype=torch.float32, device=device),
        torch.zeros(programs, dtype=torch.int32, device=device),
    )


_scratch: dict[tuple[torch.device, int | None], tuple[torch.Tensor, torch.Tensor]] = {}
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []
_empty: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
