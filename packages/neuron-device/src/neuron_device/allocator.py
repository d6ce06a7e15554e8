"""Device memory: a model of CUDA's caching allocator, run against each device's simulated HBM capacity.

Storage is host memory (see `storage`), allocated by the CPU allocator and adopted as `neuron` storage; the host
bytes are freed by the CPU allocator as soon as the storage dies. What the device would hold is modelled here, with
the rules of PyTorch's CUDACachingAllocator, so `memory_allocated`/`memory_reserved` and out-of-memory behave as on
a GPU of the same size:

* sizes are rounded up to 512 bytes; requests of at most 1 MiB come from the small pool (2 MiB segments), larger
  ones from the large pool (20 MiB segments for requests under 10 MiB, else the size rounded up to 2 MiB);
* the smallest cached free block that fits is reused and split when the remainder is worth keeping (>= 512 bytes
  in the small pool, > 1 MiB in the large one); freed blocks merge with free neighbours of their segment;
* when a new segment does not fit under the capacity (or the `set_per_process_memory_fraction` limit), every
  unsplit cached segment is released and the allocation retried once (`num_alloc_retries`); if it still does not
  fit, `OutOfMemoryError` is raised (`num_ooms`). `empty` checks before it takes any host memory; `adopt_tracked`
  charges memory an op result already holds on the host, which is dropped with the error. With `overcommit` (plan
  mode, which must run on past the first allocation that does not fit), that allocation is counted in `num_ooms`
  and granted beyond the capacity instead: every step before it, the release of the cache and the retry, is the
  real allocator's, so what is reserved above the capacity is what a real run could not hold.

Streams are not modelled (one stream per device). A storage's block is freed when the storage's Python object dies
(`_Holding`), which torch keeps alive exactly as long as the C++ StorageImpl. That may happen inside any allocation
(garbage collection), so it only queues the block; every allocator entry point drains the queue under the device
lock.

An op's result is charged (`track`) between two kernels, whose memory traffic has evicted the allocator's objects from
the CPU caches: run there, one at a time, the model costs several times what it costs run back to back. So `track`
queues its request (`_Request`) in the same queue, in order with the frees, and the queue is replayed in one go: at
every entry point and statistic read that drains it, after `_QUEUE_BOUND` requests, and at once whenever the requests
queued might not fit. `budget` counts the segments of `SMALL_BUFFER` bytes that the queued requests may still add:
the limit minus what was reserved at the last replay, in those units (every segment size is a multiple), each request
taking the largest segment it could add (`_segment_size` of its size: a request adds at most one segment, a free
none); a request that would take it below zero is replayed with the queue before `track` returns. Queued requests
therefore never release the cache, retry or fail: OutOfMemoryError, `num_alloc_retries` and `num_ooms` come at the op
that causes them, with the same message, and every statistic, peak and segment read is what the allocation in place
would give. A storage's holding keeps its request, not a block, until the replay fills it in; the request is queued
again when the storage dies, after its allocation. Changing the limit (`fraction`) or installing a
`segment_tracker` (which observes each new segment in its caller's context) replays the queue first, and nothing is
queued while a tracker is installed.

Every op result goes through `replay` and `_use` and, when it dies, `_free`, so all are written for speed: each
statistic changes by one signed amount per call, all of a call's statistics in one `_Stats.add_each`, and the totals
that follow from others are derived when read; the block objects `_free` merges away are reused by `_use`'s next
split, and a storage's `_Holding` and `_Request` are lists, so a result makes no Python object of the allocator's own
but those two. In a loop's steady state an op's result dies just before the next op asks for the same size;
`_reuse_pending` hands that block out again without merging and re-splitting it, with the statistics `_free` then
`malloc` would give.
Whether it can, and how the splits' statistics move, depends only on the block's neighbours and its pool's free
blocks, so it is decided once per state of the pool (`_Pool.version`, bumped by every change of its free blocks)
and kept on the block.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import contextvars
import math
import threading
from collections.abc import Callable, Iterator

import torch

from . import compile_time as _compile_time
from . import envvars
from . import storage as _storage
from . import topology as _topology
from .barrier import flush_barrier

__all__ = [
    "DeviceAllocator",
    "OutOfMemoryError",
    "adopt_charged",
    "adopt_tracked",
    "allocating_from",
    "allocation_source",
    "device",
    "empty",
    "format_size",
    "resize",
    "track",
]

MIN_BLOCK_SIZE = 512  # every block is a multiple of this
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # segment size of the small pool
LARGE_BUFFER = 20 << 20  # segment size for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # larger requests get a segment of their size rounded up to this
# Requests (of the small pool; a larger one counts as many as its segment holds small segments) after which `track`
# replays the queue. Each replay starts cold (after kernels): in the tiny Llama forward (86 requests, 172 entries) the
# CPU time in the replays was 402 us at 32 (2.6 replays per forward), 332 at 64, 293 at 128, 233 at 256 and 177 at
# 1000, where an entry costs what it does in a tight loop (6 December)
_QUEUE_BOUND = 256

_POOLS = ("all", "small_pool", "large_pool")
# The statistics kept. CUDA's "active" and "active_bytes" are reported as copies of "allocation" and
# "allocated_bytes": without streams, a freed block is never still in use by pending work.
_STAT_ARRAYS = (
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
)
(ALLOCATED_BYTES, ALLOCATION, INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES, REQUESTED_BYTES, RESERVED_BYTES,
 SEGMENT) = range(len(_STAT_ARRAYS))
_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms", "num_sync_all_streams")


class OutOfMemoryError(torch.OutOfMemoryError):
    """A `neuron` allocation does not fit in the device's (simulated) HBM. `torch.neuron.OutOfMemoryError`."""


