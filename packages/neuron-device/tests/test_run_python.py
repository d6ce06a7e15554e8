"""`device_support.run_python`: a child forked from its torch-preloaded server behaves as a fresh `python -c` does
(the tests that use it assert on what a fresh interpreter would do)."""

from __future__ import annotations

import os
import subprocess

import pytest
from device_support import run_python

# What a program started by `python -c` sees: argv, its namespace, sys.path, the working directory, a variable that
# neuron-device reads (after the fork), whether its parent is this process (fresh) or the server (forked).
ESSENTIALS = """
import os, sys, torch
print(sys.argv, __name__, sorted(globals()), sys.path, os.getcwd())
print(torch.neuron.get_device_properties().name, torch.neuron.device_count(), torch.neuron.current_device())
print(os.getppid() == {parent}, file=sys.stderr)
print("to stderr", file=sys.stderr)
"""


@pytest.mark.parametrize("ending, status", [("raise ValueError('boom')", 1), ("raise SystemExit(3)", 3),
                                            ("sys.exit('a message')", 1), ("", 0)])
def test_a_forked_run_sees_what_a_fresh_one_sees(tmp_path, monkeypatch, ending, status):
    monkeypatch.chdir(tmp_path)
    env = {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1", "LOCAL_RANK": "1"}
    code = ESSENTIALS.format(parent=os.getpid()) + ending
    fresh, forked = run_python(code, env=env, fresh=True), run_python(code, env=env)
    assert fresh.stderr.startswith("True\n") and forked.stderr.startswith("False\n"), "not one run of each kind"
    assert (forked.returncode, forked.stdout, forked.stderr[5:]) == (fresh.returncode, fresh.stdout, fresh.stderr[4:])
    assert fresh.returncode == status
    assert "['-c'] __main__ " in fresh.stdout and str(tmp_path) in fresh.stdout
    assert fresh.stdout.splitlines()[1] == "trn1 2 1"  # the variables neuron-device reads


def test_atexit_runs_and_a_signal_is_a_negative_code():
    code = "import atexit, os, signal\natexit.register(print, 'at exit')\n"
    assert run_python(code).stdout == "at exit\n"
    assert run_python("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)").returncode == -11


def test_a_variable_read_at_import_runs_fresh():
    code = "import os; print(os.getppid())"
    path = os.environ.get("PYTHONPATH", "") + os.pathsep
    assert run_python(code, env={"PYTHONPATH": path}).stdout.strip() == str(os.getpid())
    assert run_python(code).stdout.strip() != str(os.getpid())


def test_a_timeout_kills_the_child():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; time.sleep(60)", timeout=1)
