"""Run a script for real and print what the planner reports for it: the last optimizer step's simulated seconds
(the device's latest stream clock between two steps) and the peak HBM of this rank's core."""

import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from neuron_device import timeline

index = int(os.environ["LOCAL_RANK"])
marks = []
register_optimizer_step_post_hook(lambda *args: marks.append(max(timeline.timeline(index).clocks.values())))
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
print(f"MEASURED {os.environ['RANK']} {marks[-1] - marks[-2]} {torch.neuron.max_memory_reserved(index)} "
      f"{torch.neuron.max_memory_allocated(index)}", flush=True)
