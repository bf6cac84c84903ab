"""Pandera models of data/replay/<batch>/ (per-case ABCD records, batched timings, per-request
timings) and the replay plot data.

A replay case row is an eval item row (same scoring columns, :class:`schemas.eval.EvalItems`)
plus the condition, whether retrieval was on, what it retrieved and whether the gold
document was among it.
"""

from __future__ import annotations

import json

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.judge.replay import CONDITIONS, PLOT_METRICS
from clap.task.answer import AnswerSchema
from schemas.eval import BatchedTimings, EvalItemsFixed, with_answer


def _json_list(text: str) -> bool:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return False
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class ReplayCasesFixed(EvalItemsFixed):
    """cases.parquet: one scored answer per replay case x condition; deterministic (no timings). The
    answer's columns are added by :func:`replay_cases`."""

    condition: Series[str] = pa.Field(isin=list(CONDITIONS))
    model: Series[str] = pa.Field(isin=sorted({m for m, _ in CONDITIONS.values()}))
    rag: Series[bool]
    gold_doc_id: Series[str] = pa.Field(str_length={"min_value": 1})
    retrieved_doc_ids: Series[str]
    retrieval_hit: Series[bool]
    core_correct: Series[bool]

    @pa.dataframe_check(name="one_row_per_item_and_condition")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:  # replaces the eval check of the same method name
        return ~df.duplicated(["condition", "item_id"], keep=False) & ~df.duplicated(
            ["condition", "position"], keep=False
        )

    @pa.dataframe_check(name="condition_matches_model_and_rag")
    def _condition(cls, df: pd.DataFrame) -> Series[bool]:
        return pd.Series(
            [CONDITIONS.get(c) == (m, bool(r)) for c, m, r in zip(df["condition"], df["model"], df["rag"])],
            index=df.index,
        )

    @pa.check("retrieved_doc_ids", name="json_list_of_doc_ids")
    def _doc_ids(cls, s: Series[str]) -> Series[bool]:
        return s.map(_json_list)

    @pa.dataframe_check(name="no_rag_retrieves_nothing")
    def _no_rag(cls, df: pd.DataFrame) -> Series[bool]:
        return df["rag"] | (df["retrieved_doc_ids"] == "[]")

    @pa.dataframe_check(name="hit_means_gold_doc_retrieved")
    def _hit(cls, df: pd.DataFrame) -> Series[bool]:
        found = [
            g in json.loads(r) if _json_list(r) else False
            for g, r in zip(df["gold_doc_id"], df["retrieved_doc_ids"])
        ]
        return df["retrieval_hit"] == pd.Series(found, index=df.index)


def replay_cases(answer: AnswerSchema) -> pa.DataFrameSchema:
    """The schema of cases.parquet for the declared answer (``core_correct``: every key field right)."""
    keys = [f"{k}_correct" for k in answer.keys]
    core = pa.Check(
        lambda df: df["core_correct"] == df[keys].all(axis=1), name="core_means_core_fields_right"
    )
    return with_answer(ReplayCasesFixed, answer, "ReplayCases", (core,))


class ReplayTimings(BatchedTimings):
    """timings.parquet: per-case latency (retrieval + apportioned generation), milliseconds."""

    condition: Series[str] = pa.Field(isin=list(CONDITIONS))
    retrieval_ms: Series[float] = pa.Field(ge=0.0)
    generation_ms: Series[float] = pa.Field(ge=0.0)


class ReplayRequests(pa.DataFrameModel):
    """request_timings.parquet: the per-request latency sample of the RAG conditions (A, B), one
    request at a time (batch size 1): wall clock of the whole chain and its retrieval and generation parts."""

    condition: Series[str] = pa.Field(isin=[c for c, (_, rag) in CONDITIONS.items() if rag])
    request: Series[int] = pa.Field(ge=0)
    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    retrieval_ms: Series[float] = pa.Field(ge=0.0)
    generation_ms: Series[float] = pa.Field(gt=0.0)
    request_ms: Series[float] = pa.Field(gt=0.0)
    new_tokens: Series[int] = pa.Field(ge=1)
    batch_size: Series[int] = pa.Field(isin=[1])

    @pa.dataframe_check(name="one_row_per_request_and_condition")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(["condition", "request"], keep=False) & ~df.duplicated(
            ["condition", "item_id"], keep=False
        )

    @pa.dataframe_check(name="request_covers_retrieval_and_generation")
    def _covers(cls, df: pd.DataFrame) -> Series[bool]:  # the request's clock encloses both parts
        return df["request_ms"] >= df["retrieval_ms"] + df["generation_ms"]

    class Config:
        strict = True
        coerce = True


class ReplayPlot(pa.DataFrameModel):
    """plots/replay/<batch>.csv: one bar per condition x metric."""

    condition: Series[str] = pa.Field(isin=list(CONDITIONS))
    metric: Series[str] = pa.Field(isin=list(PLOT_METRICS))
    value: Series[float] = pa.Field(ge=0.0, le=1.0)
    series: Series[str]

    class Config:
        strict = True
        coerce = True
