"""Plan mode replays a compiled graph's host code called again on inputs laid out as before (`plan_replay`): a
static-cache decode runs one graph each token. The replayed plan must be the full one, figure for figure."""

import json
import os
import subprocess
import sys

import pytest
from launcher import WORKERS

# Plans workers/plan/llama_generate.py (a tiny Llama, TP 2 with DTensor, greedy `generate` with a static cache whose
# decode transformers compiles) as rank 0 of 2, replaying ("replay") or running every call of the host code
# ("full"), and prints the plan, its charges and how many calls ran the graph's ops.
_PLANNED = """
import json, runpy, sys
import torch_neuronx, transformers  # transformers imported before the plan: generate's rules apply
from neuron_distributed import plan_patches
mode, script = sys.argv[1], sys.argv[2]
runs = []
replaying = plan_patches.replaying
def counted(run_graph):
    def run(self, args):
        runs.append(1)
        return run_graph(self, args)
    return replaying(run) if mode == "replay" else run
plan_patches.replaying = counted
sys.argv = [script]
plan = torch_neuronx.plan(lambda: runpy.run_path(script, run_name="__main__"), world_size=2)
print("RESULT", json.dumps({"plan": plan.as_dict(), "lanes": plan.lanes, "graph_runs": len(runs)}))
"""


def _planned(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _PLANNED, mode,
                           str(WORKERS / "plan" / "llama_generate.py")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


@pytest.mark.slow
@pytest.mark.optional
@pytest.mark.all_wheels  # the compiled decode needs neuron-compile
def test_replayed_decode_plans_every_figure_of_the_full_plan():
    """The 8-token decode's compiled graph runs its ops once (its first call), and the 6 later calls replay it: the
    plan (step, compute, communication, FLOPs, peak HBM reserved and allocated, breakdown, TTFT, TPOT, KV cache)
    and every charge (name, stream, start, end) equal those of the plan that runs every call."""
    pytest.importorskip("transformers")
    pytest.importorskip("neuron_compile")
    replayed, full = _planned("replay"), _planned("full")
    assert full["graph_runs"] == 7 and replayed["graph_runs"] == 1
    assert replayed["plan"] == full["plan"]
    assert replayed["lanes"] == full["lanes"]
    assert replayed["plan"]["serving"]["output_tokens"] == 8
