"""Config (how a kernel is tiled: one point of a kind's search space) and the knobs it holds.

The fields every kind shares are ``Config``'s own: the tile (BLOCK_M x BLOCK_N x BLOCK_K), its
GROUP_M, SPLIT_K, warps, stages and the variant. A kind's own knobs (the depthwise strip's
TILE_H, the weight-only dot's SWAP_AB, the matmul's Hopper knobs) are declared by the module
of the family that owns them (``declare``), and so are the values a kind adds to a shared
field (``extend``: the variants, a depthwise strip's 512 pixels). A config is validated on
construction: one read from anywhere (a database row, a user) holds declared values only. A
name or value not declared yet loads the registry, and with it every kind (``ir/plugin``).

A config is stored as a JSON object of field names: a knob at its default may be there (every
row before the kinds declared their own) or not (``to_dict`` leaves it out); both read alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

from epilab.ir.plugin import load_templates

Value = int | str

# The values of the fields every kind has; a kind adds its own (``extend``).
SHARED: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "BLOCK_M": (16, 32, 64, 128, 256),
    "BLOCK_N": (16, 32, 64, 128, 256),
    "BLOCK_K": (16, 32, 64, 128, 256),
    "GROUP_M": (1, 2, 4, 8, 16),
    "SPLIT_K": (1, 2, 4, 8, 16, 32),
    "num_warps": (1, 2, 4, 8, 16),
    "num_stages": (1, 2, 3, 4, 5, 6, 7),
    "variant": ("default",),  # the kinds name their main loops and reductions
}
REQUIRED = ("BLOCK_M", "BLOCK_N", "BLOCK_K")


@dataclass(frozen=True)
class Knob:
    """A config field of a kind's own: its values, its default (what every other kind holds),
    and how ``config_text`` shows a value other than the default: a format of it (``rows{}``)
    or a word (``swap``)."""

    name: str
    values: tuple[int, ...] | tuple[str, ...]
    default: Value
    shown: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_") or self.name == "knobs":
            raise ValueError(f"a knob's name must be a public identifier, got {self.name!r}")
        types = {type(v) for v in self.values}
        if len(types) != 1 or types - {int, str}:
            raise ValueError(f"knob {self.name}: its values must be ints or strings, all of one type")
        if type(self.default) is not type(self.values[0]) or self.default not in self.values:
            raise ValueError(f"knob {self.name}: its default {self.default!r} is not one of {self.values}")


_KNOBS: dict[str, Knob] = {}  # by name, in the order declared (``config_text`` shows them so)
_ALLOWED: dict[str, tuple[Value, ...]] = dict(SHARED)  # every declared field's values
# ... as a set and the one type of its values: the check every config's construction makes
# (a space's enumeration builds millions)
_ACCEPTS: dict[str, tuple[type, frozenset[Value]]] = {}


def _allow(name: str, values: tuple[Value, ...]) -> None:
    _ALLOWED[name] = values
    _ACCEPTS[name] = (type(values[0]), frozenset(values))


for _name, _values in SHARED.items():
    _allow(_name, _values)


def declare(*knobs: Knob) -> tuple[Knob, ...]:
    """Declare a kind's own knobs (at its module's import; again with the same ones is a no-op)."""
    for knob in knobs:
        if knob.name in SHARED:
            raise ValueError(f"{knob.name} is a field every config has: extend its values instead")
        had = _KNOBS.get(knob.name)
        if had is not None and had != knob:
            raise ValueError(f"config knob {knob.name} declared twice, differently: {had} and {knob}")
        if had is None and hasattr(Config, knob.name):
            raise ValueError(f"a knob named {knob.name} would hide Config.{knob.name}")
        _KNOBS[knob.name] = knob
        _allow(knob.name, knob.values)
        # its default, read as a class attribute by every config that does not set it
        setattr(Config, knob.name, knob.default)
    return knobs


def extend(name: str, values: tuple[Value, ...]) -> tuple[Value, ...]:
    """Add a kind's values to a shared field (its variants, wider tiles); returns them."""
    if name not in SHARED:
        raise ValueError(f"{name!r} is not a shared config field; one of {list(SHARED)}")
    kind = type(SHARED[name][0])
    if any(type(v) is not kind for v in values):
        raise ValueError(f"{name} takes {kind.__name__} values, got {values}")
    have = _ALLOWED[name]
    added = have + tuple(v for v in dict.fromkeys(values) if v not in have)
    _allow(name, tuple(sorted(added)) if kind is int else added)  # type: ignore[type-var]
    return values


def knob(name: str) -> Knob | None:
    """The declared knob ``name`` (loading every kind's declarations first if it is not yet)."""
    if name not in _KNOBS and name not in SHARED:
        load_templates()
    return _KNOBS.get(name)


def choices() -> dict[str, tuple[Value, ...]]:
    """Every field a config may hold and its values, the kinds' own after the shared ones."""
    load_templates()
    return dict(_ALLOWED)


def _value_error(name: str, value: object) -> str | None:
    allowed = _ALLOWED.get(name)
    if allowed is None:
        return f"unknown config field {name!r:.40}; known: {list(_ALLOWED)}"
    kind = type(allowed[0])  # int or str; 64.0 == 64, True == 1, but neither launches a kernel
    if type(value) is not kind or value not in allowed:
        return f"config {name}={value!r:.40} is not allowed; choose one of {allowed} ({kind.__name__})"
    return None


def _check(name: str, value: object) -> None:
    accepts = _ACCEPTS.get(name)
    if accepts is not None and type(value) is accepts[0] and value in accepts[1]:
        return
    why = _value_error(name, value)
    if why is not None and load_templates():  # a kind not imported yet may declare it: look again
        why = _value_error(name, value)
    if why is not None:
        raise ValueError(why)


