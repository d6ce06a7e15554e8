"""The layering of the four wheels, checked on the sources' import statements (run by `nox -s lint` as a script,
and by pytest with the cross-package tests).

Rules (issue 16):

* a wheel uses another wheel only through its public modules: of neuron-device, `neuron_device` itself, the service
  interface `neuron_device.services`, `torch_neuronx` and the hardware spec `neuron_spec`; of the other wheels,
  modules with no ``_``-prefixed part;
* the legacy ``neuronxcc.nki`` layer uses the ``nki`` core only through its public modules and ``nki.extension``;
* the hardware spec `neuron_spec` imports only the standard library (no torch, nothing of ours);
* the ``nki`` core (everything in ``nki`` but its torch adapter ``nki.torch``) imports neither torch nor
  ``neuronxcc``, nor neuron-device beyond `neuron_spec`;
* neuron-device imports no sibling wheel;
* no import cycle inside a wheel (issue 36): a module that imports another, directly or through others, is never
  imported back by it. An import inside a function counts as any other (it closes the cycle when it runs); only
  imports under ``if TYPE_CHECKING:`` do not, as they never run.

Every import counts, also inside functions. `python tests/test_layering.py` prints each violation and exits 1.
"""

from __future__ import annotations

import ast
import collections
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = {  # top-level package -> the wheel that ships it
    "neuron_device": "neuron-device",
    "neuron_spec": "neuron-device",
    "torch_neuronx": "neuron-device",
    "neuron_compile": "neuron-compile",
    "neuron_distributed": "neuron-distributed",
    "nki": "neuron-nki",
    "neuronxcc": "neuron-nki",
}
# neuron-device's public modules for the other wheels (everything else of it is internal).
DEVICE_PUBLIC = ("neuron_device", "neuron_device.services", "torch_neuronx", "torch_neuronx.metrics")
STDLIB = sys.stdlib_module_names


