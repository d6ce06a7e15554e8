"""Per-device random number generators: reproducible under seeds, and the same numbers as the CPU."""

from __future__ import annotations

import sys

import pytest
import torch


def test_manual_seed_reproduces_random_ops():
    torch.manual_seed(123)
    first = [torch.randn(5, device="neuron").cpu(), torch.rand(3, device="neuron").cpu()]
    torch.manual_seed(123)
    second = [torch.randn(5, device="neuron").cpu(), torch.rand(3, device="neuron").cpu()]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "sample",
    [
        lambda device: torch.randn(4, 3, device=device),
        lambda device: torch.randint(0, 10, (7,), device=device),
        lambda device: torch.empty(6, device=device).uniform_(-1, 1),
        lambda device: torch.bernoulli(torch.full((8,), 0.5, device=device)),
        lambda device: torch.randperm(9, device=device),
        lambda device: torch.nn.functional.dropout(torch.ones(10, device=device), 0.5),
    ],
    ids=["randn", "randint", "uniform_", "bernoulli", "randperm", "dropout"],
)
def test_same_numbers_as_cpu_under_the_same_seed(sample):
    torch.manual_seed(7)
    expected = sample("cpu")
    torch.manual_seed(7)
    actual = sample("neuron")
    assert actual.device.type == "neuron"
    assert torch.equal(actual.cpu(), expected)


def test_devices_have_independent_generators():
    torch.neuron.manual_seed_all(1)
    torch.neuron.set_device(1)
    try:
        torch.neuron.manual_seed(99)  # only the current device
        assert torch.neuron.initial_seed() == 99
    finally:
        torch.neuron.set_device(0)
    assert torch.neuron.initial_seed() == 1
    torch.neuron.manual_seed_all(5)
    a = torch.randn(4, device="neuron:0").cpu()
    b = torch.randn(4, device="neuron:1").cpu()
    assert torch.equal(a, b)  # same seed, separate streams, same numbers


def test_neuron_generator_does_not_consume_cpu_generator():
    torch.manual_seed(3)
    expected = torch.randn(4)
    torch.manual_seed(3)
    torch.randn(100, device="neuron")
    torch.nn.functional.dropout(torch.ones(10, device="neuron"), 0.5)
    assert torch.equal(torch.randn(4), expected)


def test_get_set_rng_state_roundtrip():
    torch.manual_seed(11)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(6, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.randn(6, device="neuron").cpu(), a)


def test_get_set_rng_state_all():
    torch.manual_seed(2)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    values = [torch.rand(3, device=f"neuron:{i}").cpu() for i in range(torch.neuron.device_count())]
    torch.neuron.set_rng_state_all(states)
    again = [torch.rand(3, device=f"neuron:{i}").cpu() for i in range(torch.neuron.device_count())]
    assert all(torch.equal(a, b) for a, b in zip(values, again))


def test_set_rng_state_rejects_wrong_type():
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.neuron.set_rng_state(torch.zeros(3))


def test_seed_all_and_seed_change_the_seed():
    torch.neuron.manual_seed_all(0)
    torch.neuron.seed_all()
    seeds = set()
    for index in range(torch.neuron.device_count()):
        with torch.neuron.device(index):
            seeds.add(torch.neuron.initial_seed())
    assert len(seeds) == 1 and seeds != {0}  # one fresh random 64-bit seed for all devices
    torch.neuron.seed()
    assert torch.neuron.initial_seed() not in seeds


