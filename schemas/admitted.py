"""Pandera models of data/admitted/<batch>/ (docs/data-contract.md, "Admitted").

The admitted splits keep the normalized columns (built from the declared answer); :class:`AdmittedSet` is the
dataframe-level zero-overlap check over all admitted splits together; :func:`unseen_in_earlier_training`
checks a held-out or GRPO split against what earlier batches trained on.
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from clap.data.admission import Seen, question_answer_key
from clap.data.normalize import Vocab
from clap.task.answer import AnswerSchema
from schemas.normalized import normalized_items, normalized_kb

# sft and grpo are both drawn from the training pool and may share items; every other
# pair of groups must be disjoint by item_id and by input hash.
GROUP_OF_ROLE = {"sft": "train", "grpo": "train", "eval": "eval", "probe": "probe", "replay": "replay"}


def admitted_items(vocab: Vocab) -> pa.DataFrameSchema:
    """sft/grpo/eval/probe/replay.parquet: admitted items (probe items keep split ``eval``)."""
    schema = normalized_items(vocab)
    schema.name = "AdmittedItems"
    return schema


def admitted_kb(vocab: Vocab) -> pa.DataFrameSchema:
    """kb.parquet: the normalized knowledge base, copied."""
    schema = normalized_kb(vocab)
    schema.name = "AdmittedKB"
    return schema


class AdmittedSet(pa.DataFrameModel):
    """All admitted items, one row per (role, item): no ID or input shared across groups."""

    role: Series[str] = pa.Field(isin=list(GROUP_OF_ROLE))
    item_id: Series[str] = pa.Field(str_length={"min_value": 1})
    input_hash: Series[str] = pa.Field(str_matches=r"^[0-9a-f]{64}$")

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check
    def zero_overlap(cls, df: pd.DataFrame) -> Series[bool]:
        group = df["role"].map(GROUP_OF_ROLE)
        ok = pd.Series(True, index=df.index)
        for key in ("item_id", "input_hash"):
            ok &= group.groupby(df[key]).transform("nunique") == 1
        return ok

    @pa.dataframe_check
    def unique_within_role(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(["role", "item_id"], keep=False) & ~df.duplicated(
            ["role", "input_hash"], keep=False
        )


def unseen_in_earlier_training(seen: Seen, answer: AnswerSchema) -> pa.DataFrameSchema:
    """An admitted grpo/eval/probe/replay split: no item whose input hash, or whose normalized question
    with its answer, is in an earlier batch's training pool (``seen``: clap.data.admission.seen_in_training)."""

    def by_question_answer(df: pd.DataFrame) -> pd.Series:
        keys = [question_answer_key(row, answer) for _, row in df.iterrows()]
        return pd.Series([k not in seen.question_answer for k in keys], index=df.index, dtype=bool)

    return pa.DataFrameSchema(
        checks=[
            pa.Check(lambda df: ~df["input_hash"].isin(seen.input_hash), name="unseen_input_hash"),
            pa.Check(by_question_answer, name="unseen_question_answer"),
        ],
        name="UnseenInEarlierTraining",
    )