def modules(root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every source module of the four wheels."""
    for path in sorted(root.glob("packages/*/src/**/*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts[3:])  # packages/<wheel>/src/<module path>
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` but those under ``if TYPE_CHECKING:`` (its ``else`` branch runs)."""
    todo = collections.deque([tree])  # breadth first, in source order, as `ast.walk`
    while todo:
        node = todo.popleft()
        yield node
        todo.extend(node.orelse if _type_checking(node) else ast.iter_child_nodes(node))


def imports(module: str, path: Path, tree: ast.AST, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in `tree` that runs (not under ``if TYPE_CHECKING:``);
    ``from a import b`` names ``a.b`` when that is one of our modules (`known`), so importing a private submodule by
    name is seen."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield node.lineno, candidate if candidate in known else base


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


def violation(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    top, importer_top = imported.partition(".")[0], importer.partition(".")[0]
    wheel, own_wheel = WHEELS.get(top), WHEELS[importer_top]
    if importer_top == "neuron_spec":
        if top != "neuron_spec" and top not in STDLIB:
            return "the hardware spec imports only the standard library"
        return None
    if importer_top == "nki" and not importer.startswith("nki.torch"):
        if top in ("torch", "neuronxcc") or (wheel == "neuron-device" and top != "neuron_spec"):
            return "the nki core imports neither torch, neuronxcc nor neuron-device (beyond neuron_spec)"
    if importer_top == "neuronxcc" and top == "nki" and _private(imported) and imported != "nki.extension":
        return "neuronxcc.nki uses nki's public API and nki.extension only"
    if wheel is None or wheel == own_wheel:
        return None
    if own_wheel == "neuron-device":
        return "neuron-device imports no sibling wheel"
    if wheel == "neuron-device":
        if top == "neuron_spec" or imported in DEVICE_PUBLIC:
            return None
        return "a sibling wheel uses neuron-device through neuron_device.services only"
    if _private(imported):
        return f"a private module of {wheel}"
    return None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles of `graph` (module -> {imported module: line}): one per strongly connected component of
    more than one module (or a module importing itself), as a closed path ``[a, b, ..., a]`` through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):  # Tarjan's algorithm, iterative (no recursion limit on long import chains)
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(_closed_path(graph, component))
    return found


def _closed_path(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of `component` (breadth-first inside the component)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt in component and nxt not in parents:
                    parents[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def violations(root: Path = ROOT) -> list[str]:
    """Every import that breaks the layering, as ``path:line: importer imports imported (rule)``, and every import
    cycle inside a wheel, as ``import cycle in <wheel>: a (path:line) -> b (path:line) -> ... -> a``."""
    found = list(modules(root))
    known = {name for name, _ in found}
    paths = dict(found)
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    problems = []
    for module, path in found:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, imported in imports(module, path, tree, known):
            reason = violation(module, imported)
            if reason:
                problems.append(f"{path.relative_to(root)}:{line}: {module} imports {imported} ({reason})")
            if imported in known and WHEELS[imported.partition(".")[0]] == WHEELS[module.partition(".")[0]]:
                graph[module].setdefault(imported, line)
    for cycle in cycles(graph):
        steps = " -> ".join(
            f"{a} ({paths[a].relative_to(root)}:{graph[a][b]})" for a, b in itertools.pairwise(cycle))
        problems.append(f"import cycle in {WHEELS[cycle[0].partition('.')[0]]}: {steps} -> {cycle[0]}")
    return problems


def test_the_wheels_keep_their_layering():
    assert violations() == []


def test_each_rule_catches_its_violation():
    cases = {
        ("neuron_compile.passes", "neuron_device.allocator"): True,
        ("neuron_compile.passes", "neuron_device.services"): False,
        ("neuron_compile.passes", "neuron_spec.hardware"): False,
        ("nki.torch.adapter", "neuron_compile._patches"): True,
        ("neuron_spec.machine", "torch"): True,
        ("neuron_spec.machine", "neuron_device.topology"): True,
        ("neuron_spec.machine", "re"): False,
        ("nki._targets", "torch"): True,
        ("nki.language", "neuronxcc.nki.isa"): True,
        ("nki._targets", "neuron_spec.machine"): False,
        ("nki.torch.native", "torch"): False,
        ("neuronxcc.nki.isa", "nki._tensor"): True,
        ("neuronxcc.nki.isa", "nki.extension"): False,
        ("neuron_device.ops.fastpath", "nki.torch"): True,
        ("torch_neuronx", "neuron_compile"): True,
    }
    assert {case: violation(*case) is not None for case in cases} == cases


def test_private_submodules_imported_by_name_are_seen():
    source = "from neuron_device import allocator\nfrom . import services\n"
    known = {"neuron_device.allocator", "neuron_device.services", "neuron_compile.x"}
    found = list(imports("neuron_compile.x", Path("x.py"), ast.parse(source), known))
    assert found == [(1, "neuron_device.allocator"), (2, "neuron_compile")]


def test_import_cycles_are_found_also_through_deferred_imports():
    sources = {
        "low": "from . import barrier\n",
        "barrier": "def flush():\n    from . import queue\n",  # deferred: runs when flush() is called
        "queue": "from . import low\n",
        "typed": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import low\n",
        "leaf": "import os\n",
    }
    known = {f"neuron_device.{name}" for name in sources}
    graph = {
        f"neuron_device.{name}": {imported: line for line, imported in imports(
            f"neuron_device.{name}", Path(f"{name}.py"), ast.parse(source), known) if imported in known}
        for name, source in sources.items()
    }
    graph["neuron_device.low"]["neuron_device.typed"] = 1  # importing a module whose import of us is for typing only
    assert cycles(graph) == [["neuron_device.barrier", "neuron_device.queue", "neuron_device.low",
                              "neuron_device.barrier"]]
    del graph["neuron_device.barrier"]["neuron_device.queue"]
    assert cycles(graph) == []


if __name__ == "__main__":
    problems = violations()
    print("\n".join(problems) or "layering: ok")
    sys.exit(1 if problems else 0)
