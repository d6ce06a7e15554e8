"""Serving plans: transformers' `generate`, planned unmodified, and its figures (time to first token, time per output
token, KV cache), measured by the same marks in a plan and in a real run.

`generate` reads values that steer it. Plan mode answers three kinds by rule (each answer charged as the real run's
copy of the value to the host), and the report names the rules that answered:

* **decode length**: the stop check after each token (`StopCheck`: `bool(unfinished_sequences.max() == 0)`, after
  the stopping criteria, which compare the new tokens with EOS) is answered by the length limit alone: no sequence
  ends before `max_length` (the prompt plus `max_new_tokens`), so the plan decodes exactly `max_new_tokens` tokens,
  the most the script allows. Without a length limit the read is refused as any branch on a value.
* **unpadded prompts**: `generate`'s own checks of the prompt's padding (`(attention_mask == 1).all()`: True; the
  right-padding warning's read: False): every prompt fills the input length the script gives.
* the tokens themselves need no answer: the next token (`argmax`, `multinomial`) is a planned tensor, and no op's
  charge depends on token values (an embedding lookup is charged by its shapes).

Figures (`Serving`): `generate`'s entry, and each token's stop check (the token is on the host then, after the
read's copy): the time to first token is the first mark less the entry (the prefill and the first token), the time
per output token the mean interval between the later marks (steady decode); the KV cache's bytes are those of the
cache `generate` made, on this core (a tensor-parallel model's local heads). The last `generate` call is reported.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_device import services

from . import plan_state
from .plan_patches import patched

__all__ = ["RULES", "Serving", "generation_patches", "marking"]

RULES = {
    "decode_length": "every sequence decodes to max_length (the prompt plus max_new_tokens): the stop check's read "
                     "of the tokens (EOS) is answered by the length limit alone",
    "prompt_tokens": "every prompt is the input length of valid token ids, unpadded: generate's checks of the prompt "
                     "(padding, negative ids) answered so",
}
# `GenerationMixin`'s checks of the prompt, by function and the text of the condition that reads: the answer of a
# prompt of valid token ids, unpadded
_PROMPT_READS = {"generate": (("== 1).all()", True), ("[:, -1] == 0", False), ("has_right_padding", False)),
                 "_get_logits_processor": (("< 0).any()", False),)}


class Serving:
    """The marks of `generate` calls on one core, and the figures from the last call's."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.start = 0.0
        self.tokens: list[float] = []
        self.batch = 0
        self.cache: Any = None
        self.kv_cache_bytes = 0
        self.answered: set[str] = set()
        self.max_length: int | None = None  # the running generate's length limit, read from its stopping criteria
        self.length = 0  # the running generate's sequence length at its last stopping criteria

    def clock(self) -> float:
        return max(services.timeline(self.index).clocks.values())

    def began(self, batch: int) -> None:
        self.start, self.tokens, self.batch, self.cache = self.clock(), [], batch, None

    def ended(self) -> None:
        self.kv_cache_bytes = _cache_bytes(self.cache)
        self.cache = None

    def figures(self) -> dict[str, Any] | None:
        """The last `generate` call's figures, or None before any token."""
        if not self.tokens:
            return None
        decode = self.tokens[-1] - self.tokens[0]
        steps = len(self.tokens) - 1
        return {"batch_size": self.batch, "output_tokens": len(self.tokens), "ttft_seconds": self.tokens[0] - self.start,
                "tpot_seconds": decode / steps if steps else 0.0, "kv_cache_bytes": self.kv_cache_bytes,
                "assumed": [RULES[name] for name in sorted(self.answered)]}


def _cache_bytes(cache: Any) -> int:
    """Bytes of a transformers `Cache`'s key and value tensors on this core (a DTensor's local shard)."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                local = getattr(tensor, "_local_tensor", tensor)
                total += local.untyped_storage().nbytes()
    return total


def _generate(generate: Callable, serving: Serving, prompt_reads: dict[Any, tuple] | None) -> Callable:
    @functools.wraps(generate)
    def planned(self: Any, inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        prompt = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        serving.began(prompt.shape[0] if isinstance(prompt, torch.Tensor) else 0)
        with plan_state.answering_by(functools.partial(_prompt_answer, prompt_reads, serving)) \
                if prompt_reads is not None else contextlib.nullcontext():
            result = generate(self, inputs, *args, **kwargs)
        serving.ended()
        return result

    return planned


def _prompt_answer(reads: dict[Any, tuple], serving: Serving) -> Any:
    """The answer of the rule 'prompts of valid token ids, unpadded' to a read made by one of generate's own checks of
    the prompt (`reads`: code object -> (text of the condition, answer)...), else none."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(plan_state.INTERNALS):
        frame = frame.f_back
    checks = reads.get(frame.f_code) if frame is not None else None
    condition = _condition(frame) if checks else ""
    for text, answer in checks or ():
        if text in condition:
            serving.answered.add("prompt_tokens")
            return answer
    return plan_state.UNANSWERED


