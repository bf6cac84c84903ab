"""clap.task.context: an item's context documents, in order, or a loud error."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from layout import ROOT

from clap.errors import ClapError
from clap.judge.evaluation import item_contexts
from clap.task.answer import ContextSpec, load_answer_schema
from clap.task.context import item_docs, kb_bodies
from clap.train.sft import build_examples

KB = pd.DataFrame({"doc_id": ["D1", "D2", "D3"], "body": ["one", "two", "three"]})


@pytest.mark.parametrize("ids", [["D3", "D1"], ["D2"], ["D1", "D2", "D3"]])
def test_item_docs_follow_context_order(ids):
    row = {"item_id": "Q1", "context_doc_ids": json.dumps(ids)}
    assert item_docs(row, KB) == [(d, dict(zip(KB.doc_id, KB.body))[d]) for d in ids]


def test_item_docs_accepts_lists_arrays_series_rows_and_a_prebuilt_index():
    bodies = kb_bodies(KB)
    assert item_docs({"item_id": "Q", "context_doc_ids": ["D2", "D1"]}, bodies) == [
        ("D2", "two"),
        ("D1", "one"),
    ]
    assert item_docs({"item_id": "Q", "context_doc_ids": np.array(["D3"])}, KB) == [("D3", "three")]
    row = pd.DataFrame({"item_id": ["Q"], "context_doc_ids": ['["D1"]']}).iloc[0]
    assert item_docs(row, KB) == [("D1", "one")]


def test_replay_items_have_no_context():
    assert item_docs({"item_id": "R1", "context_doc_ids": "[]"}, KB) == []


def test_unknown_doc_raises_naming_item_and_doc():
    with pytest.raises(ClapError) as e:
        item_docs({"item_id": "Q7", "context_doc_ids": '["D1", "D404"]'}, KB)
    assert e.value.rule == "context_doc_unknown" and e.value.column == "context_doc_ids"
    assert "Q7" in str(e.value) and "D404" in str(e.value)


def test_malformed_context_raises():
    with pytest.raises(ClapError) as e:
        item_docs({"item_id": "Q8", "context_doc_ids": "D1, D2"}, KB)
    assert e.value.rule == "malformed_context" and "Q8" in str(e.value)


def test_repeated_doc_id_in_kb_raises():
    kb = pd.concat([KB, KB.iloc[[0]]])
    with pytest.raises(ClapError) as e:
        kb_bodies(kb)
    assert e.value.rule == "duplicate_doc_id" and "D1" in str(e.value)


REPORT = pd.DataFrame(
    {
        "doc_id": ["R1", "R2", "R3", "R4", "P1"],
        "body": [
            "Revenue: 2019 $1,200; 2018 $1,100",
            "Cost of sales: 2019 $700; 2018 $650",
            "Gross profit: 2019 $500; 2018 $450",
            "Operating expenses: 2019 $300; 2018 $280",
            "Revenue grew because of higher volumes in Europe.",
        ],
    }
)


def _item(split: str, evidence: str = "R1", question: str = "What was the revenue in 2019?") -> dict:
    return {
        "item_id": "Q",
        "question": question,
        "split": split,
        "evidence_doc_id": evidence,
        "context_doc_ids": list(REPORT.doc_id),
    }


def test_context_docs_keeps_the_best_ranked_in_cited_order():
    shown = item_docs(_item("eval"), REPORT, ContextSpec(2))
    assert [d for d, _ in shown] == ["R1", "P1"]  # the two that say "revenue", R1 first as cited


def test_context_docs_zero_or_at_least_the_cited_number_shows_every_document():
    every = [d for d, _ in item_docs(_item("eval"), REPORT)]
    assert every == list(REPORT.doc_id)
    assert [d for d, _ in item_docs(_item("eval"), REPORT, ContextSpec(5))] == every


def test_a_training_item_always_shows_its_evidence_a_held_out_one_what_its_question_finds():
    train = item_docs(_item("train", evidence="R4"), REPORT, ContextSpec(2))
    held = item_docs(_item("eval", evidence="R4"), REPORT, ContextSpec(2))
    assert [d for d, _ in train] == ["R1", "R4"]  # the evidence replaced the lower ranked P1
    assert [d for d, _ in held] == ["R1", "P1"]


def test_a_question_of_stopwords_only_keeps_the_first_cited():
    shown = item_docs(_item("eval", question="What was it?"), REPORT, ContextSpec(2))
    assert [d for d, _ in shown] == ["R1", "R2"]


def test_cues_add_the_document_that_states_a_convention():
    report = pd.concat(
        [REPORT, pd.DataFrame({"doc_id": ["P2"], "body": ["Amounts are shown in thousands."]})],
        ignore_index=True,
    )
    item = {**_item("eval"), "context_doc_ids": list(report.doc_id)}
    shown = item_docs(item, report, ContextSpec(2, ("thousands", "millions")))
    assert [d for d, _ in shown] == ["R1", "P1", "P2"]
    assert item_docs(item, report, ContextSpec(2, ("billions",))) == item_docs(item, report, ContextSpec(2))


def test_training_and_eval_prompts_show_the_same_documents_the_rule_picks():
    """sft's examples and eval's contexts resolve an item through task.context (one rule, every stage)."""
    schema = dataclasses.replace(load_answer_schema(ROOT / "params.yaml"), context=ContextSpec(2))
    items = pd.DataFrame([_item("train", evidence="R4")])
    items["answer"] = ""
    for name in schema.names:
        items[name] = "1" if name != "date" else "2026-01-01"
    items["value"] = 1.0
    prompt = build_examples(items, REPORT, schema)[0]["prompt"][-1]["content"]
    assert "Operating expenses" in prompt and "Revenue: 2019" in prompt and "Gross profit" not in prompt
    shown = item_contexts(items.assign(split="eval"), REPORT, schema.context)[0]
    assert [d for d, _ in shown] == ["R1", "P1"]
