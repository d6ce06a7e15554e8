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
* neuron-device imports no sibling wheel.

Every import counts, also inside functions. `python tests/test_layering.py` prints each violation and exits 1.
"""

from __future__ import annotations

import ast
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


def imports(module: str, path: Path, tree: ast.AST, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in `tree`; ``from a import b`` names ``a.b`` when that is one of
    our modules (`known`), so importing a private submodule by name is seen."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
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


def violations(root: Path = ROOT) -> list[str]:
    """Every import that breaks the layering, as ``path:line: importer imports imported (rule)``."""
    found = list(modules(root))
    known = {name for name, _ in found}
    problems = []
    for module, path in found:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, imported in imports(module, path, tree, known):
            reason = violation(module, imported)
            if reason:
                problems.append(f"{path.relative_to(root)}:{line}: {module} imports {imported} ({reason})")
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


if __name__ == "__main__":
    problems = violations()
    print("\n".join(problems) or "layering: ok")
    sys.exit(1 if problems else 0)
