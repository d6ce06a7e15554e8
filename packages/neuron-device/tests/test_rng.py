"""Per-device random number generators: reproducible under seeds, and the same numbers as the CPU."""

from __future__ import annotations

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


def test_threads_get_independent_dropout_masks_and_leave_the_cpu_generator_alone():
    """Issue 19, item 2: 4 threads of dropout on `neuron` beside one thread drawing CPU numbers."""
    import threading

    torch.neuron.manual_seed(0)
    x = torch.ones(32, 32, device="neuron")
    masks: list[bytes] = []
    cpu_draws_intact: list[bool] = []
    errors: list[BaseException] = []

    def dropout_worker():
        try:
            for _ in range(60):
                masks.append((torch.nn.functional.dropout(x, 0.5, training=True) != 0).cpu().numpy().tobytes())
        except BaseException as error:  # reported below, with the test's failure
            errors.append(error)

    def cpu_worker():
        reference = torch.Generator().manual_seed(5)
        torch.default_generator.manual_seed(5)
        for _ in range(200):
            cpu_draws_intact.append(torch.equal(torch.rand(64), torch.rand(64, generator=reference)))

    threads = [threading.Thread(target=dropout_worker) for _ in range(4)] + [threading.Thread(target=cpu_worker)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert len(masks) == 240 and len(set(masks)) == 240  # no two threads drew the same mask
    assert all(cpu_draws_intact) and len(cpu_draws_intact) == 200
