"""The template registry, as ir/ reaches it: a plugin loaded by name.

ir/ imports nothing above it, yet a problem is checked against its template and a config
against the knobs its kinds declare. The registry (``templates/registry.py``) hands its kinds
over when it is imported; whatever asks before that loads the module by name, as a plugin is
loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

REGISTRY_MODULE = "epilab.templates.registry"


_REGISTRY: list[Mapping[str, Any]] = []


def register_templates(templates: Mapping[str, Any]) -> None:
    """Make ``templates`` (kept, not copied) the registry problems are checked against."""
    _REGISTRY[:] = [templates]


def load_templates() -> bool:
    """Import the registry (and with it every kind, and the knobs they declare) unless it was;
    whether it is loaded. While the registry module is still being imported (a kind's own
    module asking) it is not, and nothing more can be loaded."""
    if not _REGISTRY:
        importlib.import_module(REGISTRY_MODULE)
    return bool(_REGISTRY)


def templates() -> Mapping[str, Any]:
    """The registered templates by name (``ir.problem.Template``s), importing the registry the
    first time."""
    if not load_templates():
        raise RuntimeError(f"{REGISTRY_MODULE} is being imported: its kinds are not registered yet")
    return _REGISTRY[0]
