"""Fallback reporting: which ops the chip runs natively, the once-per-op warning, strict mode, compile counts."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_neuronx
import torch_neuronx.metrics as met
from neuron_device import fallback
from neuron_device.ops import catalogue
from neuron_device.simulation import costmodel, ledger

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh_tracking(monkeypatch):
    monkeypatch.delenv(fallback.FALLBACK_ENV, raising=False)
    torch_neuronx.clear_op_tracking()
    torch_neuronx.clear_compilation_cache()


def _fallback_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "fell back to CPU" in str(w.message)]


@pytest.mark.parametrize(
    ("op", "engine"),
    [
        (aten.mm.default, "tensor"), (aten.addmm.default, "tensor"), (aten.bmm.out, "tensor"),
        (aten.convolution.default, "tensor"), (aten.convolution_backward.default, "tensor"),
        (aten.add.Tensor, "vector"), (aten.mul_.Tensor, "vector"), (aten.relu.default, "vector"),
        (aten.sum.dim_IntList, "vector"), (aten._softmax.default, "vector"), (aten.native_layer_norm.default, "vector"),
        (aten._foreach_add_.Scalar, "vector"),
        (aten.exp.default, "scalar"), (aten.gelu.default, "scalar"), (aten._foreach_sqrt.default, "scalar"),
        (aten.gather.default, "gpsimd"), (aten.embedding.default, "gpsimd"), (aten.index.Tensor, "gpsimd"),
        (aten.cat.default, "dma"), (aten.clone.default, "dma"),
        (aten.transpose.int, "view"), (aten.expand.default, "view"), (aten.split.Tensor, "view"),
        # RNG ops are native on Trainium (issue 19, item 13: they were reported as fallback, wrongly)
        (aten.normal_.default, "vector"), (aten.native_dropout.default, "vector"), (aten.randperm.generator, "gpsimd"),
        (aten.nonzero.default, None),
        (aten.linalg_inv_ex.default, None), (aten.kthvalue.default, None),
    ],
)
def test_engine_mapping(op, engine):
    assert catalogue.op_info(op).engine == engine
    assert catalogue.op_info(op) is catalogue.op_info(op)  # computed once per overload (a compiler asks per node)


@pytest.mark.parametrize("make", [lambda: torch.eye(4, device="neuron"), lambda: torch.eye(3, 5, device="neuron"),
                                  lambda: torch.eye(3, out=torch.empty(0, device="neuron"))])
def test_eye_is_native(make):
    """An iota and a compare on the engines: it was a CPU fallback (strict mode refused it; issue 40)."""
    torch_neuronx.clear_op_tracking()
    result = _fallback_warnings(make)
    assert result == [] and torch_neuronx.get_fallback_ops() == []
    assert torch.equal(make().cpu(), torch.eye(*make().shape))


def test_native_op_is_recorded_as_executed_without_warning():
    a = torch.ones(3, device="neuron")
    assert _fallback_warnings(lambda: a + a) == []
    assert "aten::add.Tensor" in torch_neuronx.get_executed_ops()
    assert torch_neuronx.get_fallback_ops() == []


def test_copies_are_recorded_as_executed():
    a = torch.ones(3).to("neuron")
    a.copy_(torch.zeros(3))
    a.cpu()
    assert {"aten::copy_", "aten::_to_copy"} <= set(torch_neuronx.get_executed_ops())


def test_fallback_warns_once_per_op_records_and_computes_correctly():
    cpu = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    a = cpu.to("neuron")
    first = _fallback_warnings(lambda: torch.kthvalue(a, 1))
    assert first == ["Operator 'aten::kthvalue.values' fell back to CPU"]
    assert _fallback_warnings(lambda: torch.kthvalue(a, 1)) == []  # once per op
    assert torch_neuronx.get_fallback_ops() == ["aten::kthvalue.values"]
    assert "aten::kthvalue.values" not in torch_neuronx.get_executed_ops()
    values, indices = torch.kthvalue(a, 1)
    expected_values, expected_indices = torch.kthvalue(cpu, 1)
    assert torch.equal(values.cpu(), expected_values) and torch.equal(indices.cpu(), expected_indices)


def test_fallback_warning_points_at_the_calling_code():
    a = torch.ones(2, 2, device="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nn.functional.pdist(a)  # through torch.nn.functional and the dispatcher
    assert [(str(w.message), w.filename) for w in caught] == [
        ("Operator 'aten::_pdist_forward' fell back to CPU", __file__)
    ]


def test_clear_op_tracking_forgets_and_warns_again():
    a = torch.ones(2, 2, device="neuron")
    _fallback_warnings(lambda: torch.kthvalue(a, 1))
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_fallback_ops() == [] and torch_neuronx.get_executed_ops() == []
    assert len(_fallback_warnings(lambda: torch.kthvalue(a, 1))) == 1


def test_strict_mode_raises_before_the_op_runs(monkeypatch):
    monkeypatch.setenv("NEURON_FALLBACK_ENABLED", "0")
    a = torch.ones(4, device="neuron")
    with pytest.raises(RuntimeError, match=r"Operator 'aten::exponential_' has no Neuron kernel .*NEURON_FALLBACK_ENABLED=0"):
        a.exponential_()
    assert torch.equal(a.cpu(), torch.ones(4))  # the in-place op never ran
    assert torch_neuronx.get_fallback_ops() == ["aten::exponential_"]
    assert torch.equal((a * 2).cpu(), torch.full((4,), 2.0))  # native ops still run


@pytest.mark.parametrize("value", ["1", "true", "TRUE"])
def test_fallback_enabled_values(monkeypatch, value):
    monkeypatch.setenv("NEURON_FALLBACK_ENABLED", value)
    a = torch.ones(2, 2, device="neuron")
    assert len(_fallback_warnings(lambda: torch.kthvalue(a, 1))) == 1


def test_invalid_fallback_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("NEURON_FALLBACK_ENABLED", "sometimes")
    a = torch.ones(2, 2, device="neuron")
    with pytest.raises(RuntimeError, match="NEURON_FALLBACK_ENABLED='sometimes' is invalid"):
        torch.kthvalue(a, 1)


def test_fallback_is_charged_the_round_trip_over_the_host_link():
    a = torch.ones(1024, 1024, device="neuron")
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.kthvalue(a, 1)
    end.record()
    in_bytes, out_bytes = 1024 * 1024 * 4, 1024 * 4 + 1024 * 8  # values (fp32) and indices (int64)
    expected = costmodel.transfer_seconds(in_bytes) + costmodel.transfer_seconds(out_bytes)
    assert start.elapsed_time(end) == pytest.approx(expected * 1e3)
    assert torch.neuron.query()  # the host waited for the fallback's data


def test_one_compilation_per_signature():
    a, b, c = torch.ones(3, 4, device="neuron"), torch.ones(3, 4, device="neuron"), torch.ones(5, device="neuron")
    a64, b64 = a.double(), b.double()
    torch_neuronx.clear_compilation_cache()  # count from here
    a + b
    a + b
    stats = torch_neuronx.get_compilation_cache_stats()
    assert (stats["total_compilations"], stats["in_memory_hits"]) == (1, 1)
    c + c  # new shape
    a64 + b64  # new dtype
    torch.add(a, b, alpha=2)  # new non-tensor argument
    stats = torch_neuronx.get_compilation_cache_stats()
    assert stats["compilations_per_op"]["aten::add.Tensor"] == 4
    assert stats["in_memory_hits"] == 1
    assert stats["hit_rate"] == pytest.approx(stats["in_memory_hits"] / (stats["in_memory_hits"] + stats["total_compilations"]))


def test_views_and_fallbacks_compile_nothing():
    a = torch.ones(4, 4, device="neuron")
    torch_neuronx.clear_compilation_cache()
    a.t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.kthvalue(a, 1)
    assert torch_neuronx.get_compilation_cache_stats()["total_compilations"] == 0


def test_cached_kernels_survive_a_counter_reset():
    a = torch.ones(6, device="neuron")
    torch_neuronx.clear_compilation_cache()
    a * a
    met.clear_counters()
    a * a
    stats = torch_neuronx.get_compilation_cache_stats()
    assert (stats["total_compilations"], stats["in_memory_hits"], stats["total_entries"]) == (0, 1, 1)


def test_metrics_counters():
    a = torch.ones(7, device="neuron")
    torch_neuronx.clear_compilation_cache()
    assert met.get_counter_value("CompilationCache.TotalCompilations") is None  # never incremented
    a - a
    a - a
    assert met.get_counter_value("CompilationCache.TotalCompilations") == 1
    assert met.get_counter_value("CompilationCache.InMemoryHits") == 1
    assert met.get_counter_names() == [
        "CompilationCache.InMemoryHits", "CompilationCache.InMemoryMisses", "CompilationCache.TotalCompilations",
    ]
    assert "CompilationCache.TotalCompilations" in met.get_compilation_metrics()
    assert "Counter: CompilationCache.TotalCompilations\n  Value: 1\n" in met.report()
    met.clear_all()
    assert met.get_counter_names() == []


def test_torch_neuronx_exposes_the_stream_api():
    assert torch_neuronx.Stream is torch.neuron.Stream and torch_neuronx.Event is torch.neuron.Event
    assert torch_neuronx.current_stream() == torch.neuron.current_stream()
    assert torch_neuronx.synchronize is torch.neuron.synchronize


def test_torch_neuronx_imported_before_torch(python):
    """AWS's examples `import torch_neuronx` first; its extras must work from a fresh interpreter."""
    result = python(
        "import torch_neuronx, torch\n"
        "torch.ones(2, device='neuron').sum().item()\n"
        "print(torch_neuronx.get_executed_ops())\n",
        fresh=True,  # ours imported before torch (a forked child has torch imported)
    )
    assert result.returncode == 0, result.stderr
    assert "aten::_local_scalar_dense" in result.stdout


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_kernels_outside_the_fallback_are_recorded_and_charged():
    """What an NKI kernel or a compiled graph reports: executed, compiled once per signature, charged its time."""
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    ledger.record_kernel("nki::rmsnorm", 0, ((128, 512), torch.bfloat16), 5e-6)
    ledger.record_kernel("nki::rmsnorm", 0, ((128, 512), torch.bfloat16), 5e-6)
    end.record()
    assert start.elapsed_time(end) == pytest.approx(10e-3)
    assert "nki::rmsnorm" in torch_neuronx.get_executed_ops()
    stats = torch_neuronx.get_compilation_cache_stats()
    assert (stats["compilations_per_op"]["nki::rmsnorm"], stats["in_memory_hits"]) == (1, 1)
    with pytest.raises(ValueError, match="non-negative"):
        ledger.record_kernel("nki::rmsnorm", 0, "sig", -1.0)


