"""schemas.eval: one good frame per artifact, one bad frame per rule."""

from __future__ import annotations

import pandas as pd
import pytest

from clap.errors import ClapError
from clap.judge.scored import SCORED_COLUMNS, TIMING_COLUMNS
from clap.task.prompt import ANSWER_FIELDS
from schemas.eval import EvalItems, EvalTimings
from schemas.normalized import validate_frame


def item(model: str, pos: int, good: bool) -> dict:
    row = dict.fromkeys(SCORED_COLUMNS)
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
    row.update({f"{k}_correct": good or k != "value" for k in ANSWER_FIELDS})
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
        columns=SCORED_COLUMNS,
    )


def test_good_frames_pass():
    assert len(validate_frame(EvalItems, items(), "items.parquet")) == 4
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
]


@pytest.mark.parametrize("mutate, rule", BAD_ITEMS)
def test_bad_items_fail_their_rule(mutate, rule):
    with pytest.raises(ClapError) as e:
        validate_frame(EvalItems, mutate(items()), "items.parquet")
    assert rule in str(e.value)


def test_bad_timings_fail():
    bad = pd.DataFrame([("base", "Q-0", -1.0, 20.0, 0, 0)], columns=TIMING_COLUMNS)
    with pytest.raises(ClapError, match="greater_than_or_equal_to"):
        validate_frame(EvalTimings, bad, "timings.parquet")
