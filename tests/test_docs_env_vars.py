"""Every environment variable the four packages read is declared once, in its package's declarations module, and
docs/environment-variables.md documents exactly the declared ones.

The declarations (`EnvVar` constants listed in each module's ``VARIABLES``; how to add one: `neuron_spec.env`) are
the list. That the code reads nothing undeclared is checked on the sources' syntax trees: only the one parser
(`neuron_spec.env`) and the places that hand the whole environment to it touch ``os.environ``.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from pathlib import Path

from neuron_spec.env import EnvVar

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))
TABLE = ROOT / "docs" / "environment-variables.md"
DECLARATIONS = ("neuron_device.envvars", "neuron_compile.envvars", "neuron_distributed.envvars", "nki.envvars")
# Modules that pass the whole environment to the parser (`read_topology(os.environ)`), or are the parser.
WHOLE_ENVIRONMENT = {"neuron_spec/env.py", "neuron_device/topology.py", "nki/_targets.py"}


def declared() -> list[EnvVar]:
    """Every declared variable, in declaration order (a name declared twice appears twice)."""
    return [var for module in DECLARATIONS for var in importlib.import_module(module).VARIABLES]


def documented() -> set[str]:
    """First-column names of the env-var table."""
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", TABLE.read_text(encoding="utf-8"), re.MULTILINE))


def environment_reads(tree: ast.AST) -> list[int]:
    """Lines of a module that touch ``os.environ`` or call ``os.getenv`` / ``os.putenv``."""
    return sorted(node.lineno for node in ast.walk(tree)
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"))
            or (isinstance(node, ast.ImportFrom) and node.module == "os"
            and any(alias.name in ("environ", "getenv") for alias in node.names)))


def test_every_declaration_is_an_envvar_declared_once():
    variables = declared()
    assert all(isinstance(var, EnvVar) for var in variables)
    twice = [name for name, count in Counter(var.name for var in variables).items() if count > 1]
    assert twice == [], "declared in more than one place"
    # every package contributes: an empty list would prove nothing
    names = {var.name for var in variables}
    assert {"NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_SIM_REPORT", "TORCH_NEURONX_NEFF_CACHE_DIR",
            "NEURON_DISTRIBUTED_CHECK_COLLECTIVES", "NKI_PRECISE_FP"} <= names


def test_every_declared_variable_is_documented_and_every_documented_one_is_declared():
    names = {var.name for var in declared()}
    table = documented()
    assert names - table == set(), "declared but missing from docs/environment-variables.md"
    assert table - names == set(), "in docs/environment-variables.md but declared by no package"


def test_no_module_reads_the_environment_around_the_declarations():
    readers = {}
    for path in SOURCES:
        relative = "/".join(path.relative_to(ROOT).parts[3:])  # packages/<wheel>/src/<this part>
        lines = environment_reads(ast.parse(path.read_text(encoding="utf-8")))
        if lines and relative not in WHOLE_ENVIRONMENT:
            readers[relative] = lines
    assert readers == {}, "read the environment directly: declare the variable (neuron_spec.env) and use .read()"


def test_the_scanner_sees_each_form():
    sample = "import os\nos.environ.get('A')\nos.getenv('B')\nfrom os import environ\n"
    assert environment_reads(ast.parse(sample)) == [2, 3, 4]


INVALID_PROBE = r"""
import json, sys
import torch
assert (torch.ones(3) + 1).sum().item() == 6  # CPU-only code runs with every invalid value set
import importlib
from neuron_spec.env import EnvVarError
refusals = {}
for module in sys.argv[1:]:
    for var in importlib.import_module(module).VARIABLES:
        try:
            var.read()
        except EnvVarError as error:
            refusals[var.name] = str(error)
try:
    torch.ones(2, device="neuron") + 1
except Exception as error:
    refusals["<device use>"] = str(error)
print(json.dumps(refusals))
"""


def test_every_typed_variable_refuses_an_invalid_value_by_name_and_import_torch_still_works():
    """Set every declared variable that has an invalid value (bool, int, float, or a choice) to one: a CPU-only
    `import torch` and CPU computation work (nothing is read eagerly at import), and reading each variable refuses
    its value with a message naming it (using the device refuses too, naming one of them)."""
    import os
    import subprocess
    import sys

    typed = [var for var in declared() if var.owner != "torch" and (var.type is not str or var.choices)]
    assert len(typed) > 20 and "NEURON_LAUNCH_BLOCKING" in {var.name for var in typed}
    env = {**os.environ, **{var.name: "banana" for var in typed}}
    result = subprocess.run([sys.executable, "-c", INVALID_PROBE, *DECLARATIONS], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    refusals = json.loads(result.stdout.strip().splitlines()[-1])
    for var in typed:
        assert var.name in refusals.get(var.name, ""), (var.name, refusals.get(var.name))
        assert "banana" in refusals[var.name]
    assert any(var.name in refusals["<device use>"] for var in typed), refusals["<device use>"]


def test_raw_reads_the_process_environment_as_os_environ_get(monkeypatch):
    """`EnvVar.raw` reads `os.environ`'s own store (a per-kernel-call read): the same text as `os.environ.get` when
    set (blank and non-ASCII included) and unset, at every change, and another mapping put in its place is read."""
    import os

    var = EnvVar("NEURON_TEST_RAW_READ", str, "x", "test only")
    monkeypatch.delenv(var.name, raising=False)
    assert var.raw() is None
    for text in ("1", "", " simulate ", "caf\u00e9"):
        monkeypatch.setenv(var.name, text)
        assert var.raw() == os.environ.get(var.name) == text
    monkeypatch.delenv(var.name)
    assert var.raw() is None
    monkeypatch.setattr(os, "environ", {var.name: "replaced"})
    assert var.raw() == "replaced"
    assert var.raw({var.name: "given"}) == "given"
