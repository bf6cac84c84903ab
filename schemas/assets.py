"""Schemas of data/assets/<batch>/ (docs/data-contract.md, section Assets), written by assetize.

Strings are as found in the raw exports, so the checks are structural: required columns
present and non-null, IDs unique within an asset, source systems and splits from their
sets, values finite, source lines 1-based, context_doc_ids a JSON list of strings. The
records and question items carry one ``<key>_raw`` column per key field of the declared
answer (params ``task``), so their schemas are built from it.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.data.assetize import RULES, asset_columns
from clap.task.answer import AnswerSchema

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


class KbAsset(_Sourced):
    """kb.parquet: the declared documents sources (what retrieval searches)."""

    doc_id: Series[str] = pa.Field(unique=True)
    system: Series[str]
    record_ref: Series[str]
    title: Series[str]
    body: Series[str]


class RejectsAsset(_Sourced):
    """rejects.parquet: every raw row that did not become an asset, with its rule."""

    source_system: Series[str] = pa.Field(str_matches=SOURCE_NAME)
    record_id: Series[str] = pa.Field(nullable=True)
    rule: Series[str] = pa.Field(isin=list(RULES))
    column: Series[str]
    detail: Series[str]
    raw: Series[str]


def _finite(s: pd.Series) -> pd.Series:
    return pd.Series(np.isfinite(s.to_numpy(dtype=float)), index=s.index)


def _sourced() -> dict[str, pa.Column]:
    return {"source_file": pa.Column(str), "source_line": pa.Column(int, pa.Check.ge(1))}


def records_asset(answer: AnswerSchema) -> pa.DataFrameSchema:
    """records.parquet: the declared records sources' facts, one value each (``<key>_raw`` per key field)."""
    number = answer.field(answer.value).type == "number"
    cols = {
        "record_id": pa.Column(str, unique=True),
        "source_system": pa.Column(str, pa.Check.str_matches(SOURCE_NAME)),
        **{c: pa.Column(str) for c in asset_columns(answer)["records"] if c.endswith("_raw")},
        "value": pa.Column(float, pa.Check(_finite, name="finite")) if number else pa.Column(str),
        "text": pa.Column(str),
        **_sourced(),
    }
    return pa.DataFrameSchema(cols, strict=True, coerce=True, name="RecordsAsset")


def items_asset(answer: AnswerSchema, splits: list[str], name: str) -> pa.DataFrameSchema:
    """sft/eval/replay/grpo.parquet: question-log rows with their reviewer gold, as text."""
    columns = asset_columns(answer)["items"]
    cols = {c: pa.Column(str) for c in columns if c not in ("source_file", "source_line")}
    cols["item_id"] = pa.Column(str, unique=True)
    cols["split"] = pa.Column(str, pa.Check.isin(splits))
    cols["context_doc_ids"] = pa.Column(
        str, pa.Check(lambda s: s.map(_is_json_str_list).astype(bool), name="json_list_of_strings")
    )
    return pa.DataFrameSchema({**cols, **_sourced()}, strict=True, coerce=True, name=name)


def asset_schemas(answer: AnswerSchema) -> dict[str, pa.DataFrameSchema | type[pa.DataFrameModel]]:
    """The schema of every asset file, for the declared answer (params ``task``)."""
    return {
        "records": records_asset(answer),
        "kb": KbAsset,
        "sft": items_asset(answer, ["train"], "SftAsset"),
        "eval": items_asset(answer, ["eval"], "EvalAsset"),
        "replay": items_asset(answer, ["replay"], "ReplayAsset"),
        "grpo": items_asset(answer, ["train"], "SftAsset"),
        "rejects": RejectsAsset,
    }
