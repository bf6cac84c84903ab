"""schemas.replay: one good frame per artifact, one bad frame per replay-specific rule."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from clap.errors import ClapError
from clap.judge.replay import CASE_COLUMNS, CONDITIONS, REQUEST_COLUMNS, TIMING_COLUMNS
from clap.task.prompt import ANSWER_FIELDS
from schemas.normalized import validate_frame
from schemas.replay import ReplayCases, ReplayPlot, ReplayRequests, ReplayTimings


def case(cond: str, pos: int) -> dict:
    model, rag = CONDITIONS[cond]
    retrieved = ["KB-1", "KB-2"] if rag else []
    row = dict.fromkeys(CASE_COLUMNS)
    row.update(
        condition=cond,
        model=model,
        rag=rag,
        position=pos,
        item_id=f"R-{pos}",
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
        pred_value=7.0,
        overall=7 / 9,
        hallucination=True,
        wrong_fact=False,
        new_tokens=12,
        prompt_tokens=90,
        gold_doc_id="KB-1",
        retrieved_doc_ids=json.dumps(retrieved),
        retrieval_hit=rag,
        core_correct=True,
    )
    row.update({f"{k}_correct": k != "value" for k in ANSWER_FIELDS})
    row["pass"] = False
    return row


def cases() -> pd.DataFrame:
    return pd.DataFrame([case(c, p) for c in CONDITIONS for p in (0, 1)], columns=CASE_COLUMNS)


def test_good_frames_pass():
    assert len(validate_frame(ReplayCases, cases(), "cases.parquet")) == 8
    timings = pd.DataFrame([("A", "R-0", 0.5, 10.0, 10.5, 20.0, 2, 0)], columns=TIMING_COLUMNS)
    assert len(validate_frame(ReplayTimings, timings, "timings.parquet")) == 1
    plot = pd.DataFrame(
        [("A", "value_accuracy", 0.8, "A value_accuracy")], columns=["condition", "metric", "value", "series"]
    )
    assert len(validate_frame(ReplayPlot, plot, "plot.csv")) == 1


def _set(col, i, value):
    def mutate(df: pd.DataFrame) -> pd.DataFrame:
        df.loc[i, col] = value
        return df

    return mutate


BAD_CASES = [
    (_set("condition", 0, "E"), "isin"),
    (_set("position", 1, 0), "one_row_per_item_and_condition"),
    (_set("model", 0, "adapter"), "condition_matches_model_and_rag"),
    (_set("rag", 4, True), "condition_matches_model_and_rag"),  # row 4 is C: no retrieval
    (_set("retrieved_doc_ids", 0, "KB-1"), "json_list_of_doc_ids"),
    (_set("retrieved_doc_ids", 4, '["KB-1"]'), "no_rag_retrieves_nothing"),
    (_set("retrieval_hit", 0, False), "hit_means_gold_doc_retrieved"),
    (_set("core_correct", 0, False), "core_means_core_fields_right"),
    (_set("pass", 0, True), "pass_means_every_field_right"),
]


@pytest.mark.parametrize("mutate, rule", BAD_CASES)
def test_bad_cases_fail_their_rule(mutate, rule):
    with pytest.raises(ClapError) as e:
        validate_frame(ReplayCases, mutate(cases()), "cases.parquet")
    assert rule in str(e.value)


def test_bad_timings_and_plot_fail():
    with pytest.raises(ClapError, match="greater_than_or_equal_to"):
        validate_frame(
            ReplayTimings,
            pd.DataFrame([("A", "R-0", -1.0, 10.0, 9.0, 20.0, 2, 0)], columns=TIMING_COLUMNS),
            "timings.parquet",
        )
    with pytest.raises(ClapError, match="less_than_or_equal_to"):
        validate_frame(
            ReplayPlot,
            pd.DataFrame(
                [("A", "value_accuracy", 1.5, "A")], columns=["condition", "metric", "value", "series"]
            ),
            "plot.csv",
        )


def requests() -> pd.DataFrame:
    rows = [(c, k, f"R-{k}", 0.5, 300.0 + k, 301.0 + k, 20, 1) for c in "AB" for k in (0, 1)]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


BAD_REQUESTS = [
    (_set("condition", 0, "C"), "isin"),  # no-RAG conditions are not timed per request
    (_set("batch_size", 0, 4), "isin"),  # a batched answer is not a single request
    (_set("request", 1, 0), "one_row_per_request_and_condition"),
    (_set("item_id", 1, "R-0"), "one_row_per_request_and_condition"),
    (_set("request_ms", 0, 200.0), "request_covers_retrieval_and_generation"),
    (_set("request_ms", 0, 0.0), "greater_than"),
]


def test_good_requests_pass():
    assert len(validate_frame(ReplayRequests, requests(), "request_timings.parquet")) == 4


@pytest.mark.parametrize("mutate, rule", BAD_REQUESTS)
def test_bad_requests_fail_their_rule(mutate, rule):
    with pytest.raises(ClapError) as e:
        validate_frame(ReplayRequests, mutate(requests()), "request_timings.parquet")
    assert rule in str(e.value)
