"""Plan mode's charging rules for higher-order ops (`torch._higher_order_ops`), which reach the charger whole.

`flex_attention` and its backward run on `neuron` as one flash-attention kernel each (neuron-device's PrivateUse1
implementations, `neuron_device.ops.flex_attention`), charged the Tensor-engine work of the score tiles the block
mask visits. A plan runs the fake mode's implementation and charges the same kernel with the same fraction of tiles.
That fraction is read from the block mask's values in a real run; a planned block mask has none, so the plan makes
the block mask again from its `mask_mod`, for real on the host, as `create_block_mask` makes it: positions in,
booleans out, the mask's layout and not the job's data. A `mask_mod` that reads tensors (a document mask built from
the batch's tokens) depends on their values: they are assumed zeros (one document a sequence, the causal mask's
tiles: the most a document mask keeps), an assumption the report states (`ONE_DOCUMENT`). Any other higher-order op
is refused by name.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from neuron_device import services

from . import plan_state

__all__ = ["charge"]

_flex = services.flex_attention
ONE_DOCUMENT = ("one document a sequence: the tensors a flex_attention mask_mod reads (a document mask's document ids, "
                "torchtitan's block_causal) are zeros, so a document mask keeps its causal mask's score tiles, the "
                "most it can keep")
# The block mask's place among each op's arguments (`BlockMask.as_tuple()`), the captured tensors of its mask_mod,
# and whether it is the backward.
_RULES = {"flex_attention": (4, 8, False), "flex_attention_backward": (9, 13, True)}


def charge(func: Any, args: tuple, kwargs: dict, result: Any) -> list[torch.UntypedStorage]:
    """Charge one planned call of the higher-order op `func` (already run on the fakes, giving `result`) as a real
    run's kernel charges it; return the storages it allocated."""
    rule = _RULES.get(func.name())
    if rule is None:
        raise NotImplementedError(f"plan mode: the higher-order op {func.name()} has no charging rule (flex_attention "
                                  "and its backward have)")
    mask_at, buffers_at, backward = rule
    query, key = args[0], args[1]
    visible = _visible(args[mask_at], tuple(args[buffers_at]) if len(args) > buffers_at else ())
    moved = (args[:3], result) if not backward else (args[:3], args[3], args[5], result[:3])
    _flex.charge_kernel(func.name(), query, key, visible, backward, _flex.nbytes(*moved))
    return services.account_planned_op(func, args, kwargs, result)


def _visible(block_mask: tuple, captured: tuple) -> float:
    """The fraction of score tiles the real run's kernel visits under `block_mask` (`BlockMask.as_tuple()`). The
    tensors its mask_mod reads (a document mask's document ids) have no values in a plan: they are assumed zeros
    (`ONE_DOCUMENT`), stated in the plan's report."""
    planner = plan_state.active_planner()
    if captured and planner is not None and planner.assumed is not None:
        planner.assumed.state(ONE_DOCUMENT)
    q_len, kv_len, kv_num_blocks = block_mask[0], block_mask[1], block_mask[2]
    read = tuple((tuple(t.shape), t.dtype) for t in captured)
    return _fraction(block_mask[-1], *kv_num_blocks.shape[:2], q_len, kv_len, block_mask[-3], block_mask[-2], read)


@functools.cache
def _fraction(mask_mod: Any, batch: int, heads: int, q_len: int, kv_len: int, q_block: int, kv_block: int,
              read: tuple = ()) -> float:
    from torch.nn.attention.flex_attention import create_block_mask

    with _disable_current_modes():
        zeros = [torch.zeros(shape, dtype=dtype) for shape, dtype in read]
        block_mask = create_block_mask(lambda b, h, q, kv: mask_mod(b, h, q, kv, *zeros), batch, heads, q_len, kv_len,
                                       device="cpu",
                                       BLOCK_SIZE=(q_block, kv_block))
        return _flex.visible_fraction(block_mask.as_tuple(), kv_len)
