"""schemas.admitted: admitted splits keep the normalized rules; the admitted set has zero overlap."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from clap.data.normalize import build_vocab, input_hash, normalize_params
from clap.errors import ClapError
from clap.task.answer import load_answer_schema
from schemas.admitted import AdmittedSet, admitted_items, admitted_kb
from schemas.normalized import validate_frame

ROLES = ["sft", "grpo", "eval", "probe", "replay"]
ANSWER = load_answer_schema(Path(__file__).resolve().parents[2] / "params.yaml")


def admitted_set() -> pd.DataFrame:
    ids = ["Q-1", "Q-1", "Q-2", "Q-3", "Q-4"]  # sft and grpo may share a training item
    return pd.DataFrame(
        {"role": ROLES, "item_id": ids, "input_hash": [input_hash(f"question {i}") for i in ids]}
    )


def test_good_admitted_set_passes():
    assert len(validate_frame(AdmittedSet, admitted_set(), "admission.json")) == 5


def _leak(role: str, to_role: str, column: str):
    def mutate(df):
        df.loc[df["role"] == role, column] = df.loc[df["role"] == to_role, column].iloc[0]
        return df

    return mutate


BAD = [
    (_leak("eval", "sft", "item_id"), "zero_overlap"),  # train/eval overlap by ID
    (_leak("probe", "grpo", "input_hash"), "zero_overlap"),  # train/probe overlap by input
    (_leak("probe", "eval", "item_id"), "zero_overlap"),  # the probe must not reuse eval items
    (_leak("replay", "eval", "input_hash"), "zero_overlap"),
    (
        lambda df: pd.concat([df, df.iloc[[2]].assign(input_hash=input_hash("x"))], ignore_index=True),
        "unique_within_role",
    ),
    (lambda df: df.assign(role=["sft", "grpo", "test", "probe", "replay"]), "isin"),
    (lambda df: df.assign(input_hash="nothex"), "str_matches"),
    (lambda df: df.drop(columns="input_hash"), "column_in_dataframe"),
]


@pytest.mark.parametrize(("mutate", "check"), BAD, ids=[f"{c}-{i}" for i, (_, c) in enumerate(BAD)])
def test_bad_admitted_set_fails(mutate, check):
    with pytest.raises(ClapError) as e:
        validate_frame(AdmittedSet, mutate(admitted_set()), "data/admitted/b/admission.json")
    assert check in str(e.value)


def test_admitted_items_and_kb_keep_the_normalized_rules():
    question = "OEE L3 B?"
    item = pd.DataFrame({
        "item_id": ["Q-1"], "split": ["eval"], "question": [question], "question_type": ["terse"], "context_doc_ids": ['["KB-1"]'],
        "metric": ["oee"], "value": [81.5], "unit": ["%"], "line": ["L3"], "shift": ["B"], "date": ["2026-03-14"],
        "evidence": ["OEE was 81.5 %"], "evidence_doc_id": ["KB-1"], "source_system": ["mes"], "input_hash": [input_hash(question)],
        "source_file": ["question_log.jsonl"], "source_line": [3],
    })  # fmt: skip
    vocab = build_vocab(normalize_params(Path(__file__).resolve().parents[2] / "params.yaml"))
    validate_frame(admitted_items(vocab), item, "eval.parquet")
    with pytest.raises(ClapError, match="isin"):
        validate_frame(admitted_items(vocab), item.assign(line="Line 3"), "eval.parquet")
    doc = pd.DataFrame(
        {
            "doc_id": ["KB-1"],
            "system": ["mes"],
            "record_ref": ["SR-1"],
            "title": ["t"],
            "body": ["OEE was 81.5 %."],
            "metric": ["oee"],
            "line": ["L3"],
            "shift": ["B"],
            "date": ["2026-03-14"],
        }
    )
    validate_frame(admitted_kb(vocab), doc, "kb.parquet")
    with pytest.raises(ClapError, match="cleaned_text"):
        validate_frame(admitted_kb(vocab), doc.assign(body="OEE was 81.5 % "), "kb.parquet")


def _held_out() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": ["Scrap rate on L1?", "OEE on L2?"],
            "input_hash": [input_hash("Scrap rate on L1?"), input_hash("OEE on L2?")],
            **{k: ["x", "y"] for k in ANSWER.keys},
            ANSWER.value: [1.0, 2.0],
        }
    )


def test_held_out_split_unseen_by_earlier_training_passes():
    from clap.data.admission import seen_in_training
    from schemas.admitted import unseen_in_earlier_training

    earlier = _held_out().iloc[:0]
    seen = seen_in_training({"2025-12": earlier}, ANSWER)
    unseen_in_earlier_training(seen, ANSWER).validate(_held_out())


@pytest.mark.parametrize(
    ("reword", "check"),
    [(False, "unseen_input_hash"), (True, "unseen_question_answer")],
    ids=["hash", "reworded"],
)
def test_held_out_split_with_an_item_earlier_training_saw_fails(reword, check):
    import pandera.errors

    from clap.data.admission import seen_in_training
    from schemas.admitted import unseen_in_earlier_training

    earlier = _held_out().iloc[:1].copy()
    if reword:
        earlier["question"] = "scrap rate, on L1 ?"
        earlier["input_hash"] = earlier["question"].map(input_hash)
    seen = seen_in_training({"2025-12": earlier}, ANSWER)
    with pytest.raises(pandera.errors.SchemaError, match=check):
        unseen_in_earlier_training(seen, ANSWER).validate(_held_out())
