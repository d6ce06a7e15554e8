"""Adaptive eager (`neuron_device.adaptive_eager`): queued ops, flush points, views, in-place ops, autograd, the
deterministic switch, the queue limit and what the timeline is charged. Every result is compared with the CPU.

The op-by-op tests keep the fuser out (`FUSE_AFTER` out of reach): they check neuron-device alone. The fused-path
tests use a fuser that returns the FX graph itself (it runs the same CPU kernels), which checks the graph the run
becomes, the live outputs written back and the single charge; tests/test_adaptive_eager_fused.py compiles with
neuron-compile's Inductor fuser.
"""

from __future__ import annotations

import pytest
import torch
from device_support import elapsed_ms

from neuron_device import plugins
from neuron_device.adaptive_eager import queue as adaptive_eager
from neuron_device.simulation import costmodel, ledger

# adaptive eager hands repeated runs to neuron-compile's fuser when it is installed (all session)
pytestmark = pytest.mark.all_wheels


@pytest.fixture
def graphs(monkeypatch):
    """Adaptive eager on, with a fuser that hands back the run's FX graph (kept in the returned list)."""
    seen: list[torch.fx.GraphModule] = []

    def fuse(graph_module, example_inputs):
        seen.append(graph_module)
        return graph_module

    monkeypatch.setattr(plugins, "fuse", fuse)
    previous = adaptive_eager.set_enabled(True)
    yield seen
    adaptive_eager.set_enabled(previous)


@pytest.fixture(params=["op by op", "fused"])
def adaptive(request, monkeypatch):
    """Adaptive eager on, runs executed op by op or (from their second time) through the graph-returning fuser."""
    if request.param == "fused":
        monkeypatch.setattr(plugins, "fuse", lambda graph_module, example_inputs: graph_module)
    else:
        monkeypatch.setattr(adaptive_eager, "FUSE_AFTER", 1 << 30)
    previous = adaptive_eager.set_enabled(True)
    yield request.param
    adaptive_eager.set_enabled(previous)


def _pair(*shape):
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    return a, b, a.to("neuron"), b.to("neuron")


def _chain(a, b):
    c = a + b
    d = (c * 2).exp()
    e = d.t() @ c
    return e.sum(0), torch.softmax(e + 0.5, -1), (e > 0).float().mean()


def test_the_ledger_is_read_without_flushing_by_peek_and_with_flushing_by_launches(queued):
    """The live statistics read the op ledger from their own thread (`ledger.peek`): that must not run queued ops;
    the public readers (`launches`, `get_executed_ops`) flush first."""
    ledger.clear_op_tracking()
    a = torch.ones(4, device="neuron")
    a + a
    assert adaptive_eager.pending_ops() == 1
    tracking = ledger.peek()
    assert adaptive_eager.pending_ops() == 1
    assert "aten::add.Tensor" not in {launch.name for launch in tracking.launches}
    assert "aten::add.Tensor" in {launch.name for launch in ledger.launches()}
    assert adaptive_eager.pending_ops() == 0


def test_the_recorder_wraps_the_fast_path_only_while_on():
    """Adaptive eager is a wrapper installed in front of the fast path's direct call (issue 36), not a branch every
    plain eager op takes: off, the fast kernels call the direct call itself."""
    from neuron_device.ops import fastpath

    previous = adaptive_eager.set_enabled(False)
    try:
        assert fastpath._call is fastpath._direct
        adaptive_eager.set_enabled(True)
        assert fastpath._call is fastpath._recorded and fastpath._record is adaptive_eager.record
        a = torch.ones(4, device="neuron")
        b = a + a
        assert adaptive_eager.pending_ops() == 1
        adaptive_eager.set_enabled(False)
        assert fastpath._call is fastpath._direct and adaptive_eager.pending_ops() == 0
        assert torch.equal(b.cpu(), torch.full((4,), 2.0))
    finally:
        adaptive_eager.set_enabled(previous)


def test_ops_are_queued_and_match_the_cpu_bitwise(queued):
    a, b, na, nb = _pair(8, 8)
    results = _chain(na, nb)
    assert adaptive_eager.pending_ops() > 0
    assert all(r.device.type == "neuron" for r in results)
    for got, expected in zip(results, _chain(a, b), strict=True):
        assert got.shape == expected.shape and got.stride() == expected.stride() and got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)
    assert adaptive_eager.pending_ops() == 0


