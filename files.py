"""Writing a file the user named: refused clearly when it cannot be, never half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_target(path: str | Path) -> Path:
    """``path`` as a Path if a file can be written there; a ValueError says why not (before
    any work whose result would have nowhere to go)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give the name of a file to write")
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: the directory {path.parent} does not exist")
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader never
    sees half a file and a failure leaves the old one. A path that is a directory, or whose
    directory does not exist, is a ValueError that says so; other failures are OSErrors."""
    path = check_target(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would have made it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
