"""Shape buckets for `torch.compile(backend="neuron")`: serving prompts of many lengths compiles one graph per bucket.

The compiler takes static shapes only (`dynamic=True` is refused; every new input shape compiles a graph), which is
what variable-length prompts hit. `pad_to_buckets(fn)` pads a call's token inputs up to the next bucket of sequence
length and of batch size, runs `fn` (a compiled model or forward, or a model's `generate`) at the bucket's shape,
and cuts the outputs back, so `fn` sees only the buckets' shapes: one graph per bucket, and the simulated time is the
padded graph's, what the chip runs.

Padding is correct only where the model masks it, so the policy pads only what it knows how to mask, by Hugging Face's
argument names: `input_ids` (with `pad_token_id`) with a 2-D `attention_mask` (zeros) of the same shape, plus
`token_type_ids` (zeros) and `labels` (-100, ignored by the loss). A call without an `attention_mask`, or with any
other tensor argument (`position_ids`, `inputs_embeds`, `past_key_values`, ...), is refused with the name of what it
cannot pad. Forward calls are padded on the right (outputs cut on dim 0, batch, and dim 1, sequence, a 2-D output
only when per position by name; a returned `DynamicCache` is cropped); `generate` on the left, as generate pads
batched prompts itself (the padded columns and rows are dropped from the sequences and scores). Padded batch rows
repeat the first row, so they mask, stop and finish as it does.

Buckets come from the arguments or from `TORCH_NEURONX_SHAPE_BUCKETS` (`envvars.SHAPE_BUCKETS`), a list or the powers
of two in a range: ``seq_len=pow2:16-2048;batch=1,2,4,8``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from . import envvars

__all__ = ["ShapeBuckets", "pad_to_buckets", "powers_of_two"]

_DIMS = ("seq_len", "batch")
_POW2 = re.compile(r"^pow2:(\d+)-(\d+)$")
# What the arguments padded besides the prompt (`input_ids`, padded with `pad_token_id`) are padded with; a forward
# pads all of them, generate (which takes no labels, and token types in no padded form) the mask alone. Any other
# tensor argument is refused.
_PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "labels": -100}
_PER_POSITION_2D = ("start_logits", "end_logits")  # question answering's (batch, sequence) outputs


def powers_of_two(smallest: int, largest: int) -> tuple[int, ...]:
    """The powers of two from `smallest` to `largest` (both powers of two): ``powers_of_two(16, 128)`` is
    ``(16, 32, 64, 128)``."""
    for name, value in (("smallest", smallest), ("largest", largest)):
        if not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise ValueError(f"powers_of_two: {name} must be a positive power of two, got {value!r}")
    if smallest > largest:
        raise ValueError(f"powers_of_two: smallest {smallest} is above largest {largest}")
    return tuple(1 << k for k in range(smallest.bit_length() - 1, largest.bit_length()))


def _parse_dim(dim: str, spec: str) -> tuple[int, ...]:
    """A bucket list from its text: ``16,32,64`` or ``pow2:16-2048``."""
    match = _POW2.match(spec.strip())
    if match:
        return powers_of_two(int(match[1]), int(match[2]))
    try:
        return tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"shape buckets: {dim} buckets must be integers separated by ',' or 'pow2:MIN-MAX', "
                         f"got {spec!r}") from None


def _check(dim: str, values: Iterable[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"shape buckets: the {dim} bucket list is empty")
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v <= 0]
    if bad:
        raise ValueError(f"shape buckets: {dim} buckets must be positive integers, got {bad[0]!r} in {list(values)}")
    for before, after in itertools.pairwise(values):
        if after <= before:
            raise ValueError(f"shape buckets: {dim} buckets must be strictly increasing, got {after} after {before} "
                             f"in {list(values)}")
    return values


@dataclasses.dataclass(frozen=True)
class ShapeBuckets:
    """Bucket sizes of the sequence-length and the batch dimension (None: that dimension is not padded)."""

    seq_len: tuple[int, ...] | None = None
    batch: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for dim in _DIMS:
            value = getattr(self, dim)
            if isinstance(value, str):
                value = _parse_dim(dim, value)
            if value is not None:
                object.__setattr__(self, dim, _check(dim, value))  # a list or generator becomes a tuple
        if self.seq_len is None and self.batch is None:
            raise ValueError("shape buckets: no buckets given; pass seq_len and/or batch (a list of sizes or "
                             "'pow2:MIN-MAX')")

    @classmethod
    def parse(cls, spec: str) -> ShapeBuckets:
        """Buckets from `TORCH_NEURONX_SHAPE_BUCKETS`'s form: ``seq_len=128,256,512;batch=pow2:1-8``."""
        fields: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            dim, sep, values = part.partition("=")
            dim = dim.strip()
            if not sep or dim not in _DIMS:
                raise ValueError(f"{envvars.SHAPE_BUCKETS.name}: expected 'seq_len=...' and/or 'batch=...' separated "
                                 f"by ';', got {part!r}")
            if dim in fields:
                raise ValueError(f"{envvars.SHAPE_BUCKETS.name}: {dim} is given twice in {spec!r}")
            fields[dim] = values
        return cls(**fields)

    @classmethod
    def from_env(cls) -> ShapeBuckets:
        """The buckets `TORCH_NEURONX_SHAPE_BUCKETS` sets; an error when it is unset."""
        spec = envvars.SHAPE_BUCKETS.read()
        if not spec:
            raise ValueError(f"shape buckets: none given; pass seq_len and/or batch, or set "
                             f"{envvars.SHAPE_BUCKETS.name} (e.g. 'seq_len=pow2:16-2048;batch=1,2,4')")
        return cls.parse(spec)

    def bucket(self, dim: str, size: int) -> int:
        """The smallest bucket of `dim` holding `size` (`size` itself when `dim` has no buckets)."""
        buckets = getattr(self, dim)
        if buckets is None:
            return size
        for bucket in buckets:
            if bucket >= size:
                return bucket
        raise ValueError(f"shape buckets: {dim} {size} is above the largest {dim} bucket {buckets[-1]} "
                         f"(buckets {list(buckets)}); add a larger bucket")