def test_fork_rng_covers_neuron():
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(10, device="neuron")
    a = torch.randn(3, device="neuron").cpu()
    torch.manual_seed(0)
    assert torch.equal(torch.randn(3, device="neuron").cpu(), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dropout_is_the_cpus_bitwise(dtype):
    x = torch.randn(512, generator=torch.Generator().manual_seed(1)).to(dtype)
    torch.manual_seed(7)
    expected = torch.ops.aten.native_dropout(x, 0.3, True)
    torch.manual_seed(7)
    output, mask = torch.ops.aten.native_dropout(x.to("neuron"), 0.3, True)
    assert torch.equal(output.cpu(), expected[0]) and torch.equal(mask.cpu(), expected[1])


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def _attention_dropout(x: torch.Tensor) -> torch.Tensor:
    q = x.view(1, 2, 16, 32)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def _seeded_randperm(x: torch.Tensor) -> torch.Tensor:
    """The path of a compiled graph's random ATen op (neuron-compile's `device_rng_*` ops): an op without a
    generator argument, run on the device's generator."""
    from neuron_device.services import seeded_call

    return seeded_call(torch.ops.aten.randperm.default, 0, (x.numel(),), {"dtype": torch.int64})


def _run_beside_a_cpu_thread(draw, workers: int, draws: int) -> list[bytes]:
    """`workers` threads each calling `draw()` `draws` times, beside one thread drawing CPU numbers whose every
    value is checked bit for bit against a single-threaded reference generator."""
    import threading

    results: list[bytes] = []
    cpu_draws_intact: list[bool] = []
    errors: list[BaseException] = []

    def worker():
        try:
            for _ in range(draws):
                results.append(draw().detach().cpu().numpy().tobytes())
        except BaseException as error:  # reported below, with the test's failure
            errors.append(error)

    def cpu_worker():
        reference = torch.Generator().manual_seed(5)
        torch.default_generator.manual_seed(5)
        for _ in range(200):
            cpu_draws_intact.append(torch.equal(torch.rand(64), torch.rand(64, generator=reference)))

    threads = [threading.Thread(target=worker) for _ in range(workers)] + [threading.Thread(target=cpu_worker)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so a draw that swaps the CPU generator's state is seen
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert all(cpu_draws_intact) and len(cpu_draws_intact) == 200
    return results


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
@pytest.mark.parametrize("op", [_dropout, _attention_dropout, _seeded_randperm])
def test_threads_get_independent_streams_and_leave_the_cpu_generator_alone(op):
    """Issue 19, item 2: 4 threads of random ops on `neuron` beside one thread drawing CPU numbers."""
    torch.neuron.manual_seed(0)
    x = torch.ones(32, 32, device="neuron")
    results = _run_beside_a_cpu_thread(lambda: op(x), workers=4, draws=60)
    assert len(results) == 240 and len(set(results)) == 240  # no two threads drew the same numbers


@pytest.mark.parametrize(("op", "on_cpu"), [(_dropout, _dropout), (_attention_dropout, _attention_dropout),
                                            (_seeded_randperm, lambda x: torch.randperm(x.numel()))])
@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_each_path_draws_from_the_device_generator_as_the_cpu_does(op, on_cpu):
    """Reproducible under `torch.neuron.manual_seed`, the CPU's numbers under the same seed, and the CPU's generator
    not advanced."""
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(9)
    expected = on_cpu(x)
    torch.neuron.manual_seed(9)
    cpu_state = torch.default_generator.get_state()
    first = op(x.to("neuron")).cpu()
    assert torch.equal(torch.default_generator.get_state(), cpu_state)
    torch.neuron.manual_seed(9)
    assert torch.equal(op(x.to("neuron")).cpu(), first)
    assert torch.equal(first, expected)


def test_data_parallel_replicas_leave_the_cpu_generator_alone():
    """`nn.DataParallel` runs its replicas in threads: their dropout draws from each device's generator."""
    model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to("neuron"),
                                  device_ids=[0, 1])
    x = torch.ones(6, 8, device="neuron")
    torch.neuron.manual_seed_all(0)
    rows = _run_beside_a_cpu_thread(lambda: model(x), workers=1, draws=20)
    assert len(set(rows)) == 20
    torch.neuron.manual_seed_all(0)
    assert _run_beside_a_cpu_thread(lambda: model(x), workers=1, draws=20) == rows  # reproducible


def test_every_random_cpu_kernel_has_a_way_to_run_on_the_device_generator():
    """`seeded_call` raises for a random op it can run only by borrowing the CPU's generator: no CPU kernel of the
    installed torch is one (each takes a generator, has an overload that does, has a step-by-step form, or draws
    nothing)."""
    from neuron_device.ops import seeded
    from neuron_device.ops.call import overload_record

    stranded = []
    for name in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = name.partition("::")
        packet_name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, packet_name, None), overload or "default", None)
        if namespace != "aten" or op is None or torch.Tag.nondeterministic_seeded not in op.tags:
            continue
        if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            continue  # composite or CPU-less: reaches the device as the ops it is made of
        if overload_record(op).generator_form is None and name not in seeded.WITH_GENERATOR \
                and name not in seeded.DRAW_NOTHING_ON_CPU:
            stranded.append(name)
    assert stranded == []


def test_seeded_call_refuses_to_borrow_the_cpu_generator():
    from neuron_device.services import seeded_call

    def no_generator_form(n):  # a random function with no schema: nothing says how to give it a generator
        return torch.rand(n)

    with pytest.raises(NotImplementedError, match="no form taking a generator"):
        seeded_call(no_generator_form, 0, (3,), {})


def _seed_and_offset(state: torch.Tensor) -> tuple[int, int]:
    return state[:8].view(torch.uint64).item(), state[8:].view(torch.int64).item()


def test_state_is_cudas_seed_and_offset():
    """Issue 39, item 3: the state is CUDA's 16-byte Philox-style (seed, offset) pair (DTensor's RNG tracker reads
    and shifts it); it was a CPU generator's 5,056 bytes."""
    torch.manual_seed(3)
    state = torch.neuron.get_rng_state()
    assert state.numel() == 16 and _seed_and_offset(state) == (3, 0)
    assert torch.equal(torch.neuron.get_rng_state(), state)  # nothing drawn: the same position
    torch.rand(5, device="neuron")
    seed, offset = _seed_and_offset(torch.neuron.get_rng_state())
    assert seed == 3 and offset > 0 and offset % 4 == 0
    with pytest.raises(RuntimeError, match="RNG state is wrong size"):
        torch.neuron.set_rng_state(torch.zeros(5056, dtype=torch.uint8))


def test_the_stream_is_a_function_of_the_state():
    """A (seed, offset) pair gives the same numbers whatever came before it and on every device (as a state saved
    in one process and restored in another), and another offset gives other numbers."""
    torch.manual_seed(4)
    torch.randn(7, device="neuron")
    state = torch.neuron.get_rng_state()
    expected = torch.rand(6, device="neuron").cpu()
    torch.neuron.manual_seed_all(123)
    torch.randn(100, device="neuron:1")
    torch.neuron.set_rng_state(state, 1)
    assert torch.equal(torch.rand(6, device="neuron:1").cpu(), expected)
    shifted = state.clone()
    shifted[8:] = torch.tensor([_seed_and_offset(state)[1] + 16]).view(torch.uint8)
    torch.neuron.set_rng_state(shifted)
    assert not torch.equal(torch.rand(6, device="neuron").cpu(), expected)


def test_state_is_read_and_restored_under_a_fake_tensor_mode():
    """Activation checkpointing saves and restores device states inside plan mode's and tracers' fake tensor modes:
    the state is a host value, read and written without a tensor op such a mode would refuse (real tensors in a
    fake mode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(6)
    torch.rand(3, device="neuron")
    with FakeTensorMode():
        state = torch.neuron.get_rng_state()
        torch.neuron.set_rng_state(state)
    assert _seed_and_offset(state) == (6, 4)