def format_size(nbytes: int) -> str:
    """A byte count as CUDA's allocator writes it in messages ('512 bytes', '2.00 MiB', '24.00 GiB')."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1024**2:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1024**3:
        return f"{nbytes / 1024**2:.2f} MiB"
    return f"{nbytes / 1024**3:.2f} GiB"


class _Stats:
    """CUDA's statistics of one pool ("small_pool" or "large_pool"): for each of `_STAT_ARRAYS`, its current and peak
    value and total increase ("allocated"). Lists, for cheap updates.

    What follows from these is derived when read, not kept per call: the total decrease ("freed") is
    `allocated - (current - base)`, `base` being `current` when the totals were last reset; the "all" pool is the sum
    of the two pools, except for its peak, `peak_all`, which both pools share.
    """

    __slots__ = ("allocated", "base", "current", "other", "peak", "peak_all")

    def __init__(self, peak_all: list[int]) -> None:
        count = len(_STAT_ARRAYS)
        self.current, self.peak, self.allocated, self.base = [0] * count, [0] * count, [0] * count, [0] * count
        self.peak_all = peak_all
        self.other: _Stats = self  # the other pool, set by the allocator

    def add(self, index: int, amount: int) -> None:
        """Change statistic `index` by the signed `amount`. Callers pass one net amount per statistic per call, as
        CUDA updates its stats: a peak sees the net value, not the steps to it."""
        if amount > 0:
            self.rise_and_fall(index, amount)
        self.current[index] += amount

    def add_each(self, changes: tuple[tuple[int, int], ...]) -> None:
        """`add` of each (statistic, signed amount) of `changes` (distinct statistics), in one call: the statistics
        an op's result moves (its allocation, the split it leaves, the merges of its block when it dies)."""
        current, allocated, peak, peak_all, other = self.current, self.allocated, self.peak, self.peak_all, \
            self.other.current
        for index, amount in changes:
            value = current[index] = current[index] + amount
            if amount > 0:  # a decrease only lowers `current`
                allocated[index] += amount
                if value > peak[index]:
                    peak[index] = value
                value += other[index]
                if value > peak_all[index]:
                    peak_all[index] = value

    def rise_and_fall(self, index: int, amount: int) -> None:
        """`add(index, amount)` then `add(index, -amount)` (amount > 0): the total and the peaks of the rise, the
        current value unchanged (`add` of an increase is this, then the current value's change)."""
        value = self.current[index] + amount
        self.allocated[index] += amount
        if value > self.peak[index]:
            self.peak[index] = value
        value += self.other.current[index]
        if value > self.peak_all[index]:
            self.peak_all[index] = value

    def freed(self, index: int) -> int:
        return self.allocated[index] - self.current[index] + self.base[index]

    def as_dict(self, index: int) -> dict[str, int]:
        return {"current": self.current[index], "peak": self.peak[index], "allocated": self.allocated[index],
                "freed": self.freed(index)}

    def as_dict_all(self, index: int) -> dict[str, int]:
        """The "all" pool: this pool plus the other one."""
        other = self.other
        return {"current": self.current[index] + other.current[index], "peak": self.peak_all[index],
                "allocated": self.allocated[index] + other.allocated[index],
                "freed": self.freed(index) + other.freed(index)}


class _Block:
    """A piece of a segment of simulated device memory; `prev`/`next` link the pieces of one segment."""

    __slots__ = ("address", "allocated", "next", "prev", "ref", "requested", "reuse", "size", "small")

    def __init__(self, size: int, address: int, small: bool) -> None:
        self.size = size
        self.address = address
        self.small = small
        self.requested = 0
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.reuse: tuple[int, int, int] | None = None  # `DeviceAllocator._reuse_pending`'s verdict, by pool version

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """One pool of blocks: its free blocks, ordered by (size, address) so the best fit is a bisection away, and the
    statistics of all its blocks."""

    __slots__ = ("entries", "stats", "version")

    def __init__(self, stats: _Stats) -> None:
        self.entries: list[tuple[int, int, _Block]] = []
        self.stats = stats
        # Bumped by every change of `entries` (made by the allocator's `malloc`, `_use`, `_free` and
        # `_release_cached`, inline). Every change of a block's neighbours (split, merge, freed, taken) changes its
        # pool's free blocks, so what was decided from them holds while the version does.
        self.version = 0


