"""Constrained decoding on the tiny random model: every answer is a valid object of its schema,
forced-token chunks change no token, and free decoding is untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clap.model.base import load_model, load_tokenizer
from clap.model.constrain import Constraint, Grammars, RowMatcher
from clap.model.generate import generate_batched, stop_ids
from clap.task.answer import load_answer_schema
from clap.task.prompt import answer_json_schema, build_messages

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
FIELDS = ANSWER.names
VOCAB = {"metric": ["oee", "scrap_count"], "line": ["L1", "L2"], "shift": ["A", "B"], "unit": ["%", "pcs"]}
UNITS = {"oee": "%", "scrap_count": "pcs"}
DOCS = [
    [("KB-1", "Line L1 on 2026-01-05, shift A. OEE was 81.5 %. Nothing else happened.")],
    [("KB-2", "Scrap on line L2 reached 14 pcs on 6 January 2026. The late shift ran.")],
    [("KB-3", "A short note without a number.")],
]
QUOTES = [
    ["Line L1 on 2026-01-05, shift A", "OEE was 81.5 %", "Nothing else happened"],
    ["Scrap on line L2 reached 14 pcs on 6 January 2026", "The late shift ran"],
    ["A short note without a number"],
]
DATES = [["2026-01-05"], ["2026-01-06"], []]


@pytest.fixture(scope="module")
def tiny(tiny_base):
    return load_model(tiny_base), load_tokenizer(tiny_base, padding_side="left")


def _constraint(model, tok):
    grammars = Grammars(tok, model.config.vocab_size, stop_ids(model, tok))
    schemas = [answer_json_schema(ANSWER, VOCAB, q, UNITS, d) for q, d in zip(QUOTES, DATES)]
    return Constraint(grammars, [grammars.compile(s) for s in schemas]), schemas


def _chats():
    return [build_messages(f"question {i}?", d, ANSWER) for i, d in enumerate(DOCS)]


def test_every_constrained_answer_is_a_valid_object_of_its_own_schema(tiny):
    model, tok = tiny
    constraint, _ = _constraint(model, tok)
    gens = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=400, constraint=constraint)
    for g, quotes, dates in zip(gens, QUOTES, DATES):
        answer = json.loads(g.text)  # a random model: only the grammar makes this parse
        assert list(answer) == list(FIELDS)
        assert answer["metric"] in VOCAB["metric"] and answer["unit"] == UNITS[answer["metric"]]
        assert answer["line"] in VOCAB["line"] and answer["shift"] in VOCAB["shift"]
        assert answer["evidence"] in quotes
        assert isinstance(answer["value"], (int, float))
        if dates:
            assert answer["date"] in dates
        keys = ", ".join(f'"{k}": ' for k in FIELDS)
        assert keys == ", ".join(f'"{k}": ' for k in answer)
        assert g.text.startswith('{"metric": "') and '", "line": "' in g.text  # format_answer's layout
        assert " \n" not in g.text and "  " not in g.text.replace(answer["evidence"], "")


def test_free_decoding_of_the_random_model_does_not_parse(tiny):
    model, tok = tiny
    gens = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=20)
    assert not any(g.text.startswith('{"metric": ') for g in gens)  # the constraint above did all the work


def test_forced_chunks_save_forward_passes_and_stay_valid(tiny, monkeypatch):
    """Forced tokens go in one forward pass. Their tokenization is the grammar's (longest tokens),
    so a random model, which would pick other splits of the same text step by step, can diverge
    after them; on the trained adapter the two agree on every held-out answer
    (benchmarks/results/constrained_decoding.json: identical_to_step)."""
    model, tok = tiny
    constraint, _ = _constraint(model, tok)
    chunked = generate_batched(model, tok, _chats(), batch_size=2, max_new_tokens=400, constraint=constraint)
    calls = {"n": 0}
    forward = type(model).forward

    def counting(self, *a, **k):
        calls["n"] += 1
        return forward(self, *a, **k)

    monkeypatch.setattr(type(model), "forward", counting)
    generate_batched(model, tok, _chats(), batch_size=2, max_new_tokens=400, constraint=constraint)
    with_jump = calls["n"]
    calls["n"] = 0
    monkeypatch.setattr(RowMatcher, "forced", lambda self, limit: [])  # one decoding step per token
    stepwise = generate_batched(model, tok, _chats(), batch_size=2, max_new_tokens=400, constraint=constraint)
    for g in stepwise + chunked:
        assert list(json.loads(g.text)) == list(FIELDS)
    assert calls["n"] > 1.5 * with_jump  # most of the JSON skeleton is forced


def test_budget_cuts_a_constrained_answer_and_it_fails_to_parse(tiny):
    model, tok = tiny
    constraint, _ = _constraint(model, tok)
    gens = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=7, constraint=constraint)
    assert all(g.new_tokens <= 7 for g in gens)
    for g in gens:
        with pytest.raises(json.JSONDecodeError):
            json.loads(g.text)


def test_grammar_count_must_match_chats(tiny):
    model, tok = tiny
    constraint, _ = _constraint(model, tok)
    with pytest.raises(ValueError, match="3 grammars for 2 chats"):
        generate_batched(model, tok, _chats()[:2], batch_size=2, max_new_tokens=5, constraint=constraint)


def test_schemas_compile_once(tiny):
    model, tok = tiny
    grammars = Grammars(tok, model.config.vocab_size, stop_ids(model, tok))
    s = answer_json_schema(ANSWER, VOCAB, QUOTES[0], UNITS, DATES[0])
    assert grammars.compile(s) is grammars.compile(json.loads(json.dumps(s)))


@pytest.mark.parametrize("policy", [lambda q: max(q), lambda q: 1])
def test_how_forced_runs_are_chunked_changes_no_token(tiny, monkeypatch, policy):
    """A forced run fed in one pass (padding the other rows), one token a pass, or as
    chunk_length chooses: the same keys and values, so the same answers."""
    model, tok = tiny
    constraint, _ = _constraint(model, tok)
    chosen = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=400, constraint=constraint)
    monkeypatch.setattr("clap.model.generate.chunk_length", policy)
    other = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=400, constraint=constraint)
    assert [g.token_ids for g in other] == [g.token_ids for g in chosen]
