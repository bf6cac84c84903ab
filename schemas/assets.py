"""Schemas of data/assets/<batch>/ (docs/data-contract.md, section Assets), written by assetize.

Strings are as found in the raw exports, so the checks are structural: required columns
present and non-null, IDs unique within an asset, source systems and splits from their
sets, values finite, source lines 1-based, context_doc_ids a JSON list of strings.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.data.assetize import RULES

SOURCE_NAME = r"^[a-z][a-z0-9_]*$"  # a declared source's name (params assetize.sources)


def _is_json_str_list(text: str) -> bool:
    try:
        v = json.loads(text)
    except (TypeError, ValueError):
        return False
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


class _Sourced(pa.DataFrameModel):
    """Where a row came from: raw file name and 1-based physical start line."""

    source_file: Series[str]
    source_line: Series[int] = pa.Field(ge=1)

    class Config:
        strict = True
        coerce = True


class RecordsAsset(_Sourced):
    """records.parquet: the declared records sources' facts, one value each."""

    record_id: Series[str] = pa.Field(unique=True)
    source_system: Series[str] = pa.Field(str_matches=SOURCE_NAME)
    line_raw: Series[str]
    shift_raw: Series[str]
    date_raw: Series[str]
    metric_label: Series[str]
    value: Series[float]
    unit_raw: Series[str]
    text: Series[str]

    @pa.check("value", name="finite")
    def _finite(cls, s: Series[float]) -> Series[bool]:
        return pd.Series(np.isfinite(s.to_numpy(dtype=float)), index=s.index)


class KbAsset(_Sourced):
    """kb.parquet: the declared documents sources (what retrieval searches)."""

    doc_id: Series[str] = pa.Field(unique=True)
    system: Series[str]
    record_ref: Series[str]
    title: Series[str]
    body: Series[str]


class ItemsAsset(_Sourced):
    """sft/eval/replay/grpo.parquet: question-log rows with their reviewer gold, as text."""

    item_id: Series[str] = pa.Field(unique=True)
    split: Series[str] = pa.Field(isin=["train", "eval", "replay"])
    question: Series[str]
    question_type: Series[str]
    context_doc_ids: Series[str]
    metric_label: Series[str]
    value_raw: Series[str]
    unit_raw: Series[str]
    line_raw: Series[str]
    shift_raw: Series[str]
    date_raw: Series[str]
    evidence: Series[str]
    evidence_doc_id: Series[str]

    @pa.check("context_doc_ids", name="json_list_of_strings")
    def _context_json(cls, s: Series[str]) -> Series[bool]:
        return s.map(_is_json_str_list).astype(bool)


class SftAsset(ItemsAsset):
    split: Series[str] = pa.Field(isin=["train"])


class EvalAsset(ItemsAsset):
    split: Series[str] = pa.Field(isin=["eval"])


class ReplayAsset(ItemsAsset):
    split: Series[str] = pa.Field(isin=["replay"])


class RejectsAsset(_Sourced):
    """rejects.parquet: every raw row that did not become an asset, with its rule."""

    source_system: Series[str] = pa.Field(str_matches=SOURCE_NAME)
    record_id: Series[str] = pa.Field(nullable=True)
    rule: Series[str] = pa.Field(isin=list(RULES))
    column: Series[str]
    detail: Series[str]
    raw: Series[str]


SCHEMAS: dict[str, type[pa.DataFrameModel]] = {
    "records": RecordsAsset,
    "kb": KbAsset,
    "sft": SftAsset,
    "eval": EvalAsset,
    "replay": ReplayAsset,
    "grpo": SftAsset,
    "rejects": RejectsAsset,
}
