"""Batched generation for chat prompts: shared-prefix KV, left padding, shrinking batches.

Greedy for eval, replay and serving; sampled (:class:`Sampling`) for the GRPO probe's rollouts.

Every prompt starts with the same tokens (chat template + system prompt: 67 of ~150 tokens in
the demo), so their keys and values are computed once and copied into each batch's cache.
Prompts are sorted by token length so a batch pads little, each batch's suffixes are
left-padded after the shared prefix (position ids skip the padding, the attention mask hides
it), and a plain greedy loop decodes them: a row leaves the batch as soon as it emits an
end-of-sequence token or reaches the budget, so one rambling answer does not keep the other
rows' compute alive. The forward pass is an engine's (:mod:`clap.model.engine`): the torch model,
whose keys and values are written into buffers sized for the whole batch up front instead of being
re-concatenated each step (``DynamicCache`` copies the whole cache on every token), or the same
weights compiled by OpenVINO, which keeps them in its own state. On torch the arithmetic is the
model's own forward pass, so answers are those of per-item ``model.generate``
(``benchmarks/eval_speed.py`` checks token equality); on OpenVINO at f32 they are those of the torch
path (``benchmarks/generation_engines.py``).

Each item gets its share of its batch's wall time (apportioned by new tokens, which dominate
decoding cost) and the batch's wall time itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from clap.model.constrain import Constraint, Grammar, Grammars
from clap.model.engine import prefix_state, session
from clap.model.kv import shared_prefix_length
from clap.progress import Progress

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
        token_ids: the new tokens themselves (``new_tokens`` of them).
    """

    text: str
    new_tokens: int
    prompt_tokens: int
    latency_ms: float
    batch_wall_ms: float
    batch_size: int
    batch_index: int
    token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Ancestral sampling instead of greedy: each token drawn from ``softmax(logits / temperature)``
    (after a constraint's mask) with ``generator``, the only source of randomness, so a seeded
    generator reproduces the draws. No top-k, top-p or repetition penalty: the GRPO probe's rollouts
    sample the policy itself (:func:`clap.train.grpo.clap_rollouts` refuses other settings).
    """

    temperature: float
    generator: Any  # torch.Generator on the model's device

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"sampling temperature must be > 0, got {self.temperature}")

    def pick(self, logits: Any) -> list[int]:
        """One token per row of ``logits`` (rows x vocabulary)."""
        import torch

        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0].tolist()


def encode_chats(tokenizer: Any, chats: Sequence[Messages]) -> list[list[int]]:
    """Token ids of each chat through the tokenizer's chat template, with the generation prompt."""
    return [
        list(
            tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        for m in chats
    ]


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence token ids: the model's generation config plus the tokenizer's eos."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _decode(
    model: Any,
    prefix: Any,
    prefix_len: int,
    rows: Sequence[Sequence[int]],
    pad_id: int,
    max_new_tokens: int,
    stops: set[int],
    grammars: Grammars | None = None,
    row_grammars: Sequence[Grammar] = (),
    sampling: Sampling | None = None,
) -> list[list[int]]:
    """New tokens for each suffix row after the shared prefix, each ending at its first stop token:
    greedy, or drawn by ``sampling``.

    With ``grammars`` (and one grammar per row in ``row_grammars``) every step's logits are masked to what the
    grammar allows, and the tokens the grammar then forces are queued with the chosen one and fed in chunks
    (:func:`chunk_length`: a lone row feeds its whole run in one forward pass; in a full batch a long run
    is spread over several passes rather than padding every other row to its length). Rows whose feeds are
    shorter are left-padded, the padding masked out of attention, and logits are computed at the chunk's
    last position only, and (greedy) only for the rows that choose their next token there.
    """
    import torch

    n = len(rows)
    ids, suffix_mask = _left_padded(rows, pad_id)
    positions = (prefix_len + suffix_mask.cumsum(-1) - 1).clamp(min=0)
    mask = torch.cat([torch.ones((n, prefix_len), dtype=torch.long), suffix_mask], dim=1)
    state = session(model, prefix, n, prefix_len + ids.shape[1] + max_new_tokens)
    logits = state.forward(ids, mask, positions)
    scored = list(range(n))  # the rows (indices into `alive`) that `logits` holds, in order
    last = positions[:, -1:]
    alive, generated = list(range(n)), [[] for _ in range(n)]
    constrained = grammars is not None
    matchers = [g.matcher() for g in row_grammars] if constrained else []
    bitmask = grammars.bitmask(n) if constrained else None
    queued: list[list[int]] = [[] for _ in range(n)]  # tokens a row still has to feed (a forced run's rest)
    while True:
        at = {j: k for k, j in enumerate(scored)}
        if constrained and scored:
            for j, row in enumerate(alive):
                if not queued[row]:
                    matchers[row].fill(bitmask, at[j])
            grammars.apply(logits, bitmask[: len(scored)])
        if not scored:
            tokens = []
        else:
            tokens = logits.argmax(-1).tolist() if sampling is None else sampling.pick(logits)
        keep = _take_tokens(
            tokens, at, alive, generated, queued, matchers, stops, max_new_tokens, constrained
        )
        if not keep:
            return generated
        if len(keep) < len(alive):
            state.select(keep)
            index = torch.tensor(keep)
            alive, mask, last = [alive[j] for j in keep], mask[index], last[index]
        # a chunk is left-padded, so every row's last fed token is the chunk's last position and the
        # output layer (a fifth of a step's work) runs there only: a forced token costs a body pass, no logits
        step = chunk_length([len(queued[row]) for row in alive])
        feeds = []
        for row in alive:
            feeds.append(queued[row][:step])
            del queued[row][:step]
        chunk, chunk_mask = _left_padded(feeds, pad_id)
        mask = torch.cat([mask, chunk_mask], dim=1)
        positions = last + chunk_mask.cumsum(-1).clamp(min=1)  # padding takes the row's next position, masked
        last = last + chunk_mask.sum(-1, keepdim=True)
        # greedy: logits only for the rows that choose next (a row still inside a forced run does not use
        # them); sampling scores every row, so each draw takes the generator's same place in the stream
        scored = list(range(len(alive)))
        if sampling is None:
            scored = [j for j, row in enumerate(alive) if not queued[row]]
        logits = state.forward(chunk, mask, positions, None if len(scored) == len(alive) else scored)


def _left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """``rows`` as one left-padded id tensor (rows x longest row) and its mask (1 on the real tokens)."""
    import torch

    n, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, mask


def _take_tokens(
    tokens: list[int],
    at: dict[int, int],
    alive: list[int],
    generated: list[list[int]],
    queued: list[list[int]],
    matchers: list[Any],
    stops: set[int],
    max_new_tokens: int,
    constrained: bool,
) -> list[int]:
    """Give each choosing row of ``alive`` its token (``tokens[at[j]]``) and, constrained, the run the
    grammar then forces (``constrained``: one matcher per row): appended to ``generated`` and queued to be fed. Returns the rows (indices into
    ``alive``) that go on: not stopped, within the budget, or still feeding a forced run."""
    keep = []
    for j, row in enumerate(alive):
        if queued[row]:  # its last fed token was inside a forced run: nothing to choose yet
            keep.append(j)
            continue
        tok = tokens[at[j]]
        generated[row].append(tok)
        if constrained:
            matchers[row].accept(tok)
        if tok in stops or len(generated[row]) >= max_new_tokens:
            continue
        queued[row] = [tok]
        if constrained:
            forced = matchers[row].forced(max_new_tokens - len(generated[row]))
            generated[row].extend(forced)
            queued[row].extend(forced)
            if len(generated[row]) >= max_new_tokens:
                continue
        keep.append(j)
    return keep


STEP_OVERHEAD_POSITIONS = 8
"""What one forward call costs beyond its positions, in positions' worth of compute: SmolLM2-135M,
2 threads, a batch-40 step computes a position in ~1.25 ms and pays ~10 ms per call regardless
(weights read once, op dispatch). Only the speed depends on it: fed tokens are the same either way."""


def chunk_length(queued: Sequence[int], overhead: float = STEP_OVERHEAD_POSITIONS) -> int:
    """How many queued tokens each row feeds in the next forward pass.

    Every row computes the chunk's full length (shorter feeds are padded), so one row with a long
    forced run (an evidence quote: 20-40 tokens) would make the whole batch compute that many
    positions for a handful of useful ones (measured on 40 demo prompts: 8,719 positions computed
    for 2,853 fed). The length chosen maximizes fed tokens per unit of cost, ``overhead + rows x
    length``; rows with more queued carry the rest to the next passes (their logits in between are
    not used). One row feeds its whole run at once; a full batch feeds about one token a row.
    """
    best, best_rate = 1, 0.0
    for length in sorted(set(queued)):
        rate = sum(min(q, length) for q in queued) / (overhead + len(queued) * length)
        if rate > best_rate:
            best, best_rate = length, rate
    return best


def generate_batched(
    model: Any,
    tokenizer: Any,
    chats: Sequence[Messages],
    *,
    batch_size: int,
    max_new_tokens: int,
    desc: str | None = "generate",
    constraint: Constraint | None = None,
    sampling: Sampling | None = None,
) -> list[Generation]:
    """Greedy (or sampled) answers to ``chats`` in input order.

    Args:
        model: any Hugging Face causal LM (eval mode), or an :class:`clap.model.engine.OpenVINOModel`.
        tokenizer: its tokenizer; needs a chat template and a pad token.
        chats: one message list per item (``clap.task.prompt.build_messages``).
        batch_size: prompts decoded together (1 = unbatched).
        max_new_tokens: generation budget per item.
        desc: progress label (:class:`clap.progress.Progress`, items); None: no progress shown.
        constraint: decode each chat only as its grammar allows (None: free decoding).
        sampling: draw each token (:class:`Sampling`); None: greedy.

    Returns:
        One :class:`Generation` per chat, same order as ``chats``.
    """
    import torch

    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has no pad token (clap.model.base.load_tokenizer sets one)")
    if constraint is not None and len(constraint.per_chat) != len(chats):
        raise ValueError(f"{len(constraint.per_chat)} grammars for {len(chats)} chats")
    encoded = encode_chats(tokenizer, chats)
    stops = set(stop_ids(model, tokenizer))
    prefix_len = shared_prefix_length(encoded)
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))  # stable: ties keep input order
    results: list[Generation | None] = [None] * len(encoded)
    progress = (
        Progress(len(encoded), desc, "item", leave=False) if desc is not None else contextlib.nullcontext()
    )
    with torch.inference_mode(), progress as bar:
        start = time.perf_counter()
        prefix = prefix_state(model, encoded[0][:prefix_len]) if prefix_len else None
        prefix_ms = (time.perf_counter() - start) * 1000.0
        for batch_index, lo in enumerate(range(0, len(order), batch_size)):
            idx = order[lo : lo + batch_size]
            start = time.perf_counter()
            new_rows = _decode(
                model,
                prefix,
                prefix_len,
                [encoded[i][prefix_len:] for i in idx],
                tokenizer.pad_token_id,
                max_new_tokens,
                stops,
                constraint.grammars if constraint is not None else None,
                [constraint.per_chat[i] for i in idx] if constraint is not None else (),
                sampling,
            )
            # the shared prefix's one forward pass is billed to the batches in proportion to their size
            wall_ms = (time.perf_counter() - start) * 1000.0 + prefix_ms * len(idx) / len(encoded)
            total = sum(len(r) for r in new_rows)
            for i, row in zip(idx, new_rows):
                text = tokenizer.decode(row, skip_special_tokens=True)
                results[i] = Generation(
                    text,
                    len(row),
                    len(encoded[i]),
                    wall_ms * len(row) / total,
                    wall_ms,
                    len(idx),
                    batch_index,
                    tuple(row),
                )
            if bar is not None:
                bar.update(len(idx))
    return [r for r in results if r is not None]
