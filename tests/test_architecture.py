"""The package's structure: imports go one way (no cycle, counting imports inside functions too), the
executor never imports the cost model, framework behaviour is not a string test in the cost model, and
the generated settings reference is what the records say."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "advisor"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The advisor modules ``name`` imports anywhere in its source (a name imported from a package counts as
    that package's module where one exists)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else base)
    return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_there_is_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_executor_never_imports_the_cost_model_or_the_searchers():
    graph = _graph()
    offending = {m: sorted(d for d in deps if d.startswith(("advisor.cost", "advisor.search")))
                 for m, deps in graph.items() if m.startswith("advisor.executor")}
    assert {m: d for m, d in offending.items() if d} == {}


def test_the_registry_and_the_records_import_nothing_of_the_rest():
    graph = _graph()
    assert graph["advisor.families"] <= {"advisor.errors"}
    assert graph["advisor.specs.frameworks"] == set()


def test_the_settings_reference_is_what_the_records_say():
    from advisor.commands.settings_doc import DOC, render

    assert DOC.read_text() == render(), "run python -m advisor.commands.settings_doc"


def test_every_family_hook_resolves_to_a_function():
    from dataclasses import fields

    from advisor.families import registered, resolve

    for family in registered():
        for fl in fields(family):
            value = getattr(family, fl.name)
            hooks = value.values() if isinstance(value, dict) and fl.name == "exporters" else [value]
            for hook in hooks:
                if isinstance(hook, str) and ":" in hook and hook.startswith("advisor."):
                    assert callable(resolve(hook)), (family.name, fl.name, hook)
