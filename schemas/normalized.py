"""Pandera models of data/normalized/<batch>/ (docs/data-contract.md, "Normalized").

The columns come from the declared answer (params ``task``: a column per key field, the value,
the unit) and its key normalizers (params ``normalize.keys``): a vocabulary or code key must be
one of its declared words, a date key an ISO date, a text key cleaned text; the unit one of the
canonical units. Cleaned text is checked by idempotence: a cleaned string cleans to itself.
"""

from __future__ import annotations

import json

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.data.normalize import KeyNorm, Vocab, clean_text, input_hash
from clap.errors import ClapError

SOURCE = r"^[a-z][a-z0-9_]*$"  # a source system's name (a declared source's, or a document's system)
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


def _key_column(key: KeyNorm, nullable: bool = False) -> pa.Column:
    """A canonical key field: one of the declared words (vocabulary, code), an ISO date, or cleaned text."""
    if key.kind in ("vocabulary", "code"):
        return pa.Column(str, pa.Check.isin(list(key.words)), nullable=nullable)
    if key.kind == "date":
        checks = [pa.Check.str_matches(DATE), pa.Check(_valid_dates, name="valid_date")]
        return pa.Column(str, checks, nullable=nullable)
    return pa.Column(
        str, [pa.Check.str_length(min_value=1), pa.Check(_cleaned, name="cleaned_text")], nullable=nullable
    )


def _finite(s: pd.Series) -> pd.Series:
    return s.abs() < float("inf")


def _value_and_unit(vocab: Vocab) -> dict[str, pa.Column]:
    if vocab.value_type == "number":
        cols = {"value": pa.Column(float, pa.Check(_finite, name="finite_value"))}
    else:
        cols = {
            "value": pa.Column(
                str, [pa.Check.str_length(min_value=1), pa.Check(_cleaned, name="cleaned_text")]
            )
        }
    if vocab.unit_field:
        cols[vocab.unit_field] = pa.Column(
            str, pa.Check.isin(sorted({u for u, _ in vocab.unit_by_variant.values()}))
        )
    return cols


def _sourced() -> dict[str, pa.Column]:
    return {"source_file": pa.Column(str), "source_line": pa.Column(int, pa.Check.ge(1))}


def normalized_records(vocab: Vocab) -> pa.DataFrameSchema:
    """records.parquet: one canonical fact per row (no two with the same key fields and value)."""
    keys = list(vocab.answer.keys)
    checks = [pa.Check(lambda df: ~df.duplicated([*keys, "value"], keep=False), name="no_duplicate_fact")]
    if vocab.unit_of:
        unit, of = vocab.unit_field, vocab.unit_of
        checks.append(
            pa.Check(lambda df: df.groupby(of)[unit].transform("nunique") == 1, name=f"one_unit_per_{of}")
        )
    cols = {
        "record_id": pa.Column(str, [pa.Check.str_length(min_value=1)], unique=True),
        "source_system": pa.Column(str, pa.Check.str_matches(SOURCE)),
        **{k.name: _key_column(k) for k in vocab.keys},
        **_value_and_unit(vocab),
        "text": pa.Column(str),
        **_sourced(),
    }
    return pa.DataFrameSchema(cols, checks=checks, strict=True, coerce=True, name="NormalizedRecords")


def normalized_kb(vocab: Vocab) -> pa.DataFrameSchema:
    """kb.parquet: cleaned documents with the key fields of the record they describe (null if none)."""
    text = [pa.Check(_cleaned, name="cleaned_text")]
    cols = {
        "doc_id": pa.Column(str, [pa.Check.str_length(min_value=1)], unique=True),
        "system": pa.Column(str, pa.Check.str_matches(SOURCE)),
        "record_ref": pa.Column(str, nullable=True),
        "title": pa.Column(str, text),
        "body": pa.Column(str, [pa.Check.str_length(min_value=1), *text]),
        **{k.name: _key_column(k, nullable=True) for k in vocab.keys},
    }
    return pa.DataFrameSchema(cols, strict=True, coerce=True, name="NormalizedKB")


def normalized_items(vocab: Vocab) -> pa.DataFrameSchema:
    """sft/grpo/eval/replay.parquet: canonical gold answers with verifiable evidence."""
    cleaned = pa.Check(_cleaned, name="cleaned_text")
    cols = {
        "item_id": pa.Column(str, [pa.Check.str_length(min_value=1)], unique=True),
        "split": pa.Column(str, pa.Check.isin(["train", "eval", "replay"])),
        "question": pa.Column(str, [pa.Check.str_length(min_value=1), cleaned]),
        "question_type": pa.Column(str),
        "context_doc_ids": pa.Column(str, pa.Check(lambda s: s.map(_json_list), name="json_list_of_ids")),
        **{k.name: _key_column(k) for k in vocab.keys},
        **_value_and_unit(vocab),
        "evidence": pa.Column(str, [pa.Check.str_length(min_value=1), cleaned]),
        "evidence_doc_id": pa.Column(str, pa.Check.str_length(min_value=1)),
        "source_system": pa.Column(str, pa.Check.str_matches(SOURCE)),
        "input_hash": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$"), unique=True),
        **_sourced(),
    }
    check = pa.Check(
        lambda df: df["input_hash"] == df["question"].map(input_hash), name="input_hash_of_question"
    )
    return pa.DataFrameSchema(cols, checks=[check], strict=True, coerce=True, name="NormalizedItems")


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


def normalized_schemas(vocab: Vocab) -> dict[str, pa.DataFrameSchema | type[pa.DataFrameModel]]:
    """The schema of every normalized file, for the declared answer and its key normalizers."""
    items = normalized_items(vocab)
    return {
        "records": normalized_records(vocab),
        "kb": normalized_kb(vocab),
        **dict.fromkeys(("sft", "grpo", "eval", "replay"), items),
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
