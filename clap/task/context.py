"""The provided context of an item: its ``context_doc_ids`` resolved against the knowledge base.

Everything that builds prompts from admitted data (train, eval, admit's reward check)
resolves documents here and renders them with :mod:`clap.task.prompt`, so every stage shows a
model the same context for the same item.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from clap.errors import ClapError


def parse_doc_ids(value: Any) -> list[str]:
    """``context_doc_ids`` as a list of doc ids (JSON list text, list or array); raises ClapError otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise ClapError(
                f"context_doc_ids is not a JSON list: {e}", column="context_doc_ids", rule="malformed_context"
            ) from e
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ClapError(
            f"context_doc_ids must be a list of doc ids, got {value!r}",
            column="context_doc_ids",
            rule="malformed_context",
        )
    return [x.strip() for x in value]


def kb_bodies(kb_df: pd.DataFrame) -> dict[str, str]:
    """doc_id -> body of a (normalized) knowledge base; a repeated doc_id raises ClapError."""
    repeated = kb_df["doc_id"][kb_df["doc_id"].duplicated()]
    if len(repeated):
        raise ClapError(
            f"knowledge base repeats doc_id {repeated.iloc[0]!r}", column="doc_id", rule="duplicate_doc_id"
        )
    return dict(zip(kb_df["doc_id"], kb_df["body"]))


def item_docs(item_row: Mapping[str, Any], kb_df: pd.DataFrame | Mapping[str, str]) -> list[tuple[str, str]]:
    """The (doc_id, body) pairs an item provides as context, in ``context_doc_ids`` order.

    Args:
        item_row: an item (mapping or pandas row) with ``item_id`` and ``context_doc_ids``
            (JSON list text or list).
        kb_df: the knowledge base frame, or a ``doc_id -> body`` mapping from
            :func:`kb_bodies` (build it once when resolving many items).

    Returns:
        One (doc_id, body) per cited document; ``[]`` for an item without context.

    Raises:
        ClapError: a cited doc_id is not in the knowledge base (rule ``context_doc_unknown``).
    """
    bodies = kb_bodies(kb_df) if isinstance(kb_df, pd.DataFrame) else kb_df
    item_id = item_row.get("item_id")
    try:
        ids = parse_doc_ids(item_row["context_doc_ids"])
    except ClapError as e:
        raise ClapError(f"item {item_id}: {e.args[0]}", column="context_doc_ids", rule=e.rule) from e
    missing = [d for d in ids if d not in bodies]
    if missing:
        raise ClapError(
            f"item {item_id} cites documents not in the knowledge base: {missing}",
            column="context_doc_ids",
            rule="context_doc_unknown",
        )
    return [(d, bodies[d]) for d in ids]
