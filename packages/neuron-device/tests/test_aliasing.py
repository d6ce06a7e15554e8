"""Overlapping and aliased writes behave as on the CPU: the same error, or the same values (issue 19, item 1).

PyTorch's overlap and alias checks compare storages. Every host alias of a `neuron` storage is a view of one CPU
storage (`neuron_device.storage`), so those checks see what the CPU sees; before that, each alias had a storage of its own and
`x[1:] = x[:-1]` silently gave zeros. The seeded fuzz below draws in-place and `out=` calls whose operands are
views of one buffer (shifted, transposed, expanded, the same tensor twice) and compares every outcome with the CPU's.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch

_CASES = 600
_SEED = 19


def _outcome(fn, base: torch.Tensor):
    """(exception type, None) or (None, the whole buffer and the result on the CPU) after `fn(base)`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resizing a non-empty out= warns, on both devices alike
            result = fn(base)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        return type(error), None
    result = result.cpu() if isinstance(result, torch.Tensor) else result
    return None, (base.cpu(), result)


def _views(rng: random.Random):
    """A recipe of one view of a (4, 6) buffer, as a function of the buffer."""
    kind = rng.choice(["whole", "rows", "cols", "t", "flat", "expand", "diag"])
    a, b = rng.randrange(0, 3), rng.randrange(1, 4)
    if kind == "whole":
        return lambda x: x
    if kind == "rows":
        return lambda x: x[a : a + b]
    if kind == "cols":
        return lambda x: x[:, a : a + b + 1]
    if kind == "t":
        return lambda x: x[:, a : a + 4].t()
    if kind == "flat":
        return lambda x: x.view(-1)[a : a + 8 + b]
    if kind == "expand":
        return lambda x: x[a : a + 1, a : a + 4].expand(3, 4)
    return lambda x: x[:, :4].diagonal()


_UNARY_OUT = [torch.neg, torch.exp, torch.abs, torch.sin, torch.cumsum]
_BINARY_OUT = [torch.add, torch.mul, torch.sub, torch.maximum, torch.ldexp, torch.atan2]
_INPLACE_BINARY = ["add_", "mul_", "sub_", "copy_", "div_", "ldexp_", "lerp_"]
_INPLACE_UNARY = ["neg_", "exp_", "abs_", "sin_", "clamp_", "t_"]


def _case(rng: random.Random):
    """One call on views of the buffer: (description, fn(buffer))."""
    first, second, third = _views(rng), _views(rng), _views(rng)
    kind = rng.choice(["unary_out", "binary_out", "inplace_binary", "inplace_unary", "setitem", "mm_out"])
    if kind == "unary_out":
        op = rng.choice(_UNARY_OUT)
        if op is torch.cumsum:
            return f"cumsum(out=)#{rng.random()}", lambda x: torch.cumsum(first(x), 0, out=second(x))
        return f"{op.__name__}(out=)", lambda x: op(first(x), out=second(x))
    if kind == "binary_out":
        op = rng.choice(_BINARY_OUT)
        return f"{op.__name__}(out=)", lambda x: op(first(x), second(x), out=third(x))
    if kind == "inplace_binary":
        name = rng.choice(_INPLACE_BINARY)
        if name == "lerp_":
            return name, lambda x: first(x).lerp_(second(x), 0.5)
        return name, lambda x: getattr(first(x), name)(second(x))
    if kind == "inplace_unary":
        name = rng.choice(_INPLACE_UNARY)
        if name == "clamp_":
            return name, lambda x: first(x).clamp_(-1.0, 1.0)
        return name, lambda x: getattr(first(x), name)()
    if kind == "setitem":
        def setitem(x):
            first(x)[...] = second(x)
            return x
        return "setitem", setitem
    return "mm(out=)", lambda x: torch.mm(first(x), second(x).t(), out=third(x))


