"""Pandera models of data/eval/<batch>/: scored items (one row per item x model) and timings."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.judge.scored import ROLES
from clap.task.prompt import ANSWER_FIELDS


class EvalItems(pa.DataFrameModel):
    """items.parquet: a parsed, scored answer per item x model; deterministic (no timings)."""

    model: Series[str] = pa.Field(isin=list(ROLES))
    position: Series[int] = pa.Field(ge=0)
    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    metric: Series[str]
    line: Series[str]
    shift: Series[str]
    source_system: Series[str]
    question_type: Series[str]
    gold_value: Series[float]
    output: Series[str]
    parse_ok: Series[bool]
    parse_error: Series[str]
    pred_metric: Series[str] = pa.Field(nullable=True)
    pred_value: Series[float] = pa.Field(nullable=True)
    pred_unit: Series[str] = pa.Field(nullable=True)
    pred_line: Series[str] = pa.Field(nullable=True)
    pred_shift: Series[str] = pa.Field(nullable=True)
    pred_date: Series[str] = pa.Field(nullable=True)
    pred_evidence: Series[str] = pa.Field(nullable=True)
    metric_correct: Series[bool]
    value_correct: Series[bool]
    unit_correct: Series[bool]
    line_correct: Series[bool]
    shift_correct: Series[bool]
    date_correct: Series[bool]
    evidence_correct: Series[bool]
    pass_: Series[bool] = pa.Field(alias="pass")
    overall: Series[float] = pa.Field(ge=0.0, le=1.0)
    hallucination: Series[bool]
    wrong_fact: Series[bool]
    new_tokens: Series[int] = pa.Field(ge=0)
    prompt_tokens: Series[int] = pa.Field(ge=1)

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check(name="one_row_per_item_and_model")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(["model", "item_id"], keep=False) & ~df.duplicated(
            ["model", "position"], keep=False
        )

    @pa.dataframe_check(name="pass_means_every_field_right")
    def pass_means_every_field_right(cls, df: pd.DataFrame) -> Series[bool]:
        return df["pass"] == df[[f"{k}_correct" for k in ANSWER_FIELDS]].all(axis=1)

    @pa.dataframe_check(name="unparseable_scores_zero")
    def _unparsed(cls, df: pd.DataFrame) -> Series[bool]:
        return df["parse_ok"] | (df["overall"] == 0.0)

    @pa.dataframe_check(name="hallucination_excludes_wrong_fact")
    def _exclusive(cls, df: pd.DataFrame) -> Series[bool]:
        return ~(df["hallucination"] & df["wrong_fact"])


class EvalTimings(pa.DataFrameModel):
    """timings.parquet: apportioned latency and batch wall time per item x model (ms)."""

    model: Series[str] = pa.Field(isin=list(ROLES))
    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    latency_ms: Series[float] = pa.Field(ge=0.0)
    batch_wall_ms: Series[float] = pa.Field(ge=0.0)
    batch_size: Series[int] = pa.Field(ge=1)
    batch_index: Series[int] = pa.Field(ge=0)

    class Config:
        strict = True
        coerce = True
