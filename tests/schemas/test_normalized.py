"""schemas.normalized: one good frame per model passes; one bad frame per rule fails, naming the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from clap.data.normalize import build_vocab, input_hash, normalize_params
from clap.errors import ClapError
from schemas.normalized import (
    NormalizedRejects,
    normalized_items,
    normalized_kb,
    normalized_records,
    validate_frame,
)

V = build_vocab(
    normalize_params(Path(__file__).resolve().parents[2] / "params.yaml")
)  # the demo's declaration
NormalizedRecords, NormalizedKB, NormalizedItems = (
    normalized_records(V),
    normalized_kb(V),
    normalized_items(V),
)


def _name(model) -> str:
    return getattr(model, "__name__", None) or model.name


def records() -> pd.DataFrame:
    return pd.DataFrame({
        "record_id": ["SR-1", "QI-1"], "source_system": ["mes", "qms"], "line": ["L3", "L7"], "shift": ["B", "C"],
        "date": ["2026-03-14", "2026-03-15"], "metric": ["oee", "first_pass_yield"], "value": [81.5, 97.2], "unit": ["%", "%"],
        "text": ["OEE 81,5 %", ""], "source_file": ["mes_shift_reports.csv", "quality_inspections.jsonl"], "source_line": [2, 1],
    })  # fmt: skip


def kb() -> pd.DataFrame:
    return pd.DataFrame({
        "doc_id": ["KB-1", "KB-2"], "system": ["mes", "cmms"], "record_ref": ["SR-1", None], "title": ["Shift report L3/B", "Ticket"],
        "body": ["Line L3, shift B. OEE was 81.5 %.", "Unrelated note."], "metric": ["oee", None], "line": ["L3", None], "shift": ["B", None], "date": ["2026-03-14", None],
    })  # fmt: skip


def items() -> pd.DataFrame:
    questions = ["What was the OEE on L3, shift B, 2026-03-14?", "OEE L3 B?"]
    return pd.DataFrame({
        "item_id": ["Q-1", "Q-2"], "split": ["train", "train"], "question": questions, "question_type": ["direct", "terse"],
        "context_doc_ids": [json.dumps(["KB-1", "KB-2"]), "[]"], "metric": ["oee", "oee"], "value": [81.5, 81.5], "unit": ["%", "%"],
        "line": ["L3", "L3"], "shift": ["B", "B"], "date": ["2026-03-14", "2026-03-14"], "evidence": ["OEE was 81.5 %"] * 2,
        "evidence_doc_id": ["KB-1", "KB-1"], "source_system": ["mes", "mes"], "input_hash": [input_hash(q) for q in questions],
        "source_file": ["question_log.jsonl"] * 2, "source_line": [1, 2],
    })  # fmt: skip


def rejects() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "artifact": ["sft", "records"],
            "item_id": ["Q-9", "SR-9"],
            "rule": ["unknown_metric", "duplicate_across_systems"],
            "action": ["rejected", "deduplicated"],
            "detail": ["x", "y"],
        }
    )


_GOOD = [
    (NormalizedRecords, records),
    (NormalizedKB, kb),
    (NormalizedItems, items),
    (NormalizedRejects, rejects),
]


def good(model) -> pd.DataFrame:
    return next(make for m, make in _GOOD if m is model)()


@pytest.mark.parametrize("model", [m for m, _ in _GOOD], ids=_name)
def test_good_frame_passes(model):
    out = validate_frame(model, good(model), "good.parquet")
    assert len(out) == 2


def _set(col, value, row=0):
    def mutate(df):
        df[col] = df[col].astype(object)
        df.at[row, col] = value
        return df

    return mutate


BAD = [
    (NormalizedRecords, _set("record_id", "QI-1"), "field_uniqueness"),
    (NormalizedRecords, _set("source_system", "ERP export"), "str_matches"),
    (NormalizedRecords, _set("line", "Line 3"), "isin"),
    (NormalizedRecords, _set("shift", "late"), "isin"),
    (NormalizedRecords, _set("date", "14.03.2026"), "str_matches"),
    (NormalizedRecords, _set("date", "2026-02-30"), "valid_date"),
    (NormalizedRecords, _set("metric", "First Pass Yield"), "isin"),
    (NormalizedRecords, _set("value", float("nan")), "not_nullable"),
    (NormalizedRecords, _set("value", float("inf")), "finite_value"),
    (NormalizedRecords, _set("unit", "pct"), "isin"),
    (NormalizedRecords, _set("source_line", 0), "greater_than_or_equal_to"),
    (NormalizedRecords, lambda df: df.assign(extra=1), "column_in_schema"),
    (NormalizedRecords, lambda df: df.drop(columns="unit"), "column_in_dataframe"),
    (
        NormalizedRecords,
        lambda df: df.assign(metric="oee", unit=["%", "pct"], value=[1.0, 2.0]),
        "one_unit_per_metric",
    ),
    (
        NormalizedRecords,
        lambda df: df.assign(line="L3", shift="B", date="2026-03-14", metric="oee", value=81.5, unit="%"),
        "no_duplicate_fact",
    ),
    (NormalizedKB, _set("doc_id", "KB-2"), "field_uniqueness"),
    (NormalizedKB, _set("system", "SAP docs"), "str_matches"),
    (NormalizedKB, _set("body", ""), "str_length"),
    (NormalizedKB, _set("body", "OEE  was\u00a081.5 %"), "cleaned_text"),
    (NormalizedKB, _set("line", "l3"), "isin"),
    (NormalizedKB, _set("date", "2026-13-01"), "valid_date"),
    (NormalizedItems, _set("item_id", "Q-2"), "field_uniqueness"),
    (NormalizedItems, _set("split", "test"), "isin"),
    (NormalizedItems, _set("question", ""), "str_length"),
    (NormalizedItems, _set("question", "OEE\u00a0L3 B? "), "cleaned_text"),
    (NormalizedItems, _set("context_doc_ids", "KB-1, KB-2"), "json_list_of_ids"),
    (NormalizedItems, _set("metric", "OEE"), "isin"),
    (NormalizedItems, _set("value", float("inf")), "finite_value"),
    (NormalizedItems, _set("line", "L0"), "isin"),
    (NormalizedItems, _set("shift", "b"), "isin"),
    (NormalizedItems, _set("date", "2026/03/14"), "str_matches"),
    (NormalizedItems, _set("evidence", ""), "str_length"),
    (NormalizedItems, _set("source_system", "ERP"), "str_matches"),
    (NormalizedItems, _set("input_hash", "abc"), "str_matches"),
    (NormalizedItems, _set("input_hash", input_hash("OEE L3 B?")), "field_uniqueness"),
    (NormalizedItems, _set("input_hash", input_hash("another question")), "input_hash_of_question"),
    (NormalizedRejects, _set("artifact", "probe"), "isin"),
    (NormalizedRejects, _set("rule", "Unknown Metric"), "str_matches"),
    (NormalizedRejects, _set("action", "dropped"), "isin"),
]


@pytest.mark.parametrize(
    ("model", "mutate", "check"), BAD, ids=[f"{_name(m)}-{c}-{i}" for i, (m, _, c) in enumerate(BAD)]
)
def test_bad_frame_fails_naming_its_rule(model, mutate, check):
    with pytest.raises(ClapError) as e:
        validate_frame(model, mutate(good(model)), "data/normalized/b/x.parquet")
    assert check in str(e.value)
    assert e.value.file == "data/normalized/b/x.parquet"
