"""Plan mode on a mixture of experts with expert parallelism (torchtitan's deepseek_v3): the all-to-all whose split
sizes the router's tokens per expert give (read values, planned as a balanced router's and reported), the token
permutation's Triton kernel run by Triton's interpreter (charged as the real run's copies), and a compiled Triton
kernel or a slice made from read values, refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from neuron_distributed.plan_report import build_report, format_report
from neuron_distributed.plan_values import BALANCED_ALL_TO_ALL, PlannedValues, balanced_splits

_ALL_TO_ALL = torch.ops._c10d_functional.all_to_all_single.default

_KERNEL = """
import json, os, sys
if sys.argv[1] == "interpret":
    os.environ["TRITON_INTERPRET"] = "1"
import torch, torch_neuronx, triton, triton.language as tl
from neuron_device.simulation import ledger
from neuron_distributed.plan_state import PlanValueError
@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2, mask=offsets < n)
def step(kernel=True):
    x = torch.randn(1024, device="neuron")
    out = torch.empty_like(x)
    if kernel:
        double_kernel[(1,)](x, out, 1024, BLOCK=1024)
    return x, out
if sys.argv[1] == "interpret":
    x, out = step(kernel=False)
    torch.neuron.synchronize()
    ledger.clear_op_tracking()
    double_kernel[(1,)](x, out, 1024, BLOCK=1024)
    print(json.dumps(sorted(l.name for l in ledger.launches() for _ in range(l.calls))))
    assert torch.equal(out.cpu(), x.cpu() * 2)
    before = {name for name, *_ in torch_neuronx.plan(lambda: step(False), world_size=1).lanes}
    lanes = [name for name, *_ in torch_neuronx.plan(step, world_size=1).lanes]
    print(json.dumps(sorted(name for name in lanes if name not in before)))
else:
    try:
        torch_neuronx.plan(step, world_size=1)
    except PlanValueError as error:
        print(error)
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge"}, check=False)


def _kernel_script(tmp_path, mode: str) -> subprocess.CompletedProcess:
    """`_KERNEL` run from a file (Triton compiles a kernel from its source file) in `mode`."""
    script = tmp_path / "kernel.py"
    script.write_text(_KERNEL)
    return _python(f"import runpy, sys; sys.argv[1:] = [{mode!r}]; runpy.run_path({str(script)!r})")


@pytest.mark.optional
def test_interpreted_triton_kernel_is_charged_the_real_runs_copies(tmp_path):
    """A Triton kernel Triton's interpreter runs (`TRITON_INTERPRET=1`; torchtitan's MoE token permutation) on
    planned tensors is charged what a real run on `neuron` charges for it: each tensor argument's storage copied to
    the host and back (the kernel itself runs on the host). It was refused (a planned tensor has no memory)."""
    pytest.importorskip("triton")
    done = _kernel_script(tmp_path, "interpret")
    assert done.returncode == 0, done.stderr
    real, planned = map(json.loads, done.stdout.strip().splitlines()[-2:])
    assert real == ["aten::copy_ (device->host)"] * 2 + ["aten::copy_ (host->device)"] * 2
    assert planned == real


@pytest.mark.optional
def test_compiled_triton_kernel_on_planned_tensors_is_refused_naming_it(tmp_path):
    """A compiled Triton kernel (no `TRITON_INTERPRET`) launched on planned tensors needs their memory: refused with
    a PlanValueError naming the kernel; the process died of a segmentation fault after torch's "Accessing the data
    pointer of FakeTensor" warning before."""
    pytest.importorskip("triton")
    done = _kernel_script(tmp_path, "compiled")
    assert done.returncode == 0, done.stderr
    assert "the Triton kernel 'double_kernel'" in done.stdout, done.stdout


def test_balanced_splits_share_the_rows_and_keep_given_sizes():
    """The balanced router's split sizes: the input's rows evenly among the ranks, the first `rows % ranks` one
    more; a list of given sizes is kept, and a call without read sizes is left as it is."""
    values = PlannedValues()
    read = [values.read(torch.zeros((), dtype=torch.int64)) for _ in range(4)]
    rows = torch.empty(10, 3, device="meta")
    args, assumed = balanced_splits(_ALL_TO_ALL, (rows, read, [4, 2, 2, 2], "0"))
    assert assumed and args[1:] == ([3, 3, 2, 2], [4, 2, 2, 2], "0")
    given = (rows, [1, 2, 3, 4], [4, 3, 2, 1], "0")
    assert balanced_splits(_ALL_TO_ALL, given) == (given, False)
    assert balanced_splits(torch.ops.aten.add.Tensor, (rows, rows)) == ((rows, rows), False)


