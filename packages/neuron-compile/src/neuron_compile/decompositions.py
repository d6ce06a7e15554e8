"""The Neuron decomposition table AOTAutograd lowers with.

Start from Inductor's table (everything its C++ host codegen can lower well), then keep whole the ops that have a
Neuron kernel to substitute (NKI attention, norms: see `nki_substitution`): decomposing them would hide them from the
substitution pass. SDPA's fused op on `neuron` (`_scaled_dot_product_fused_attention_overrideable`, + backward) is
lowered to the flash op its eager kernel runs (neuron-device's `fused_attention_decompositions`), so a compiled graph
prices and substitutes the one flash kernel as eager does. The table is rebuilt when the set of substitutable ops
changes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from neuron_device.services import fused_attention_decompositions

from . import nki_substitution

__all__ = ["neuron_decompositions"]

_cache: tuple[frozenset, dict] | None = None


def neuron_decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """Inductor's decompositions minus the ops a registered Neuron kernel replaces."""
    global _cache
    from torch._inductor.decomposition import select_decomp_table

    keep = frozenset(nki_substitution.substitutable_ops())
    if _cache is None or _cache[0] != keep:
        table = {**select_decomp_table(), **fused_attention_decompositions()}
        for op in keep:
            table.pop(op, None)
        _cache = (keep, table)
    return _cache[1]
