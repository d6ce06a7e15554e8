"""Storage of `neuron` tensors: real data pointers, strides and offsets, storage shared between views, and memory
freed exactly when the last tensor, view or storage reference dies."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

from neuron_device import allocator
from neuron_device import storage as hostmem


@pytest.fixture
def allocated():
    """`memory_allocated(index)` now, after a collection so earlier tests' garbage does not count."""

    def read(index: int = 0) -> int:
        gc.collect()
        return torch.neuron.memory_allocated(index)

    return read


def test_memory_is_freed_when_the_last_tensor_dies(allocated):
    base = allocated()
    t = torch.ones(1000, device="neuron")
    assert allocated() >= base + 4000
    del t
    assert allocated() == base


def test_a_view_keeps_its_base_memory_alive(allocated):
    base = allocated()
    t = torch.arange(1000.0, device="neuron")
    held = allocated()
    view = t[10:20]
    del t
    assert allocated() == held
    assert view.tolist() == [float(i) for i in range(10, 20)]
    view_of_view = view.view(2, 5)
    del view
    assert allocated() == held and view_of_view[1, 4].item() == 19.0
    del view_of_view
    assert allocated() == base


def test_storage_alone_keeps_memory_alive(allocated):
    base = allocated(1)
    t = torch.arange(8, dtype=torch.int32, device="neuron:1")
    untyped = t.untyped_storage()
    held = allocated(1)
    del t
    assert allocated(1) == held
    rebuilt = torch.empty(0, dtype=torch.int32, device="neuron:1").set_(untyped)
    assert rebuilt.tolist() == list(range(8))
    del rebuilt, untyped
    assert allocated(1) == base


