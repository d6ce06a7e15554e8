"""The patched crash paths of torch 2.13 (`neuron_device._patches`): each segfaults in plain torch with a Python
backend, so each check runs in a process of its own (`run_checked`), where a crash fails the test by its signal."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch
from crash_support import run_checked

from neuron_device import _patches


def test_untyped_storage_allocates_on_every_device_spelling():
    run_checked("""
        import torch
        base = {i: torch.neuron.memory_allocated(i) for i in range(3)}
        for device, index in [("neuron", 0), ("neuron:1", 1), (torch.device("neuron", 2), 2), ("privateuseone:1", 1)]:
            s = torch.UntypedStorage(24, device=device)
            assert s.device == torch.device("neuron", index), (device, s.device)
            assert s.nbytes() == 24 and s.data_ptr() != 0
            assert torch.neuron.memory_allocated(index) >= base[index] + 24, device
            del s
            assert torch.neuron.memory_allocated(index) == base[index], device
        empty = torch.UntypedStorage(device="neuron")
        assert empty.nbytes() == 0 and empty.device.type == "neuron"
        s = torch.UntypedStorage([1, 2, 255], device="neuron:1")
        assert s.device == torch.device("neuron:1") and s.tolist() == [1, 2, 255]
        with torch.neuron.device(3):
            assert torch.UntypedStorage(4, device="neuron").device == torch.device("neuron:3")
    """)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ("torch.UntypedStorage(-1, device='neuron')", RuntimeError, "negative"),
        ("torch.UntypedStorage(8, device='neuron:99')", RuntimeError, "Invalid device index 99"),
        ("torch.UntypedStorage(8, device='neuron', allocator=0)", NotImplementedError, "allocator"),
        ("torch.UntypedStorage([1, 'x'], device='neuron')", Exception, ""),
        ("torch.UntypedStorage(1, 2, device='neuron')", TypeError, ""),
        ("type('Sub', (torch.UntypedStorage,), {})(8, device='neuron')", NotImplementedError, "subclasses"),
    ],
)
def test_untyped_storage_bad_arguments_raise(call, error, message):
    run_checked(f"""
        import torch
        try:
            {call}
        except {error.__name__} as e:
            assert {message!r} in str(e), str(e)
        else:
            raise AssertionError("no error")
    """)


def test_cpu_storage_constructor_unchanged():
    assert torch.UntypedStorage(8).device == torch.device("cpu")
    assert torch.UntypedStorage(8, device="cpu").nbytes() == 8
    assert torch.UntypedStorage([1, 2], device=torch.device("cpu")).tolist() == [1, 2]
    assert torch.UntypedStorage().nbytes() == 0
    storage = torch.UntypedStorage(4)
    assert storage.new().device.type == "cpu"
    assert storage.resize_(16) is storage and storage.nbytes() == 16


def test_typed_storage_on_neuron():
    run_checked("""
        import warnings
        import torch
        warnings.simplefilter("ignore")
        s = torch.TypedStorage(4, dtype=torch.float32, device="neuron:1")
        assert s.device == torch.device("neuron:1") and s.size() == 4 and s.nbytes() == 16
        s = torch.TypedStorage([1.5, 2.5], dtype=torch.float64, device="neuron")
        assert s.device.type == "neuron" and s.tolist() == [1.5, 2.5]
        t = torch.arange(4.0, device="neuron:2")
        typed = t.storage()
        assert typed.clone().device == torch.device("neuron:2") and typed.clone().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert typed.float().tolist() == [0.0, 1.0, 2.0, 3.0]  # same dtype: a clone
        assert typed.double().dtype == torch.float64 and typed.double().device.type == "neuron"
        assert typed.cpu().device.type == "cpu"
    """)


def test_storage_clone_new_and_moves():
    run_checked("""
        import torch
        t = torch.arange(6, dtype=torch.int16, device="neuron:1")
        s = t.untyped_storage()
        c = s.clone()
        assert c.device == s.device and c.nbytes() == s.nbytes() and c.data_ptr() != s.data_ptr()
        assert c.tolist() == s.tolist()
        c[0] = 99
        assert s[0] == 0  # independent memory
        n = s.new()
        assert n.device == torch.device("neuron:1") and n.nbytes() == 0
        moved = torch.arange(3, dtype=torch.uint8).untyped_storage().to(device="neuron:2")
        assert moved.device == torch.device("neuron:2") and moved.tolist() == [0, 1, 2]
        assert torch.arange(3, dtype=torch.uint8).untyped_storage().neuron().device == torch.device("neuron:0")
        back = s.cpu()
        assert back.device.type == "cpu" and back.tolist() == s.tolist()
        shared = torch.UntypedStorage._new_shared(8, device="neuron:1")  # CUDA-style: a plain device allocation
        assert shared.device == torch.device("neuron:1") and shared.nbytes() == 8
    """)


def test_from_file_onto_neuron(tmp_path):
    path = tmp_path / "floats.bin"
    torch.arange(4, dtype=torch.float32).numpy().tofile(path)
    run_checked(f"""
        import torch
        t = torch.from_file({str(path)!r}, size=4, dtype=torch.float32, device="neuron:1")
        assert t.device == torch.device("neuron:1") and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    """)


def test_deepcopy_of_tensors_parameters_and_modules():
    run_checked("""
        import copy
        import torch
        t = torch.arange(6.0, device="neuron:1").requires_grad_()
        c = copy.deepcopy(t)
        assert c.device == t.device and torch.equal(c.detach().cpu(), t.detach().cpu()) and c.requires_grad
        assert c.data_ptr() != t.data_ptr()
        # Views keep sharing one (new) storage, as in the original.
        base = torch.arange(6.0, device="neuron")
        a, b = copy.deepcopy([base, base[2:]])
        assert a.untyped_storage() is b.untyped_storage() and b.storage_offset() == 2
        a[2] = 100
        assert b[0].item() == 100 and base[2].item() == 2
        p = torch.nn.Parameter(torch.ones(3, device="neuron"))
        q = copy.deepcopy(p)
        assert isinstance(q, torch.nn.Parameter) and q.device.type == "neuron" and q.data_ptr() != p.data_ptr()
        # A whole module, with a parameter shared between two layers (tied weights).
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to("neuron:1")
        m[1].weight = m[0].weight
        m2 = copy.deepcopy(m)
        assert m2[1].weight is m2[0].weight and m2[0].weight is not m[0].weight
        assert all(p.device == torch.device("neuron:1") for p in m2.parameters())
        x = torch.randn(2, 4, device="neuron:1")
        assert torch.equal(m(x).detach().cpu(), m2(x).detach().cpu())
        buffers = copy.deepcopy(torch.nn.BatchNorm1d(3).to("neuron"))
        assert buffers.running_mean.device.type == "neuron"
    """)


def test_storage_resize_in_place():
    run_checked("""
        import torch
        base = torch.neuron.memory_allocated(1)
        t = torch.arange(4, dtype=torch.int32, device="neuron:1")
        s = t.untyped_storage()
        assert s.resize_(32) is s and s.nbytes() == 32
        assert t.untyped_storage() is s and t.tolist() == [0, 1, 2, 3]  # kept bytes; the tensor sees the new memory
        assert torch.neuron.memory_allocated(1) >= base + 32
        view = torch.empty(0, dtype=torch.int32, device="neuron:1").set_(s, 0, (8,), (1,))
        view[7] = 7
        grown = torch.neuron.memory_allocated(1)
        assert s.resize_(8).nbytes() == 8
        assert base + 8 <= torch.neuron.memory_allocated(1) <= grown
        assert torch.empty(0, dtype=torch.int32, device="neuron:1").set_(s).tolist() == [0, 1]
        # FSDP2 frees and re-allocates parameter memory this way.
        s.resize_(0)
        assert s.nbytes() == 0 and torch.neuron.memory_allocated(1) == base
        s.resize_(16)
        assert torch.neuron.memory_allocated(1) >= base + 16
        t.fill_(3)
        assert t.tolist() == [3, 3, 3, 3]
        try:
            s.resize_(-1)
        except RuntimeError as e:
            assert "non-negative" in str(e)
        else:
            raise AssertionError("negative size accepted")
        import warnings
        warnings.simplefilter("ignore")
        typed = torch.ones(2, device="neuron").storage()
        typed.resize_(5)
        assert typed.size() == 5 and typed.tolist()[:2] == [1.0, 1.0]
        del t, view, s
        assert torch.neuron.memory_allocated(1) == base
    """)


def test_tensor_resize_grows_shared_storage():
    """Like CPU and CUDA, growing a tensor grows its storage in place: views of it see later writes."""
    run_checked("""
        import torch
        a = torch.arange(3.0, device="neuron")
        storage, head = a.untyped_storage(), a[:2]
        a.resize_(10)
        a[0] = 7
        assert a.untyped_storage() is storage and storage.nbytes() == 40
        assert head.tolist() == [7.0, 1.0] and a[:3].tolist() == [7.0, 1.0, 2.0]
    """)


def test_pin_memory_makes_a_pinned_copy():
    source = torch.arange(6.0).reshape(2, 3).t()  # non-contiguous: strides are preserved, as on CUDA
    pinned = source.pin_memory()
    assert pinned.is_pinned() and not source.is_pinned()
    assert torch.equal(pinned, source) and pinned.stride() == source.stride()
    assert pinned.data_ptr() != source.data_ptr()
    assert pinned.pin_memory() is pinned and torch.ones(2).pin_memory("neuron").is_pinned()
    assert pinned.to("neuron", non_blocking=True).cpu().tolist() == source.tolist()
    assert torch.ones(3).untyped_storage().pin_memory().is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(3, device="neuron").pin_memory()
    with pytest.raises(TypeError, match="only CPU memory can be pinned"):
        torch.ones(3, device="neuron").untyped_storage().pin_memory()
    assert not torch.ones(3, device="neuron").is_pinned()
    assert torch.Tensor.pin_memory.__name__ == "pin_memory" and torch.Tensor.pin_memory.__doc__


def test_pinned_flag_dies_with_its_storage():
    pinned = torch.ones(1000).pin_memory()
    pointer = pinned.untyped_storage().data_ptr()
    del pinned
    gc.collect()
    assert pointer not in _patches._pinned_storages


def test_numpy_raises_like_cuda():
    t = torch.ones(3, device="neuron")
    expected = "can't convert neuron:0 device type tensor to numpy. Use Tensor.cpu()"
    with pytest.raises(TypeError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        t.numpy()
    with pytest.raises(TypeError, match="can't convert neuron:0 device type tensor to numpy"):
        np.asarray(t)
    assert np.array_equal(t.cpu().numpy(), np.ones(3, dtype=np.float32))


def test_host_reads_and_new_tensors():
    run_checked("""
        import torch
        t = torch.tensor([[1.5, -2.0], [3.0, 4.0]], device="neuron:1")
        assert t.tolist() == [[1.5, -2.0], [3.0, 4.0]] and t[0, 1].item() == -2.0
        assert torch.tensor(True, device="neuron").tolist() is True
        assert torch.tensor([1 + 2j], device="neuron").tolist() == [1 + 2j]
        assert torch.tensor([1.0], dtype=torch.bfloat16, device="neuron").tolist() == [1.0]
        assert torch.empty(0, 3, device="neuron").tolist() == []
        n = t.new_tensor([7, 8])
        assert n.device == torch.device("neuron:1") and n.dtype == torch.float32 and n.tolist() == [7.0, 8.0]
        assert t.new_empty(3).device == t.device and t.new_zeros(2).tolist() == [0.0, 0.0]
        assert t.new_ones((1,)).tolist() == [1.0] and t.new_full((2,), 5.0).tolist() == [5.0, 5.0]
        # On neuron:1: the C++ guard would say neuron:0.
        assert t.new(2).device == t.device and t.new().numel() == 0 and t.new().device == t.device
        assert t.new([1.0]).tolist() == [1.0] and t.new([1.0]).device == t.device
        assert t.new(device="neuron:2").device == torch.device("neuron:2")
        assert t.new(t.untyped_storage()).data_ptr() == t.data_ptr() and t.new(t).data_ptr() == t.data_ptr()
        assert torch.ones(1).new_tensor([2]).device.type == "cpu" and torch.ones(1).new(2).device.type == "cpu"
        assert [x.tolist() for x in t] == [[1.5, -2.0], [3.0, 4.0]]
        assert float(t[1, 1]) == 4.0 and int(t[1, 0]) == 3 and bool(t[0, 0])
    """)


def test_share_memory_is_a_no_op_on_neuron():
    t = torch.ones(3, device="neuron")
    pointer = t.data_ptr()
    assert t.share_memory_() is t and t.data_ptr() == pointer
    assert t.is_shared() and t.untyped_storage().is_shared()
    storage = t.untyped_storage()
    assert storage.share_memory_() is storage and t.data_ptr() == pointer


def test_data_loader_pins_batches():
    """DataLoader pins in a helper thread (and with workers), as Trainer and TRL do by default."""
    run_checked("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        for workers in (0, 1):
            loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True, num_workers=workers)
            batches = [b[0] for b in loader]
            assert all(b.is_pinned() for b in batches)
            assert [b.tolist() for b in batches] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """)


