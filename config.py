"""epilab's knobs: one typed settings object, read from the environment once.

Every knob has an ``EPILAB_*`` environment override; code reads ``settings()``
instead of ``os.environ``. Tests change knobs with ``patch(...)``:

    with config.patch(interpret=True):
        ...

| variable           | field       | meaning                                                  |
|--------------------|-------------|----------------------------------------------------------|
| EPILAB_CACHE_DIR   | cache_dir   | rendered kernels, default db; default                    |
|                    |             | ``$XDG_CACHE_HOME/epilab`` or ``~/.cache/epilab``        |
| EPILAB_DB          | db          | tuning database: a path (SQLite) or SQLAlchemy URL;      |
|                    |             | default ``<cache_dir>/tuning.db``                        |
| EPILAB_INTERPRET   | interpret   | allow CPU tensors, run through Triton's interpreter      |
|                    |             | (also on when ``TRITON_INTERPRET=1``)                    |
| EPILAB_POLICY      | policy      | the backend's choice of template or aten op: ``auto``    |
|                    |             | (the database decides; default), ``always``, ``never``   |
| EPILAB_LOG         | log_level   | level of the ``epilab`` logger (DEBUG, INFO, WARNING...);|
|                    |             | ``1`` means INFO: the backend prints its decisions       |
| EPILAB_DEBUG_DIR   | debug_dir   | if set, every rendered kernel is also copied here        |
| EPILAB_DETERMINISTIC | deterministic | reduction outputs (row/column statistics) summed in a |
|                    |             | fixed order (per-tile partials, then a sum), bitwise     |
|                    |             | reproducible; off: fp32 atomics (also on under           |
|                    |             | ``torch.use_deterministic_algorithms(True)``)            |
| EPILAB_EXACT_MATH  | exact_math  | epilogues keep their exact fp32 forms for 16-bit and fp8 |
|                    |             | outputs too (no GPU approximations: rules.py, "Fast      |
|                    |             | forms"); for comparisons and numerics studies            |
| EPILAB_COMPILE_SERVER_IDLE | compile_server_idle_s | seconds the host's compile server |
|                    |             | (tuner/compile_server.py) waits without a command before |
|                    |             | it leaves; default 300; 0: no server, each ``tune``      |
|                    |             | compiles in processes of its own                         |
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LOG_SWITCH = {"1": "INFO", "TRUE": "INFO", "YES": "INFO", "ON": "INFO", "0": "WARNING", "": "WARNING"}
POLICIES = ("auto", "always", "never")
MAX_LEASE_TTL_S = 86400.0  # `tune --lease-ttl`: a killed worker's problems wait at most a day for another


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    db: str
    interpret: bool
    policy: str
    log_level: str
    debug_dir: Path | None
    deterministic: bool = False
    exact_math: bool = False
    compile_server_idle_s: float = 300.0

    @property
    def kernel_dir(self) -> Path:
        """Where rendered kernel sources are written (Triton needs real files)."""
        return self.cache_dir / "kernels"


class SettingsError(ValueError):
    """An ``EPILAB_*`` variable holds a value epilab cannot use: which, and what is accepted.
    Raised where the settings are first needed, never on ``import epilab``."""


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingsError(f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def _home(env: Mapping[str, str]) -> Path:
    """The user's home: ``$HOME`` when it is an absolute path, else the password database's
    (an empty or relative HOME would put the cache at ``/.cache`` or under the working dir)."""
    home = env.get("HOME", "")
    if os.path.isabs(home):
        return Path(home)
    try:
        import pwd

        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError, OSError) as e:
        raise SettingsError(
            f"HOME={home!r} is not an absolute path and the user has no home directory ({e}); "
            "set EPILAB_CACHE_DIR (and EPILAB_DB) to directories epilab may use"
        ) from None


def _path(name: str, value: str) -> Path:
    """``value`` of variable ``name`` as a path, ``~`` expanded, or a SettingsError saying why not."""
    try:
        return Path(value).expanduser()
    except RuntimeError as e:  # ~nosuchuser, or no home to expand ~ to
        raise SettingsError(f"{name}={value!r}: cannot expand '~' ({e}); give an absolute path") from None


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Build settings from an environment mapping (``os.environ`` by default). A variable
    holding only blanks counts as unset; XDG_CACHE_HOME counts only when absolute (as the
    XDG base directory spec says)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME", "")
    cache_text = env.get("EPILAB_CACHE_DIR", "").strip()
    if cache_text:
        cache_dir = _path("EPILAB_CACHE_DIR", cache_text)
    else:
        cache_dir = (Path(xdg) if os.path.isabs(xdg) else _home(env) / ".cache") / "epilab"
    if cache_dir.exists() and not cache_dir.is_dir():
        raise SettingsError(f"EPILAB_CACHE_DIR={str(cache_dir)!r} is a file; give a directory")
    db = env.get("EPILAB_DB", "").strip() or str(cache_dir / "tuning.db")
    interpret = _parse_bool("EPILAB_INTERPRET", env.get("EPILAB_INTERPRET", "0")) or _parse_bool(
        "TRITON_INTERPRET", env.get("TRITON_INTERPRET", "0")
    )
    policy = env.get("EPILAB_POLICY", "auto").strip().lower() or "auto"
    if policy not in POLICIES:
        raise SettingsError(f"EPILAB_POLICY={policy!r} is not a policy; use one of {POLICIES}")
    log_level = env.get("EPILAB_LOG", "WARNING").strip().upper()
    log_level = _LOG_SWITCH.get(log_level, log_level)
    if log_level not in _LOG_LEVELS:
        raise SettingsError(f"EPILAB_LOG={log_level!r} is not a log level; use 1, 0 or one of {_LOG_LEVELS}")
    debug_dir = env.get("EPILAB_DEBUG_DIR", "").strip()
    return Settings(
        cache_dir=cache_dir,
        db=db,
        interpret=interpret,
        policy=policy,
        log_level=log_level,
        debug_dir=_path("EPILAB_DEBUG_DIR", debug_dir) if debug_dir else None,
        deterministic=_parse_bool("EPILAB_DETERMINISTIC", env.get("EPILAB_DETERMINISTIC", "0")),
        exact_math=_parse_bool("EPILAB_EXACT_MATH", env.get("EPILAB_EXACT_MATH", "0")),
        compile_server_idle_s=_seconds(
            "EPILAB_COMPILE_SERVER_IDLE", env.get("EPILAB_COMPILE_SERVER_IDLE", "")
        ),
    )


def _seconds(name: str, value: str, default: float = 300.0) -> float:
    """``value`` of variable ``name`` as seconds (0 or more; blank: ``default``)."""
    text = value.strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise SettingsError(f"{name}={value!r} is not a number of seconds; give 0 or more (0: off)")
    return seconds


_current: Settings | None = None


def settings() -> Settings:
    """The settings in force (read from the environment on first use)."""
    global _current
    if _current is None:
        _current = from_env()
        _configure_logging(_current.log_level)
    return _current


def _configure_logging(level: str) -> None:
    """Set the ``epilab`` logger's level; when EPILAB_LOG asks for more than warnings and
    nothing else prints them, give the logger a stderr handler of its own."""
    logger = logging.getLogger("epilab")
    logger.setLevel(level)
    quiet = logger.handlers or logging.getLogger().handlers
    if logging.getLevelName(level) < logging.WARNING and not quiet:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)


@contextmanager
def patch(**overrides: object) -> Iterator[Settings]:
    """Temporarily replace some settings; unknown names raise TypeError."""
    global _current
    before = settings()
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = set(overrides) - fields
    if unknown:
        raise TypeError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(fields)}")
    _current = dataclasses.replace(before, **overrides)  # type: ignore[arg-type]
    try:
        yield _current
    finally:
        _current = before