def test_queued_results_are_charged_to_the_allocator(queued):
    before = torch.neuron.memory_allocated()
    x = torch.zeros(1024, device="neuron")
    y = x + 1
    assert adaptive_eager.pending_ops() == 1
    assert torch.neuron.memory_allocated() >= before + 2 * 4096
    del y
    adaptive_eager.flush()


@pytest.mark.parametrize("read", ["print", "item", "cpu", "tolist", "bool", "numpy"])
def test_every_host_read_flushes(queued, read, capsys):
    a, b, na, nb = _pair(3)
    y = (na * nb).sum()
    assert adaptive_eager.pending_ops() == 2
    expected = (a * b).sum()
    if read == "print":
        print(y)
        assert f"{expected.item():.4f}" in capsys.readouterr().out
    elif read == "item":
        assert y.item() == expected.item()
    elif read == "cpu":
        assert torch.equal(y.cpu(), expected)
    elif read == "tolist":
        assert y.tolist() == expected.tolist()
    elif read == "bool":
        assert bool(y > 0) == bool(expected > 0)
    else:
        assert y.cpu().numpy() == expected.numpy()
    assert adaptive_eager.pending_ops() == 0


def test_a_non_fusable_op_flushes_first(queued):
    a, b, na, nb = _pair(6)
    y = na - nb
    assert adaptive_eager.pending_ops() == 1
    nonzero = torch.nonzero(y > 0)  # data-dependent output shape: never queued
    assert adaptive_eager.pending_ops() == 0
    assert torch.equal(nonzero.cpu(), torch.nonzero(a - b > 0))


def test_index_ops_run_at_once_with_their_errors(queued):
    table = torch.randn(4, 3).to("neuron")
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(torch.tensor([7], device="neuron"), table)


def test_shape_errors_raise_at_the_call(queued):
    with pytest.raises(RuntimeError, match="size of tensor"):
        torch.ones(3, device="neuron") + torch.ones(4, device="neuron")
    assert adaptive_eager.pending_ops() == 0


def test_in_place_op_on_an_input_of_a_queued_op(adaptive):
    for _ in range(3):  # the third time through the fuser in fused mode
        a, _, na, _ = _pair(5)
        y = na * 2
        na.add_(1)  # in place: runs now, after the queued op read the old values
        assert torch.equal(y.cpu(), a * 2)
        assert torch.equal(na.cpu(), a + 1)


def test_in_place_op_on_a_queued_result(adaptive):
    for _ in range(3):  # the third time through the fuser in fused mode
        a, b, na, nb = _pair(5)
        y = na + nb
        y.mul_(3)
        z = y - na
        expected = (a + b).mul_(3)
        assert torch.equal(y.cpu(), expected)
        assert torch.equal(z.cpu(), expected - a)


def test_metadata_changed_in_place_before_the_flush(adaptive):
    for _ in range(3):  # the third time through the fuser in fused mode
        a, _, na, _ = _pair(4)
        y = na * 3
        na.unsqueeze_(0)  # metadata only: no flush, the queued op still reads a 1-d tensor
        z = na + 1
        assert y.shape == (4,) and torch.equal(y.cpu(), a * 3)
        assert torch.equal(z.cpu(), a.unsqueeze(0) + 1)


def test_set_on_an_input_of_a_queued_op(queued):
    a, b, na, nb = _pair(4)
    y = na + 1
    na.set_(nb.untyped_storage(), 0, (4,), (1,))
    assert torch.equal(y.cpu(), a + 1)
    assert torch.equal(na.cpu(), b)


