"""The GPUs a command names, read without importing torch (``--device``, ``--devices``,
``CUDA_VISIBLE_DEVICES``, the NVIDIA device files), so that workers and compile processes
can start while the command is still importing."""

from __future__ import annotations

import os


def gpus_named_without_torch(device: str, devices: str | None) -> tuple[int, ...] | None:
    """The indices ``--device``/``--devices`` name, where they can be read without importing
    torch and name distinct GPUs this host has; None otherwise."""
    count = gpus_without_torch()
    named = devices if devices is not None else device.removeprefix("cuda").removeprefix(":") or "0"
    if named.strip() == "all":
        indices = list(range(count))
    else:
        parts = [p.strip().removeprefix("cuda:") for p in named.split(",")]
        if not all(p.isdigit() for p in parts):
            return None
        indices = [int(p) for p in parts]
    if not indices or any(i >= count for i in indices) or len(set(indices)) != len(indices):
        return None
    return tuple(indices)


def gpus_without_torch() -> int:
    """How many GPUs this process may use, from CUDA_VISIBLE_DEVICES or the NVIDIA device files
    (0 where neither says: a guess that only decides whether to start compiles early)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    if not os.path.isdir("/dev"):
        return 0
    return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
