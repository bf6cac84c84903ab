"""Training forwards that compute a prefix every row shares once.

Every SFT example starts with the same chat-template header and system prompt (67 tokens of a demo
example's ~218), and the rows of a GRPO group repeat one whole prompt. A padded forward computes those
positions once per row, in the forward pass and again in the backward. :func:`shared_prefix_backbone`
runs the decoder on the rows' longest common prefix once (one row), then on each row's rest with that
prefix's keys and values as the cache, and returns the hidden states of every position as the plain
forward does (the prefix's broadcast to every row). The loss, the LM head and the optimizer see the
same tensors; gradients reach the prefix through its keys, values and hidden states, summed over the
rows, as the chain rule has it. Only float summation order differs (tests: loss and LoRA gradients
within 1e-5 of the plain forward, padded and left-padded rows, a warm start).

A forward falls back to the plain one when the rows share fewer than ``min_tokens`` leading positions
(ids, all unmasked), when there is one row, when it is handed a cache or embeddings, or for packed rows
(position ids that restart).
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

    decoder = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = decoder.base_model
    plain = decoder.forward

    def forward(input_ids=None, attention_mask=None, position_ids=None, **kwargs):
        use = (
            input_ids is not None
            and all(kwargs.get(k) is None for k in ("inputs_embeds", "past_key_values", "cache"))
            and _plain_positions(position_ids, input_ids.shape[1])
        )
        width = input_ids.shape[1] if input_ids is not None else 0
        shared = common_prefix_length(input_ids, attention_mask) if use else 0
        shared = min(shared, width - 1)  # at least one position of each row's own
        if shared < min_tokens:
            return plain(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
        import torch

        rows = input_ids.shape[0]
        for key in ("use_cache", "inputs_embeds", "past_key_values", "cache"):
            kwargs.pop(key, None)
        cache = DynamicCache(config=decoder.config)
        head = plain(input_ids=input_ids[:1, :shared], cache=cache, use_cache=True, **kwargs)
        cache.batch_repeat_interleave(rows)  # the prefix's keys/values for every row (differentiable copies)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        positions = torch.arange(shared, width, device=input_ids.device).expand(rows, -1)
        tail = plain(
            input_ids=input_ids[:, shared:],
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            **kwargs,
        )
        hidden = torch.cat([head.last_hidden_state.expand(rows, -1, -1), tail.last_hidden_state], dim=1)
        return BaseModelOutputWithPast(last_hidden_state=hidden)

    own = decoder.__dict__.get("forward")  # an instance-level forward already there (hooks), else None
    decoder.forward = forward
    try:
        yield
    finally:
        if own is None:
            del decoder.forward  # the class's forward again
        else:
            decoder.forward = own
