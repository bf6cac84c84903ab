"""clap.model.generate: batched left-padded greedy generation equals per-item generation, in input order;
sampled generation draws each token from the model's own softmax, reproducibly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import scramble_weights
from hypothesis import given
from hypothesis import strategies as st

from clap.model.generate import Sampling, chunk_length, encode_chats, generate_batched, stop_ids
from clap.task.answer import load_answer_schema
from clap.task.prompt import build_messages

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")

QUESTIONS = [
    "What was the OEE on line L1, shift A, 2026-03-02?",
    "Scrap?",
    "What was the first pass yield on line L3, shift B, on 2026-03-14 according to the MES shift report?",
    "Downtime L2 C 2026-03-05",
    "What was the defect rate (ppm) on L4 during shift A on 2026-03-09?",
]
DOCS = [
    ("MES-1", "Shift report L1/A 02.03.2026: OEE 78,4 %"),
    ("CMMS-7", "Line L2 stopped 45 min, jam at station 3"),
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model_and_tok(tiny_base):
    from clap.model.base import load_model, load_tokenizer

    model = scramble_weights(load_model(tiny_base), seed=0)
    return model, load_tokenizer(tiny_base, padding_side="left")


def _reference(model, tok, chats, max_new_tokens):
    """Naive per-item generate: no padding at all."""
    out = []
    for ids in encode_chats(tok, chats):
        with torch.inference_mode():
            seq = model.generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=stop_ids(model, tok),
            )
        out.append(seq[0, len(ids) :].tolist())
    return out


def test_batched_equals_per_item_and_keeps_input_order(model_and_tok):
    model, tok = model_and_tok
    chats = [build_messages(q, DOCS[: i % 3], ANSWER) for i, q in enumerate(QUESTIONS)]
    batched = generate_batched(model, tok, chats, batch_size=3, max_new_tokens=12)
    reference = _reference(model, tok, chats, 12)
    assert len(batched) == len(chats)
    assert len({g.text for g in batched}) == len(chats)  # answers differ, so order and padding matter
    for gen, ref in zip(batched, reference):
        assert gen.new_tokens == len(ref) or ref[gen.new_tokens - 1] in stop_ids(model, tok)
        assert gen.text == tok.decode(ref[: gen.new_tokens], skip_special_tokens=True)
    lengths = [len(x) for x in encode_chats(tok, chats)]
    assert [g.prompt_tokens for g in batched] == lengths


def test_latency_is_apportioned_within_each_batch(model_and_tok):
    model, tok = model_and_tok
    chats = [build_messages(q, None, ANSWER) for q in QUESTIONS]
    gens = generate_batched(model, tok, chats, batch_size=2, max_new_tokens=4)
    by_batch: dict[float, list] = {}
    for g in gens:
        by_batch.setdefault(g.batch_wall_ms, []).append(g)
    assert sorted(len(v) for v in by_batch.values()) == [1, 2, 2]
    for wall, members in by_batch.items():
        assert sum(g.latency_ms for g in members) == pytest.approx(wall)
        assert all(g.batch_size == len(members) for g in members)


def test_missing_pad_token_is_refused(model_and_tok):
    model, tok = model_and_tok

    class NoPad:
        pad_token_id = None

    with pytest.raises(ValueError):
        generate_batched(model, NoPad(), [build_messages("q", None, ANSWER)], batch_size=1, max_new_tokens=2)


def test_rows_leave_the_batch_at_their_stop_token(model_and_tok, monkeypatch):
    """Rows that stop early drop out of the batch; the rest go on exactly as they would alone."""
    import clap.model.generate as gen_mod

    model, tok = model_and_tok
    chats = [build_messages(q, DOCS[: i % 3], ANSWER) for i, q in enumerate(QUESTIONS)]
    free = _reference(model, tok, chats, 12)
    # a token some answers emit (and others never): it ends those answers early
    stops = [next(t for row in free for t in row if 0 < sum(t in r for r in free) < len(free))]
    monkeypatch.setattr(gen_mod, "stop_ids", lambda model, tok: stops)
    monkeypatch.setattr(model.generation_config, "eos_token_id", stops)
    reference = _reference(model, tok, chats, 12)
    batched = generate_batched(model, tok, chats, batch_size=5, max_new_tokens=12)
    assert min(g.new_tokens for g in batched) < 12 and max(g.new_tokens for g in batched) == 12
    for gen, ref in zip(batched, reference):
        n = next((i + 1 for i, t in enumerate(ref) if t in stops), len(ref))
        assert gen.new_tokens == n
        assert gen.text == tok.decode(ref[:n], skip_special_tokens=True)


def test_rows_without_a_shared_prefix_are_left_padded(model_and_tok):
    """No common prefix (prefix_len 0): plain left padding, still equal to unpadded generation."""
    from clap.model.generate import _decode

    model, tok = model_and_tok
    rows = [[5, 9, 13, 2 + i] * (1 + i) for i in range(4)]
    with torch.inference_mode():
        got = _decode(model, None, 0, rows, tok.pad_token_id, 6, set())
        for row, new in zip(rows, got):
            ref = model.generate(
                input_ids=torch.tensor([row]),
                max_new_tokens=6,
                min_new_tokens=6,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            assert new == ref[0, len(row) :].tolist()


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([[1, 2, 3], [1, 2, 4, 5]], 2),
        ([[1, 2, 3], [1, 2, 3, 4]], 2),  # a row that is all prefix keeps its last token to feed
        ([[7, 8]], 1),
        ([[1, 2], [3, 4]], 0),
        ([], 0),
    ],
)
def test_shared_prefix_length(rows, expected):
    from clap.model.kv import shared_prefix_length

    assert shared_prefix_length(rows) == expected


def test_sampling_draws_from_the_tempered_softmax():
    from scipy import stats

    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(40_000, -1)
    draws = Sampling(0.7, torch.Generator().manual_seed(3)).pick(logits)
    expected = torch.softmax(logits[0] / 0.7, dim=-1).numpy() * len(draws)
    observed = [draws.count(t) for t in range(4)]
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    with pytest.raises(ValueError):
        Sampling(0.0, torch.Generator())


def test_sampled_tokens_follow_the_models_own_conditionals(model_and_tok):
    """Each sampled token is the draw a fresh full forward over the prompt and the tokens so far gives
    from a generator in the same state: the cache, positions and sampling feed the right logits."""
    model, tok = model_and_tok
    chat = build_messages(QUESTIONS[2], DOCS[:1], ANSWER)
    got = generate_batched(
        model,
        tok,
        [chat],
        batch_size=1,
        max_new_tokens=8,
        sampling=Sampling(1.3, torch.Generator().manual_seed(5)),
    )[0]
    replay = Sampling(1.3, torch.Generator().manual_seed(5))
    ids = encode_chats(tok, [chat])[0]
    with torch.inference_mode():
        for token in got.token_ids:
            assert replay.pick(model(input_ids=torch.tensor([ids])).logits[:, -1]) == [token]
            ids.append(token)
    assert got.new_tokens == len(got.token_ids) and got.text == tok.decode(
        got.token_ids, skip_special_tokens=True
    )


def test_a_group_of_one_prompt_samples_different_reproducible_completions(model_and_tok):
    """The GRPO case: copies of one prompt in one batch (its whole prompt is the shared prefix)."""
    model, tok = model_and_tok
    chats = [build_messages(QUESTIONS[0], DOCS, ANSWER)] * 4

    def draw(seed):
        sampling = Sampling(1.0, torch.Generator().manual_seed(seed))
        return [
            g.token_ids
            for g in generate_batched(model, tok, chats, batch_size=4, max_new_tokens=6, sampling=sampling)
        ]

    first = draw(11)
    assert first == draw(11) and len(set(first)) > 1 and first != draw(12)
    stops = set(stop_ids(model, tok))
    assert all(len(c) == 6 or (c[-1] in stops and not stops & set(c[:-1])) for c in first)


@given(st.lists(st.integers(1, 60), min_size=1, max_size=48), st.floats(0.0, 64.0))
def test_chunk_length_feeds_the_most_tokens_per_unit_of_cost(queued, overhead):
    """Brute force over every length: none feeds more tokens per ``overhead + rows x length``."""
    rate = lambda t: sum(min(q, t) for q in queued) / (overhead + len(queued) * t)  # noqa: E731
    chosen = chunk_length(queued, overhead)
    assert 1 <= chosen <= max(queued)
    assert rate(chosen) >= max(rate(t) for t in range(1, max(queued) + 1)) * (1 - 1e-12)


def test_chunk_length_lone_row_feeds_its_run_and_a_full_batch_about_one_token():
    assert chunk_length([37]) == 37
    assert chunk_length([37] + [1] * 39) == 1  # was 37 positions for each of 40 rows
    assert chunk_length([5, 5, 5, 5]) == 5