def test_apply_all_is_idempotent():
    before = (torch.UntypedStorage.__new__, torch.UntypedStorage.resize_, torch.Tensor.pin_memory)
    _patches.apply_all()
    assert (torch.UntypedStorage.__new__, torch.UntypedStorage.resize_, torch.Tensor.pin_memory) == before


def test_non_blocking_storage_copy_to_cpu_does_not_need_pinning():
    storage = torch.arange(4, dtype=torch.uint8, device="neuron").untyped_storage()
    copied = storage.to(device="cpu", non_blocking=True)
    assert copied.device.type == "cpu" and copied.tolist() == [0, 1, 2, 3] and not copied.is_pinned()
    t = torch.ones(3, device="neuron")
    assert t.to("cpu", non_blocking=True).tolist() == [1.0, 1.0, 1.0]


def _receive_and_write(inbox, outbox) -> None:
    """The receiving process of `test_neuron_memory_sent_through_a_queue_is_shared_as_on_cuda`."""
    received = inbox.get(timeout=120)
    outbox.put({name: (str(obj.device), type(obj).__name__, obj.cpu().tolist() if isinstance(obj, torch.Tensor)
                       else obj.tolist()) for name, obj in received.items()})
    received["view"].mul_(10)  # written in place: the sender sees it, as with CUDA's IPC
    outbox.put(torch.neuron.memory_allocated(1))


