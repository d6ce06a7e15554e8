"""The eager fast path (`ops/fastpath.py`): direct kernels on hot overloads give the CPU's results, and leave every
call outside the common case to the boxed fallback; the record of an overload every path reads, and the common
call's argument walk (`ops/call.py`)."""

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from neuron_device import allocator
from neuron_device import storage as hostmem
from neuron_device.ops import call, fastpath, registry
from neuron_device.simulation.ledger import executed_ops


def _inputs(*shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen).to(dtype) for shape in shapes]


CASES = {
    "add broadcast": (lambda a, b: a + b, [(4, 1), (1, 5)]),
    "add alpha": (lambda a, b: torch.add(a, b, alpha=0.5), [(3, 4), (3, 4)]),
    "mul python float": (lambda a: a * 1.3, [(3, 4)]),
    "sub python int": (lambda a: a - 2, [(3,)]),
    "div": (lambda a, b: a / b, [(6,), (6,)]),
    "pow scalar": (lambda a: a.pow(2), [(5,)]),
    "rsqrt of mean": (lambda a: torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6), [(2, 8)]),
    "silu": (F.silu, [(7,)]),
    "log_softmax": (lambda a: torch.log_softmax(a, 0), [(3, 9)]),
    "sum dtype": (lambda a: a.sum(dtype=torch.float64), [(4, 4)]),
    "amax": (lambda a: a.amax(1), [(4, 6)]),
    "cat": (lambda a, b: torch.cat([a, b], 1), [(2, 3), (2, 2)]),
    "clone non-contiguous": (lambda a: a.t().clone(), [(3, 5)]),
    "where": (lambda a, b: torch.where(a > 0, a, b), [(6,), (6,)]),
    "transposed input": (lambda a, b: a.t() * b, [(3, 4), (4, 3)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_results_equal_cpu(name):
    fn, shapes = CASES[name]
    inputs = _inputs(*shapes)
    expected = fn(*inputs)
    actual = fn(*(t.to("neuron") for t in inputs))
    assert actual.device.type == "neuron"
    assert actual.dtype == expected.dtype and actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_bfloat16_and_integer_results_equal_cpu():
    a, b = _inputs((8,), (8,), dtype=torch.bfloat16)
    torch.testing.assert_close((a.to("neuron") * b.to("neuron") + 1.7).cpu(), a * b + 1.7, rtol=0, atol=0)
    i = torch.arange(10)
    torch.testing.assert_close((i.to("neuron") * 3 - i.to("neuron")).cpu(), i * 3 - i, rtol=0, atol=0)


def test_hot_ops_take_the_direct_kernel():
    a, b = (t.to("neuron") for t in _inputs((4,), (4,)))
    executed_ops.clear()
    a + b
    a * 2.0
    assert executed_ops == {"aten::add.Tensor": 1, "aten::mul.Tensor": 1}
    assert "aten::add.Tensor" in torch_neuronx.get_executed_ops()


def test_every_path_reads_one_record_per_overload(monkeypatch):
    """The fast path, the boxed fallback and the 64-bit numerics read one record per overload, built on first use:
    an overload without a direct call, through `run_direct`, gets it once, not once per call."""
    built = []

    class Counting(call.OverloadRecord):
        __slots__ = ()

        def __init__(self, op):
            built.append(op)
            super().__init__(op)

    aten = torch.ops.aten
    ops = (aten.add.out, aten.nonzero.default, aten.exp.default)
    x = torch.arange(6.0).to("neuron")
    out, wide = torch.empty(6).to("neuron"), x.double()
    saved = {op._op: call.records.pop(op._op) for op in ops if op._op in call.records}
    monkeypatch.setattr(call, "OverloadRecord", Counting)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nonzero falls back to the CPU
            for _ in range(2):
                fastpath.run_direct(aten.add.out, x, x, out=out)  # no direct call: the fallback runs it
                torch.nonzero(x)
                torch.neuron.set_downcast_64bit(True)
                try:
                    wide.exp()
                finally:
                    torch.neuron.set_downcast_64bit(False)
        assert sorted(map(str, built)) == sorted(map(str, ops))
    finally:
        for op in ops:
            call.records.pop(op._op, None)
        call.records.update(saved)


def test_the_charge_is_cached_in_the_overload_record():
    """The ledger keeps its per-call lookup in the op's record, keyed by the call's shapes (not by a signature with
    the op's name in a cache of its own), and a clear of the op tracking empties it: the next call counts anew."""
    from neuron_device.simulation import ledger

    record = call.overload_record(torch.ops.aten.add.Tensor)
    a, b = (t.to("neuron") for t in _inputs((3, 5), (3, 5)))
    torch_neuronx.clear_op_tracking()
    assert record.charges == {}
    a + b
    a + b
    (launch, _, part), = record.charges.values()
    assert (launch.name, launch.calls, part) == ("aten::add.Tensor", 2, "vector_scalar")
    assert next(iter(record.charges)) == ((torch.Size([3, 5]), torch.float32), (torch.Size([3, 5]), torch.float32))
    torch_neuronx.clear_op_tracking()
    assert record.charges == {}
    a + b
    assert [(launch.name, launch.calls) for launch in ledger.launches()] == [("aten::add.Tensor", 1)]


def _books() -> tuple:
    """What a call may change in the ledger, the timeline and the allocator."""
    from neuron_device import timeline
    from neuron_device.simulation import ledger

    torch.neuron.synchronize()
    clocks = timeline.timeline(0)
    return ([(launch.name, launch.calls) for launch in ledger.launches()], ledger.compilation_stats(),
            dict(clocks.clocks), dict(clocks.busy), torch.neuron.memory_stats())


@pytest.mark.parametrize("cached", [False, True])
def test_a_kernel_that_raises_is_not_charged(cached):
    """The fast path charges a call, and allocates its result, only once its kernel has returned (whatever it may
    look up before): a call whose kernel raises leaves the launches, cache hits, timeline and memory statistics as
    they were, for a signature charged before (its cache entry exists: here an index out of range) as for a new one.
    It is counted in `executed_ops`, as every path counts a call before running it."""
    assert registry.kernels["aten::index_select"].__name__ == "index_select_fast"
    table = torch.randn(8, 4).to("neuron")
    good, bad = torch.tensor([1, 7]).to("neuron"), torch.tensor([1, 8]).to("neuron")
    torch_neuronx.clear_op_tracking()
    if cached:
        torch.index_select(table, 0, good)
    before, calls = _books(), executed_ops["aten::index_select"]
    with pytest.raises(IndexError, match="out of range"):
        torch.index_select(table, 0, bad)
    assert _books() == before
    assert executed_ops["aten::index_select"] == calls + 1
    torch.index_select(table, 0, good)  # and the next call is charged as before
    assert ("aten::index_select", 2 if cached else 1) in _books()[0]


def test_walk_takes_the_common_call_only():
    """`call.walk`, shared by the fast path and adaptive eager: tensors (and tensor lists) of one `neuron` device
    converted, a number in position 1 run by the `.Scalar` overload; None for anything else."""
    aten = torch.ops.aten
    add, cat = call.overload_record(aten.add.Tensor), call.overload_record(aten.cat.default)
    a, b = torch.ones(2).to("neuron"), torch.zeros(2).to("neuron")
    host, index, run = call.walk(add, (a, b), id)
    assert host == [id(a), id(b)] and index == 0 and run is add.call
    host, index, run = call.walk(add, (a, 2.5), id)
    assert host == [id(a), 2.5] and run is add.scalar_call is aten.add.Scalar._op
    assert call.walk(cat, ([a, b], 0), id) == ([[id(a), id(b)], 0], 0, cat.call)
    assert call.walk(add, (a, torch.ones(2)), id) is None  # a CPU tensor: the fallback's device rules
    assert call.walk(cat, ([a, torch.ones(2)], 0), id) is None
    assert call.walk(cat, ([a, "b"], 0), id) is None
    assert call.walk(add, (2.5, a), id) is None  # a number where no Scalar overload takes it


def test_embedding_and_index_equal_cpu():
    weight, = _inputs((10, 4))
    ids = torch.tensor([[1, 3], [9, 0]])
    expected = F.embedding(ids, weight)
    torch.testing.assert_close(F.embedding(ids.to("neuron"), weight.to("neuron")).cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(weight.to("neuron")[ids.to("neuron")].cpu(), weight[ids], rtol=0, atol=0)


def test_in_place_returns_self_and_writes_through_views():
    base = torch.zeros(4, 4).to("neuron")
    row = base[1]
    assert row.mul_(3).add_(1) is row
    base.fill_(0.5)[0].zero_()
    expected = torch.full((4, 4), 0.5)
    expected[0] = 0
    torch.testing.assert_close(base.cpu(), expected, rtol=0, atol=0)


def test_cpu_scalar_tensor_is_allowed_and_cpu_tensor_is_an_error():
    a = torch.ones(3).to("neuron")
    torch.testing.assert_close((a * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(3)


def test_devices_are_checked():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device="neuron:0") + torch.ones(3, device="neuron:1")
    out = torch.ones(3, device="neuron:1") * 2
    assert out.device == torch.device("neuron:1")


def test_64bit_downcast_still_applies():
    big = torch.tensor([2**31 - 1], dtype=torch.int64)
    torch.neuron.set_downcast_64bit(True)
    try:
        wrapped = (big.to("neuron") + 1).cpu()
    finally:
        torch.neuron.set_downcast_64bit(False)
    assert wrapped.item() == -(2**31)
    assert (big.to("neuron") + 1).cpu().item() == 2**31


def test_results_are_charged_to_the_allocator():
    a = torch.ones(1024).to("neuron")
    before = allocator.device(0).allocated()
    result = a * 2
    assert allocator.device(0).allocated() == before + 4096
    del result
    assert allocator.device(0).allocated() == before


def test_existing_direct_kernels_keep_precedence():
    assert registry.kernels["aten::mm"].__name__ == "mm_neuron_numerics"
    assert registry.kernels["aten::add.Tensor"].__name__ == "add_fast"
    assert "aten::add.out" not in registry.kernels  # out= calls keep the boxed fallback


def test_run_direct_falls_back_for_out_and_ineligible_calls():
    a = torch.ones(3).to("neuron")
    out = torch.empty(0).to("neuron")
    assert fastpath.run_direct(torch.ops.aten.add.out, a, a, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize("fn", [lambda x: torch.where(x > 0, x, 0.0), lambda x: x.var(0), lambda x: torch.min(x, x * 2)],
                         ids=["where.ScalarOther", "var.dim", "min.other"])
def test_gradients_of_decomposed_overloads_match_cpu(fn):
    """Overloads differentiated through their decomposition must keep it (no direct kernel that cuts the graph)."""
    x, = _inputs((5, 3))
    cpu = x.clone().requires_grad_()
    neuron = x.to("neuron").requires_grad_()
    fn(cpu).sum().backward()
    fn(neuron).sum().backward()
    torch.testing.assert_close(neuron.grad.cpu(), cpu.grad, rtol=0, atol=0)


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_undefined_optional_outputs_stay_none():
    """Backward kernels leave outputs they were not asked for undefined (None): they must not be adopted."""
    x = torch.randn(4, 8)
    weight, bias = torch.randn(8), torch.randn(8)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)
    grad = torch.randn(4, 8)
    args = (grad, x, [8], mean, rstd, weight, bias, [True, False, False])
    expected = torch.ops.aten.native_layer_norm_backward(*args)
    on_device = torch.ops.aten.native_layer_norm_backward(
        *[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args]
    )
    assert on_device[1] is None and on_device[2] is None
    # Close rather than equal: with neuron-nki installed its layer-norm kernel computes this backward.
    torch.testing.assert_close(on_device[0].cpu(), expected[0], atol=1e-5, rtol=1e-5)


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_fallback_runs_the_decomposition_of_an_op_the_cpu_has_no_kernel_for():
    """`_fused_rms_norm_backward` has CUDA/MPS kernels and a decomposition, but no CPU kernel: `nn.RMSNorm` training
    on `neuron` (without neuron-nki's kernel for it) reached the fallback and raised NotImplementedError."""
    from neuron_device.fallback import run_on_host

    x, weight, grad = _inputs((3, 5), (5,), (3, 5))
    x.requires_grad_()
    weight.requires_grad_()
    torch.nn.functional.rms_norm(x, (5,), weight).backward(grad)
    on_neuron = [t.to("neuron") for t in (grad, x.detach(), weight.detach())]
    rstd = torch.rsqrt(x.detach().pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps).to("neuron")
    op = torch.ops.aten._fused_rms_norm_backward.default
    grad_input, grad_weight = run_on_host(op, on_neuron[0], on_neuron[1], [5], rstd, on_neuron[2], [True, True])
    assert grad_input.device.type == "neuron" and grad_weight.device.type == "neuron"
    torch.testing.assert_close(grad_input.cpu(), x.grad)
    torch.testing.assert_close(grad_weight.cpu(), weight.grad)


def _hot_program() -> list[torch.Tensor]:
    """Hot ops whose inputs are op results (laid out as their storage's twin), views, in-place targets, lists,
    complex conjugates and integers."""
    a, b = (t.to("neuron") for t in _inputs((8, 16), (8, 16)))
    z = torch.tensor([1 + 2j, 3 - 4j]).to("neuron") * 1
    results = []
    for _ in range(3):
        c = a + b
        d = c * a
        results += [d.t().clone(), torch.cat([a, b, c]).sum(0), a[1:] * b[:-1], torch.where(a > 0, a, b)]
        a.add_(b).mul_(0.5)
        results += [a.clone(), (a.view(-1)[::2] + 1).exp(), torch.softmax(d, -1), z.conj() * 2, z * z]
        results.append(torch.arange(10).to("neuron") * 3 - 1)
    return [r.cpu() for r in results]


def _run_measured(program) -> tuple:
    """`program`'s results, with the statistics and simulated figures it produced on device 0."""
    from neuron_device import timeline
    from neuron_device.simulation import ledger

    gc.collect()
    torch_neuronx.clear_op_tracking()
    torch.neuron.reset_peak_memory_stats(0)
    torch.neuron.reset_accumulated_memory_stats(0)
    line = timeline.timeline(0)
    clocks, busy, host = dict(line.clocks), dict(line.busy), line.host
    values = program()
    gc.collect()
    line = timeline.timeline(0)
    figures = (
        torch.neuron.memory_stats(0),
        torch_neuronx.get_executed_ops(),
        sorted((launch.name, launch.calls, launch.seconds) for launch in ledger.launches()),
    )
    # time moved on the device's clocks: differences of sums that started elsewhere, so equal up to rounding
    elapsed = (
        {stream: end - clocks.get(stream, 0.0) for stream, end in line.clocks.items()},
        {stream: total - busy.get(stream, 0.0) for stream, total in line.busy.items()},
        line.host - host,
    )
    return values, figures, elapsed


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_handing_out_the_twin_changes_nothing_but_speed(monkeypatch):
    """CPU kernels given the host twin itself for inputs laid out as it (`storage.kernel_input`) compute, account
    and time exactly as with a fresh view of it per input, as before: same results and statistics."""
    _run_measured(_hot_program)  # warm-up: compiled kernels and cached segments, as both runs below find them
    new_values, new_figures, new_elapsed = _run_measured(_hot_program)
    monkeypatch.setattr(fastpath, "kernel_input", hostmem.host_alias)
    old_values, old_figures, old_elapsed = _run_measured(_hot_program)
    assert new_figures == old_figures
    assert new_elapsed[2] == pytest.approx(old_elapsed[2], rel=1e-9, abs=1e-15)
    for new, old in zip(new_elapsed[:2], old_elapsed[:2], strict=True):
        assert new.keys() == old.keys() and all(new[k] == pytest.approx(old[k], rel=1e-9) for k in new)
    for new, old in zip(new_values, old_values, strict=True):
        torch.testing.assert_close(new, old, rtol=0, atol=0)


def test_records_are_found_without_hashing_an_op_overload_in_python(monkeypatch):
    """`OpOverload.__hash__` is a Python method: the hot lookups (`run_direct`, the fallback, adaptive eager's
    signatures) key by the overload's C callable instead, so no op runs that frame."""
    aten = torch.ops.aten
    x = torch.arange(6.0).to("neuron")
    hashed = []
    original = torch._ops.OpOverload.__hash__
    monkeypatch.setattr(torch._ops.OpOverload, "__hash__", lambda op: hashed.append(op) or original(op))
    fastpath.run_direct(aten.add.Tensor, x, x)
    fastpath.run_direct(aten.add.out, x, x, out=torch.empty(6).to("neuron"))  # the fallback
    from neuron_device.adaptive_eager import queue

    previous = queue.set_enabled(True)
    try:
        y = x * 3.0 + x  # queued, then run op by op at the flush
        queue.flush()
    finally:
        queue.set_enabled(previous)
    assert hashed == []
    assert y.cpu().tolist() == [4.0 * v for v in range(6)]
