"""schemas.assets: one good frame per asset, one bad frame per rule."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pandera.pandas as pa
import pytest

from clap.task.answer import load_answer_schema
from schemas.assets import asset_schemas

_S = asset_schemas(
    load_answer_schema(Path(__file__).resolve().parents[2] / "params.yaml")
)  # the demo's declaration
RecordsAsset, KbAsset, SftAsset, EvalAsset, ReplayAsset, RejectsAsset = (
    _S[n] for n in ("records", "kb", "sft", "eval", "replay", "rejects")
)

SRC = {"source_file": "f.csv", "source_line": 2}
RECORD = {
    "record_id": "SR-1",
    "source_system": "mes",
    "line_raw": "L3 ",
    "shift_raw": "B",
    "date_raw": "14.03.2026",
    "metric_raw": "98,2% FPY",
    "value": 98.2,
    "unit_raw": "%",
    "text": "",
    **SRC,
}
KB = {"doc_id": "KB-1", "system": "mes", "record_ref": "SR-1", "title": "t", "body": "FPY was 98.2 %.", **SRC}
ITEM = {
    "item_id": "Q-1",
    "split": "train",
    "question": "FPY on L3?",
    "question_type": "direct",
    "context_doc_ids": '["KB-1", "KB-2"]',
    "metric_raw": "FPY",
    "value_raw": "98,2",
    "unit_raw": "%",
    "line_raw": "L3",
    "shift_raw": "B",
    "date_raw": "2026-03-14",
    "evidence": "FPY was 98.2 %",
    "evidence_doc_id": "KB-1",
    **SRC,
}
REJECT = {
    "source_system": "mes",
    "record_id": None,
    "rule": "bad_json",
    "column": "<row>",
    "detail": "x",
    "raw": "{",
    **SRC,
}


def frame(row: dict, n: int = 2, **changes) -> pd.DataFrame:
    rows = [dict(row) for _ in range(n)]
    for key in ("record_id", "doc_id", "item_id"):
        if key in row:
            for i, r in enumerate(rows):
                r[key] = f"{row[key]}-{i}"
    for col, value in changes.items():
        rows[-1][col] = value
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "model,row",
    [
        (RecordsAsset, RECORD),
        (KbAsset, KB),
        (SftAsset, ITEM),
        (EvalAsset, dict(ITEM, split="eval")),
        (ReplayAsset, dict(ITEM, split="replay", context_doc_ids="[]")),
        (RejectsAsset, REJECT),
    ],
)
def test_good_frames_pass(model, row):
    out = model.validate(frame(row), lazy=True)
    assert len(out) == 2


def test_coerce_turns_numeric_text_into_numbers():
    out = RecordsAsset.validate(frame(RECORD, value="42", source_line="7"), lazy=True)
    assert out["value"].tolist() == [98.2, 42.0] and out["source_line"].dtype == "int64"


BAD = [  # (what, model, good row, change of the last row, failing column, failing check)
    ("duplicate record_id", RecordsAsset, RECORD, {"record_id": "SR-1-0"}, "record_id", "field_uniqueness"),
    (
        "source system not a source name",
        RecordsAsset,
        RECORD,
        {"source_system": "ERP export"},
        "source_system",
        "str_matches",
    ),
    ("null value", RecordsAsset, RECORD, {"value": None}, "value", "not_nullable"),
    ("infinite value", RecordsAsset, RECORD, {"value": math.inf}, "value", "finite"),
    ("value not a number", RecordsAsset, RECORD, {"value": "n/a"}, "value", "coerce_dtype"),
    ("null string", RecordsAsset, RECORD, {"line_raw": None}, "line_raw", "not_nullable"),
    (
        "source_line below 1",
        RecordsAsset,
        RECORD,
        {"source_line": 0},
        "source_line",
        "greater_than_or_equal_to",
    ),
    ("duplicate doc_id", KbAsset, KB, {"doc_id": "KB-1-0"}, "doc_id", "field_uniqueness"),
    ("null body", KbAsset, KB, {"body": None}, "body", "not_nullable"),
    ("duplicate item_id", SftAsset, ITEM, {"item_id": "Q-1-0"}, "item_id", "field_uniqueness"),
    ("eval row in sft", SftAsset, ITEM, {"split": "eval"}, "split", "isin"),
    ("train row in eval", EvalAsset, dict(ITEM, split="eval"), {"split": "train"}, "split", "isin"),
    ("unknown split", ReplayAsset, dict(ITEM, split="replay"), {"split": "test"}, "split", "isin"),
    (
        "context not JSON",
        SftAsset,
        ITEM,
        {"context_doc_ids": "KB-1;KB-2"},
        "context_doc_ids",
        "json_list_of_strings",
    ),
    (
        "context not a list of strings",
        SftAsset,
        ITEM,
        {"context_doc_ids": "[1, 2]"},
        "context_doc_ids",
        "json_list_of_strings",
    ),
    ("unknown reject rule", RejectsAsset, REJECT, {"rule": "looks_odd"}, "rule", "isin"),
    (
        "reject system not a source name",
        RejectsAsset,
        REJECT,
        {"source_system": ""},
        "source_system",
        "str_matches",
    ),
    ("null reject detail", RejectsAsset, REJECT, {"detail": None}, "detail", "not_nullable"),
]


@pytest.mark.parametrize("what,model,row,change,column,check", BAD, ids=[b[0] for b in BAD])
def test_bad_frames_fail_on_their_rule(what, model, row, change, column, check):
    with pytest.raises(pa.errors.SchemaErrors) as e:
        model.validate(frame(row, **change), lazy=True)
    failed = {(c, str(k)) for c, k in e.value.failure_cases[["column", "check"]].itertuples(index=False)}
    assert any(c == column and k.startswith(check) for c, k in failed), failed


@pytest.mark.parametrize(
    "model,row", [(RecordsAsset, RECORD), (KbAsset, KB), (SftAsset, ITEM), (RejectsAsset, REJECT)]
)
def test_strict_columns(model, row):
    with pytest.raises(pa.errors.SchemaErrors):
        model.validate(frame(row).assign(extra=1), lazy=True)
    with pytest.raises(pa.errors.SchemaErrors):
        model.validate(frame(row).drop(columns=["source_line"]), lazy=True)
