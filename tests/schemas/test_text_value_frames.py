"""schemas.eval and schemas.replay for a value declared ``type: text`` (and with params
``eval.answer_metric: tatqa``): one good frame each, one bad frame per rule."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import TEXT_ANSWER

from clap.errors import ClapError
from clap.judge.replay import CONDITIONS, case_columns
from clap.judge.scored import scored_columns
from clap.task.answer import parse_answer_schema
from schemas.eval import eval_items
from schemas.normalized import validate_frame
from schemas.replay import replay_cases

ANSWER = parse_answer_schema(TEXT_ANSWER)  # row, evidence, a text value, scale


def item(model: str, pos: int, good: bool) -> dict:
    row = dict.fromkeys(scored_columns(ANSWER))
    row.update(
        model=model,
        position=pos,
        item_id=f"Q-{pos}",
        question_type="span",
        source_system="table",
        gold_value="Fixed Price",
        output='{"value": "Fixed Price"}',
        parse_ok=True,
        parse_error="",
        pred_row="Revenue",
        pred_evidence="Fixed Price contracts",
        pred_value="fixed price" if good else "Cost Plus",
        pred_scale="none",
        overall=1.0 if good else 3 / 6,
        hallucination=not good,
        wrong_fact=False,
        new_tokens=12,
        prompt_tokens=90,
    )
    row.update({f"{k}_correct": good or k != "value" for k in ANSWER.names})
    row["pass"] = good
    return row


def items(**extra) -> pd.DataFrame:
    rows = [
        item("base", 0, False),
        item("base", 1, True),
        item("candidate", 0, True),
        item("candidate", 1, True),
    ]
    frame = pd.DataFrame(rows, columns=scored_columns(ANSWER))
    return frame.assign(**extra)


def test_good_text_frames_pass_with_and_without_the_answer_metric():
    out = validate_frame(eval_items(ANSWER), items(), "items.parquet")
    assert list(out["gold_value"]) == ["Fixed Price"] * 4 and out["pred_value"][0] == "Cost Plus"
    unanswered = items()
    unanswered.loc[0, "pred_value"] = None  # no value predicted: null, not the text "None"
    assert validate_frame(eval_items(ANSWER), unanswered, "items.parquet")["pred_value"].isna()[0]
    scores = items(em=[0.0, 1.0, 1.0, 1.0], f1=[0.5, 1.0, 1.0, 1.0])
    assert len(validate_frame(eval_items(ANSWER, answer_metric="tatqa"), scores, "items.parquet")) == 4


def _set(col, i, value):
    def mutate(df: pd.DataFrame) -> pd.DataFrame:
        df.loc[i, col] = value
        return df

    return mutate


BAD = [
    (_set("gold_value", 1, ""), "str_length"),  # a text gold is not empty
    (_set("gold_value", 1, None), "not_nullable"),
    (
        lambda df: _set("pred_value", 1, None)(_set("value_correct", 1, True)(df)),
        "right_value_was_predicted",
    ),
    (_set("pass", 0, True), "pass_means_every_field_right"),
]


@pytest.mark.parametrize("mutate, rule", BAD, ids=[r for _, r in BAD])
def test_bad_text_frames_are_refused(mutate, rule):
    with pytest.raises(ClapError, match=rule):
        validate_frame(eval_items(ANSWER), mutate(items()), "items.parquet")


METRIC_BAD = [
    (dict(em=[0.5, 1.0, 1.0, 1.0], f1=[0.5, 1.0, 1.0, 1.0]), "isin"),  # em is 0 or 1
    (dict(em=[0.0, 1.0, 1.0, 1.0], f1=[1.5, 1.0, 1.0, 1.0]), "in_range"),
    (dict(em=[1.0, 1.0, 1.0, 1.0], f1=[0.5, 1.0, 1.0, 1.0]), "exact_match_means_f1_one"),
]


@pytest.mark.parametrize("extra, rule", METRIC_BAD, ids=[r for _, r in METRIC_BAD])
def test_bad_answer_metric_columns_are_refused(extra, rule):
    with pytest.raises(ClapError, match=rule):
        validate_frame(eval_items(ANSWER, answer_metric="tatqa"), items(**extra), "items.parquet")


def test_answer_metric_columns_exist_only_when_enabled():
    with pytest.raises(ClapError, match="column_in_dataframe"):  # enabled: em and f1 are required
        validate_frame(eval_items(ANSWER, answer_metric="tatqa"), items(), "items.parquet")
    with pytest.raises(ClapError, match="column_in_schema"):  # none: no such columns
        validate_frame(eval_items(ANSWER), items(em=1.0, f1=1.0), "items.parquet")
    with pytest.raises(ClapError, match="eval.answer_metric"):
        eval_items(ANSWER, answer_metric="squad")


def case(cond: str, pos: int, good: bool) -> dict:
    model, rag = CONDITIONS[cond]
    row = {**dict.fromkeys(case_columns(ANSWER)), **item(model, pos, good)}
    row.update(
        condition=cond,
        rag=rag,
        gold_doc_id="R-1",
        retrieved_doc_ids=json.dumps(["R-1"] if rag else []),
        retrieval_hit=rag,
        core_correct=True,
    )
    return row


def test_replay_cases_of_a_text_value():
    frame = pd.DataFrame(
        [case(c, p, p == 1) for c in CONDITIONS for p in (0, 1)], columns=case_columns(ANSWER)
    )
    out = validate_frame(replay_cases(ANSWER), frame, "cases.parquet")
    assert len(out) == 8 and out["gold_value"].map(type).eq(str).all()
    with pytest.raises(ClapError, match="str_length"):
        validate_frame(replay_cases(ANSWER), _set("gold_value", 2, "")(frame.copy()), "cases.parquet")
    wrong = _set("pred_value", 1, None)(frame.copy())
    with pytest.raises(ClapError, match="right_value_was_predicted"):
        validate_frame(replay_cases(ANSWER), wrong, "cases.parquet")