@pytest.mark.multiprocess
def test_neuron_memory_sent_through_a_queue_is_shared_as_on_cuda():
    """A `neuron` tensor on a multiprocessing queue failed in the feeder thread ("_share_fd_: only available on
    CPU") while `put()` returned, and the receiver waited forever. Now the receiver gets `neuron` tensors and
    storages of the same device, over the same memory."""
    import torch.multiprocessing as mp

    base = torch.arange(12.0, device="neuron:1").reshape(3, 4)
    view = base[:, 1:3]  # strided, at an offset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        sent = {"view": view, "parameter": torch.nn.Parameter(torch.ones(2, device="neuron:1")),
                "untyped_storage": torch.tensor([1, 2], dtype=torch.uint8, device="neuron:1").untyped_storage(),
                "typed_storage": torch.tensor([3, 4], device="neuron:1").storage(),
                "empty": torch.empty(0, device="neuron:1")}
    allocated = torch.neuron.memory_allocated(1)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive_and_write, args=(inbox, outbox), daemon=True)
    receiver.start()
    try:
        inbox.put(sent)
        got = outbox.get(timeout=120)
        child_allocated = outbox.get(timeout=60)
        receiver.join(timeout=60)
    finally:
        receiver.kill()
    assert receiver.exitcode == 0
    assert got == {"view": ("neuron:1", "Tensor", [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]]),
                   "parameter": ("neuron:1", "Parameter", [1.0, 1.0]),
                   "untyped_storage": ("neuron:1", "UntypedStorage", [1, 2]),
                   "typed_storage": ("neuron:1", "TypedStorage", [3, 4]),
                   "empty": ("neuron:1", "Tensor", [])}
    assert base.tolist() == [[0.0, 10.0, 20.0, 3.0], [4.0, 50.0, 60.0, 7.0], [8.0, 90.0, 100.0, 11.0]]
    # moving the bytes into shared memory kept the sender's device charge; the receiver charged what it mapped
    assert torch.neuron.memory_allocated(1) == allocated and child_allocated > 0


