"""Run a script (`measure.py SCRIPT ARGS`, or a module: `measure.py -m MODULE ARGS`) for real and print what the
planner reports for it: the last optimizer step's simulated seconds (the device's latest stream clock between two
steps; as in the planner, an optimizer stepped inside another's step, as torchtitan's `OptimizersContainer` steps
its model parts', is part of it) and the peak HBM of this rank's core up to that step (MEASURED); for a script that
generates, the last `generate` call's figures by the planner's marks and the run's peak HBM (SERVING, JSON)."""

import json
import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from neuron_device import timeline
from neuron_distributed.plan_generate import marking

index = int(os.environ["LOCAL_RANK"])
marks = []
depth = [0]  # an optimizer stepped inside another's step (torchtitan's OptimizersContainer) is part of its step


def stepping(*args):
    depth[0] += 1


def stepped(*args):
    depth[0] -= 1
    if depth[0] == 0:  # the peaks up to this step, as the planner's (torchtitan resets them after logging a step)
        marks.append((max(timeline.timeline(index).clocks.values()), torch.neuron.max_memory_reserved(index),
                      torch.neuron.max_memory_allocated(index)))


register_optimizer_step_pre_hook(stepping)
register_optimizer_step_post_hook(stepped)
with marking(index) as serving:
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        script = sys.argv[1]
        sys.argv = sys.argv[1:]
        runpy.run_path(script, run_name="__main__")
if len(marks) >= 2:
    print(f"MEASURED {os.environ['RANK']} {marks[-1][0] - marks[-2][0]} {marks[-1][1]} {marks[-1][2]}", flush=True)
if serving.figures() is not None:
    print("SERVING", json.dumps({**serving.figures(), "peak_hbm_bytes": torch.neuron.max_memory_reserved(index),
                                 "peak_allocated_bytes": torch.neuron.max_memory_allocated(index)}), flush=True)