def test_storage_resized_under_a_queued_op(python):
    """FSDP2 frees an unsharded parameter with `untyped_storage().resize_(0)` while ops reading it may be queued:
    the resize flushes them first (they used to read freed memory at the flush: a segfault)."""
    code = ("import torch, neuron_device.adaptive_eager.queue as c\n"
            "x = torch.arange(4096.0).to('neuron'); y = x * 2; z = (y + 1).sum()\n"
            "assert c.pending_ops() == 3\n"
            "x.untyped_storage().resize_(0); w = torch.ones(1 << 20, device='neuron')\n"
            "print(c.pending_ops(), z.item())")
    result = python(code, env={adaptive_eager.ENABLE_ENV: "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == f"0 {float((torch.arange(4096.0) * 2 + 1).sum())}"


def test_queued_results_have_the_cpu_kernels_dtypes(queued):
    """A queued result's metadata comes from the CPU kernel, not the op's meta function: for bfloat16 input,
    `native_layer_norm`'s mean and rstd are bfloat16 on the CPU (float32 on meta, as on CUDA)."""
    x, w, b = (torch.randn(*shape, dtype=torch.bfloat16) for shape in ((4, 8), (8,), (8,)))
    expected = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to("neuron"), [8], w.to("neuron"), b.to("neuron"), 1e-5)
    if adaptive_eager.pending_ops() == 0:
        pytest.skip("a plugin's native_layer_norm kernel runs it (not queued)")
    for result, reference in zip(got, expected, strict=True):
        assert result.dtype == reference.dtype and result.stride() == reference.stride()
        torch.testing.assert_close(result.cpu(), reference)


def test_views_of_queued_results(adaptive):
    a, b, na, nb = _pair(6, 6)

    def views(x, y):
        p = x @ y
        q = p.t() * 2  # a transposed view of a queued result
        r = p[1:, :3] + q[1:, 1:4]  # offset views
        s = (p.view(36)[::5] + 1).view(-1, 1).expand(8, 3) * 1.5
        return q, r, s, p.transpose(0, 1).contiguous()

    fused = adaptive_eager.stats()["fused_runs"]
    for _ in range(3):
        for got, expected in zip(views(na, nb), views(a, b), strict=True):
            assert torch.equal(got.cpu(), expected)
    assert (adaptive_eager.stats()["fused_runs"] > fused) == (adaptive == "fused")


def test_views_of_non_contiguous_queued_results(adaptive):
    a, _, na, _ = _pair(2, 3, 4)

    def chain(x):
        y = x.transpose(1, 2) * 2  # queued result with the transposed input's layout
        return y[:, :, 1:] + y.chunk(2, dim=1)[1].sum(1, keepdim=True)[..., :2]

    fused = adaptive_eager.stats()["fused_runs"]
    for _ in range(3):
        assert torch.equal(chain(na).cpu(), chain(a))
    assert (adaptive_eager.stats()["fused_runs"] > fused) == (adaptive == "fused")


def test_dtype_view_of_a_queued_result(adaptive):
    for _ in range(3):  # the third time through the fuser in fused mode
        a, _, na, _ = _pair(4)
        y = na * 2
        bits = y.view(torch.int32) + 1
        assert torch.equal(bits.cpu(), (a * 2).view(torch.int32) + 1)


def test_large_results_take_the_computed_memory(adaptive):
    a, b, na, nb = _pair(128, 256)  # 128 KiB results: given the kernel's memory instead of a copy
    allocated = torch.neuron.memory_allocated()
    for _ in range(3):
        y = na @ nb.t()
        view = y[3:, 5]  # made before the flush: sees the values through the same storage
        z = (y * 2).sum(0)
        assert torch.equal(view.cpu(), (a @ b.t())[3:, 5])
        assert torch.equal(z.cpu(), ((a @ b.t()) * 2).sum(0))
        y.add_(1)  # the memory is y's own
        assert torch.equal(y.cpu(), a @ b.t() + 1)
    del y, view, z
    assert torch.neuron.memory_allocated() == allocated


def test_results_queued_in_inference_mode(adaptive):
    a, _, na, _ = _pair(4)
    for _ in range(3):
        with torch.inference_mode():
            y = na + 1
            z = y * 2
        assert torch.equal((z + y).cpu(), (a + 1) * 2 + (a + 1))  # queued inside, the last op and flush outside
        assert torch.is_inference(y) and not torch.is_inference(z + y)


def test_conjugate_views_of_queued_results(adaptive):
    values = torch.randn(6, dtype=torch.complex64)
    device_values = values.to("neuron")
    for _ in range(3):
        y = device_values * 2
        z = y.conj() + 1  # a lazy conjugate view of a queued result
        assert torch.equal(z.cpu(), (values * 2).conj() + 1)


def test_runs_differing_only_in_a_number_are_different_runs(adaptive):
    a, _, na, _ = _pair(4)
    for _ in range(3):
        for scale in (0.0, -0.0, float("nan")):
            got = (na.abs() * scale).cpu()
            expected = a.abs() * scale
            assert torch.equal(torch.signbit(got), torch.signbit(expected)) and got.isnan().equal(expected.isnan())


def test_dead_results_are_not_written(queued):
    a, b, na, nb = _pair(4)
    x = na + nb
    host = adaptive_eager._queue[-1].outputs[0][0]
    host.fill_(7.0)  # the buffer behind x's device memory
    del x
    y = na * nb
    assert torch.equal(y.cpu(), a * b)
    assert torch.equal(host, torch.full((4,), 7.0))


def test_autograd_forward_and_backward_are_queued(queued):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2), torch.nn.LogSoftmax(-1))
    x = torch.randn(4, 6)
    reference = model(x).sum()
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    device_model = model.to("neuron")
    before = adaptive_eager.stats()["recorded"]
    loss = device_model(x.to("neuron")).sum()
    loss.backward()
    assert adaptive_eager.stats()["recorded"] > before + 6
    assert torch.equal(loss.cpu(), reference)
    for parameter, grad in zip(device_model.parameters(), expected, strict=True):
        assert torch.equal(parameter.grad.cpu(), grad)