def test_dynamo_does_not_trace_the_runtime_between_graphs():
    """Eager `neuron` ops after a graph break enter the runtime's Python kernels from C++; Dynamo must skip those
    frames as it skips torch's own (it traced the allocator and the cost model, and split user graphs there)."""
    out = run_checked("""
        import logging
        import torch
        traced = []

        class Started(logging.Handler):
            def emit(self, record):
                message = record.getMessage()
                if "torchdynamo start tracing" in message:
                    traced.append(message.split()[-1])

        logger = logging.getLogger("torch._dynamo.symbolic_convert")
        logger.setLevel(logging.INFO)
        logger.addHandler(Started())

        def f(x):
            y = x.sin()
            z = y.nonzero()  # data-dependent: a graph break, then eager neuron ops
            return z.sum() + y.cos().sum()

        x = torch.randn(8, device="neuron")
        torch.testing.assert_close(torch.compile(f, backend="aot_eager")(x).cpu(), f(x.cpu()))
        runtime = [path for path in traced if "neuron_device" in path and "device.py:" not in path]
        assert not runtime, runtime
        print(len(traced))
    """)
    assert int(out.split()[-1]) >= 2  # the user's function and its resumption were traced


_RAISING_MODE = """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Raising(TorchDispatchMode):
        def __init__(self, op):
            super().__init__()
            self.op = op

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is self.op:
                raise ValueError(f"refused {func}")
            return func(*args, **(kwargs or {}))

    def assert_refused(backward):
        try:
            backward()
        except ValueError as error:
            assert "refused" in str(error), error
        else:
            raise AssertionError("no error")
"""


