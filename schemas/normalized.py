"""Pandera models of data/normalized/<batch>/ (docs/data-contract.md, "Normalized").

Canonical spellings are checked by shape (``L<n>``, one-letter shift, ISO date, snake_case
metric) rather than by list, because the vocabulary is params policy (params.yaml
``normalize``). Cleaned text is checked by idempotence: a cleaned string cleans to itself.
"""

from __future__ import annotations

import json

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.data.normalize import clean_text, input_hash
from clap.errors import ClapError

SYSTEMS = ["mes", "qms", "cmms"]
LINE = r"^L[1-9][0-9]*$"
SHIFT = r"^[A-Z]$"
METRIC = r"^[a-z][a-z0-9_]*$"
DATE = r"^\d{4}-\d{2}-\d{2}$"


def _cleaned(s: pd.Series) -> pd.Series:
    return s.map(lambda t: not isinstance(t, str) or t == clean_text(t))


def _valid_dates(s: pd.Series) -> pd.Series:
    return s.isna() | pd.to_datetime(s, format="%Y-%m-%d", errors="coerce").notna()


def _json_list(text: str) -> bool:
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return False
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


class NormalizedRecords(pa.DataFrameModel):
    """records.parquet: one canonical fact per row."""

    record_id: Series[str] = pa.Field(unique=True, str_length={"min_value": 1})
    source_system: Series[str] = pa.Field(isin=SYSTEMS)
    line: Series[str] = pa.Field(str_matches=LINE)
    shift: Series[str] = pa.Field(str_matches=SHIFT)
    date: Series[str] = pa.Field(str_matches=DATE)
    metric: Series[str] = pa.Field(str_matches=METRIC)
    value: Series[float] = pa.Field(nullable=False)
    unit: Series[str] = pa.Field(str_length={"min_value": 1})
    text: Series[str]
    source_file: Series[str]
    source_line: Series[int] = pa.Field(ge=1)

    class Config:
        strict = True
        coerce = True

    @pa.check("date")
    def valid_date(cls, s: Series[str]) -> Series[bool]:
        return _valid_dates(s)

    @pa.check("value")
    def finite_value(cls, s: Series[float]) -> Series[bool]:
        return s.abs() < float("inf")

    @pa.dataframe_check
    def one_unit_per_metric(cls, df: pd.DataFrame) -> Series[bool]:
        return df.groupby("metric")["unit"].transform("nunique") == 1

    @pa.dataframe_check
    def no_duplicate_fact(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(["line", "shift", "date", "metric", "value"], keep=False)


class NormalizedKB(pa.DataFrameModel):
    """kb.parquet: cleaned documents with line/shift/date of the record they describe (null if none)."""

    doc_id: Series[str] = pa.Field(unique=True, str_length={"min_value": 1})
    system: Series[str] = pa.Field(isin=SYSTEMS)
    record_ref: Series[str] = pa.Field(nullable=True)
    title: Series[str]
    body: Series[str] = pa.Field(str_length={"min_value": 1})
    line: Series[str] = pa.Field(nullable=True, str_matches=LINE)
    shift: Series[str] = pa.Field(nullable=True, str_matches=SHIFT)
    date: Series[str] = pa.Field(nullable=True, str_matches=DATE)

    class Config:
        strict = True
        coerce = True

    @pa.check("title", "body")
    def cleaned_text(cls, s: Series[str]) -> Series[bool]:
        return _cleaned(s)

    @pa.check("date")
    def valid_date(cls, s: Series[str]) -> Series[bool]:
        return _valid_dates(s)


class NormalizedItems(pa.DataFrameModel):
    """sft/grpo/eval/replay.parquet: canonical gold answers with verifiable evidence."""

    item_id: Series[str] = pa.Field(unique=True, str_length={"min_value": 1})
    split: Series[str] = pa.Field(isin=["train", "eval", "replay"])
    question: Series[str] = pa.Field(str_length={"min_value": 1})
    question_type: Series[str]
    context_doc_ids: Series[str]
    metric: Series[str] = pa.Field(str_matches=METRIC)
    value: Series[float] = pa.Field(nullable=False)
    unit: Series[str] = pa.Field(str_length={"min_value": 1})
    line: Series[str] = pa.Field(str_matches=LINE)
    shift: Series[str] = pa.Field(str_matches=SHIFT)
    date: Series[str] = pa.Field(str_matches=DATE)
    evidence: Series[str] = pa.Field(str_length={"min_value": 1})
    evidence_doc_id: Series[str] = pa.Field(str_length={"min_value": 1})
    source_system: Series[str] = pa.Field(isin=SYSTEMS)
    input_hash: Series[str] = pa.Field(unique=True, str_matches=r"^[0-9a-f]{64}$")
    source_file: Series[str]
    source_line: Series[int] = pa.Field(ge=1)

    class Config:
        strict = True
        coerce = True

    @pa.check("question", "evidence")
    def cleaned_text(cls, s: Series[str]) -> Series[bool]:
        return _cleaned(s)

    @pa.check("context_doc_ids")
    def json_list_of_ids(cls, s: Series[str]) -> Series[bool]:
        return s.map(_json_list)

    @pa.check("date")
    def valid_date(cls, s: Series[str]) -> Series[bool]:
        return _valid_dates(s)

    @pa.check("value")
    def finite_value(cls, s: Series[float]) -> Series[bool]:
        return s.abs() < float("inf")

    @pa.dataframe_check
    def input_hash_of_question(cls, df: pd.DataFrame) -> Series[bool]:
        return df["input_hash"] == df["question"].map(input_hash)


class NormalizedRejects(pa.DataFrameModel):
    """rejects.parquet: every dropped or repaired row, with its rule."""

    artifact: Series[str] = pa.Field(isin=["records", "kb", "sft", "grpo", "eval", "replay"])
    item_id: Series[str]
    rule: Series[str] = pa.Field(str_matches=r"^[a-z][a-z0-9_]*$")
    action: Series[str] = pa.Field(isin=["rejected", "repaired", "deduplicated"])
    detail: Series[str]

    class Config:
        strict = True
        coerce = True


SCHEMAS: dict[str, type[pa.DataFrameModel]] = {
    "records": NormalizedRecords,
    "kb": NormalizedKB,
    "sft": NormalizedItems,
    "grpo": NormalizedItems,
    "eval": NormalizedItems,
    "replay": NormalizedItems,
    "rejects": NormalizedRejects,
}


def validate_frame(
    model: type[pa.DataFrameModel] | pa.DataFrameSchema, df: pd.DataFrame, file: str
) -> pd.DataFrame:
    """Validate lazily; every failure becomes one ClapError naming the file, column, check and rows.

    Args:
        model: the pandera model (or a schema built for the declared answer).
        df: the frame.
        file: the output path it is about to be written to (for the message).

    Returns:
        The validated (coerced) frame.
    """
    try:
        return model.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        cases = e.failure_cases.astype({"column": str, "check": str})
        groups = cases.groupby(["column", "check"], sort=False)
        lines = [
            f"column {c!r} check {k!r}: {len(g)} row(s), e.g. {list(g['failure_case'].head(3))} at rows {list(g['index'].head(3))}"
            for (c, k), g in groups
        ]
        first = cases.iloc[0]
        raise ClapError(
            f"{len(cases)} schema failure(s) in {getattr(model, '__name__', None) or model.name}:\n  "
            + "\n  ".join(lines),
            file=file,
            column=first["column"],
            rule=first["check"],
        ) from e
