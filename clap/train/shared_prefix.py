"""Training forwards that compute neither a prefix every row shares twice nor padding.

Every SFT example starts with the same chat-template header and system prompt (67 tokens of a demo
example's ~218), and the rows of a GRPO group repeat one whole prompt. A padded forward computes those
positions once per row, in the forward pass and again in the backward. :func:`shared_prefix_backbone`
runs the decoder on the rows' longest common prefix once (one row), then on each row's rest with that
prefix's keys and values as the cache, and returns the hidden states of every position as the plain
forward does (the prefix's broadcast to every row). When the rows are right-padded to lengths that
run faster apart than padded together (:func:`clap.model.base.padded_together`: a batch of a short and a
long TAT-QA report prompt, seldom two demo prompts), each row's rest runs at its own length, one row at
a time, and its padded positions get zero hidden states (their labels are masked: no loss, no
gradient). The loss, the LM head and the optimizer see the same values at every unpadded position;
gradients reach the prefix through its keys, values and hidden states, summed over the rows, as the
chain rule has it. Only float summation order differs (tests: loss and LoRA gradients within 1e-5 of the
plain forward, padded and left-padded rows, a warm start).

A forward falls back to the plain one when the rows share fewer than ``min_tokens`` leading positions
and are not right-padded enough to split, when there is one row, when it is handed a cache or
embeddings, or for packed rows (position ids that restart).
"""

from __future__ import annotations

import contextlib
from typing import Any

MIN_SHARED_TOKENS = 16
"""Below this many shared positions the second decoder call costs more than it saves."""


def common_prefix_length(input_ids: Any, attention_mask: Any | None) -> int:
    """How many leading positions every row has equal and unmasked (0 for a single row)."""
    import torch

    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    differs = torch.nonzero(~same)
    return int(differs[0, 0]) if len(differs) else int(input_ids.shape[1])


def right_padded_lengths(attention_mask: Any | None, rows: int, width: int) -> list[int] | None:
    """Each row's length when every row is its first positions unmasked and the rest masked (right
    padding; no mask: every row ``width`` long); None for any other mask (left padding, holes)."""
    import torch

    if attention_mask is None:
        return [width] * rows
    lengths = attention_mask.sum(dim=1)
    want = torch.arange(width, device=attention_mask.device)[None, :] < lengths[:, None]
    return [int(n) for n in lengths] if bool((attention_mask.bool() == want).all()) else None


def _plain_positions(position_ids: Any | None, width: int) -> bool:
    """Position ids absent, or 0..width-1 on every row (not packed, not shifted)."""
    import torch

    if position_ids is None:
        return True
    want = torch.arange(width, device=position_ids.device).expand_as(position_ids)
    return bool((position_ids == want).all())


@contextlib.contextmanager
def shared_prefix_backbone(model: Any, min_tokens: int = MIN_SHARED_TOKENS):
    """Within the block, ``model``'s decoder computes the rows' common prefix once per forward.

    ``model``: a causal LM (or a peft model around one) whose ``base_model`` attribute chain ends at
    the decoder that TRL's fused LM head calls (``LlamaModel`` for Llama).
    """
    from transformers import DynamicCache
    from transformers.modeling_outputs import BaseModelOutputWithPast

    from clap.model import base as mdl

    decoder = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = decoder.base_model
    plain = decoder.forward

    def forward(input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        use = (
            input_ids is not None
            and input_ids.shape[0] > 1
            and all(kwargs.get(k) is None for k in ("inputs_embeds", "past_key_values", "cache"))
            and _plain_positions(position_ids, input_ids.shape[1])
        )
        if not use:
            return plain(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
        rows, width = input_ids.shape
        lengths = right_padded_lengths(attention_mask, rows, width)
        shortest = min(lengths) if lengths is not None else width
        shared = min(common_prefix_length(input_ids, attention_mask), shortest - 1)  # >= 1 own position a row
        shared = shared if shared >= min_tokens else 0
        padded = lengths is not None and not mdl.padded_together(
            [n - shared for n in lengths], width - shared
        )
        if not shared and not padded:
            return plain(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
        import torch

        for key in ("use_cache", "inputs_embeds", "past_key_values", "cache"):
            kwargs.pop(key, None)
        head = None
        if shared:
            cache = DynamicCache(config=decoder.config)
            head = plain(input_ids=input_ids[:1, :shared], cache=cache, use_cache=True, **kwargs)
        if padded:  # each row's rest at its own length: no padded position is computed
            prefix = cache if shared else None
            tails = [
                _row_tail(plain, decoder.config, input_ids[r : r + 1, shared:n], shared, prefix, kwargs)
                for r, n in enumerate(lengths)
            ]
            tail = torch.cat(
                [torch.nn.functional.pad(t, (0, 0, 0, width - shared - t.shape[1])) for t in tails], dim=0
            )
        else:
            # the prefix's keys/values for every row (differentiable copies)
            cache.batch_repeat_interleave(rows)
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            tail = plain(
                input_ids=input_ids[:, shared:],
                attention_mask=mask,
                position_ids=torch.arange(shared, width, device=input_ids.device).expand(rows, -1),
                cache=cache,
                use_cache=True,
                **kwargs,
            ).last_hidden_state
        if head is not None:
            tail = torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail], dim=1)
        return BaseModelOutputWithPast(last_hidden_state=tail)

    own = decoder.__dict__.get("forward")  # an instance-level forward already there (hooks), else None
    decoder.forward = forward
    try:
        yield
    finally:
        if own is None:
            del decoder.forward  # the class's forward again
        else:
            decoder.forward = own


def _row_tail(plain: Any, config: Any, ids: Any, start: int, prefix: Any | None, kwargs: dict) -> Any:
    """One row's hidden states at positions ``start`` onwards (``ids``: that row's tokens there, no
    padding), after ``prefix``'s keys and values (a one-row cache of the first ``start`` positions;
    it is not changed: each row reads the same prefix tensors, so their gradients add up)."""
    import torch
    from transformers import DynamicCache

    if prefix is None:
        return plain(input_ids=ids, use_cache=False, **kwargs).last_hidden_state
    cache = DynamicCache(config=config)
    for src, dst in zip(prefix.layers, cache.layers):
        dst.lazy_initialization(src.keys, src.values)
        dst.keys, dst.values = src.keys, src.values  # update() concatenates into new tensors
    positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None, :]
    return plain(
        input_ids=ids, position_ids=positions, cache=cache, use_cache=True, **kwargs
    ).last_hidden_state
