"""Every environment variable the four packages read is in docs/environment-variables.md, and nothing else is.

The sources are scanned as text (no import), so the check covers every package whether or not it is installed.
A variable is read when its name is a literal in ``os.environ.get(...)`` / ``os.getenv(...)`` /
``os.environ[...]`` / ``"NAME" in os.environ``, or is the value of a module constant whose name ends in ``ENV``
(``TARGET_ENV = "NEURON_..."``) or of an ``ENV = {...}`` table, the two ways the packages name variables they
read through a helper.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))
TABLE = ROOT / "docs" / "environment-variables.md"
NAME = r"[\"']([A-Z][A-Z0-9_]*)[\"']"
DIRECT = [
    re.compile(r"(?:environ\.get|getenv|environ\.pop|environ\.setdefault)\(\s*" + NAME),
    re.compile(r"environ\[\s*" + NAME + r"\s*\]"),
    re.compile(NAME + r"\s+(?:not\s+)?in\s+os\.environ"),
]
CONSTANT = re.compile(r"^(?:[A-Z][A-Z0-9_]*)?ENV\s*(?::[^=\n]+)?=\s*" + NAME, re.MULTILINE)
TABLE_BLOCK = re.compile(r"^ENV(?::[^=\n]+)?\s*=\s*\{(.*?)^\}", re.MULTILINE | re.DOTALL)
TABLE_VALUE = re.compile(r":\s*" + NAME)
# Read by torch, not by us, but it decides whether `import torch` registers the device: documented on purpose.
TORCH_OWN = {"TORCH_DEVICE_BACKEND_AUTOLOAD"}


def read_variables(text: str) -> set[str]:
    """Names of the environment variables one source file reads."""
    names = {match for pattern in DIRECT for match in pattern.findall(text)}
    if "environ" in text or "getenv" in text:
        names |= set(CONSTANT.findall(text))
        for block in TABLE_BLOCK.findall(text):
            names |= set(TABLE_VALUE.findall(block))
    return names


def documented() -> set[str]:
    """First-column names of the env-var table."""
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", TABLE.read_text(encoding="utf-8"), re.MULTILINE))


def test_the_scanner_finds_each_form():
    sample = (
        'import os\nTARGET_ENV = "A_TARGET"\nENV = {\n    "x": "A_TABLE",  # comment\n}\n'
        'os.environ.get("A_GET"); os.getenv("A_GETENV"); os.environ["A_ITEM"]\nif "A_IN" in os.environ: pass\n'
        'os.environ.get(name)\n'
    )
    assert read_variables(sample) == {"A_TARGET", "A_TABLE", "A_GET", "A_GETENV", "A_ITEM", "A_IN"}
    assert read_variables('X_ENV = "NOT_READ"\n') == set()  # a constant in a file that reads no environment


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    read = set().union(*(read_variables(path.read_text(encoding="utf-8")) for path in SOURCES))
    # the scan must see the variables of every package, or it proves nothing
    assert {"NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_SIM_REPORT", "TORCH_NEURONX_NEFF_CACHE_DIR",
            "NEURON_DISTRIBUTED_CHECK_COLLECTIVES", "NKI_PRECISE_FP"} <= read
    table = documented()
    assert read - table == set(), "read by the code but missing from docs/environment-variables.md"
    assert table - read - TORCH_OWN == set(), "in docs/environment-variables.md but read by no package"