@functools.cache
def _conditions(code: Any) -> list[tuple[int, int, str]]:
    """(first line of the statement, last line, source of the condition) of each `if`, `while` and assignment in
    the function of `code`, innermost last."""
    lines, first = inspect.getsourcelines(code)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found = []
    for node in ast.walk(tree):
        part = node.test if isinstance(node, (ast.If, ast.While)) else node.value if isinstance(node, ast.Assign) \
            else None
        if part is not None:
            found.append((node.lineno + first - 1, part.end_lineno + first - 1,
                          "".join(lines[part.lineno - 1:part.end_lineno])))
    return sorted(found, key=lambda item: item[1] - item[0], reverse=True)


def _condition(frame: Any) -> str:
    """The source of the innermost condition (or assigned value) around the line `frame` runs."""
    around = [text for start, end, text in _conditions(frame.f_code) if start <= frame.f_lineno <= end]
    return around[-1] if around else ""


def _prefill(prefill: Callable, serving: Serving) -> Callable:
    @functools.wraps(prefill)
    def planned(*args: Any, **kwargs: Any) -> Any:
        outputs = prefill(*args, **kwargs)
        serving.cache = getattr(outputs, "past_key_values", None)
        return outputs

    return planned


def _stopping_criteria(call: Callable, serving: Serving) -> Callable:
    @functools.wraps(call)
    def planned(self: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        serving.max_length, serving.length = self.max_length, input_ids.shape[-1]
        return call(self, input_ids, *args, **kwargs)

    return planned


def _decode_length_answer(serving: Serving) -> Any:
    if serving.max_length is None:  # no length limit: how long decode runs depends on the tokens' values
        return plan_state.UNANSWERED
    serving.answered.add("decode_length")
    return serving.length >= serving.max_length


def _stop_check(call: Callable, serving: Serving, rules: bool) -> Callable:
    @functools.wraps(call)
    def planned(*args: Any, **kwargs: Any) -> Any:
        with plan_state.answering_by(functools.partial(_decode_length_answer, serving)) if rules \
                else contextlib.nullcontext():
            stop = call(*args, **kwargs)
        serving.tokens.append(serving.clock())
        return stop

    return planned


def generation_patches(serving: Serving, rules: bool) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) of transformers' generation for `serving`'s marks and, with `rules` (plan mode), its
    value rules; none when transformers is not imported (a script that imports it inside the plan is not patched,
    and its `generate`'s reads are refused as any)."""
    if "transformers" not in sys.modules:
        return []
    from transformers.generation import stopping_criteria, utils

    mixin = utils.GenerationMixin
    reads = {inspect.unwrap(getattr(mixin, name)).__code__: checks for name, checks in _PROMPT_READS.items()}
    return [(mixin, "generate", _generate(mixin.generate, serving, reads if rules else None)),
            (mixin, "_prefill", _prefill(mixin._prefill, serving)),
            (stopping_criteria.StoppingCriteriaList, "__call__",
             _stopping_criteria(stopping_criteria.StoppingCriteriaList.__call__, serving)),
            (utils.StopCheck, "__call__", _stop_check(utils.StopCheck.__call__, serving, rules))]


@contextlib.contextmanager
def marking(index: int) -> Iterator[Serving]:
    """A real run's `generate` marks on core `index`, for a block: the figures a plan reports, measured. Without
    transformers installed there is no `generate` to mark, and the block runs as it is."""
    if importlib.util.find_spec("transformers") is not None:
        import transformers.generation.utils  # noqa: F401  (a script run in the block imports it after this)

    serving = Serving(index)
    with contextlib.ExitStack() as stack:
        for owner, name, value in generation_patches(serving, rules=False):
            stack.enter_context(patched(owner, name, value))
        yield serving