def test_all_to_all_split_sizes_read_from_values_are_balanced_and_reported():
    """Expert parallelism's token dispatch (torchtitan's `ExpertParallel._token_dispatch`): the tokens per expert are
    all-to-all'ed, their per-rank sums read (`.tolist()`) and given as the all-to-all's split sizes. The plan takes
    them as a balanced router's (the output has the input's rows), charges the all-to-all, and says so in the plan's
    assumptions. It was refused: a tensor shape made from read values."""
    code = """
import json, torch, torch.distributed as dist, torch_neuronx
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
def step():
    dist.init_process_group("neuron")
    group = dist.group.WORLD
    counts = torch.randint(0, 5, (8,), device="neuron")
    received = torch.ops._c10d_functional.wait_tensor(all_to_all_single(counts, None, None, group=group))
    input_splits = counts.view(2, -1).sum(dim=1).to("cpu").tolist()
    output_splits = received.view(2, -1).sum(dim=1).to("cpu").tolist()
    tokens = torch.randn(11, 16, device="neuron", requires_grad=True)
    routed = all_to_all_single_autograd(tokens, output_splits, input_splits, group)
    back = all_to_all_single_autograd(routed * 2, input_splits, output_splits, group)
    back.sum().backward()
    print(json.dumps([list(routed.shape), list(back.shape)]))
plan = torch_neuronx.plan(step, world_size=2, rank=1)
print(json.dumps(plan.as_dict()["assumptions"]))
print(json.dumps(sorted({name for name, *_ in plan.lanes if "all_to_all" in name or "alltoall" in name})))
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    shapes, assumptions, collectives = map(json.loads, done.stdout.strip().splitlines()[-3:])
    assert shapes == [[11, 16], [11, 16]]
    assert assumptions == [BALANCED_ALL_TO_ALL]
    assert collectives, done.stdout


def test_slice_made_from_read_values_is_refused_naming_the_line(tmp_path):
    """`x[: sum(counts.tolist())]` (torchtitan's for-loop experts): a slice whose bound is a read value is a
    PlanValueError naming the line; the fake mode raised an AssertionError ("Must have shape_env to create
    symint") before."""
    script = tmp_path / "sliced.py"
    script.write_text("""
import torch, torch_neuronx
from neuron_distributed.plan_state import PlanValueError
def step():
    x = torch.randn(8, 4, device="neuron")
    counts = torch.randint(0, 3, (2,), device="neuron").tolist()
    try:
        x[: sum(counts)]  # SLICE
    except PlanValueError as error:
        print(error)
torch_neuronx.plan(step, world_size=1)
""")
    done = _python(f"import runpy; runpy.run_path({str(script)!r})")
    assert done.returncode == 0, done.stderr
    assert "an index made from the values" in done.stdout, done.stdout


def test_report_lists_the_plans_assumptions():
    """The job's report carries what any planned rank assumed, once, and prints it."""
    rank = {"rank": 0, "world_size": 2, "steps_observed": 1, "step_seconds": 1.0, "compute_seconds": 1.0,
            "communication_seconds": 0.0, "exposed_communication_seconds": 0.0, "flops_per_step": 1.0,
            "peak_hbm_bytes": 1, "peak_allocated_bytes": 1, "hbm_capacity_bytes": 2, "fits": True, "oom": None,
            "pipeline": None, "breakdown": {}, "assumptions": [BALANCED_ALL_TO_ALL]}
    report = build_report([rank, {**rank, "rank": 1}], instance="trn1.2xlarge", nodes=1, tokens_per_step=None,
                          price_per_hour=1.0)
    assert report["assumptions"] == [BALANCED_ALL_TO_ALL]
    assert f"assumed: {BALANCED_ALL_TO_ALL}" in format_report(report)