# What handing a queued block out again does to the inactive splits (`DeviceAllocator._reuse_pending`)
_DRAIN, _REUSE_ALONE, _REUSE_SPLIT, _REUSE_SPLIT_MERGED, _REUSE_UNSPLIT_MERGED = range(5)


def _segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class DeviceAllocator:
    """The caching-allocator model of one device: pools, segments and CUDA's statistics."""

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index
        self.capacity = capacity
        self._fraction = 1.0
        self.overcommit = False  # grant, and count in num_ooms, what does not fit after the retry (plan mode)
        self.lock = threading.Lock()
        # Requests queued by `track` and blocks (or requests) freed by storage callbacks, in the order they were made
        self.pending: collections.deque[_Block | _Request] = collections.deque()
        # Segments of SMALL_BUFFER bytes the queued requests may still add without any of them risking to fail, at
        # most _QUEUE_BOUND (see the module's doc): below zero, the queue is replayed. Small numbers, for speed.
        self.budget = min(_QUEUE_BOUND, capacity // SMALL_BUFFER)
        peak_all = [0] * len(_STAT_ARRAYS)
        small, large = _Stats(peak_all), _Stats(peak_all)
        small.other, large.other = large, small
        self._pools = {True: _Pool(small), False: _Pool(large)}  # keyed by "small"
        self._next_address = 1 << 40  # simulated device addresses: order and identity of blocks only
        # the first block of every reserved segment, by address (the segment's): `segments` walks them
        self._heads: dict[int, _Block] = {}
        # Blocks merged into a neighbour (`_free`), referenced nowhere else: `_use` reuses them for the blocks it
        # splits off, so an op's result makes no Python object here in a steady state
        self._spare: list[_Block] = []
        self._counters = dict.fromkeys(_COUNTERS, 0)
        # Called with the reserved bytes after each new segment, as CUDA's allocator calls its trace trackers
        # (`attachAllocatorTraceTracker`) on a "segment_alloc": a planner, whose allocator overcommits, sees the
        # allocation that goes past the HBM, whatever makes it (an op, a compiled graph's output).
        # Called with `lock` held.
        self._segment_tracker: Callable[[int], None] | None = None

    # -- statistics ------------------------------------------------------------------------------------------------

    def _current(self, index: int) -> int:
        """Current value of statistic `index` in the "all" pool."""
        return self._pools[True].stats.current[index] + self._pools[False].stats.current[index]

    @property
    def limit(self) -> int:
        """Bytes this process may reserve on the device: capacity times the per-process fraction."""
        return self.capacity if self._fraction >= 1.0 else int(self._fraction * self.capacity)

    @property
    def fraction(self) -> float:
        """The per-process fraction of the capacity (`set_per_process_memory_fraction`)."""
        return self._fraction

    @fraction.setter
    def fraction(self, fraction: float) -> None:
        with self.lock:  # the queued requests were judged against the old limit: they are made under it
            self.replay()
            self._fraction = fraction
            self.budget = self._budget()

    @property
    def segment_tracker(self) -> Callable[[int], None] | None:
        """Called with the reserved bytes after each new segment (see `__init__`)."""
        return self._segment_tracker

    @segment_tracker.setter
    def segment_tracker(self, tracker: Callable[[int], None] | None) -> None:
        with self.lock:  # the requests queued before are not the new tracker's to see
            self.replay()
            self._segment_tracker = tracker
            self.budget = self._budget()

    def _budget(self) -> int:
        """`budget` with nothing queued. A tracker reads its caller's context (the op, the module) when a segment is
        made, so with one installed every request is made at once."""
        if self._segment_tracker is not None:
            return -1
        return min(_QUEUE_BOUND, (self.limit - self._current(RESERVED_BYTES)) // SMALL_BUFFER)

    def request(self, nbytes: int) -> _Request:
        """Queue the allocation of `nbytes` (> 0) for a new storage (`track`): `[nbytes, block]`, the block made at
        the next replay, at once if the request might not fit (OutOfMemoryError then)."""
        request = [nbytes, None]
        with self.lock:
            self.pending.append(request)
            if nbytes <= SMALL_SIZE:
                self.budget -= 1
            else:
                self.budget -= _segment_size(-(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE) // SMALL_BUFFER
            if self.budget < 0:
                self.replay()
        return request

    def drain(self) -> None:
        """Return the freed blocks at the head of the queue (queued before any allocation still queued) to their
        pools. Caller holds `lock`."""
        pending = self.pending
        while pending:
            block = pending[0]
            if type(block) is _Request:
                block = block[1]
                if block is None:
                    return
            pending.popleft()
            self._free(block)

    def replay(self) -> None:
        """Replay the queue: make the queued requests' allocations and return the freed blocks to their pools, in the
        order they were queued. Caller holds `lock`.

        Every op result's allocation is made here: the pool's best fit is written out inline."""
        pending, pools = self.pending, self._pools
        try:
            while pending:
                entry = pending[0]
                if type(entry) is _Request:
                    block = entry[1]
                    if block is None:  # its allocation: every entry queued before it is done
                        pending.popleft()
                        nbytes = entry[0]
                        size = -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE  # at least MIN_BLOCK_SIZE: nbytes > 0
                        small = size <= SMALL_SIZE
                        pool = pools[small]
                        entries = pool.entries  # `take_best_fit`
                        position = bisect.bisect_left(entries, (size,))
                        if position < len(entries):
                            pool.version += 1
                            block = entries.pop(position)[2]
                        else:
                            block = self._new_block(size, pool, small)
                        entry[1] = self._use(block, size, nbytes, pool)
                        continue
                    pending[0] = entry = block  # its storage died: the free of the block it got
                if len(pending) > 1:  # the steady state of a loop: a result dies, the next op asks for its size
                    following = pending[1]
                    if (type(following) is _Request and following[1] is None
                            and -(-following[0] // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE == entry.size):
                        reused = self._reuse_pending(entry.size, following[0])
                        if reused is not None:
                            following[1] = reused
                        continue
                pending.popleft()
                self._free(entry)
        finally:
            self.budget = self._budget()

    def allocated(self) -> int:
        with self.lock:
            self.replay()
            return self._current(ALLOCATED_BYTES)

    def stats_as_nested_dict(self) -> dict:
        """CUDA's `memory_stats_as_nested_dict` layout."""
        with self.lock:
            self.replay()
            small, large = self._pools[True].stats, self._pools[False].stats
            result: dict = dict(self._counters)
            for index, name in enumerate(_STAT_ARRAYS):
                result[name] = {"all": small.as_dict_all(index), "small_pool": small.as_dict(index),
                                "large_pool": large.as_dict(index)}
            result["active"] = {pool: dict(stat) for pool, stat in result["allocation"].items()}
            result["active_bytes"] = {pool: dict(stat) for pool, stat in result["allocated_bytes"].items()}
            zero = dict.fromkeys(("current", "peak", "allocated", "freed"), 0)
            result["oversize_allocations"] = dict(zero)  # no block is ever oversize: max_split_size is unlimited
            result["oversize_segments"] = dict(zero)
            result["max_split_size"] = -1
            return result

    def reset_peak(self) -> None:
        with self.lock:
            self.replay()
            small, large = self._pools[True].stats, self._pools[False].stats
            small.peak[:] = small.current
            large.peak[:] = large.current
            small.peak_all[:] = [a + b for a, b in zip(small.current, large.current, strict=True)]

    def reset_accumulated(self) -> None:
        with self.lock:
            self.replay()
            for pool in self._pools.values():
                stats = pool.stats
                stats.allocated[:] = [0] * len(_STAT_ARRAYS)
                stats.base[:] = stats.current
            self._counters = dict.fromkeys(_COUNTERS, 0)

    def segments(self) -> list[dict]:
        """Every reserved segment and its blocks, like one device's part of `torch.cuda.memory_snapshot()`."""
        with self.lock:
            self.replay()
            firsts = self._heads
            result = []
            for address in sorted(firsts):
                block, blocks = firsts[address], []
                while block is not None:
                    state = "active_allocated" if block.allocated else "inactive"
                    blocks.append({"address": block.address, "size": block.size,
                                   "requested_size": block.requested, "state": state})
                    block = block.next
                result.append({
                    "device": self.index,
                    "address": address,
                    "total_size": sum(b["size"] for b in blocks),
                    "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "segment_type": "small" if firsts[address].small else "large",
                    "blocks": blocks,
                })
            return result

    # -- allocation ------------------------------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> _Block:
        """A block for `nbytes` (> 0), made now (after the queue), reusing cached memory when possible;
        OutOfMemoryError if it cannot fit."""
        request = [nbytes, None]
        with self.lock:
            self.pending.append(request)
            self.replay()
        return request[1]

    def _new_block(self, size: int, pool: _Pool, small: bool) -> _Block:
        """A new segment for a request of `size` that no cached block fits: after releasing the cache and a retry if
        it does not fit, beyond the capacity if overcommitting, else OutOfMemoryError."""
        segment = _segment_size(size)
        block = self._new_segment(segment, pool, small)
        if block is None:
            self._release_cached()
            self._counters["num_alloc_retries"] += 1
            block = self._new_segment(segment, pool, small)
        if block is None:
            self._counters["num_ooms"] += 1
            if not self.overcommit:
                raise OutOfMemoryError(self._oom_message(segment))
            block = self._new_segment(segment, pool, small, over_limit=True)
        return block

    def _reuse_pending(self, size: int, requested: int) -> _Block | None:
        """The block of `size` first in the queue, freed, and the request of `requested` bytes of that size after it
        (`replay` checked both): when the block is what `_free` then `malloc` of `size` would hand out again, in the
        same place and leaving the same pieces, hand it out without the merge and split, with the statistics changed
        exactly as those two would (the steady state of a loop: each op's result dies before the next op allocates
        the same size), both entries dequeued. None: the block returned the ordinary way (`drain`), the request
        still queued. Caller holds `lock`."""
        pending = self.pending
        block = pending[0]
        pool = self._pools[block.small]
        verdict = block.reuse
        if verdict is None or verdict[0] != pool.version:  # decided once per state of the pool's free blocks
            verdict = block.reuse = (pool.version, *self._reuse_kind(block, pool, size))
        kind = verdict[1]
        if kind == _DRAIN:
            self.drain()
            return None
        pending.popleft()
        pending.popleft()
        # The statistics as `_free` then `_use` would leave them. Each count falls and rises back, or rises and falls
        # back: only its total increase moves, and its peak if it rose first (a fall cannot move a peak, which is
        # never below the current value).
        stats = pool.stats
        allocated, current = stats.allocated, stats.current
        allocated[ALLOCATION] += 1
        allocated[ALLOCATED_BYTES] += size
        allocated[REQUESTED_BYTES] += requested  # `stats.add(REQUESTED_BYTES, requested)`, inline: every op
        value = current[REQUESTED_BYTES] = current[REQUESTED_BYTES] - block.requested + requested
        block.requested = requested
        if value > stats.peak[REQUESTED_BYTES]:
            stats.peak[REQUESTED_BYTES] = value
        value += stats.other.current[REQUESTED_BYTES]
        if value > stats.peak_all[REQUESTED_BYTES]:
            stats.peak_all[REQUESTED_BYTES] = value
        if kind == _REUSE_UNSPLIT_MERGED:  # freed: the neighbour merges into a whole segment; handed out: split again
            allocated[INACTIVE_SPLIT] += 1
            allocated[INACTIVE_SPLIT_BYTES] += verdict[2]
        elif kind == _REUSE_SPLIT_MERGED:  # freed: the merged block is an inactive split of `size` more bytes
            stats.rise_and_fall(INACTIVE_SPLIT_BYTES, size)
        elif kind == _REUSE_SPLIT:  # freed: the block is an inactive split; handed out: it is not
            stats.rise_and_fall(INACTIVE_SPLIT, 1)
            stats.rise_and_fall(INACTIVE_SPLIT_BYTES, size)
        return block

    def _reuse_kind(self, block: _Block, pool: _Pool, size: int) -> tuple[int, int]:
        """How `_free` then `malloc` of `size` would change the inactive splits around the queued `block`
        (`_REUSE_*`, with the size of the free neighbour it would merge), or `_DRAIN` if they would not hand `block`
        out again as it is."""
        previous, following = block.prev, block.next
        merges_next = following is not None and not following.allocated
        if (
            (previous is not None and not previous.allocated)  # `_free` would merge the block into its predecessor
            or self._fits_before(pool, size, following if merges_next else None,
                                 size + following.size if merges_next else size, block.address)
        ):
            return _DRAIN, 0
        split = previous is not None or (following.next if merges_next else following) is not None
        if merges_next:
            return (_REUSE_SPLIT_MERGED if split else _REUSE_UNSPLIT_MERGED), following.size
        return (_REUSE_SPLIT if split else _REUSE_ALONE), 0

    @staticmethod
    def _fits_before(pool: _Pool, size: int, absorbed: _Block | None, merged_size: int, address: int) -> bool:
        """Whether a free block of `pool` other than `absorbed` is a better fit for `size` than a free block of
        `merged_size` at `address` would be (best fit: smallest size, then lowest address)."""
        entries = pool.entries
        position = bisect.bisect_left(entries, (size,))
        if position < len(entries) and entries[position][2] is absorbed:
            position += 1
        if position == len(entries):
            return False
        best = entries[position]
        return best[0] < merged_size or (best[0] == merged_size and best[1] < address)

    def _new_segment(self, size: int, pool: _Pool, small: bool, over_limit: bool = False) -> _Block | None:
        if not over_limit and self._current(RESERVED_BYTES) + size > self.limit:
            return None
        block = self._heads[self._next_address] = _Block(size, self._next_address, small)
        self._next_address += size
        pool.stats.add(SEGMENT, 1)
        pool.stats.add(RESERVED_BYTES, size)
        self._counters["num_device_alloc"] += 1
        if self._segment_tracker is not None:
            self._segment_tracker(self._current(RESERVED_BYTES))
        return block

    def _use(self, block: _Block, size: int, requested: int, pool: _Pool) -> _Block:
        """Hand out `block` (taken from `pool` or fresh), splitting off the rest when worth keeping."""
        stats = pool.stats
        small = block.small
        previous = block.prev
        already_split = previous is not None or block.next is not None
        remaining = block.size - size
        if (remaining >= MIN_BLOCK_SIZE) if small else (remaining > SMALL_SIZE):
            spare = self._spare
            if spare:  # a block `_free` merged away, instead of a new object
                front = spare.pop()
                front.size, front.address, front.small, front.reuse = size, block.address, small, None
            else:
                front = _Block(size, block.address, small)
            front.prev = previous
            if previous is not None:
                previous.next = front
            else:
                self._heads[front.address] = front
            front.next = block
            block.prev = front
            block.address += size
            block.size = remaining
            bisect.insort(pool.entries, (remaining, block.address, block))  # `pool.insert`, inline: most ops
            pool.version += 1
            front.allocated = True
            front.requested = requested
            if already_split:
                stats.current[INACTIVE_SPLIT_BYTES] -= size  # `stats.add`: a decrease only lowers `current`
                stats.add_each(((ALLOCATION, 1), (REQUESTED_BYTES, requested), (ALLOCATED_BYTES, size)))
            else:  # a new inactive split of the rest
                stats.add_each(((ALLOCATION, 1), (REQUESTED_BYTES, requested), (ALLOCATED_BYTES, size),
                                (INACTIVE_SPLIT_BYTES, remaining), (INACTIVE_SPLIT, 1)))
            return front
        if already_split:
            current = stats.current
            current[INACTIVE_SPLIT_BYTES] -= block.size
            current[INACTIVE_SPLIT] -= 1
        block.allocated = True
        block.requested = requested
        stats.add_each(((ALLOCATION, 1), (REQUESTED_BYTES, requested), (ALLOCATED_BYTES, block.size)))
        return block

    def _free(self, block: _Block) -> None:
        """Return `block` to its pool, merged with its free neighbours (`_Pool.remove`, `_Block.absorb` and
        `_Pool.insert` written out: every op result that dies comes here)."""
        pool = self._pools[block.small]
        stats = pool.stats
        current = stats.current  # a decrease only lowers `current` (see `_Stats`)
        current[ALLOCATION] -= 1
        current[ALLOCATED_BYTES] -= block.size
        current[REQUESTED_BYTES] -= block.requested
        block.allocated = False
        block.requested = 0
        net_blocks = net_bytes = 0
        entries = pool.entries
        previous = block.prev
        if previous is not None and not previous.allocated:
            del entries[bisect.bisect_left(entries, (previous.size, previous.address))]
            block.size += previous.size  # `block.absorb(previous)`
            block.address = previous.address
            net_blocks -= 1
            net_bytes -= previous.size
            self._spare.append(previous)
            block.prev = previous = previous.prev
            if previous is not None:
                previous.next = block
            else:
                self._heads[block.address] = block  # the first block now: it absorbed the old one
        following = block.next
        if following is not None and not following.allocated:
            del entries[bisect.bisect_left(entries, (following.size, following.address))]
            block.size += following.size  # `block.absorb(following)`
            net_blocks -= 1
            net_bytes -= following.size
            self._spare.append(following)
            block.next = following = following.next
            if following is not None:
                following.prev = block
        bisect.insort(entries, (block.size, block.address, block))
        pool.version += 1
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        if net_blocks or net_bytes:
            stats.add_each(((INACTIVE_SPLIT, net_blocks), (INACTIVE_SPLIT_BYTES, net_bytes)))

    def _release_cached(self) -> None:
        """Give every cached, unsplit segment back to the device (CUDA's `release_cached_blocks`, which first
        synchronises all streams)."""
        self._counters["num_sync_all_streams"] += 1
        for pool in self._pools.values():
            kept = []
            for entry in pool.entries:
                block = entry[2]
                if block.is_split:
                    kept.append(entry)
                    continue
                del self._heads[block.address]
                pool.stats.add(SEGMENT, -1)
                pool.stats.add(RESERVED_BYTES, -block.size)
                self._counters["num_device_free"] += 1
            pool.entries = kept
            pool.version += 1

    def empty_cache(self) -> None:
        with self.lock:
            self.replay()
            self._release_cached()
            self.budget = self._budget()

    def free(self, block: _Block) -> None:
        with self.lock:
            self.replay()
            self._free(block)

    def _oom_message(self, segment: int) -> str:
        topo = _topology.topology()
        reserved = self._current(RESERVED_BYTES)
        allocated = self._current(ALLOCATED_BYTES)
        allowed = f"{format_size(self.limit)} allowed; " if self._fraction < 1.0 else ""
        return (
            f"Neuron out of memory. Tried to allocate {format_size(segment)}. Neuron device {self.index} has a total "
            f"capacity of {format_size(self.capacity)} of which {format_size(max(self.capacity - reserved, 0))} is "
            f"free. {allowed}Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
            f"{format_size(reserved - allocated)} is reserved by PyTorch but unallocated. (Simulated "
            f"{topo.target.name} logical NeuronCore, LNC={topo.lnc}.) If reserved but unallocated memory is large, "
            "call torch.neuron.empty_cache() to release it."
        )


_devices: dict[int, DeviceAllocator] = {}
_devices_lock = threading.Lock()


def device(index: int) -> DeviceAllocator:
    """The allocator model of device `index` (created on first use, sized from the topology)."""
    found = _devices.get(index)
    if found is None:
        with _devices_lock:
            found = _devices.get(index)
            if found is None:
                envvars.raise_deferred()  # the device's first memory: a bad setting seen at import is named now
                found = _devices[index] = DeviceAllocator(index, _topology.topology().hbm_bytes_per_device)
    return found


# -- storages <-> blocks ---------------------------------------------------------------------------------------------


# An allocation queued by `track` (`DeviceAllocator.request`): `[nbytes, block]`, the block None until the queue is
# replayed. The storage's holding keeps it, and the queue until it is made: the free of a storage that dies first
# comes after it. A plain list (no other entry of the queue is one), the cheapest object to make at every op.
_Request = list


class _Holding(list):
    """The device block a `neuron` storage holds (None: no bytes), in the storage's `__dict__` (`_HOLDING`):
    `[allocator, block]`, or `[allocator, request]` for a block `track` queued (`_Request`), which the queue holds
    in its turn (not the holding: it still dies with its storage).

    torch keeps a storage's Python object, and so its `__dict__`, exactly as long as the C++ StorageImpl: the
    storage's death drops the last reference to its holding, whose `__del__` queues the block. That is all the
    bookkeeping a storage costs (no weak reference, no registry); `resize` swaps the block of a live storage. A list,
    so that making one (every op's result) runs no Python `__init__`.
    """

    __slots__ = ()

    @property
    def allocator(self) -> DeviceAllocator:
        return self[0]

    @property
    def block(self) -> _Block | None:
        held = self[1]
        if type(held) is not _Request:
            return held
        if held[1] is None:  # still queued
            allocator = self[0]
            with allocator.lock:
                allocator.replay()
        return held[1]

    @block.setter
    def block(self, block: _Block | None) -> None:
        self[1] = block

    def __del__(self) -> None:
        block = self[1]  # or the request of a block `track` queued, freed once made
        if block is not None:
            self[0].pending.append(block)  # no lock: this may run inside an allocation (garbage collection)


_HOLDING = "_neuron_block"


def _bind(storage: torch.UntypedStorage, allocator: DeviceAllocator, block: _Block | None) -> None:
    storage.__dict__[_HOLDING] = _Holding((allocator, block))


def _holding_of(storage: torch.UntypedStorage) -> _Holding | None:
    return storage.__dict__.get(_HOLDING)


def _extent(size, stride, itemsize: int) -> int:
    """Bytes spanned by a tensor of these sizes and strides (torch's `computeStorageNbytes`)."""
    if 0 in size:
        return 0
    return itemsize * (1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True)))


_source: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "neuron_allocation_source", default=None)


@contextlib.contextmanager
def allocating_from(op: str, stack_trace: str | None) -> Iterator[None]:
    """Allocations in the block are made for `op`'s result, written at `stack_trace` (an FX node's, innermost frame
    last): a compiled graph's output adopted on the device, whose Python stack is the simulator's, not the line
    that made it."""
    token = _source.set((op, stack_trace))
    try:
        yield
    finally:
        _source.reset(token)


def allocation_source() -> tuple[str, str | None] | None:
    """(op, stack trace) of the innermost `allocating_from` block, or None outside one."""
    return _source.get()


def adopt_tracked(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """`storage.adopt`, charging the new storage to device `index` (OutOfMemoryError if it does not fit)."""
    return track(_storage.adopt(cpu_tensor, index), index)


def adopt_charged(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """`adopt_tracked`, unless `cpu_tensor`'s host storage is charged to the device already (`simulation.planned.
    track_storage`): the new storage then shares that charge, whose block is freed when neither storage is alive.

    For host memory that a `neuron` tensor and host tensors both hold: a compiled graph's result that is also saved
    for its backward as a host tensor (charged when the graph returned it) counts once, for as long as either holds
    it, as the one device buffer of a real run would.
    """
    holding = _holding_of(cpu_tensor.untyped_storage())
    if holding is None:
        return adopt_tracked(cpu_tensor, index)
    tensor = _storage.adopt(cpu_tensor, index)
    tensor.untyped_storage().__dict__[_HOLDING] = holding
    return tensor


def track(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Charge the storage of `tensor`, just adopted (`storage.adopt`) on device `index`, to that device
    (OutOfMemoryError if it does not fit); return `tensor`.

    The host memory exists already, so the storage is adopted first and charged for exactly the bytes it spans.
    A storage made at compile time (`compile_time`) is not charged, for its whole life. The allocation is queued
    (`DeviceAllocator.request`): every op's result comes here, between two kernels.
    """
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes and not _compile_time.now():
        allocator = _devices.get(index) or device(index)
        storage.__dict__[_HOLDING] = _Holding((allocator, allocator.request(nbytes)))  # `_bind`, inline: every op
    return tensor


_SHARED = "_neuron_shared"  # attribute of a device storage whose memory is shared memory: that CPU storage


def host_shared(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The CPU shared-memory storage that holds the bytes of the (non-empty) `neuron` storage `storage`: what
    another process maps to share it, as CUDA's IPC handle. The first call moves the bytes there, as
    `share_memory_` moves a CPU storage; the storage object, its device block and its tensors stay the same."""
    shared = storage.__dict__.get(_SHARED)
    if shared is not None and shared.data_ptr() == storage.data_ptr():  # not moved since (adaptive eager's results)
        return shared
    flush_barrier()  # adaptive eager: queued ops still read or write the old memory
    shared = torch.UntypedStorage._new_shared(storage.nbytes())
    fresh = _storage.adopt(torch.empty(0, dtype=torch.uint8).set_(shared), storage.device.index).untyped_storage()
    _bytes_of(fresh).copy_(_bytes_of(storage))
    _storage.replace_memory(storage, fresh)
    storage.__dict__[_SHARED] = shared
    return shared


def adopt_shared(shared: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    """A `neuron:index` storage over the CPU (shared-memory) storage `shared`, charged to the device: the receiving
    end of `host_shared`."""
    storage = adopt_tracked(torch.empty(0, dtype=torch.uint8).set_(shared), index).untyped_storage()
    storage.__dict__[_SHARED] = shared
    return storage


_INT64_MAX = 2**63 - 1


def empty(size, stride=None, *, dtype: torch.dtype, index: int, memory_format=None) -> torch.Tensor:
    """Allocate an uninitialised `neuron:index` tensor; the capacity check comes before any host memory is taken. At
    compile time (`compile_time`) it is not charged, for its whole life."""
    size = tuple(size)
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: {list(size)}")
    itemsize = dtype.itemsize
    if stride is None:
        nbytes = math.prod(size) * itemsize
    else:
        nbytes = _extent(size, tuple(stride), itemsize)
    if nbytes > _INT64_MAX:  # CPU's check and text (c10's computeStorageNbytes), before any OOM accounting
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)}")
    allocator = device(index)
    block = allocator.malloc(nbytes) if nbytes and not _compile_time.now() else None
    try:
        if stride is None:
            host = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
        else:
            host = torch.empty_strided(size, stride, dtype=dtype)
        tensor = _storage.adopt(host, index)
    except BaseException:
        if block is not None:
            allocator.free(block)
        raise
    if block is not None:
        _bind(tensor.untyped_storage(), allocator, block)
    return tensor


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A CPU uint8 tensor over all the bytes of a `neuron` storage."""
    return _storage.host_alias(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))


def resize(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Resize a `neuron` storage in place, keeping the bytes that fit (CUDA's `storage.resize_`; FSDP2 relies on it).

    As on CUDA, the new block is allocated (and checked against capacity) before the old one is freed. An adopted
    storage cannot grow or shrink its own memory, so the kept bytes move to a new host buffer whose data pointer is
    swapped into `storage` (`storage.replace_memory`).
    """
    if nbytes < 0:
        raise RuntimeError(f"Storage size must be non-negative, but got {nbytes}")
    old = storage.nbytes()
    if nbytes == old:
        return
    flush_barrier()  # adaptive eager: queued ops still read or write the old memory
    index = storage.device.index
    allocator = device(index)
    block = allocator.malloc(nbytes) if nbytes else None
    try:
        fresh = _storage.adopt(torch.empty(nbytes, dtype=torch.uint8), index).untyped_storage()
        kept = min(old, nbytes)
        if kept:
            _bytes_of(fresh)[:kept].copy_(_bytes_of(storage)[:kept])
        _storage.replace_memory(storage, fresh)  # the old bytes die with the returned holder
        storage.__dict__.pop(_SHARED, None)  # shared with other processes no more (as a resized CUDA storage)
    except BaseException:
        if block is not None:
            allocator.free(block)
        raise
    holding = _holding_of(storage)
    if holding is None:  # a storage that started empty: it had no block
        _bind(storage, allocator, block)
        return
    previous, holding.block = holding.block, block
    if previous is not None:
        allocator.free(previous)
