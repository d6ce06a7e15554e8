"""Device memory: the caching-allocator model (CUDA's rules) and `torch.neuron`'s memory API on top of it.

Model tests drive a fresh `DeviceAllocator` so every statistic has an exact expected value; API tests measure
differences on the shared `neuron` devices, after `gc.collect()` so earlier tests' garbage is gone.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from neuron_device import allocator
from neuron_device.allocator import DeviceAllocator, format_size

KiB, MiB, GiB = 1024, 1024**2, 1024**3


def stat(model: DeviceAllocator, name: str, pool: str = "all", metric: str = "current") -> int:
    return model.stats_as_nested_dict()[name][pool][metric]


# -- the model ----------------------------------------------------------------------------------------------------


def test_small_requests_share_a_2mib_segment_in_512_byte_blocks():
    model = DeviceAllocator(0, GiB)
    a = model.malloc(1000)
    b = model.malloc(1)
    assert (a.size, b.size) == (1024, 512)
    assert b.address == a.address + 1024
    assert stat(model, "allocated_bytes") == 1536
    assert stat(model, "requested_bytes") == 1001
    assert stat(model, "reserved_bytes") == stat(model, "reserved_bytes", "small_pool") == 2 * MiB
    assert stat(model, "segment") == 1
    assert stat(model, "inactive_split") == 1
    assert stat(model, "inactive_split_bytes") == 2 * MiB - 1536
    assert stat(model, "allocation", "small_pool") == 2
    assert stat(model, "allocation", "large_pool") == 0


class _DrainAlways(DeviceAllocator):
    """The allocator without its shortcut for a freed block handed out again: every queued block is merged back
    (`_free`) and the request served by best fit, as before the shortcut."""

    def _reuse_pending(self, size: int, requested: int) -> None:
        self.drain()


class _CountingReuse(DeviceAllocator):
    """The allocator, counting the requests its shortcut served."""

    reused = 0

    def _reuse_pending(self, size: int, requested: int):
        block = super()._reuse_pending(size, requested)
        self.reused += block is not None
        return block


def _state(model: DeviceAllocator, live: list) -> tuple:
    segments = model.segments()
    # the segments the model keeps (`_heads`) are exactly those the free and live blocks belong to
    blocks = [e[2] for pool in model._pools.values() for e in pool.entries] + live
    firsts = set()
    for block in blocks:
        while block.prev is not None:
            block = block.prev
        firsts.add(block.address)
    assert sorted(firsts) == [segment["address"] for segment in segments]
    assert sum(len(segment["blocks"]) for segment in segments) == len(blocks)
    return (model.stats_as_nested_dict(), segments, [(b.address, b.size, b.requested) for b in live],
            sorted((e[0], e[1]) for pool in model._pools.values() for e in pool.entries))


@pytest.mark.parametrize("seed", range(6))
def test_reusing_a_freed_block_changes_nothing_but_speed(seed):
    """The shortcut of `_reuse_pending` (the one queued block handed out again without merge and split) leaves
    every statistic, peak, segment, free block and address exactly as the merge-then-best-fit it replaces: both
    allocators run the same random program (storages dying through the queue, as their callbacks do, one or several
    at a time; requests of the size just freed, and others; peak and total resets; cache releases)."""
    import random

    rng = random.Random(seed)
    sizes = [512, 1000, 4096, 700 * KiB, MiB, MiB + 1, 3 * MiB, 9 * MiB, 12 * MiB, 19 * MiB, 25 * MiB + 1]
    new, old = _CountingReuse(0, 96 * MiB), _DrainAlways(0, 96 * MiB)
    live: dict[str, list] = {"new": [], "old": []}
    for _ in range(400):
        action = rng.random()
        if action < 0.45 or not live["new"]:
            nbytes = rng.choice(sizes[:5] if rng.random() < 0.7 else sizes) + rng.choice((0, 0, 1, 100))
            if live["new"] and rng.random() < 0.5:  # free one, then ask for its size: the loop's steady state
                position = rng.randrange(len(live["new"]))
                nbytes = live["new"][position].requested
                for side, model in (("new", new), ("old", old)):
                    model.pending.append(live[side].pop(position))
            for side, model in (("new", new), ("old", old)):
                try:
                    live[side].append(model.malloc(nbytes))
                except allocator.OutOfMemoryError:
                    pass
        elif action < 0.85:
            for _ in range(rng.choice((1, 1, 2, 3))):
                if live["new"]:
                    position = rng.randrange(len(live["new"]))
                    for side, model in (("new", new), ("old", old)):
                        model.pending.append(live[side].pop(position))
        elif action < 0.9:
            new.reset_peak(), old.reset_peak()
        elif action < 0.95:
            new.reset_accumulated(), old.reset_accumulated()
        else:
            new.empty_cache(), old.empty_cache()
        assert _state(new, live["new"]) == _state(old, live["old"])
    assert new.reused > 20  # the shortcut ran, and not only in one shape


@pytest.mark.parametrize(
    ("request_bytes", "block", "segment"),
    [
        (MiB, MiB, 2 * MiB),  # 1 MiB is still small
        (MiB + 1, MiB + 512, 20 * MiB),  # large, under 10 MiB: a 20 MiB segment, split
        (10 * MiB - 512, 10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB, 10 * MiB),  # from 10 MiB: the size rounded up to 2 MiB
        (25 * MiB + 1, 26 * MiB, 26 * MiB),  # remainder <= 1 MiB: not split, the block keeps the whole segment
        (19 * MiB, 19 * MiB + MiB, 20 * MiB),  # same: 1 MiB left over stays in the block
    ],
)
def test_rounding_and_segment_sizes(request_bytes, block, segment):
    model = DeviceAllocator(0, GiB)
    got = model.malloc(request_bytes)
    assert got.size == block
    assert stat(model, "reserved_bytes") == segment
    assert stat(model, "allocated_bytes") == block
    assert stat(model, "requested_bytes") == request_bytes
    assert stat(model, "inactive_split_bytes") == segment - block


def test_freed_blocks_merge_and_are_reused_without_new_segments():
    model = DeviceAllocator(0, GiB)
    a = model.malloc(3 * MiB)
    b = model.malloc(4 * MiB)
    assert stat(model, "segment") == 1
    assert stat(model, "inactive_split_bytes") == 13 * MiB
    model.free(a)
    assert stat(model, "inactive_split") == 2  # the freed front and the tail, separated by b
    model.free(b)
    assert stat(model, "inactive_split") == 0  # all merged back into one unsplit 20 MiB block
    assert stat(model, "allocated_bytes") == 0
    assert stat(model, "reserved_bytes") == 20 * MiB
    start = a.address
    c = model.malloc(5 * MiB)  # best fit: the cached segment
    assert c.address == start
    assert model.stats_as_nested_dict()["num_device_alloc"] == 1
    assert stat(model, "allocation", metric="allocated") == 3
    assert stat(model, "allocation", metric="freed") == 2


def test_best_fit_picks_the_smallest_block_that_fits():
    model = DeviceAllocator(0, GiB)
    big, small = model.malloc(40 * MiB), model.malloc(12 * MiB)
    addresses = big.address, small.address
    model.free(big)
    model.free(small)
    assert model.malloc(11 * MiB).address == addresses[1]
    assert model.malloc(13 * MiB).address == addresses[0]


def test_empty_cache_releases_unsplit_free_segments_only():
    model = DeviceAllocator(0, GiB)
    keep = model.malloc(3 * MiB)  # in a split 20 MiB segment
    drop = model.malloc(30 * MiB)  # larger than the 17 MiB left in that segment: a segment of its own
    small = model.malloc(100)
    model.free(drop)
    model.free(small)
    assert stat(model, "reserved_bytes") == 20 * MiB + 30 * MiB + 2 * MiB
    model.empty_cache()
    assert stat(model, "reserved_bytes") == 20 * MiB
    assert stat(model, "segment") == 1
    assert model.stats_as_nested_dict()["num_device_free"] == 2
    assert keep.allocated


def test_cache_is_flushed_and_retried_before_oom():
    model = DeviceAllocator(0, 64 * MiB)
    model.free(model.malloc(40 * MiB))  # 40 MiB cached
    b = model.malloc(50 * MiB)  # 40 + 50 > 64: release the cache, retry, fits
    stats = model.stats_as_nested_dict()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 0)
    assert stat(model, "reserved_bytes") == 50 * MiB
    with pytest.raises(allocator.OutOfMemoryError) as info:
        model.malloc(15 * MiB)  # a 16 MiB segment: 66 MiB > 64 even with nothing cached
    stats = model.stats_as_nested_dict()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (2, 1)
    assert str(info.value).startswith(
        "Neuron out of memory. Tried to allocate 16.00 MiB. Neuron device 0 has a total capacity of 64.00 MiB of "
        "which 14.00 MiB is free. Of the allocated memory 50.00 MiB is allocated by PyTorch, and 0 bytes is reserved "
        "by PyTorch but unallocated."
    )
    assert stat(model, "allocated_bytes") == 50 * MiB
    assert model.malloc(12 * MiB).size == 12 * MiB  # a smaller request still fits
    model.free(b)


def test_overcommit_releases_the_cache_and_retries_before_it_grants_past_the_capacity():
    """Plan mode's allocator (`overcommit`) runs on past an allocation that does not fit, but only after the real
    allocator's release of the cache and retry: a cached segment is not counted as reserved past that point (plans
    had lifted the capacity instead, so the cache was never released and its bytes were reported as not fitting)."""
    model = DeviceAllocator(0, 64 * MiB)
    model.overcommit = True
    model.free(model.malloc(40 * MiB))  # 40 MiB cached
    model.malloc(50 * MiB)  # 40 + 50 > 64: the cache is released, 50 fits
    stats = model.stats_as_nested_dict()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 0)
    assert stat(model, "reserved_bytes") == 50 * MiB
    model.malloc(20 * MiB)  # 70 > 64 with nothing cached: granted, counted as an OOM
    stats = model.stats_as_nested_dict()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (2, 1)
    assert stat(model, "reserved_bytes") == stat(model, "reserved_bytes", metric="peak") == 70 * MiB


def test_fraction_caps_reserved_memory():
    model = DeviceAllocator(0, 64 * MiB)
    model.fraction = 0.5
    model.malloc(30 * MiB)
    with pytest.raises(allocator.OutOfMemoryError, match=r"is free\. 32\.00 MiB allowed; Of the allocated"):
        model.malloc(MiB + 1)  # a 20 MiB segment: 50 MiB > 32 MiB allowed
    model.fraction = 1.0
    model.malloc(MiB + 1)


def test_peaks_and_accumulated_counters_reset():
    model = DeviceAllocator(0, GiB)
    model.free(model.malloc(12 * MiB))
    assert stat(model, "allocated_bytes", metric="peak") == 12 * MiB
    model.reset_peak()
    assert stat(model, "allocated_bytes", metric="peak") == 0
    assert stat(model, "reserved_bytes", metric="peak") == 12 * MiB  # still reserved: peak restarts from current
    model.reset_accumulated()
    stats = model.stats_as_nested_dict()
    assert stats["allocated_bytes"]["all"]["allocated"] == stats["allocated_bytes"]["all"]["freed"] == 0
    assert stats["num_device_alloc"] == 0


def test_format_size_matches_cuda():
    assert [allocator.format_size(n) for n in (0, 1024, 1025, MiB, 20 * MiB, 24 * GiB)] == [
        "0 bytes", "1024 bytes", "1.00 KiB", "1024.00 KiB", "20.00 MiB", "24.00 GiB"
    ]


# -- torch.neuron's memory API -------------------------------------------------------------------------------------


def test_allocation_and_free_are_counted_in_rounded_blocks():
    gc.collect()
    base = torch.neuron.memory_allocated()
    requested = torch.neuron.memory_stats()["requested_bytes.all.current"]
    t = torch.empty(1000, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_allocated() == base + 4096
    assert torch.neuron.memory_stats()["requested_bytes.all.current"] == requested + 4000
    del t
    assert torch.neuron.memory_allocated() == base


def test_op_results_and_views_are_counted_once():
    gc.collect()
    a = torch.ones(1000, device="neuron")
    base = torch.neuron.memory_allocated()
    b = a * 2
    view = a[10:20]
    assert torch.neuron.memory_allocated() == base + 4096
    del b, view
    assert torch.neuron.memory_allocated() == base


def test_adopted_host_memory_is_charged_for_the_whole_storage_it_spans():
    gc.collect()
    base = torch.neuron.memory_allocated(2)
    host = torch.empty(3000, dtype=torch.uint8)
    whole = allocator.adopt_tracked(torch.empty(0, dtype=torch.uint8).set_(host.untyped_storage()), 2)
    assert whole.untyped_storage().nbytes() == 3000
    assert torch.neuron.memory_allocated(2) == base + 3072
    del whole
    assert torch.neuron.memory_allocated(2) == base


def test_host_memory_charged_once_whoever_holds_it():
    """`adopt_charged` of a host buffer charged already (a compiled forward's result that its backward also saves):
    one charge for the device tensor and the host tensor together, freed when the last of them dies; of a host
    buffer not charged, `adopt_tracked`'s charge."""
    from neuron_device import services

    gc.collect()
    base = torch.neuron.memory_allocated(2)
    for device_dies_first in (True, False):
        saved = torch.empty(3000, dtype=torch.uint8)
        assert services.track_storage(saved.untyped_storage(), 2)
        output = allocator.adopt_charged(saved, 2)
        assert torch.neuron.memory_allocated(2) == base + 3072
        if device_dies_first:
            del output
        else:
            del saved
        assert torch.neuron.memory_allocated(2) == base + 3072  # the other still holds the memory
        output = saved = None
        assert torch.neuron.memory_allocated(2) == base
    fresh = allocator.adopt_charged(torch.empty(1000, dtype=torch.uint8), 2)
    assert torch.neuron.memory_allocated(2) == base + 1024
    del fresh
    assert torch.neuron.memory_allocated(2) == base


def test_stats_are_per_device():
    gc.collect()
    before = [torch.neuron.memory_allocated(i) for i in range(2)]
    t = torch.empty(256, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(0) == before[0]
    assert torch.neuron.memory_allocated("neuron:1") == before[1] + 512
    assert torch.neuron.memory_allocated(torch.device("neuron", 1)) == before[1] + 512
    del t


def test_storage_resize_is_charged_like_a_new_allocation():
    gc.collect()
    base = torch.neuron.memory_allocated(2)
    storage = torch.zeros(100, dtype=torch.uint8, device="neuron:2").untyped_storage()
    assert torch.neuron.memory_allocated(2) == base + 512
    torch.neuron.reset_peak_memory_stats(2)
    storage.resize_(3 * MiB)
    assert torch.neuron.memory_allocated(2) == base + 3 * MiB
    assert torch.neuron.max_memory_allocated(2) == base + 3 * MiB + 512  # new block before the old one is freed
    storage.resize_(0)
    assert torch.neuron.memory_allocated(2) == base
    storage.resize_(1000)
    assert torch.neuron.memory_allocated(2) == base + 1024
    del storage
    assert torch.neuron.memory_allocated(2) == base


def test_memory_stats_has_cuda_keys():
    stats = torch.neuron.memory_stats()
    arrays = ["active", "active_bytes", "allocated_bytes", "allocation", "inactive_split", "inactive_split_bytes",
              "requested_bytes", "reserved_bytes", "segment"]
    expected = {f"{a}.{p}.{m}" for a in arrays for p in ("all", "large_pool", "small_pool")
                for m in ("current", "peak", "allocated", "freed")}
    expected |= {f"{a}.{m}" for a in ("oversize_allocations", "oversize_segments")
                 for m in ("current", "peak", "allocated", "freed")}
    expected |= {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
                 "max_split_size"}
    assert set(stats) == expected
    assert list(stats) == sorted(stats)
    assert stats["max_split_size"] == -1
    nested = torch.neuron.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]


def test_reserved_follows_the_cache_and_empty_cache():
    gc.collect()
    torch.neuron.empty_cache()
    reserved = torch.neuron.memory_reserved()
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() == reserved + 20 * MiB
    assert torch.neuron.max_memory_reserved() >= reserved + 20 * MiB
    del t
    assert torch.neuron.memory_reserved() == reserved + 20 * MiB  # cached, as on CUDA
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == reserved


def test_mem_get_info_and_properties_agree():
    free, total = torch.neuron.mem_get_info()
    assert total == torch.neuron.get_device_properties(0).total_memory == 24 * GiB
    assert free == total - torch.neuron.memory_reserved()


def test_memory_fraction_api_validates_like_cuda():
    assert torch.neuron.get_per_process_memory_fraction(3) == 1.0
    with pytest.raises(TypeError, match="must be `float`"):
        torch.neuron.set_per_process_memory_fraction(1, 3)
    with pytest.raises(ValueError, match=r"Invalid fraction value: 1\.5\. Allowed range: 0~1"):
        torch.neuron.set_per_process_memory_fraction(1.5, 3)
    with pytest.raises(ValueError, match=r"Invalid fraction value: nan\. Allowed range: 0~1"):  # refused at the call
        torch.neuron.set_per_process_memory_fraction(float("nan"), 3)
    assert torch.neuron.get_per_process_memory_fraction(3) == 1.0
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.set_per_process_memory_fraction(0.5, 9)


def test_memory_summary_is_a_cuda_style_table():
    gc.collect()
    base = torch.neuron.memory_allocated(3)
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron:3")
    summary = torch.neuron.memory_summary("neuron:3")
    lines = summary.splitlines()
    assert {len(line) for line in lines} == {77}
    assert "PyTorch Neuron memory summary, device ID 3" in lines[1]
    allocated_row = next(line for line in lines if line.startswith("| Allocated memory"))
    assert allocated_row.split("|")[2].strip() == f"{(base + 5 * MiB) // KiB} KiB"  # CUDA's scaling: KiB to 768 MiB
    assert "from small pool" in summary
    assert "from small pool" not in torch.neuron.memory_summary(3, abbreviated=True)
    del t


def test_memory_snapshot_lists_segments_and_blocks():
    gc.collect()
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:3")
    segments = [s for s in torch.neuron.memory_snapshot() if s["device"] == 3]
    live = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(s["total_size"] for s in segments) == torch.neuron.memory_reserved(3)
    assert sum(b["size"] for b in live) == torch.neuron.memory_allocated(3)
    assert any(b["size"] == 3 * MiB and b["requested_size"] == 3 * MiB for b in live)
    del t


def test_empty_cache_keeps_live_memory():
    t = torch.ones(100, device="neuron")
    before = torch.neuron.memory_allocated()
    torch.neuron.empty_cache()
    assert torch.neuron.memory_allocated() == before
    assert torch.equal(t.cpu(), torch.ones(100))


def test_accelerator_memory_api_routes_to_neuron():
    gc.collect()
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    assert torch.accelerator.memory_allocated("neuron:0") == torch.neuron.memory_allocated(0)
    assert torch.accelerator.memory_reserved(0) == torch.neuron.memory_reserved(0)
    assert torch.accelerator.max_memory_reserved(0) == torch.neuron.max_memory_reserved(0)
    assert torch.accelerator.get_memory_info(0) == torch.neuron.mem_get_info(0)
    assert torch.accelerator.memory_stats(0) == torch.neuron.memory_stats(0)
    torch.accelerator.reset_accumulated_memory_stats(0)
    assert torch.neuron.memory_stats(0)["allocation.all.allocated"] == 0
    del t


def test_peak_memory_like_accelerate():
    """accelerate's `test_peak_memory_usage` measures a training step with only these calls; used <= peaked, and the
    numbers are exactly what the step left allocated."""

    def measure(step):
        gc.collect()
        torch.accelerator.empty_cache()
        torch.accelerator.reset_peak_memory_stats()
        begin = torch.accelerator.memory_allocated()
        kept = step()
        gc.collect()
        torch.accelerator.empty_cache()
        end, peak = torch.accelerator.memory_allocated(), torch.accelerator.max_memory_allocated()
        assert (end, peak) == (torch.neuron.memory_allocated(), torch.neuron.max_memory_allocated())
        return begin, end, peak, kept

    model = torch.nn.Linear(256, 512, device="neuron")  # weight 512 KiB, bias 2 KiB
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        model(torch.randn(64, 256, device="neuron")).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    begin, end, peak, _ = measure(step)
    assert end - begin == 512 * KiB + 2 * KiB  # the momentum buffers stay; gradients and activations are gone
    assert peak - begin >= end - begin + 128 * KiB  # the (64, 512) activation lived during the step
    begin, end, peak, _ = measure(step)
    assert end == begin  # the next step leaves nothing behind


def test_concurrent_allocations_keep_exact_accounts():
    gc.collect()
    base = torch.neuron.memory_stats(2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            kept = []
            for i in range(200):
                kept.append(torch.empty(1000 + 7 * i + seed, dtype=torch.uint8, device="neuron:2"))
                if i % 3 == 0:
                    kept.pop(0)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    stats = torch.neuron.memory_stats(2)
    assert errors == []
    assert stats["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert stats["allocation.all.allocated"] - base["allocation.all.allocated"] == 800
    assert stats["allocation.all.freed"] - base["allocation.all.freed"] == 800


def test_a_storage_dying_inside_the_allocator_does_not_wait_for_its_lock():
    """A storage can die while its device's lock is held (garbage collection during an allocation): its block is
    queued, not freed in place, and counted as free at the next look."""
    gc.collect()
    base = torch.neuron.memory_allocated(2)
    holder = [torch.empty(4096, dtype=torch.uint8, device="neuron:2")]
    model = allocator.device(2)
    dropper = threading.Thread(target=holder.clear)
    with model.lock:
        dropper.start()
        dropper.join(timeout=30)
        assert not dropper.is_alive()
        assert len(model.pending) == 1
    assert torch.neuron.memory_allocated(2) == base
    assert not model.pending


def test_device_conversion_out_of_memory_keeps_the_accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`x.to(dtype)` on the device takes its device memory first: an OOM leaves the accounts as they were."""
    x = torch.ones(1024, device="neuron")
    gc.collect()
    before = torch.neuron.memory_allocated()

    def full(nbytes: int) -> None:
        raise allocator.OutOfMemoryError("full")

    monkeypatch.setattr(allocator.device(x.device.index), "malloc", full)
    with pytest.raises(torch.OutOfMemoryError, match="full"):
        x.to(torch.float64)
    monkeypatch.undo()
    assert torch.neuron.memory_allocated() == before
    converted = x.to(torch.float64)
    assert converted.device == x.device and converted.dtype == torch.float64 and converted.sum().item() == 1024


def test_device_tensors_cannot_be_pinned_as_on_cuda() -> None:
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty(2, device="neuron", pin_memory=True)
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        torch.empty_strided((2,), (1,), device="neuron", pin_memory=True)


def test_a_block_handed_out_again_is_judged_once_per_state_of_its_pool():
    """The steady state of a loop (each result dies before the next op asks for its size) decides whether the
    queued block can be handed out again once, and again only after its pool's free blocks changed."""

    class Judging(DeviceAllocator):
        judged = 0

        def _reuse_kind(self, block, pool, size):
            self.judged += 1
            return super()._reuse_kind(block, pool, size)

    model = Judging(0, GiB)
    model.malloc(1000)  # a neighbour, so the reused block is a split one
    block = model.malloc(64)
    for _ in range(5):
        model.pending.append(block)
        assert model.malloc(64) is block
    assert model.judged == 1
    model.free(model.malloc(4096))  # the pool's free blocks change: the next reuse is judged anew
    model.pending.append(block)
    assert model.malloc(64) is block
    assert model.judged == 2
    assert stat(model, "allocation", metric="allocated") == 9


# -- queued allocations (`track` queues, the queue is replayed in one go) ------------------------------------------


def _read(model: DeviceAllocator, live: list) -> tuple:
    """Everything a program can read of `model`, and the blocks of its live storages (requests resolved)."""
    state = (model.stats_as_nested_dict(), model.segments())
    return (*state, [(b.address, b.size, b.requested) for b in (r if type(r) is allocator._Block else r[1]
                                                                     for r in live)])


@pytest.mark.parametrize("overcommit", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_queued_allocations_read_as_allocations_made_in_place(seed, overcommit):
    """A random program run twice, each allocation made in place (`malloc`) on one model and queued (`request`,
    as `track` does) on the other, storages dying through the queue on both: every read in between (statistics,
    peaks, segments, the live blocks) is the same, OutOfMemoryError (or with `overcommit`, plan mode's, the grant
    past the capacity) comes at the same request with the same message and counters, and a storage may die while
    its allocation is still queued."""
    import random

    rng = random.Random(seed)
    sizes = [512, 1000, 4096, 700 * KiB, MiB, MiB + 1, 3 * MiB, 9 * MiB, 12 * MiB, 19 * MiB]
    in_place, queued = DeviceAllocator(0, 64 * MiB), DeviceAllocator(0, 64 * MiB)
    in_place.overcommit = queued.overcommit = overcommit
    live: dict[str, list] = {"in_place": [], "queued": []}
    longest = ooms = 0
    for step in range(600):
        action = rng.random()
        if action < 0.5 or not live["queued"]:
            nbytes = rng.choice(sizes[:5] if rng.random() < 0.7 else sizes) + rng.choice((0, 0, 1, 100))
            outcomes, counted = [], in_place.stats_as_nested_dict()["num_ooms"]
            for side, make in (("in_place", in_place.malloc), ("queued", queued.request)):
                try:
                    live[side].append(make(nbytes))
                    outcomes.append(None)
                except allocator.OutOfMemoryError as error:
                    outcomes.append(str(error))
            assert outcomes[0] == outcomes[1], step
            ooms += in_place.stats_as_nested_dict()["num_ooms"] > counted
        elif action < 0.88:
            for _ in range(rng.choice((1, 1, 2, 3))):
                if live["queued"]:
                    position = rng.randrange(len(live["queued"]))
                    in_place.pending.append(live["in_place"].pop(position))
                    queued.pending.append(live["queued"].pop(position))  # its request: perhaps still queued
        elif action < 0.93:
            in_place.reset_peak(), queued.reset_peak()
        elif action < 0.95:
            in_place.reset_accumulated(), queued.reset_accumulated()
        elif action < 0.97:
            in_place.empty_cache(), queued.empty_cache()
        elif action < 0.985:
            fraction = rng.choice((0.5, 0.75, 1.0))
            in_place.fraction = queued.fraction = fraction
        else:
            assert _read(queued, live["queued"]) == _read(in_place, live["in_place"]), step
        longest = max(longest, sum(type(e) is allocator._Request and e[1] is None for e in queued.pending))
    assert _read(queued, live["queued"]) == _read(in_place, live["in_place"])
    assert longest > 8 and ooms > 0  # requests were queued, and some did not fit


def test_a_storage_dying_with_its_allocation_still_queued_is_freed_after_it():
    """An op's result that dies before the queue is replayed: its free is queued after its allocation, and a read
    sees both, as if made in place."""
    x = torch.ones(4096, device="neuron:1")
    gc.collect()
    before = torch.neuron.memory_stats(1)
    model = allocator.device(1)
    y = x * 2  # 16 KiB, queued
    request = allocator._holding_of(y.untyped_storage())[1]
    assert type(request) is allocator._Request and request[1] is None and model.pending[-1] is request
    del y
    assert list(model.pending)[-2:] == [request, request]  # allocated, then freed
    after = torch.neuron.memory_stats(1)
    assert not model.pending and request[1] is not None and not request[1].allocated
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.peak"] >= before["allocated_bytes.all.current"] + 16 * KiB
    assert after["allocation.all.allocated"] - before["allocation.all.allocated"] == 1
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == 1


def test_statistics_read_while_allocations_are_queued_count_them():
    """Every statistic read replays the queue first: results still queued are counted, at their peak too."""
    x = torch.ones(4096, device="neuron:1")
    gc.collect()
    torch.neuron.reset_peak_memory_stats(1)
    base = torch.neuron.memory_allocated(1)
    results = [x + i for i in range(5)]  # 16 KiB each
    assert sum(type(e) is allocator._Request for e in allocator.device(1).pending) == 5
    assert torch.neuron.memory_allocated(1) == base + 5 * 16 * KiB
    assert torch.neuron.max_memory_allocated(1) == base + 5 * 16 * KiB
    holdings = [allocator._holding_of(r.untyped_storage()) for r in results]
    assert [h.block.size for h in holdings] == [16 * KiB] * 5
    del results, holdings
    gc.collect()
    assert torch.neuron.memory_allocated(1) == base
    assert torch.neuron.max_memory_allocated(1) == base + 5 * 16 * KiB


def test_an_op_that_may_not_fit_is_allocated_at_once_and_raises_there():
    """Queued requests could exceed what is left: the op whose result might not fit replays the queue with it, so
    OutOfMemoryError (after the cache's release and retry) comes from that op."""
    gc.collect()
    torch.neuron.empty_cache()
    total = torch.neuron.get_device_properties(1).total_memory
    reserved = torch.neuron.memory_reserved(1)
    torch.neuron.set_per_process_memory_fraction((reserved + 8 * MiB) / total, 1)
    try:
        model = allocator.device(1)
        x = torch.ones(4096, device="neuron:1")  # a new 2 MiB segment
        before = torch.neuron.memory_stats(1)
        kept = [x + i for i in range(3)]  # in that segment, queued: each could still need a segment of its own
        assert sum(type(e) is allocator._Request and e[1] is None for e in model.pending) == 3
        with pytest.raises(torch.neuron.OutOfMemoryError) as info:
            x.repeat(192)  # 3 MiB: a 20 MiB segment
        assert not model.pending  # the queue was replayed with it
        allocated = format_size(before["allocated_bytes.all.current"] + 3 * 16 * KiB)
        assert "Tried to allocate 20.00 MiB. Neuron device 1" in str(info.value)
        assert f"Of the allocated memory {allocated} is allocated by PyTorch" in str(info.value)
        after = torch.neuron.memory_stats(1)
        assert after["num_ooms"] == before["num_ooms"] + 1
        assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
        del kept
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0, 1)


def test_a_segment_tracker_sees_every_allocation_as_it_is_made():
    """A tracker (plan mode's) reads its caller's context when a segment is made: with one installed nothing is
    queued, and installing one first makes what was queued."""
    model = DeviceAllocator(0, GiB)
    first = model.request(1000)
    assert first[1] is None
    seen: list[int] = []
    model.segment_tracker = seen.append
    assert first[1] is not None and seen == []  # made before the tracker was installed: not its to see
    second = model.request(3 * MiB)
    assert second[1] is not None and seen == [22 * MiB]
    model.segment_tracker = None
    assert model.request(3 * MiB)[1] is None
