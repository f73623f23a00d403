"""Files the user names: read only when they are regular files of bounded size, written
atomically; refused clearly when they cannot be (a ValueError that says why)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MAX_READ_BYTES = 512 * 2**20


def read_text_bounded(path: str | Path, what: str, limit: int = MAX_READ_BYTES) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``limit`` bytes: a device
    (``/dev/zero``), a FIFO or a directory is refused rather than read forever or blocked on.
    A missing file is a FileNotFoundError; bytes that are not UTF-8, a ValueError."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a regular file; give the {what} file itself")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit >> 20} MiB; refusing to read it as a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


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
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:  # a failed write (a full disk) names no file: say which one
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