def test_overlap_fuzz_matches_cpu():
    rng = random.Random(_SEED)
    generator = torch.Generator().manual_seed(_SEED)
    mismatches = []
    for number in range(_CASES):
        description, fn = _case(rng)
        values = torch.randn(4, 6, generator=generator)
        expected = _outcome(fn, values.clone())
        actual = _outcome(fn, values.clone().to("neuron"))
        if expected[0] is not None or actual[0] is not None:
            if expected[0] is not actual[0]:
                mismatches.append((number, description, expected[0], actual[0]))
            continue
        (cpu_base, cpu_result), (neuron_base, neuron_result) = expected[1], actual[1]
        same = torch.equal(cpu_base, neuron_base) or torch.allclose(cpu_base, neuron_base, equal_nan=True)
        if isinstance(cpu_result, torch.Tensor):
            same = same and cpu_result.shape == neuron_result.shape
            same = same and torch.allclose(cpu_result, neuron_result, equal_nan=True)
        if not same:
            mismatches.append((number, description, "values differ", ""))
    assert not mismatches, f"{len(mismatches)} of {_CASES} cases differ from the CPU, e.g. {mismatches[:8]}"


@pytest.mark.parametrize(
    "statement",
    [
        "x[1:] = x[:-1]",
        "w.copy_(w.t())",
        "torch.add(x[0:3], 1, out=x[1:4])",
    ],
)
def test_partial_overlap_raises_as_on_cpu(statement):
    x = torch.arange(5.0, device="neuron")
    w = torch.arange(9.0, device="neuron").reshape(3, 3)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        exec(statement, {"torch": torch, "x": x, "w": w})


@pytest.mark.parametrize("statement", ["torch.mul(x, o, out=x)", "x.ldexp_(o)"])
def test_output_that_is_an_input_is_not_resized(statement):
    x, o = torch.ones(5, 1, device="neuron"), torch.arange(5.0, device="neuron")
    with pytest.raises(RuntimeError, match=r"doesn't match the broadcast shape \[5, 5\]"):
        exec(statement, {"torch": torch, "x": x, "o": o})
    assert x.shape == (5, 1)


def test_full_alias_is_computed_as_on_cpu():
    x = torch.arange(6.0, device="neuron")
    x.add_(x)
    torch.mul(x, x, out=x)
    assert torch.equal(x.cpu(), (torch.arange(6.0) * 2) ** 2)


def test_host_alias_is_one_storage_per_device_storage():
    from neuron_device import storage as hostmem

    x = torch.arange(8.0, device="neuron")
    first, second = hostmem.host_alias(x[:4]), hostmem.host_alias(x[2:])
    assert first.untyped_storage()._cdata == second.untyped_storage()._cdata
    assert hostmem.host_alias(x.view(torch.int32)).untyped_storage().data_ptr() == first.data_ptr()


def test_host_alias_follows_storage_resize_and_set():
    from neuron_device import storage as hostmem

    x = torch.arange(4.0, device="neuron")
    x.untyped_storage().resize_(64)  # new memory: the host twin moves with it
    x.set_(x.untyped_storage(), 0, (16,), (1,))
    x[4:] = 7.0
    alias = hostmem.host_alias(x)
    assert alias.data_ptr() == x.data_ptr()
    assert torch.equal(alias[:4], torch.arange(4.0)) and bool((alias[4:] == 7).all())
    y = torch.zeros(3, device="neuron")
    y.set_(x.untyped_storage(), 2, (3,), (1,))
    assert hostmem.host_alias(y).data_ptr() == x.data_ptr() + 8
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        y.copy_(x[:3])


def test_host_twin_does_not_keep_the_device_storage_alive():
    import gc
    import weakref

    x = torch.empty(1000, device="neuron")
    from neuron_device import storage as hostmem

    alias = hostmem.host_alias(x)
    dead = weakref.ref(x.untyped_storage())
    del x
    gc.collect()
    assert dead() is None  # the device storage died although its host alias lives on
    alias.fill_(1.0)  # and the alias still owns valid memory
    assert float(alias.sum()) == 1000.0