@pytest.mark.parametrize(
    ("forward", "refused"),
    [
        ("x.cos().sum()", "torch.ops.aten.sin.default"),  # a backward op with a tensor result
        ("torch.nn.functional.layer_norm(x.view(1, 3), (3,)).sum()", "torch.ops.aten.native_layer_norm_backward.default"),
    ],
)
def test_dispatch_mode_error_in_backward_reaches_the_caller(forward, refused):
    """It killed the process ("terminate called without an active exception"), see `_patch_backward_mode_errors`."""
    run_checked(_RAISING_MODE + f"""
    x = torch.ones(3, device="neuron", requires_grad=True)
    loss = {forward}
    mode = Raising({refused})
    with mode:
        assert_refused(loss.backward)
    assert "__torch_dispatch__" not in vars(mode)  # the guard is gone once the backward ends
    assert x.grad is None
    y = x.cos().sum()
    y.backward()  # the device still works
    torch.testing.assert_close(x.grad.cpu(), -torch.ones(3).sin())
    """)


def test_a_mode_still_handles_the_error_of_the_mode_below_it_in_backward():
    """Only errors that would reach the engine are held back: one mode's error reaches the mode that called it."""
    run_checked(_RAISING_MODE + """
    class Replacing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            try:
                return func(*args, **(kwargs or {}))
            except ValueError:
                return torch.zeros_like(args[0])

    x = torch.ones(3, device="neuron", requires_grad=True)
    loss = x.cos().sum()
    with Raising(torch.ops.aten.sin.default), Replacing():
        loss.backward()
    assert x.grad.device.type == "neuron" and not x.grad.cpu().any(), x.grad
    """)


def test_aot_eager_backward_with_a_data_dependent_shape_matches_the_cpu():
    """AOTAutograd traces the backward of a masked assignment, hits a data-dependent shape under FakeTensorMode and
    handles it; on `neuron` that error killed the process before the patch (transformers' VITS flow)."""
    out = run_checked("""
        import torch

        def f(x, w):
            mask = x > 0
            out = torch.zeros_like(x)
            out[mask] = (x[mask] * w[mask]).sin()
            return out

        torch.manual_seed(0)
        grads = {}
        for device in ("cpu", "neuron"):
            torch._dynamo.reset()
            x, w = (torch.randn(8, generator=torch.Generator().manual_seed(s)).to(device).requires_grad_() for s in (1, 2))
            torch.compile(f, backend="aot_eager")(x, w).sum().backward()
            grads[device] = (x.grad.cpu(), w.grad.cpu())
        torch.testing.assert_close(grads["neuron"], grads["cpu"])
        print("ok")
    """)
    assert "ok" in out


