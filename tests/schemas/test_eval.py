"""schemas.eval: one good frame per artifact, one bad frame per rule."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import REPORT_ANSWER

from clap.errors import ClapError
from clap.judge.scored import TIMING_COLUMNS, scored_columns
from clap.task.answer import load_answer_schema, parse_answer_schema
from schemas.eval import EvalTimings, eval_items
from schemas.normalized import validate_frame

ROOT = Path(__file__).resolve().parents[2]
ANSWER = load_answer_schema(ROOT / "params.yaml")
EVAL_ITEMS = eval_items(ANSWER)
OTHER = parse_answer_schema(REPORT_ANSWER)  # keys row/period, a scale unit


def item(model: str, pos: int, good: bool) -> dict:
    row = dict.fromkeys(scored_columns(ANSWER))
    row.update(
        model=model,
        position=pos,
        item_id=f"Q-{pos}",
        metric="oee",
        line="L1",
        shift="A",
        source_system="mes",
        question_type="direct",
        gold_value=80.0,
        output='{"metric": "oee"}',
        parse_ok=True,
        parse_error="",
        pred_metric="oee",
        pred_value=80.0 if good else 7.0,
        overall=1.0 if good else 7 / 9,
        hallucination=not good,
        wrong_fact=False,
        new_tokens=12,
        prompt_tokens=90,
    )
    row.update({f"{k}_correct": good or k != "value" for k in ANSWER.names})
    row["pass"] = good
    return row


def items() -> pd.DataFrame:
    return pd.DataFrame(
        [
            item("base", 0, False),
            item("base", 1, True),
            item("candidate", 0, True),
            item("candidate", 1, True),
        ],
        columns=scored_columns(ANSWER),
    )


def test_good_frames_pass():
    assert set(scored_columns(ANSWER)) >= {"metric", "line", "shift", "source_system", "question_type"}
    assert len(validate_frame(EVAL_ITEMS, items(), "items.parquet")) == 4
    timings = pd.DataFrame(
        [("base", "Q-0", 10.0, 20.0, 2, 0), ("base", "Q-1", 10.0, 20.0, 2, 0)], columns=TIMING_COLUMNS
    )
    assert len(validate_frame(EvalTimings, timings, "timings.parquet")) == 2


BAD_ITEMS = [
    (lambda df: df.assign(model="oracle"), "isin"),
    (lambda df: df.assign(position=[0, 0, 0, 1]), "one_row_per_item_and_model"),
    (lambda df: df.assign(item_id=["Q-0", "Q-0", "Q-0", "Q-1"]), "one_row_per_item_and_model"),
    (lambda df: df.assign(**{"pass": True}), "pass_means_every_field_right"),
    (lambda df: df.assign(parse_ok=[False, True, True, True]), "unparseable_scores_zero"),
    (lambda df: df.assign(wrong_fact=[True, False, False, False]), "hallucination_excludes_wrong_fact"),
    (lambda df: df.assign(overall=1.5), "less_than_or_equal_to"),
    (lambda df: df.assign(new_tokens=-1), "greater_than_or_equal_to"),
    (lambda df: df.assign(extra=1), "column_in_schema"),
    (lambda df: df.drop(columns="line_correct"), "column_in_dataframe"),  # a declared answer field
    (lambda df: df.drop(columns="pred_unit"), "column_in_dataframe"),
    (lambda df: df.drop(columns="question_type"), "column_in_dataframe"),  # a declared slice
]


@pytest.mark.parametrize("mutate, rule", BAD_ITEMS)
def test_bad_items_fail_their_rule(mutate, rule):
    with pytest.raises(ClapError) as e:
        validate_frame(EVAL_ITEMS, mutate(items()), "items.parquet")
    assert rule in str(e.value)


def test_missing_answer_column_is_named():
    with pytest.raises(ClapError) as e:
        validate_frame(EVAL_ITEMS, items().drop(columns="line_correct"), "items.parquet")
    assert (e.value.rule, e.value.file) == ("column_in_dataframe", "items.parquet")
    assert "['line_correct']" in str(e.value)  # the failure case names the missing column


def test_another_declaration_has_its_own_columns():
    columns = scored_columns(OTHER)
    assert [c for c in columns if c.startswith("pred_")] == [f"pred_{k}" for k in OTHER.names]
    assert [c for c in columns if c.endswith("_correct")] == [f"{k}_correct" for k in OTHER.names]
    assert "metric" not in columns and "metric_correct" not in columns and "source_system" in columns
    rows = []
    for pos, good in enumerate((True, False)):
        row = dict.fromkeys(columns)
        row.update(
            model="candidate",
            position=pos,
            item_id=f"F-{pos}",
            source_system="erp",
            gold_value=12.5,
            output='{"row": "Net sales"}',
            parse_ok=True,
            parse_error="",
            pred_row="Net sales",
            pred_period="2026-01-31",
            pred_evidence="Net sales 12,5",
            pred_value=12.5 if good else 9.1,
            pred_scale="M",
            overall=1.0 if good else 4 / 7,
            hallucination=False,
            wrong_fact=not good,
            new_tokens=12,
            prompt_tokens=90,
        )
        row.update({f"{k}_correct": good or k != "value" for k in OTHER.names})
        row["pass"] = good
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    assert len(validate_frame(eval_items(OTHER), frame, "items.parquet")) == 2
    with pytest.raises(ClapError, match="pass_means_every_field_right"):
        validate_frame(eval_items(OTHER), frame.assign(**{"pass": True}), "items.parquet")
    with pytest.raises(ClapError, match="column_in_dataframe"):
        validate_frame(eval_items(OTHER), frame.drop(columns="period_correct"), "items.parquet")
    with pytest.raises(
        ClapError, match="column_in_dataframe"
    ):  # the params declaration wants its own columns
        validate_frame(EVAL_ITEMS, frame, "items.parquet")


def test_bad_timings_fail():
    bad = pd.DataFrame([("base", "Q-0", -1.0, 20.0, 0, 0)], columns=TIMING_COLUMNS)
    with pytest.raises(ClapError, match="greater_than_or_equal_to"):
        validate_frame(EvalTimings, bad, "timings.parquet")
