"""`neuron-plan`'s command line, shared by a plan (`plan_cli`) and a search (`plan_search`): the launcher command
after `--` (`python`, `torchrun`), the instance's ranks a node, the checks of options made before planning."""

from __future__ import annotations

import os
import shutil
import sys

from neuron_spec.hardware import INSTANCE_TYPES, TARGETS

__all__ = ["cores_per_node", "parse_command", "positive", "writable"]


def cores_per_node(instance: str) -> int:
    """Logical NeuronCores (one rank each) of one instance: chips x physical cores per chip / default LNC."""
    found = INSTANCE_TYPES.get(instance)
    if found is None:
        raise SystemExit(f"neuron-plan: unknown instance type {instance!r}; known: {sorted(INSTANCE_TYPES)}")
    target = TARGETS[found.target]
    return found.chips * target.physical_cores_per_chip // target.default_lnc


def _option(args: list[str], names: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """Remove `--name VALUE` / `--name=VALUE` (any spelling in `names`) from `args`; return the value and the rest."""
    rest, value, i = [], None, 0
    while i < len(args):
        arg = args[i]
        key = arg.split("=", 1)[0]
        if key in names:
            value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
            i += 1 if "=" in arg else 2
            continue
        rest.append(arg)
        i += 1
    return value, rest


# Interpreter options that take a value (`python -W ignore train.py`).
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def _is_python(path: str) -> bool:
    """`path` names a Python interpreter (`python`, `python3.11`, a venv's `bin/python`, a symlink to one)."""
    return any(os.path.basename(name).startswith("python") for name in (path, os.path.realpath(path)))


def _this_interpreter(name: str) -> bool:
    """`name` (`python`, `python3`, a path) runs this very interpreter: found (on PATH for a bare name) in the
    directory of `sys.executable`, and the same file. The ranks' zygote is then this process forked (`plan_ranks.
    Zygote`), not a new interpreter (2-3 s a plan or search). The directory counts, not only the file: a venv's
    `python` is a link to its base interpreter, whose prefix (site-packages) is another."""
    found = shutil.which(name)
    if found is None or not sys.executable:
        return False
    found = os.path.abspath(found)
    return (os.path.dirname(found) == os.path.dirname(os.path.abspath(sys.executable))
            and os.path.samefile(found, sys.executable))


def _python_command(command: list[str]) -> tuple[list[str], list[str]]:
    """`python [options] (script | -m module) args` -> ([python, *options], [script | -m module, *args]); `python`
    is `sys.executable` when it names this interpreter (`_this_interpreter`)."""
    interpreter, i = [sys.executable if _this_interpreter(command[0]) else command[0]], 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-m":
        if command[i] == "-c" or command[i] == "-":
            raise SystemExit("neuron-plan: plans a script or a module (python train.py, python -m package.module), "
                             f"not {command[i]!r}")
        takes_value = command[i] in _PYTHON_VALUE_OPTIONS
        interpreter += command[i:i + 1 + takes_value]
        i += 1 + takes_value
    script = command[i:]
    if not script or script == ["-m"]:
        raise SystemExit(f"neuron-plan: no script or module in {' '.join(command)!r}")
    return interpreter, script


def parse_command(command: list[str], per_node: int, nodes: int) -> tuple[list[str], list[str]]:
    """The interpreter (`[python, *options]`: the command's own, else this one) and the script with its arguments
    (`[script, *args]` or `["-m", module, *args]`) of a `python ...` or `torchrun ...` command; a torchrun world the
    cluster cannot hold is refused with the arithmetic."""
    if not command:
        raise SystemExit("neuron-plan: give the command after '--', e.g. neuron-plan -- python train.py")
    head, rest = os.path.basename(command[0]), command[1:]
    if head.startswith("torchrun"):
        nproc, rest = _option(rest, ("--nproc-per-node", "--nproc_per_node"))
        nnodes, rest = _option(rest, ("--nnodes",))
        for flag in ("--standalone",):
            rest = [a for a in rest if a != flag]
        if nproc is not None and nproc.isdigit() and int(nproc) > per_node:
            raise SystemExit(f"neuron-plan: torchrun asks for {nproc} processes per node, but one instance has "
                             f"{per_node} NeuronCores (one rank each)")
        if nnodes is not None and nnodes.isdigit() and int(nnodes) != nodes:
            raise SystemExit(f"neuron-plan: torchrun asks for {nnodes} nodes but --nodes is {nodes}")
        if nproc is not None and nproc.isdigit() and int(nproc) != per_node:
            raise SystemExit(f"neuron-plan: torchrun asks for {nproc} processes per node; plan mode plans the whole "
                             f"cluster, {nodes} x {per_node} NeuronCores = {nodes * per_node} ranks (use every core)")
        return [sys.executable], ["-m" if arg == "--module" else arg for arg in rest]
    if _is_python(command[0]):
        return _python_command(command)
    return [sys.executable], command  # a script path given directly


def writable(option: str, path: str | None) -> None:
    """Refuse, before planning, an output file that cannot be written (its directory missing or read-only)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise SystemExit(f"neuron-plan: cannot write {option} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise SystemExit(f"neuron-plan: cannot write {option} {path}: permission denied")


def positive(option: str, value: int) -> None:
    if value < 1:
        raise SystemExit(f"neuron-plan: {option} must be at least 1, got {value}")