def test_unpack_hook_error_in_backward_reaches_the_caller():
    """A saved-tensor unpack hook's error killed the process, see `_patch_backward_mode_errors`."""
    run_checked(_RAISING_MODE + """
    def refuse(packed):
        raise ValueError("refused")

    x = torch.ones(3, device="neuron", requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, refuse):
        loss = x.sin().sum()
    assert_refused(loss.backward)
    x.cos().sum().backward()  # the device still works
    torch.testing.assert_close(x.grad.cpu(), -torch.ones(3).sin())
    """)


def test_selective_checkpoint_recompute_mismatch_raises_as_on_the_cpu():
    """Selective activation checkpointing whose recompute runs an op the forward did not: its cached mode raises
    inside the recompute, in an unpack hook, during backward. That killed the process on `neuron` (torchtitan's
    MoE with FSDP2's record_function); on both devices it is the same RuntimeError."""
    out = run_checked("""
    from functools import partial
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def policy(ctx, func, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if func is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    for device in ("cpu", "neuron"):
        calls = []

        def f(x, w):
            calls.append(1)
            if len(calls) > 1:
                x = x.cos()  # only the recompute runs this op
            return (x @ w).sin()

        x, w = (torch.randn(4, 4, device=device, requires_grad=True) for _ in range(2))
        out = checkpoint(f, x, w, use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, policy))
        try:
            out.sum().backward()
        except RuntimeError as error:
            print(device, error)
        else:
            raise AssertionError("no error")
    """)
    cpu, neuron = out.strip().splitlines()[-2:]
    assert "aten.cos.default encountered during backward but not found in storage" in cpu, cpu
    assert neuron.removeprefix("neuron ") == cpu.removeprefix("cpu "), (cpu, neuron)


@pytest.mark.parametrize(
    "register",
    [
        "y.register_hook(refuse)",  # a tensor hook on an intermediate
        "x.register_hook(refuse)",  # on a leaf, run by its AccumulateGrad node
        "y.grad_fn.register_hook(refuse)",
        "y.grad_fn.register_prehook(refuse)",
        "x.register_post_accumulate_grad_hook(refuse)",
    ],
)
def test_hook_error_in_backward_reaches_the_caller(register):
    """A tensor or node hook's error killed the process ("terminate called without an active exception"), see
    `_patch_backward_mode_errors`; on both devices `backward()` raises the hook's own error."""
    run_checked(_RAISING_MODE + f"""
    def refuse(*args):
        raise ValueError("refused by the hook")

    for device in ("cpu", "neuron"):
        x = torch.ones(3, device=device, requires_grad=True)
        y = x.sin()
        handle = {register}
        assert_refused(y.sum().backward)
        handle.remove()
        x.grad = None
        x.cos().sum().backward()  # the device still works
        torch.testing.assert_close(x.grad.cpu(), -torch.ones(3).sin())
    """)


def test_dispatch_mode_error_inside_a_tensor_hook_reaches_the_caller():
    """A mode entered by a hook during backward refuses an op of the hook: it was "SystemError: ... returned NULL
    without setting an exception" on `neuron`, the mode's ValueError on the CPU."""
    run_checked(_RAISING_MODE + """
    def hook(grad):
        with Raising(torch.ops.aten.mul.Tensor):
            return grad * 2

    x = torch.ones(3, device="neuron", requires_grad=True)
    y = x.sin()
    y.register_hook(hook)
    assert_refused(y.sum().backward)
    """)


def test_tensor_hooks_are_still_traced_by_torch_compile():
    """Dynamo special-cases `Tensor.register_hook`, which is patched: a hook on an intermediate is still traced into
    the graph (no graph break) and one on an input still runs, with the eager gradients on both devices."""
    out = run_checked("""
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    def f(x, w):
        y = (x * w).sin()
        y.register_hook(lambda grad: grad * 3)
        x.register_hook(lambda grad: grad + 1)
        return y.cos().sum()

    grads = {}
    for device in ("cpu", "neuron"):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        for run in (torch.compile(f, backend=counter, fullgraph=True), f):
            x, w = torch.arange(4.0, device=device).requires_grad_(), torch.ones(4, device=device, requires_grad=True)
            run(x, w).backward()
            grads[device, run is f] = (x.grad.cpu(), w.grad.cpu())
        assert counter.frame_count == 1, counter.frame_count
    for key, value in grads.items():
        torch.testing.assert_close(value, grads["cpu", True], msg=str(key))
    print("ok")
    """)
    assert "ok" in out
