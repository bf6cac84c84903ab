"""clap.chain.chain: retrieval -> prompt -> generation -> parsing, wired once for replay and serving."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import make_tiny_adapter, tiny_retrieval, write_tiny_admitted

from clap.chain import chain as chain_mod
from clap.chain.chain import Chain, ChainParams, build_index, load_chain
from clap.chain.grounding import AnswerSpace, answer_space
from clap.data.normalize import normalize_params
from clap.errors import ClapError
from clap.model.engine import EngineParams
from clap.model.generate import Generation
from clap.task.answer import load_answer_schema, parse_answer_schema
from clap.task.prompt import build_messages
from clap.task.scoring import context_text, parse_answer

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_answer_schema(ROOT / "params.yaml")
SPACE = answer_space(normalize_params(ROOT / "params.yaml"), SCHEMA)

RP = tiny_retrieval()
TORCH = EngineParams("torch", "f32")
CP = ChainParams(top_k=2, max_new_tokens=6, decoding="free", engine=TORCH, retrieval=RP)
ANSWER = '{"metric": "oee", "value": 86, "unit": "%", "line": "L3", "shift": "B", "date": "2026-01-15", "evidence": "x"}'


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> pd.DataFrame:
    root = write_tiny_admitted(tmp_path_factory.mktemp("chainkb") / "2026-01", n_sft=2, n_probe=2, seed=1)
    return pd.read_parquet(root / "kb.parquet")


class FakeGenerate:
    """Stands in for generate_batched: records the chats and answers every chat with ``text``."""

    def __init__(self, text: str):
        self.text, self.calls = text, []

    def __call__(self, model, tokenizer, chats, *, batch_size, max_new_tokens, desc="", constraint=None):
        self.calls.append(
            {
                "chats": chats,
                "batch_size": batch_size,
                "max_new_tokens": max_new_tokens,
                "constraint": constraint,
            }
        )
        return [Generation(self.text, 5, 20, 7.0, 7.0 * len(chats), len(chats), 0) for _ in chats]


def test_rag_prompt_holds_the_retrieved_docs(kb, monkeypatch):
    fake = FakeGenerate("Sure! " + ANSWER)
    monkeypatch.setattr(chain_mod, "generate_batched", fake)
    index = build_index(kb, CP)
    questions = ["oee on line L3, late shift?", "oee for L1 early shift"]
    answers = Chain(None, None, index, CP, SPACE).answer(questions, rag=True, batch_size=4)
    expected_docs = [[(h.doc_id, h.text) for h in index.search(q, 2)] for q in questions]
    assert [a.retrieved.doc_ids for a in answers] == [[d for d, _ in docs] for docs in expected_docs]
    assert (
        answers[0].retrieved.doc_ids[0] == "KB-oee-L3-B" and answers[1].retrieved.doc_ids[0] == "KB-oee-L1-A"
    )
    assert fake.calls[0]["chats"] == [build_messages(q, d, SCHEMA) for q, d in zip(questions, expected_docs)]
    assert (fake.calls[0]["batch_size"], fake.calls[0]["max_new_tokens"]) == (4, 6)
    assert fake.calls[0]["constraint"] is None  # free decoding
    for a, docs in zip(answers, expected_docs):
        assert a.rag and a.valid and a.parsed == parse_answer("Sure! " + ANSWER, SCHEMA)
        assert a.context == context_text(docs)
        assert a.latency_ms == pytest.approx(a.retrieved.retrieval_ms + 7.0)


def test_no_rag_prompt_has_no_documents(kb, monkeypatch):
    fake = FakeGenerate("no idea")
    monkeypatch.setattr(chain_mod, "generate_batched", fake)
    (a,) = Chain(None, None, build_index(kb, CP), CP, SPACE).answer(
        ["oee on line L3, late shift?"], rag=False, batch_size=1
    )
    assert fake.calls[0]["chats"] == [build_messages("oee on line L3, late shift?", None, SCHEMA)]
    assert a.retrieved.doc_ids == [] and a.context == "" and not a.rag
    assert not a.valid and a.parsed.error


def test_rag_without_index_is_refused():
    with pytest.raises(ClapError, match="no knowledge base index"):
        Chain(None, None, None, CP, SPACE).answer(["q"], rag=True, batch_size=1)


def test_the_space_s_declared_answer_shapes_prompt_and_parsing(kb, monkeypatch):
    """Under free decoding too, the prompt's instruction and the parser are the space's declared answer."""
    other = parse_answer_schema(
        {
            "instruction": "Reply with one JSON object with keys",
            "answer": {
                "row": {"role": "key", "type": "text", "weight": 1},
                "period": {"role": "key", "type": "date", "weight": 1},
                "evidence": {"role": "evidence", "weight": 1},
                "value": {"role": "value", "type": "number", "weight": 1},
            },
            "slice_columns": [],
            "show_doc_ids": True,
            "context": {"docs": 0, "cues": []},
        }
    )
    text = '{"row": "oee", "period": "2026-01-15", "metric": "oee", "evidence": "x", "value": 86}'
    fake = FakeGenerate(text)
    monkeypatch.setattr(chain_mod, "generate_batched", fake)
    space = AnswerSpace(other, {}, {}, SPACE.vocab)
    (a,) = Chain(None, None, build_index(kb, CP), CP, space).answer(["oee on L3?"], rag=False, batch_size=1)
    assert fake.calls[0]["chats"] == [build_messages("oee on L3?", None, other)]
    assert fake.calls[0]["chats"][0][0]["content"] == (
        'Reply with one JSON object with keys "row", "period", "evidence", "value".'
    )
    assert a.valid and a.parsed == parse_answer(text, other)
    assert a.parsed.fields == {"row": "oee", "period": "2026-01-15", "evidence": "x", "value": 86}


def test_tiny_models_answer_through_the_chain(tiny_base, kb, tmp_path):
    adapter = make_tiny_adapter(tiny_base, tmp_path / "adapter", seed=4)
    index = build_index(kb, CP)
    questions = ["oee on line L3, late shift?", "scrap_count L2 early shift"]
    base = load_chain(tiny_base, None, index, CP, SPACE).answer(questions, rag=True, batch_size=2)
    tuned = load_chain(tiny_base, adapter, index, CP, SPACE).answer(questions, rag=True, batch_size=2)
    assert [a.retrieved.doc_ids for a in base] == [a.retrieved.doc_ids for a in tuned]
    assert all(0 < a.generation.new_tokens <= 6 and a.latency_ms > 0 for a in base + tuned)
    assert [a.generation.text for a in base] != [a.generation.text for a in tuned]  # the adapter is applied
    assert all(a.parsed == parse_answer(a.generation.text, SCHEMA) for a in base + tuned)


def test_params_refuse_nonsense():
    with pytest.raises(ClapError, match="top_k"):
        ChainParams(top_k=0, max_new_tokens=6, decoding="free", engine=TORCH, retrieval=RP)
