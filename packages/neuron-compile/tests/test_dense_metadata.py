"""`_patches.dense_metadata_from_first_pass`: for a graph with DTensors, AOTAutograd's second metadata pass (the
dense -> dense function's, in `aot_dispatch_subclass`) is computed from the first pass's functional inner tensors
instead of running the graph through DTensor again. Each test compiles a graph with the patch on and, at that
pass, also runs torch's own pass on the same function and inputs: the two must agree field by field, and the
derivation must be taken where it applies and declined where it does not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from neuron_compile import _patches

pytestmark = pytest.mark.compiler

dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def mesh():
    """A two-rank mesh of a fake process group (this process is rank 0): DTensor's sharding, no collective runs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


def _differences(ours: Any, theirs: Any) -> list[str]:
    """The fields (and the attributes `__post_init__` derives) in which two `ViewAndMutationMeta`s differ."""
    differences = []
    for name in sorted(set(vars(ours)) | set(vars(theirs))):
        a, b = getattr(ours, name, None), getattr(theirs, name, None)
        if name == "traced_tangents":  # fake tensors: equal in what a tangent is made from
            a, b = ([(t.shape, t.stride(), t.dtype, type(t)) for t in v] for v in (a, b))
        elif name == "tokens":
            a, b = list(a), list(b)
        if a != b:
            differences.append(f"{name}: {a!r} != {b!r}")
    return differences


def _compile(fn, *args: Any) -> tuple[list[bool], list[list[str]]]:
    """`fn` compiled by AOTAutograd (compilers that return the graph) with the patch on: for each dense pass, whether
    it was derived, and how its result differs from torch's pass on the same call (compared as it is made, before
    AOTAutograd makes it runtime-safe)."""
    from unittest import mock

    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd import collect_metadata_analysis, graph_capture_wrappers

    derived, differences = [], []
    first_pass_inner = _patches._first_pass_inner

    def spied(*arguments: Any) -> Any:
        result = first_pass_inner(*arguments)
        derived.append(result is not None)
        return result

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        return gm.forward

    backend = aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph, keep_inference_input_mutations=True)
    torch._dynamo.reset()
    with mock.patch.object(_patches, "_first_pass_inner", spied), _patches.dense_metadata_from_first_pass():
        ours = graph_capture_wrappers.run_functionalized_fw_and_collect_metadata

        def both(f: Any, **kwargs: Any) -> Any:
            def run(*dense_args: Any) -> Any:
                result = ours(f, **kwargs)(*dense_args)
                theirs = collect_metadata_analysis.run_functionalized_fw_and_collect_metadata(f, **kwargs)(*dense_args)
                differences.append(_differences(result, theirs))
                return result

            return run

        with mock.patch.object(graph_capture_wrappers, "run_functionalized_fw_and_collect_metadata", both):
            torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return derived, differences


def _sharded(mesh, shape: tuple[int, ...], placement: Any) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(torch.randn(shape), mesh, [placement])


def test_a_decode_step_mutating_its_sharded_cache(mesh) -> None:
    """As transformers' `generate` decodes (no grad), with a weight that requires a gradient all the same."""
    from torch.distributed.tensor import Replicate, Shard

    def decode(x, w_in, w_out, cache, position, norm):
        cache.index_copy_(1, position.view(1), x @ w_in)
        return (cache.sum(1) @ w_out).full_tensor() * norm

    args = (_sharded(mesh, (2, 1, 8), Replicate()), _sharded(mesh, (8, 16), Shard(1)),
            _sharded(mesh, (16, 8), Shard(0)), _sharded(mesh, (2, 4, 16), Shard(2)), torch.tensor(1),
            torch.nn.Parameter(torch.ones(8)))  # a replicated weight: a plain input requiring a gradient
    with torch.no_grad():
        derived, differences = _compile(decode, *args)
    assert derived == [True] and differences == [[]]


def test_a_dtensor_output_and_outputs_aliasing_inputs(mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard

    def returns_a_dtensor(x, w):
        return torch.relu(x @ w)

    def returns_its_mutated_input(x, cache):
        cache.mul_(2)
        return cache, x + 1

    def returns_views_of_a_plain_input(x, w, y):
        return y.view(-1), (x @ w).redistribute(placements=[Replicate()]), y[0]

    x, w = _sharded(mesh, (2, 1, 8), Replicate()), _sharded(mesh, (8, 16), Shard(1))
    with torch.no_grad():
        cache = _sharded(mesh, (2, 4, 16), Shard(2))
        for fn, args in ((returns_a_dtensor, (x, w)), (returns_its_mutated_input, (x, cache)),
                         (returns_views_of_a_plain_input, (x, w, torch.randn(3, 4)))):
            derived, differences = _compile(fn, *args)
            assert derived == [True] and differences == [[]], fn.__name__


def test_a_plain_graph_has_no_dense_pass() -> None:
    def plain(a, b):
        a.add_(1)
        return a @ b

    with torch.no_grad():
        assert _compile(plain, torch.randn(3, 3), torch.randn(3, 3)) == ([], [])


def test_a_graph_with_a_weight_requiring_a_gradient_runs_torchs_pass(mesh) -> None:
    """With grad mode on, autograd records the run on a weight that requires a gradient (its outputs' `grad_fn`):
    the derivation declines and torch's pass runs."""
    from torch.distributed.tensor import Replicate, Shard

    x, w = _sharded(mesh, (2, 1, 8), Replicate()), _sharded(mesh, (8, 16), Shard(1)).requires_grad_()
    derived, differences = _compile(lambda x, w: torch.relu(x @ w), x, w)
    assert derived == [False] and differences == [[]]
