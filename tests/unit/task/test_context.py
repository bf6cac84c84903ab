"""clap.task.context: an item's context documents, in order, or a loud error."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from clap.errors import ClapError
from clap.task.context import item_docs, kb_bodies

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
