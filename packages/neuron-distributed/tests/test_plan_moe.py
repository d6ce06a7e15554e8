"""Plan mode on a mixture of experts with expert parallelism (torchtitan's deepseek_v3): the router's tokens per
expert assumed a balanced router's (a uniform histogram, reported) and the values computed from them (the
all-to-all's split sizes, each local expert's tokens) read exactly, the token permutation's Triton kernel run by
Triton's interpreter (charged as the real run's copies), and a compiled Triton kernel or a slice made from read
values, refused by name."""

from __future__ import annotations

import json
import subprocess

import pytest
from launcher import run_code

from neuron_distributed.plan_report import build_report, format_report
from neuron_distributed.plan_values import BALANCED_ROUTER

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
    """`python -W ignore -c code args` on a trn1.2xlarge, forked from the launcher's torch-preloaded server."""
    return run_code(code, *args, env={"NEURON_SIM_INSTANCE_TYPE": "trn1.2xlarge"})


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


def test_balanced_router_gives_the_expert_parallel_split_sizes_and_is_reported():
    """Expert parallelism as torchtitan's `TokenChoiceTopKRouter` and `ExpertParallel._token_dispatch` run it: the
    router counts tokens per expert (`histc` of its top-k choices), the counts are all-to-all'ed, their per-rank sums
    read (`.tolist()`) as the all-to-all's split sizes, and the tokens each local expert gets are read again. The plan
    assumes a balanced router (a uniform histogram, the same on every rank), computes those values from it exactly,
    and says so in its assumptions. They were refused: a tensor shape made from read values."""
    code = """
import json, torch, torch.distributed as dist, torch_neuronx
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
def step():
    dist.init_process_group("neuron")
    group = dist.group.WORLD
    top_k, experts = 3, 8
    routed_input = torch.randn(13 * top_k, 16, device="neuron", requires_grad=True)
    choices = torch.randn(13, experts, device="neuron").topk(top_k, dim=-1).indices
    counts = torch.histc(choices.view(-1).float(), bins=experts, min=0, max=experts)
    received = torch.ops._c10d_functional.wait_tensor(all_to_all_single(counts, None, None, group=group))
    input_splits = counts.view(2, -1).sum(dim=1).to("cpu").int().tolist()
    output_splits = received.view(2, -1).sum(dim=1).to("cpu").int().tolist()
    routed = all_to_all_single_autograd(routed_input, output_splits, input_splits, group)
    per_expert = received.view(2, -1).sum(dim=0).int().tolist()
    outputs = [chunk * 2 for chunk in routed.split(per_expert)]
    back = all_to_all_single_autograd(torch.cat(outputs), input_splits, output_splits, group)
    back.sum().backward()
    print(json.dumps([input_splits, output_splits, per_expert, list(back.shape)]))
plan = torch_neuronx.plan(step, world_size=2, rank=1)
print(json.dumps(plan.as_dict()["assumptions"]))
print(json.dumps(sorted({name for name, *_ in plan.lanes if "all_to_all" in name or "alltoall" in name})))
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr
    values, assumptions, collectives = map(json.loads, done.stdout.strip().splitlines()[-3:])
    # 13 tokens x top 3 = 39 choices over 8 experts: 4 each, the first 7 one more; every rank routes alike, so rank 1
    # receives experts 4 to 7's counts (5, 5, 5, 4) from each of the 2 ranks
    assert values == [[20, 19], [19, 19], [10, 10, 10, 8], [39, 16]]
    assert assumptions == [BALANCED_ROUTER]
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
            "pipeline": None, "breakdown": {}, "assumptions": [BALANCED_ROUTER]}
    report = build_report([rank, {**rank, "rank": 1}], instance="trn1.2xlarge", nodes=1, tokens_per_step=None,
                          price_per_hour=1.0)
    assert report["assumptions"] == [BALANCED_ROUTER]
    assert f"assumed: {BALANCED_ROUTER}" in format_report(report)