def _pad(value: torch.Tensor, batch: int, seq: int, fill: int, left: bool) -> torch.Tensor:
    """`value` (batch, seq) padded to (`batch`, `seq`): columns of `fill`, then rows repeating the first row."""
    extra = seq - value.shape[1]
    if extra:
        columns = value.new_full((value.shape[0], extra), fill)
        value = torch.cat([columns, value] if left else [value, columns], dim=1)
    if batch > value.shape[0]:
        value = torch.cat([value, value[:1].expand(batch - value.shape[0], -1)], dim=0)
    return value


def _cut_cache(cache: Any, batch: int, seq: int, padded_seq: int) -> Any:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or not all(type(layer) is DynamicLayer for layer in cache.layers):
        raise ValueError(f"pad_to_buckets: the call returned a {type(cache).__name__}, which it cannot cut back to "
                         "the unpadded length; pass use_cache=False or call generate")
    if padded_seq > seq:
        cache.crop(seq - padded_seq)
    if cache.layers and cache.layers[0].keys.shape[0] > batch:
        cache.batch_select_indices(torch.arange(batch))
    return cache


def _cut(value: Any, batch: int, seq: int, padded: tuple[int, int], key: str = "output") -> Any:
    """A forward's outputs at the unpadded shape: dim 0 cut to `batch`, dim 1 to `seq` (Hugging Face's layout:
    (batch, sequence, features); 2-D per-position outputs only by name, as a 2-D output may be (batch, features))."""
    if isinstance(value, torch.Tensor):
        if value.ndim >= 1 and value.shape[0] == padded[0]:
            value = value[:batch]
        if value.ndim >= 2 and value.shape[1] == padded[1] and padded[1] != seq:
            if value.ndim == 2 and key not in _PER_POSITION_2D:
                raise ValueError(f"pad_to_buckets: {key} of shape {tuple(value.shape)} has the padded length "
                                 f"{padded[1]} in dim 1, but a 2-D output need not be per position (it is cut only "
                                 f"when named {' or '.join(_PER_POSITION_2D)}); use a bucket of another size")
            value = value[:, :seq]
        return value
    if isinstance(value, Mapping):  # a ModelOutput (an ordered dict) or a dict
        cut = {name: _cut(item, batch, seq, padded, name) for name, item in value.items()}
        return type(value)(**cut) if hasattr(value, "to_tuple") else type(value)(cut)
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(item, batch, seq, padded, key) for item in value)
    if hasattr(value, "get_seq_length"):  # a transformers Cache
        return _cut_cache(value, batch, seq, padded[1])
    return value


