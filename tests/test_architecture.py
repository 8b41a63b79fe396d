"""The rooms of docs/architecture.md and who may import whom, read from the source (an AST
walk over pipeline/, transforms/ and filters/; imports at module level, inside functions
and under TYPE_CHECKING count alike):

- transforms/ (the kernels and storage) imports nothing from pipeline/ or filters/;
- filters/ imports only transforms/;
- pipeline/steps/ (the public Beam steps) imports no runner and nothing of the job: only
  other steps, ``pipeline.progress``, ``pipeline.models`` and transforms/;
- each runner module imports, of the project, only ``pipeline/runners/common.py``, the
  steps, the config's types, ``pipeline.progress``, ``pipeline.stopping`` (the standard
  library only: how a started process ends) and transforms/ (the runners' package
  ``pipeline.runners`` is the one place that picks among them);
- no import cycle; no private name (``_x``) imported from another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "transforms", "filters")


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (a package's submodule, or the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, str | None]]:
    """(imported project module, imported name or None) for every import in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target is not None:
                    out.append((target, None))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    out.append((full, None))
                elif (target := _resolve(base)) is not None:
                    out.append((target, alias.name))
    return [(t, n) for t, n in out if t != module]


GRAPH = {m: {t for t, _ in imports(m)} for m in MODULES}


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_walk_sees_the_project():
    """The rules below read a graph that holds what they speak of (a walk that found
    nothing would pass them all)."""
    assert {"transforms.near.find", "pipeline.runners.local", "pipeline.steps.near",
            "filters.online"} <= set(MODULES)
    assert "transforms.near.spec" in GRAPH["transforms.near.find"]
    assert "pipeline.runners.common" in GRAPH["pipeline.runners.local"]


@pytest.mark.parametrize(("room", "allowed"), [
    ("transforms", ("transforms",)),
    ("filters", ("filters", "transforms")),
    ("pipeline.steps", ("pipeline.steps", "pipeline.progress", "pipeline.models",
                        "transforms")),
])
def test_a_room_imports_only_what_it_may(room, allowed):
    bad = sorted((m, t) for m in MODULES if _within(m, room) for t in GRAPH[m]
                 if not _within(t, *allowed))
    assert bad == []


RUNNER_MODULES = [m for m in MODULES if m.startswith("pipeline.runners.")]


@pytest.mark.parametrize("module", RUNNER_MODULES)
def test_a_runner_imports_only_common_steps_config_and_kernels(module):
    allowed = ("pipeline.runners.common", "pipeline.steps", "pipeline.config",
               "pipeline.progress", "pipeline.stopping", "transforms")
    assert sorted(t for t in GRAPH[module] if not _within(t, *allowed)) == []


def test_no_import_cycle():
    order, low, on, stack, cycles = {}, {}, set(), [], []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for v in sorted(MODULES):
        if v not in order:
            visit(v)
    assert cycles == []


def test_no_private_name_crosses_a_module():
    crossing = sorted((m, t, n) for m in MODULES for t, n in imports(m)
                      if n is not None and n.startswith("_") and not n.startswith("__"))
    assert crossing == []
