"""Batched greedy generation for chat prompts: left padding, KV cache, length-sorted batches.

Prompts are sorted by token length so each batch pads little, generated in batches with
``model.generate`` (greedy, KV cache, left padding so every row's last prompt token sits at
the end), and returned in input order. Each item gets its share of its batch's wall time
(apportioned by new tokens, which dominate decoding cost) and the batch's wall time itself.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from tqdm.auto import tqdm

Messages = list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generated answer.

    Attributes:
        text: decoded new tokens (special tokens removed).
        new_tokens: generated tokens up to and including the first end-of-sequence token.
        prompt_tokens: tokens of the templated prompt.
        latency_ms: this item's share of its batch's wall time.
        batch_wall_ms: wall time of the whole batch the item was generated in.
        batch_size: items in that batch.
        batch_index: which batch (0-based, in generation order).
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    latency_ms: float
    batch_wall_ms: float
    batch_size: int
    batch_index: int


def encode_chats(tokenizer: Any, chats: Sequence[Messages]) -> list[list[int]]:
    """Token ids of each chat through the tokenizer's chat template, with the generation prompt."""
    return [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]) for m in chats]


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence token ids: the model's generation config plus the tokenizer's eos."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: Any):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def _count_new(tokens: Sequence[int], stops: set[int]) -> int:
    for i, t in enumerate(tokens):
        if t in stops:
            return i + 1
    return len(tokens)


def _generation_config(model: Any, tokenizer: Any, max_new_tokens: int):
    from transformers import GenerationConfig

    # A fresh config: the model's own may carry sampling knobs (temperature, top_p).
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, use_cache=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=stop_ids(model, tokenizer))


def _run_batch(model: Any, tokenizer: Any, rows: Sequence[Sequence[int]], config: Any) -> tuple[list[list[int]], float]:
    """Generate for one batch of token-id rows; returns the new token ids per row and wall ms."""
    import torch

    ids, mask = _left_pad(rows, tokenizer.pad_token_id, model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    wall_ms = (time.perf_counter() - start) * 1000.0
    return out[:, ids.shape[1]:].tolist(), wall_ms


def generate_batched(model: Any, tokenizer: Any, chats: Sequence[Messages], *, batch_size: int, max_new_tokens: int, desc: str = "generate") -> list[Generation]:
    """Greedy answers to ``chats`` in input order.

    Args:
        model: any Hugging Face causal LM (eval mode).
        tokenizer: its tokenizer; needs a chat template and a pad token.
        chats: one message list per item (``clap.prompt.build_messages``).
        batch_size: prompts per ``model.generate`` call (1 = unbatched).
        max_new_tokens: generation budget per item.
        desc: progress bar label.

    Returns:
        One :class:`Generation` per chat, same order as ``chats``.
    """
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has no pad token (clap.model.load_tokenizer sets one)")
    encoded = encode_chats(tokenizer, chats)
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))  # stable: ties keep input order
    config = _generation_config(model, tokenizer, max_new_tokens)
    stops = set(config.eos_token_id)
    results: list[Generation | None] = [None] * len(encoded)
    with tqdm(total=len(encoded), desc=desc, unit="item", leave=False) as bar:
        for batch_index, lo in enumerate(range(0, len(order), batch_size)):
            idx = order[lo:lo + batch_size]
            new_rows, wall_ms = _run_batch(model, tokenizer, [encoded[i] for i in idx], config)
            counts = [_count_new(r, stops) for r in new_rows]
            total = sum(counts) or len(idx)
            for i, row, n in zip(idx, new_rows, counts):
                share = (n if sum(counts) else 1) / total
                text = tokenizer.decode(row[:n], skip_special_tokens=True)
                results[i] = Generation(text, n, len(encoded[i]), wall_ms * share, wall_ms, len(idx), batch_index)
            bar.update(len(idx))
    return [r for r in results if r is not None]