def _cut_generated(value: Any, batch: int, drop: int) -> Any:
    """generate's outputs without the padded rows, and `sequences` without the `drop` left padding columns."""
    if isinstance(value, torch.Tensor):
        return value[:batch, drop:]
    for key in ("scores", "logits"):
        if value.get(key) is not None:
            value[key] = tuple(step[:batch] for step in value[key])
    value["sequences"] = value["sequences"][:batch, drop:]
    return value


class _Bucketed:
    """`fn` called at bucket shapes (see the module docstring)."""

    def __init__(self, fn: Callable, buckets: ShapeBuckets, pad_token_id: int) -> None:
        self.fn = fn
        self.buckets = buckets
        self.pad_token_id = pad_token_id
        self.is_generate = getattr(fn, "__name__", "") == "generate"
        model = getattr(fn, "__self__", None)
        if self.is_generate and getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            raise ValueError("pad_to_buckets: generate of an encoder-decoder model is not supported (its sequences "
                             "do not contain the prompt); wrap the model's forward instead")
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        self.signature = inspect.signature(target)
        functools.update_wrapper(self, target, updated=())

    def _refuse(self, message: str) -> ValueError:
        return ValueError(f"pad_to_buckets: {message}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        kinds = {p.kind: p.name for p in self.signature.parameters.values()}
        var_keyword = kinds.get(inspect.Parameter.VAR_KEYWORD)
        if bound.arguments.get(kinds.get(inspect.Parameter.VAR_POSITIONAL)):
            raise self._refuse("it cannot tell what extra positional arguments are; pass them by name")
        named = {**bound.arguments, **bound.arguments.get(var_keyword, {})}
        named.pop(var_keyword, None)
        prompt = "inputs" if self.is_generate and "inputs" in named else "input_ids"  # generate's first parameter
        ids, mask = named.get(prompt), named.get("attention_mask")
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            raise self._refuse("the call needs input_ids of shape (batch, sequence) to pad")
        if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
            raise self._refuse(f"the call needs a 2-D attention_mask of input_ids' shape {tuple(ids.shape)} to "
                               "mask the padding (without it the padded positions would change the result)")
        pads = {prompt: self.pad_token_id, "attention_mask": 0} if self.is_generate else {prompt: self.pad_token_id,
                                                                                           **_PAD_VALUES}
        for name, value in named.items():
            if name in pads or value is None or isinstance(value, (bool, int, float, str)):
                continue
            if isinstance(value, torch.Tensor) or hasattr(value, "get_seq_length"):
                raise self._refuse(f"it cannot pad argument {name!r} (it pads {', '.join(pads)}); call without it")
        if named.get("output_attentions"):
            raise self._refuse("output_attentions=True is not supported (attention maps are not cut back)")
        limit = named.get("max_new_tokens", getattr(named.get("generation_config"), "max_new_tokens", None))
        if self.is_generate and ("max_length" in named or limit is None):
            raise self._refuse("generate needs max_new_tokens (and no max_length), so padding the prompt does not "
                               "change how many tokens are generated")
        batch, seq = ids.shape
        padded = (self.buckets.bucket("batch", batch), self.buckets.bucket("seq_len", seq))
        for name, fill in pads.items():
            value = named.get(name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.shape != ids.shape:
                raise self._refuse(f"{name} must have input_ids' shape {tuple(ids.shape)}")
            arguments = bound.arguments if name in bound.arguments else bound.arguments[var_keyword]
            arguments[name] = _pad(value, *padded, fill, left=self.is_generate)
        out = self.fn(*bound.args, **bound.kwargs)
        if self.is_generate:
            return _cut_generated(out, batch, padded[1] - seq)
        return _cut(out, batch, seq, padded)


def pad_to_buckets(
    fn: Callable,
    *,
    seq_len: Iterable[int] | str | None = None,
    batch: Iterable[int] | str | None = None,
    pad_token_id: int = 0,
) -> Callable:
    """`fn` (a compiled model or forward, or a model's `generate`) called with its token inputs padded to the next
    bucket, so it compiles one graph per bucket. Buckets: `seq_len` and `batch` as a list or ``'pow2:MIN-MAX'``; with
    neither, `TORCH_NEURONX_SHAPE_BUCKETS`. `pad_token_id`: what `input_ids` are padded with (masked; any valid id)."""
    if seq_len is None and batch is None:
        return _Bucketed(fn, ShapeBuckets.from_env(), pad_token_id)
    return _Bucketed(fn, ShapeBuckets(seq_len=seq_len, batch=batch), pad_token_id)