def test_deterministic_algorithms_disable_queueing(queued):
    a, b, na, nb = _pair(4)
    y = na + nb
    assert adaptive_eager.pending_ops() == 1
    torch.use_deterministic_algorithms(True)
    try:
        z = na * nb  # flushes what was queued and runs directly
        assert adaptive_eager.pending_ops() == 0
        w = z - 1
        assert adaptive_eager.pending_ops() == 0
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(y.cpu(), a + b) and torch.equal(w.cpu(), a * b - 1)


def test_queue_flushes_at_its_size_limit(queued, monkeypatch):
    monkeypatch.setattr(adaptive_eager, "buffer_size_limit", 3)
    a, _, na, _ = _pair(4)
    flushes = adaptive_eager.stats()["flushes"]
    y = na
    for _ in range(7):
        y = y + 1
    assert adaptive_eager.stats()["flushes"] == flushes + 2
    assert adaptive_eager.pending_ops() == 1
    assert torch.equal(y.cpu(), a + 7)


def test_run_time_switch(queued):
    a, _, na, _ = _pair(4)
    y = na + 1
    assert adaptive_eager.set_enabled(False) is True  # switching off flushes
    assert adaptive_eager.pending_ops() == 0
    z = y * 2
    assert adaptive_eager.pending_ops() == 0
    assert torch.equal(z.cpu(), (a + 1) * 2)


def test_stream_event_and_synchronize_calls_flush(queued):
    _, _, na, nb = _pair(16)
    for call in (torch.neuron.synchronize, lambda: torch.neuron.Event().record(),
                 lambda: torch.neuron.current_stream().synchronize(),
                 lambda: torch.neuron.set_stream(torch.neuron.Stream())):
        y = na + nb
        assert adaptive_eager.pending_ops() == 1
        call()
        assert adaptive_eager.pending_ops() == 0
        del y
    torch.neuron.set_stream(torch.neuron.default_stream())


def test_op_by_op_run_charges_each_op_as_eager(queued):
    _, _, na, nb = _pair(32, 32)
    ledger.clear_op_tracking()
    y = (na @ nb).relu()
    y.cpu()
    names = {launch.name for launch in ledger.launches()}
    assert {"aten::mm", "aten::relu"} <= names
    assert {"aten::mm", "aten::relu"} <= set(ledger.get_executed_ops())


def test_fused_run_is_one_graph_with_live_outputs_only(graphs):
    a, b, na, nb = _pair(8, 8)

    def run(x, y):
        hidden = (x @ y).relu()  # dead once the run ends
        return hidden.t() * 0.5 + hidden.sum(0)

    for _ in range(3):
        got = run(na, nb)
        assert torch.equal(got.cpu(), run(a, b))
    assert len(graphs) == 1
    graph = graphs[0].graph
    (output,) = graph.find_nodes(op="output")
    assert len(output.args[0]) == 1  # only the returned tensor is written back
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert torch.ops.aten.mm.default in targets and torch.ops.aten.as_strided.default in targets
    assert adaptive_eager.stats()["fused_runs"] >= 1


