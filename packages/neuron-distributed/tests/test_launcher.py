"""The tests' launcher (`launcher.py`): `run_code`, forked from its torch-preloaded server, returns what a fresh
`python -W ignore -c code args` returns (the planning tests rely on it)."""

from __future__ import annotations

from launcher import run_code

_CODE = """
import os, sys, warnings
import torch
warnings.warn("not shown: -W ignore")
print(sys.argv[1:], os.environ["NEURON_SIM_INSTANCE_TYPE"], torch.device("neuron:0"))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


def test_run_code_forked_returns_what_a_fresh_interpreter_returns() -> None:
    forked = run_code(_CODE, "a", "b", env={"NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge"})
    # a variable torch reads at import: a fresh interpreter
    fresh = run_code(_CODE, "a", "b", env={"NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge", "TORCH_SHOW_CPP_STACKTRACES": "0"})
    for done in (forked, fresh):
        assert done.returncode == 3, done.stderr
        assert done.stdout == "['a', 'b'] trn1.2xlarge neuron:0\n"
        assert done.stderr == "to stderr\n"
