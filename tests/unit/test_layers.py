"""Imports point one way: no module of the package is in an import cycle, counting the
imports inside functions (grimp sees them) and leaving out ``if TYPE_CHECKING:`` ones.

The same rule as the ``acyclic_siblings`` contract of pyproject.toml's
``[tool.importlinter]`` (``lint-imports``, run by .ci/run), kept in the suite too,
and at module granularity: a cycle through a package's ``__init__`` counts.
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("django_pgjobs", exclude_type_checking_imports=True)
    assert len(graph.modules) > 60, "the graph lost the package's modules"
    cycles = _cycles(graph)
    detail = [
        f"{importer} -> {imported} (line {d['line_number']}: {d['line_contents']})"
        for cycle in cycles
        for importer in cycle
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(cycle))
        for d in graph.get_import_details(importer=importer, imported=imported)[:1]
    ]
    assert not cycles, "modules in an import cycle:\n" + "\n".join(detail)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: two modules importing each other inside functions."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b", line_number=9, line_contents="import")
    graph.add_import(importer="pkg.b", imported="pkg.a", line_number=9, line_contents="import")
    graph.add_import(importer="pkg.c", imported="pkg.a", line_number=9, line_contents="import")
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]