def test_printing_warns_about_nothing_and_records_no_fallback():
    """Issue 19, item 13: printing measured the values with masked_select, a CPU fallback, so it warned."""
    import warnings

    import torch_neuronx

    values = torch.tensor([1.5, float("inf"), 0.0, -2.0e-7], device="neuron")
    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = repr(values) + repr(torch.arange(2000.0, device="neuron")) + str(values.to(torch.bfloat16))
    assert "device='neuron:0'" in text and "inf" in text
    assert "aten::masked_select" not in torch_neuronx.get_fallback_ops()


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, device="neuron"),
        lambda: torch.rand(4, device="neuron"),
        lambda: torch.randint(0, 5, (4,), device="neuron"),
        lambda: torch.randperm(6, device="neuron"),
        lambda: torch.multinomial(torch.ones(4, device="neuron"), 2),
        lambda: torch.nn.functional.dropout(torch.ones(4, device="neuron"), 0.5),
        lambda: torch.empty(4, device="neuron").bernoulli_(0.5),
        lambda: torch.empty(4, device="neuron").random_(),
        lambda: torch.empty(4, device="neuron").uniform_(),
    ],
)
def test_random_ops_are_native_kernels(make):
    """RNG ops run on the engines' hardware RNG on Trainium: no fallback warning, counted as executed natively."""
    import warnings

    import torch_neuronx

    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make()
    assert torch_neuronx.get_fallback_ops() == []
