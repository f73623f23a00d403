"""The house's floors (docs/design.md, "Layout"): ir/ on the ground floor imports nothing
above it, and no two modules import each other, however indirectly (imports inside
functions and under ``TYPE_CHECKING`` count: a circle is a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import epilab

ROOT = Path(epilab.__file__).parent
SKIP = {"tests", "benchmarks", "docs", "test-artifacts", ".whl", "build"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in SKIP or parts[0].startswith(".") or "migrations" in parts:
            continue
        name = ".".join(("epilab", *parts))[: -len(".py")].removesuffix(".__init__")
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The epilab modules ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {n for n in names if n in modules and n != "epilab"}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_ir_is_the_ground_floor():
    graph = _graph()
    assert any(name.startswith("epilab.ir.") for name in graph)
    above = {
        name: sorted(m for m in deps if not m.startswith(("epilab.ir", "epilab.config")))
        for name, deps in graph.items()
        if name.startswith("epilab.ir")
    }
    assert {k: v for k, v in above.items() if v} == {}


def test_no_module_imports_itself_through_others():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep] if dep in path else [name, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# Who may import a kind module (one defining ``KIND``) besides the registry and the kinds
# themselves: the user functions (``epilab.matmul``, ``epilab.gated_matmul``,
# ``epilab.grouped_matmul``) are the matmul (dual, block-scaled, weight-only) and grouped kinds'
# own API. The compiler, the tuner, the suites and the CLI ask the registry.
KIND_IMPORTERS = {
    "epilab.templates.matmul_api": {
        "epilab.templates.matmul",
        "epilab.templates.dual_matmul",
        "epilab.templates.block_scaled",
        "epilab.templates.weight_only",
    },
    "epilab.templates.grouped_api": {
        "epilab.templates.grouped_matmul",
        "epilab.templates.dual_grouped_matmul",
    },
}


def test_only_the_registry_imports_the_kind_modules():
    modules = _modules()
    kind_modules = {name for name, path in modules.items() if "\nKIND = " in path.read_text()}
    assert {"epilab.templates.matmul", "epilab.templates.conv2d"} <= kind_modules
    found = {}
    for name, deps in _graph().items():
        if name == "epilab.templates.kinds" or name in kind_modules:
            continue
        if deps & kind_modules:
            found[name] = deps & kind_modules
    assert found == KIND_IMPORTERS
