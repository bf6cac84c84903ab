"""schemas.replay: one good frame per artifact, one bad frame per replay-specific rule."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPORT_ANSWER

from clap.errors import ClapError
from clap.judge.replay import CONDITIONS, REQUEST_COLUMNS, TIMING_COLUMNS, case_columns
from clap.task.answer import load_answer_schema, parse_answer_schema
from schemas.eval import eval_items
from schemas.normalized import validate_frame
from schemas.replay import ReplayPlot, ReplayRequests, ReplayTimings, replay_cases

ROOT = Path(__file__).resolve().parents[2]
ANSWER = load_answer_schema(ROOT / "params.yaml")
REPLAY_CASES = replay_cases(ANSWER)
OTHER = parse_answer_schema(REPORT_ANSWER)  # keys row/period, a scale unit


def case(cond: str, pos: int) -> dict:
    model, rag = CONDITIONS[cond]
    retrieved = ["KB-1", "KB-2"] if rag else []
    row = dict.fromkeys(case_columns(ANSWER))
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
    row.update({f"{k}_correct": k != "value" for k in ANSWER.names})
    row["pass"] = False
    return row


def cases() -> pd.DataFrame:
    return pd.DataFrame([case(c, p) for c in CONDITIONS for p in (0, 1)], columns=case_columns(ANSWER))


def test_good_frames_pass():
    assert len(validate_frame(REPLAY_CASES, cases(), "cases.parquet")) == 8
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
    (_set("date_correct", 0, False), "core_means_core_fields_right"),  # date is a key field
    (_set("pass", 0, True), "pass_means_every_field_right"),
    (lambda df: df.drop(columns="line_correct"), "column_in_dataframe"),  # a declared answer field
    (lambda df: df.assign(extra=1), "column_in_schema"),
]


@pytest.mark.parametrize("mutate, rule", BAD_CASES)
def test_bad_cases_fail_their_rule(mutate, rule):
    with pytest.raises(ClapError) as e:
        validate_frame(REPLAY_CASES, mutate(cases()), "cases.parquet")
    assert rule in str(e.value)


def test_missing_answer_column_is_named():
    with pytest.raises(ClapError) as e:
        validate_frame(REPLAY_CASES, cases().drop(columns="line_correct"), "cases.parquet")
    assert (e.value.rule, e.value.file) == ("column_in_dataframe", "cases.parquet")
    assert "['line_correct']" in str(e.value)  # the failure case names the missing column


def _other_cases() -> pd.DataFrame:
    columns = case_columns(OTHER)
    rows = []
    for cond in CONDITIONS:
        model, rag = CONDITIONS[cond]
        for pos in (0, 1):
            row = dict.fromkeys(columns)
            row.update(
                condition=cond,
                model=model,
                rag=rag,
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
                pred_value=9.1,
                pred_scale="M",
                overall=4 / 7,
                hallucination=False,
                wrong_fact=True,
                new_tokens=12,
                prompt_tokens=90,
                gold_doc_id="FIN-1",
                retrieved_doc_ids=json.dumps(["FIN-1"] if rag else []),
                retrieval_hit=rag,
                core_correct=True,
            )
            row.update({f"{k}_correct": k != "value" for k in OTHER.names})
            row["pass"] = False
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


INHERITED = [  # the eval item rules a replay case row inherits (schemas.eval.EvalItemsFixed)
    (_set("parse_ok", 0, False), "unparseable_scores_zero"),
    (_set("wrong_fact", 0, True), "hallucination_excludes_wrong_fact"),
]


def test_inherited_rules_keep_their_names_in_both_schemas():
    """pandera 0.35 pops a shared check's name when a subclass builds its schema second: the methods
    carry the checks' names so both schemas report them the same."""
    replay_only = ["condition", "rag", "gold_doc_id", "retrieved_doc_ids", "retrieval_hit", "core_correct"]
    items = cases().query("condition == 'A'").drop(columns=replay_only).reset_index(drop=True)  # eval rows
    eval_schema, replay_schema = eval_items(ANSWER), REPLAY_CASES  # both built in this process
    assert len(validate_frame(eval_schema, items.copy(), "items.parquet")) == 2
    for mutate, rule in INHERITED:
        for schema, frame, file in (
            (replay_schema, cases(), "cases.parquet"),
            (eval_schema, items, "items.parquet"),
        ):
            with pytest.raises(ClapError) as e:
                validate_frame(schema, mutate(frame.copy()), file)
            assert e.value.rule == rule


def test_another_declaration_has_its_own_columns():
    columns = case_columns(OTHER)
    assert {"row_correct", "period_correct", "scale_correct", "pred_scale"} <= set(columns)
    assert "metric" not in columns and "metric_correct" not in columns
    schema = replay_cases(OTHER)
    assert len(validate_frame(schema, _other_cases(), "cases.parquet")) == 8
    with pytest.raises(ClapError, match="core_means_core_fields_right"):  # row and period are the key fields
        validate_frame(schema, _set("period_correct", 0, False)(_other_cases()), "cases.parquet")
    assert len(validate_frame(schema, _set("scale_correct", 0, False)(_other_cases()), "cases.parquet")) == 8
    with pytest.raises(ClapError, match="column_in_dataframe"):
        validate_frame(schema, _other_cases().drop(columns="row_correct"), "cases.parquet")
    with pytest.raises(
        ClapError, match="column_in_dataframe"
    ):  # the params declaration wants its own columns
        validate_frame(REPLAY_CASES, _other_cases(), "cases.parquet")


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