def test_fused_run_is_charged_once(graphs):
    _, _, na, nb = _pair(64, 64)

    def run():
        return ((na @ nb).relu() * 2 + 1).sum().item()

    eager = elapsed_ms(run)  # first run: op by op
    run()  # compiled here
    ledger.clear_op_tracking()
    fused = elapsed_ms(run)
    launches = {launch.name: launch for launch in ledger.launches()}
    kernel = launches[adaptive_eager.FUSED_KERNEL_NAME]
    assert kernel.calls == 1
    assert not {"aten::mm", "aten::relu", "aten::sum"} & set(launches)
    assert {"aten::mm", "aten::relu", "aten::sum"} <= set(ledger.get_executed_ops())
    # one kernel: the matmul's FLOPs, HBM traffic only for the two inputs and the scalar result
    expected = costmodel.estimate_kernel({"tensor": 2 * 64**3, "vector": 3 * 64 * 64}, 2 * 64 * 64 * 4 + 4).seconds
    assert kernel.seconds == pytest.approx(expected)
    assert fused < eager


def test_fused_run_with_autograd(graphs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    x = torch.randn(4, 6)
    reference = model(x).pow(2).mean()
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    device_model = model.to("neuron")
    nx = x.to("neuron")
    for _ in range(3):
        device_model.zero_grad(set_to_none=True)
        loss = device_model(nx).pow(2).mean()
        loss.backward()
        assert torch.equal(loss.cpu(), reference)
        for parameter, grad in zip(device_model.parameters(), expected, strict=True):
            assert torch.equal(parameter.grad.cpu(), grad)
    assert graphs


def test_environment_variable_switches_it_on(python):
    code = ("import torch, neuron_device.adaptive_eager.queue as c; x = torch.ones(3, device='neuron') + 1; "
            "print(c.is_enabled(), c.pending_ops(), x.tolist())")
    result = python(code, env={adaptive_eager.ENABLE_ENV: "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "True 1 [2.0, 2.0, 2.0]"
    # 'yes' is a boolean since every flag shares one parser (issue 16); a value that is no boolean is refused, at
    # the device's first use: `import torch` itself must not fail on it (issue 19, item 11)
    assert python("import torch", env={adaptive_eager.ENABLE_ENV: "maybe"}).returncode == 0
    result = python("import torch; torch.ones(1, device='neuron')", env={adaptive_eager.ENABLE_ENV: "maybe"})
    assert result.returncode != 0 and f"{adaptive_eager.ENABLE_ENV}='maybe' is invalid" in result.stderr


def test_ops_alternating_between_devices(adaptive):
    """An op on another device flushes the queue before it is queued; the inputs it registered before finding that
    out are not inputs of the flushed run (they were, and a fused run got more arguments than its graph takes:
    `nn.DataParallel`'s replica threads alternate devices)."""
    x0, x1 = torch.randn(8, device="neuron:0"), torch.randn(8, device="neuron:1")
    for other_device_op in (False, True, False, True):  # one run, flushed by a read or by the other device
        a = (x0 + 1) * 3
        if other_device_op:
            b = (x1 * 2) - 1  # flushes a's run, then is queued
            torch.testing.assert_close(b.cpu(), (x1.cpu() * 2) - 1, rtol=0, atol=0)
        torch.testing.assert_close(a.cpu(), (x0.cpu() + 1) * 3, rtol=0, atol=0)


def test_a_dead_results_host_buffer_backs_the_next_result_of_its_signature(adaptive):
    """A queued result's host buffer is kept at the flush once no device storage holds it (the result died, or
    took the fused run's memory) and backs the next queued result of the op's signature; one still holding a live
    result's value (written in place) is not, so that value survives what is queued after it."""
    a, b, na, nb = _pair(64, 64)  # 16 KiB results: below the size whose results take the run's memory
    for _ in range(3):  # the fused variant executes the run through its graph from the second time
        dead = na * nb
        pointer = dead.data_ptr()
        del dead
        kept = na + 1.0
        kept_pointer = kept.data_ptr()
        adaptive_eager.flush()
        assert torch.equal(kept.cpu(), a + 1.0)
        again = na * nb
        assert again.data_ptr() == pointer and again.data_ptr() != kept_pointer
        other = na - nb + 1.0
        adaptive_eager.flush()
        assert torch.equal(again.cpu(), a * b) and torch.equal(other.cpu(), a - b + 1.0)
        assert torch.equal(kept.cpu(), a + 1.0)
        del again, other, kept
        adaptive_eager.flush()


def test_a_live_result_written_in_place_is_read_through_its_own_twin(adaptive):
    """Queued results get their host twin at the flush (`storage.give_twin`), so CPU kernels see a live result's
    aliases in one CPU storage: an overlapping in-place copy between two views of it is checked, not garbage."""
    a, b, na, nb = _pair(8)
    y = na * nb  # 32 bytes: written in place at the flush
    adaptive_eager.flush()
    expected = a * b
    y[1:].copy_(y[:-1].clone())
    expected[1:] = expected[:-1].clone()
    assert torch.equal(y.cpu(), expected)
    with pytest.raises(RuntimeError, match=r"overlap|memory location"):
        torch.add(y[:-1], 1.0, out=y[1:])


@pytest.fixture
def host_state(monkeypatch):
    """Adaptive eager on, runs fused from their second time by a fuser whose callable notes, each time it runs, the
    host's oneDNN float32 matmul precision and whether autocast's CPU key is excluded."""
    seen: list[tuple[str, bool]] = []

    def fuse(graph_module, example_inputs):
        def run(*inputs):
            seen.append((torch._C._get_fp32_precision_getter("mkldnn", "matmul"),
                         torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutocastCPU)))
            return graph_module(*inputs)

        return run

    monkeypatch.setattr(plugins, "fuse", fuse)
    previous = adaptive_eager.set_enabled(True)
    yield seen
    adaptive_eager.set_enabled(previous)


@pytest.mark.parametrize("at_flush", ["none", "bf16", "tf32"])
def test_a_flush_runs_float32_matmuls_in_ieee_and_leaves_the_precision_as_it_was(host_state, at_flush):
    """Queued under oneDNN's "none" (IEEE float32), flushed under `at_flush`: the run computes in IEEE ("none" needs
    no switch, the others are switched to "ieee" for the run) and the setting is the caller's again afterwards."""
    size = {"none": 16, "bf16": 17, "tf32": 18}[at_flush]  # a run of its own (`_runs` outlives the test's fuser)
    a, b, na, nb = _pair(size, size)
    leaf = torch.backends.mkldnn.matmul
    saved = leaf.fp32_precision
    try:
        for _ in range(3):
            leaf.fp32_precision = "none"
            assert torch._C._get_fp32_precision_getter("mkldnn", "matmul") == "none"  # nothing inherited
            y = (na @ nb).relu()
            assert adaptive_eager.pending_ops() == 2
            leaf.fp32_precision = at_flush
            got = y.cpu()
            assert torch._C._get_fp32_precision_getter("mkldnn", "matmul") == at_flush
            leaf.fp32_precision = "none"
            assert torch.equal(got, (a @ b).relu())
    finally:
        leaf.fp32_precision = saved
    assert host_state[-1][0] == ("none" if at_flush == "none" else "ieee")


def test_a_flush_inside_an_autocast_region_runs_the_ops_as_queued(host_state):
    """Ops queued outside `torch.autocast("cpu")` and flushed inside it run in float32 (autocast's key is excluded
    for the run), and the region's autocasting is intact afterwards; a flush outside a region finds it excluded."""
    a, b, na, nb = _pair(19, 19)
    autocast_cpu = torch._C.DispatchKey.AutocastCPU
    for _ in range(3):
        y = (na @ nb).relu()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = y.cpu()
            assert not torch._C._dispatch_tls_is_dispatch_key_excluded(autocast_cpu)
            assert (a @ b).dtype == torch.bfloat16
        assert torch.equal(got, (a @ b).relu())
        assert torch.equal(((na @ nb).relu()).cpu(), (a @ b).relu())  # flushed outside any region
    assert len(host_state) == 4 and all(excluded for _, excluded in host_state)