@dataclass(frozen=True, init=False, repr=False)
class Config:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "default"
    # the kinds' own knobs that differ from their defaults, (name, value) sorted by name; each
    # reads as an attribute (``config.TILE_H``), a knob at its default too
    knobs: tuple[tuple[str, Value], ...] = ()

    def __init__(
        self,
        BLOCK_M: int,
        BLOCK_N: int,
        BLOCK_K: int,
        GROUP_M: int = 8,
        SPLIT_K: int = 1,
        num_warps: int = 4,
        num_stages: int = 3,
        variant: str = "default",
        knobs: tuple[tuple[str, Value], ...] = (),
        **own: Value,
    ) -> None:
        given = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages, variant)
        shared = dict(zip(SHARED, given, strict=True))
        for name, value in shared.items():
            _check(name, value)
            object.__setattr__(self, name, value)
        given_knobs = {**dict(knobs), **own}
        for name, value in given_knobs.items():
            if name in SHARED:
                raise ValueError(f"config field {name} given twice")
            _check(name, value)
        _hold(self, given_knobs)

    def __getattr__(self, name: str) -> Value:
        """A knob not declared yet (declared knobs are attributes: their defaults the class's,
        a value set otherwise the instance's): declared once the kinds are loaded, or none."""
        if name.startswith("_") or name == "knobs":
            raise AttributeError(name)
        declared = knob(name)
        if declared is None:
            raise AttributeError(f"a config has no field or declared knob {name!r}")
        return declared.default

    @classmethod
    def of_declared(cls, values: Mapping[str, Value]) -> Config:
        """The config of ``values``, each already known to be declared (a kind's space, checked
        once by ``check_declared``), built without checking each again: what an enumeration of
        a space's millions of points needs. Anything from outside goes through ``from_dict``."""
        self = object.__new__(cls)
        for name, value in {**_SHARED_DEFAULTS, **values}.items():
            if name in SHARED:
                object.__setattr__(self, name, value)
        _hold(self, {name: value for name, value in values.items() if name not in SHARED})
        return self

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in self.to_dict().items())
        return f"Config({shown})"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        """The one validation of a config from outside (an import, a database row, a user):
        declared fields only, each an exact value of its declared values; raises ValueError."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a config must be an object of {list(choices())}, got {type(d).__name__}")
        unknown = [k for k in d if not isinstance(k, str) or (k not in SHARED and knob(k) is None)]
        if unknown:
            shown = sorted(str(k)[:40] for k in unknown)[:5]
            raise ValueError(f"unknown config field(s) {shown}; known: {list(choices())}")
        missing = [name for name in REQUIRED if name not in d]
        if missing:
            raise ValueError(f"incomplete config: it has no {', '.join(missing)}")
        return cls(**d)

    @classmethod
    def is_valid(cls, d: Mapping[str, Any]) -> bool:
        """Whether ``from_dict(d)`` accepts ``d`` (the database reader skips rows it does not)."""
        try:
            cls.from_dict(d)
        except ValueError:
            return False
        return True

    def to_dict(self) -> dict[str, Value]:
        """The shared fields, then the knobs that differ from their defaults."""
        return {**{name: getattr(self, name) for name in SHARED}, **dict(self.knobs)}

    def short(self) -> str:
        """The one shorthand (``config_text``)."""
        return config_text(self)


def _hold(config: Config, knobs: Mapping[str, Value]) -> None:
    """``config``'s knobs: those that differ from their defaults, in ``config.knobs`` and as
    attributes of the instance (read without ``__getattr__``)."""
    held = sorted((name, value) for name, value in knobs.items() if value != _KNOBS[name].default)
    for name, value in held:
        object.__setattr__(config, name, value)
    object.__setattr__(config, "knobs", tuple(held))


_SHARED_DEFAULTS: dict[str, Value] = {
    f.name: f.default for f in fields(Config) if f.name in SHARED and f.default is not MISSING
}


def check_declared(values: Mapping[str, Sequence[Value]]) -> None:
    """Raise ValueError unless every value of every field in ``values`` is a declared one."""
    for name, choices in values.items():
        if name not in SHARED and knob(name) is None:
            raise ValueError(f"unknown config field {name!r:.40}; known: {list(_ALLOWED)}")
        for value in choices:
            _check(name, value)


def config_text(config: Config | Mapping[str, Any] | None) -> str:
    """The one shorthand of a config, in every table, log and report: tile MxNxK, ``g`` group,
    ``w`` warps, ``st`` stages, then only what differs from the default: ``split`` split-K,
    the variant, then each kind's knob as it declares (``Knob.shown``): the matmul's ``sub``
    epilogue slices, programs ``/sm``, ``flat``, ``ws``, ``tma-store``, fp8's ``promote``,
    weight-only's ``swap``, a depthwise strip's ``rows``."""
    if not config:
        return ""
    c = config.to_dict() if isinstance(config, Config) else config
    parts = [
        f"{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')} g{c.get('GROUP_M', 1)} "
        f"w{c.get('num_warps')} st{c.get('num_stages')}",
        f"split{c['SPLIT_K']}" if c.get("SPLIT_K", 1) != 1 else "",
        str(c["variant"]) if c.get("variant", "default") != "default" else "",
    ]
    own = {name for name in c if name not in SHARED and knob(name) is not None}
    parts += [k.shown.format(c[k.name]) for k in _KNOBS.values() if k.name in own and c[k.name] != k.default]
    return " ".join(filter(None, parts))