def test_typed_storage_alone_keeps_memory_alive(allocated):
    base = allocated(2)
    t = torch.arange(4.0, device="neuron:2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's TypedStorage deprecation (warned once per process)
        typed = t.storage()
    del t
    assert allocated(2) > base and typed.tolist() == [0.0, 1.0, 2.0, 3.0]
    del typed
    assert allocated(2) == base


def test_storage_object_lives_exactly_as_long_as_its_users():
    t = torch.ones(4, device="neuron")
    ref = weakref.ref(t.untyped_storage())
    view = t[1:]
    del t
    gc.collect()
    assert ref() is not None
    del view
    gc.collect()
    assert ref() is None


def test_set_to_another_storage_frees_the_old_one(allocated):
    base = allocated()
    t = torch.zeros(1000, device="neuron")
    other = torch.ones(10, device="neuron")
    t.set_(other.untyped_storage())
    del other
    after = allocated()
    assert base < after < base + 4000  # only the small storage is left
    assert t.tolist() == [1.0] * 10
    del t
    assert allocated() == base


def test_cycles_are_freed_by_the_collector(allocated):
    base = allocated()
    holder: list = []
    holder.append(holder)
    holder.append(torch.ones(256, device="neuron"))
    del holder
    assert allocated() == base


def test_data_ptr_strides_and_offset_are_real():
    t = torch.arange(24.0, device="neuron").reshape(2, 3, 4)
    storage = t.untyped_storage()
    assert t.data_ptr() == storage.data_ptr() != 0
    assert t.stride() == (12, 4, 1) and t.is_contiguous()
    view = t[1, 1:, ::2]
    assert view.storage_offset() == 16 and view.stride() == (4, 2)
    assert view.data_ptr() == storage.data_ptr() + 16 * t.element_size()
    assert view.untyped_storage() is storage
    transposed = t.transpose(0, 2)
    assert transposed.stride() == (1, 4, 12) and not transposed.is_contiguous()
    assert transposed.untyped_storage().data_ptr() == storage.data_ptr()
    assert torch.equal(view.cpu(), torch.arange(24.0).reshape(2, 3, 4)[1, 1:, ::2])


def test_views_share_storage_and_see_writes():
    t = torch.zeros(3, 4, device="neuron")
    row, column, flat = t[1], t[:, 2], t.view(-1)
    row.fill_(1.0)
    column.add_(10.0)
    flat[0] = 5.0
    expected = torch.zeros(3, 4)
    expected[1] = 1.0
    expected[:, 2] += 10.0
    expected.view(-1)[0] = 5.0
    assert torch.equal(t.cpu(), expected)
    assert len({x.untyped_storage().data_ptr() for x in (t, row, column, flat)}) == 1
    assert row._base is t and column._base is t


def test_to_neuron_and_back_copy():
    """Moving between host and device copies, as with CUDA: later writes on either side stay on that side."""
    host = torch.arange(4.0)
    device = host.to("neuron")
    host[0] = 100.0
    assert device[0].item() == 0.0
    device[1] = -1.0
    assert host[1].item() == 1.0
    back = device.cpu()
    device[2] = 7.0
    assert back[2].item() == 2.0
    assert device.to("neuron") is device and device.to("neuron:1").device == torch.device("neuron:1")


def test_host_alias_is_zero_copy_both_ways():
    t = torch.arange(12.0, device="neuron").reshape(3, 4)[1:, 1:]
    alias = hostmem.host_alias(t)
    assert alias.device.type == "cpu" and alias.data_ptr() == t.data_ptr()
    assert alias.shape == t.shape and alias.stride() == t.stride()
    alias[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    t[1, 2] = -3.0
    assert alias[1, 2].item() == -3.0


def test_host_alias_keeps_device_memory_alive(allocated):
    # Since every host alias is a view of the device storage's one host twin (issue 19: torch's overlap checks must
    # see one storage), an alias keeps the *memory* valid but not the device storage: the twin must not reference
    # the storage back, or the two would keep each other alive. The device's accounting follows the storage.
    base = allocated()
    t = torch.arange(256.0, device="neuron")
    alias = hostmem.host_alias(t)
    assert allocated() > base
    del t
    assert alias[255].item() == 255.0
    alias.add_(1.0)
    assert alias[255].item() == 256.0
    del alias
    assert allocated() == base


def test_a_kernel_input_is_the_twin_when_laid_out_as_the_twin():
    # The fast path hands a CPU kernel the host twin itself for an input laid out exactly as the twin (an op's
    # result), a view of it otherwise: one storage either way, so torch's overlap checks still see it.
    t = torch.arange(12.0, device="neuron") * 1.0
    twin = hostmem.kernel_input(t)
    assert hostmem.kernel_input(t) is twin and twin.data_ptr() == t.data_ptr()
    storage = twin.untyped_storage()._cdata
    for view in (t.view(3, 4), t[1:], t.view(3, 4).t(), t[::2]):
        alias = hostmem.kernel_input(view)
        assert alias is not twin and alias.untyped_storage()._cdata == storage
        assert (alias.shape, alias.stride(), alias.data_ptr()) == (view.shape, view.stride(), view.data_ptr())
    z = torch.tensor([1 + 2j, 3 - 4j], device="neuron") * 1
    assert hostmem.kernel_input(z.conj()).is_conj() and not hostmem.kernel_input(z).is_conj()
    t.add_(t)  # in place, with the twin as both inputs: only the data changes
    assert twin.shape == (12,) and twin.stride() == (1,) and t.tolist() == [2.0 * i for i in range(12)]
    with pytest.raises(RuntimeError, match="single memory location"):
        t[1:].add_(t[:-1])


def test_adopted_host_memory_is_shared_not_copied(allocated):
    base = allocated(3)
    host = torch.arange(6.0)
    device = allocator.adopt_tracked(host, 3)
    assert device.device == torch.device("neuron:3") and device.data_ptr() == host.data_ptr()
    host[0] = 9.0
    assert device[0].item() == 9.0
    del host
    assert device.tolist() == [9.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    del device
    assert allocated(3) == base


def test_conjugate_and_negative_views_alias_correctly():
    z = torch.tensor([1 + 2j, 3 - 4j], device="neuron")
    conj = z.conj()
    assert conj.is_conj() and conj.data_ptr() == z.data_ptr()
    assert conj.tolist() == [1 - 2j, 3 + 4j]
    alias = hostmem.host_alias(conj)
    assert alias.is_conj() and alias.tolist() == [1 - 2j, 3 + 4j]
    assert conj.resolve_conj().tolist() == [1 - 2j, 3 + 4j] and z.tolist() == [1 + 2j, 3 - 4j]


def test_resize_to_same_size_keeps_strides():
    t = torch.zeros(4, 3, device="neuron").t()
    t.resize_(3, 4)
    assert t.stride() == (1, 3)


def test_storage_resize_updates_memory_statistics(allocated):
    base = allocated()
    storage = torch.empty(0, dtype=torch.uint8, device="neuron").untyped_storage()
    storage.resize_(4096)
    grown = allocated()
    assert grown >= base + 4096
    storage.resize_(0)
    assert allocated() == base
    storage.resize_(100)
    del storage
    assert allocated() == base


@pytest.mark.parametrize(
    "statement",
    [
        "x = torch.arange(4.0, device='neuron'); x.untyped_storage().resize_(0); x.cpu()",
        "x = torch.arange(10.0, device='neuron'); v = x[5:]; x.untyped_storage().resize_(8); v.cpu()",
        "x = torch.arange(10.0, device='neuron'); v = x[5:]; x.untyped_storage().resize_(8); v + 1",
        "x = torch.arange(10.0, device='neuron'); v = x[5:]; x.untyped_storage().resize_(8); print(v)",
    ],
)
def test_reading_past_a_shrunk_storage_raises(python, statement):
    """Issue 19, item 4: a view read after its storage shrank returned freed memory, and `x.cpu()` after
    `resize_(0)` segfaulted. Every host read goes through the storage's host twin, whose bounds torch checks.
    (In a subprocess: the failure this guards against is a crash.)"""
    result = python(
        "import torch\ntry:\n    " + statement + "\nexcept RuntimeError as error:\n    print('raised', error)\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised setStorage" in result.stdout and "out of bounds for storage of size" in result.stdout


def test_the_legacy_typed_api_is_torch_cudas():
    """`t.storage_type()` and `isinstance(t, torch.neuron.FloatTensor)`, as `torch.cuda`'s (issue 40: None and no
    such types)."""
    import warnings

    t = torch.ones(2, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        assert t.storage_type() is torch.neuron.FloatStorage
        assert t.half().storage_type() is torch.neuron.HalfStorage
        assert isinstance(t.storage(), torch.neuron.FloatStorage)
        assert not isinstance(t.cpu().storage(), torch.neuron.FloatStorage)
    assert isinstance(t, torch.neuron.FloatTensor) and not isinstance(t, torch.neuron.DoubleTensor)
    assert not isinstance(t.cpu(), torch.neuron.FloatTensor) and isinstance(t.long(), torch.neuron.LongTensor)
    assert t.type() == "torch.neuron.FloatTensor"  # the name torch's C++ gives: the class of that name exists
    made = torch.neuron.FloatTensor(2, 3)
    assert made.shape == (2, 3) and made.dtype == torch.float32 and made.device.type == "neuron"
    assert torch.equal(torch.neuron.LongTensor([1, 2]).cpu(), torch.tensor([1, 2]))
    assert set(torch.neuron.legacy.__all__) >= {"FloatTensor", "BoolTensor", "ComplexFloatStorage"}
