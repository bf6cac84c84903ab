"""Pandera models of data/eval/<batch>/: scored items (one row per item x model) and timings."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.judge.scored import ROLES, answer_metric_columns
from clap.task.answer import AnswerSchema


class EvalItemsFixed(pa.DataFrameModel):
    """items.parquet: a parsed, scored answer per item x model; deterministic (no timings). The
    columns that depend on the declared answer (its slices, ``pred_<field>``, ``<field>_correct``)
    are added by :func:`eval_items`, ``gold_value`` too (typed by the value's declared type)."""

    model: Series[str] = pa.Field(isin=list(ROLES))
    position: Series[int] = pa.Field(ge=0)
    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    output: Series[str]
    parse_ok: Series[bool]
    parse_error: Series[str]
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

    # methods named after their checks: pandera drops a shared check's name when a subclass
    # (ReplayCasesFixed) builds its schema after this one, and would report the method name
    @pa.dataframe_check(name="unparseable_scores_zero")
    def unparseable_scores_zero(cls, df: pd.DataFrame) -> Series[bool]:
        return df["parse_ok"] | (df["overall"] == 0.0)

    @pa.dataframe_check(name="hallucination_excludes_wrong_fact")
    def hallucination_excludes_wrong_fact(cls, df: pd.DataFrame) -> Series[bool]:
        return ~(df["hallucination"] & df["wrong_fact"])


def with_answer(
    fixed: type[pa.DataFrameModel],
    answer: AnswerSchema,
    name: str,
    checks: tuple[pa.Check, ...] = (),
    *,
    answer_metric: str = "none",
) -> pa.DataFrameSchema:
    """``fixed``'s schema plus the answer's columns: each slice (text), ``gold_value`` and
    ``pred_value`` typed by the value's declared type (a float; a ``text`` value: a string, the gold
    non-empty), the other ``pred_<field>`` text (null when absent) and ``<field>_correct``; ``pass``
    is every field right. With ``answer_metric`` ``tatqa`` (params ``eval.answer_metric``) also
    TAT-QA's per-item ``em`` (0 or 1) and ``f1`` (in [0, 1], 1 where em is 1)."""
    base = fixed.to_schema()
    text = answer.value_is_text
    columns = {c: pa.Column(str, coerce=True) for c in answer.slices}
    columns["gold_value"] = (
        pa.Column(str, pa.Check.str_length(min_value=1), coerce=True)
        if text
        else pa.Column(float, coerce=True)
    )
    columns |= {
        f"pred_{k}": pa.Column(float if k == answer.value and not text else str, nullable=True, coerce=True)
        for k in answer.names
    }
    columns |= {f"{k}_correct": pa.Column(bool, coerce=True) for k in answer.names}
    correct = [f"{k}_correct" for k in answer.names]
    every = pa.Check(lambda df: df["pass"] == df[correct].all(axis=1), name="pass_means_every_field_right")
    extra = [*checks]
    if text:
        extra.append(
            pa.Check(
                lambda df: ~df["value_correct"] | df["pred_value"].notna(),
                name="right_value_was_predicted",
            )
        )
    if answer_metric_columns(answer_metric):
        columns["em"] = pa.Column(float, pa.Check.isin([0.0, 1.0]), coerce=True)
        columns["f1"] = pa.Column(float, pa.Check.in_range(0.0, 1.0), coerce=True)
        extra.append(
            pa.Check(lambda df: (df["em"] == 0.0) | (df["f1"] == 1.0), name="exact_match_means_f1_one")
        )
    return pa.DataFrameSchema(
        {**base.columns, **columns},
        checks=[*base.checks, every, *extra],
        strict=True,
        coerce=True,
        name=name,
    )


def eval_items(answer: AnswerSchema, *, answer_metric: str = "none") -> pa.DataFrameSchema:
    """The schema of items.parquet for the declared answer (and params ``eval.answer_metric``)."""
    return with_answer(EvalItemsFixed, answer, "EvalItems", answer_metric=answer_metric)


class BatchedTimings(pa.DataFrameModel):
    """The columns every batched timings file shares: an item's apportioned latency and its batch's wall
    time (ms), the batch's size and index. Subclasses add who answered (model or condition)."""

    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    latency_ms: Series[float] = pa.Field(ge=0.0)
    batch_wall_ms: Series[float] = pa.Field(ge=0.0)
    batch_size: Series[int] = pa.Field(ge=1)
    batch_index: Series[int] = pa.Field(ge=0)

    class Config:
        strict = True
        coerce = True


class EvalTimings(BatchedTimings):
    """timings.parquet: apportioned latency and batch wall time per item x model (ms)."""

    model: Series[str] = pa.Field(isin=list(ROLES))
