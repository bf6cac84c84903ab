"""The provided context of an item: its ``context_doc_ids`` resolved against the knowledge base.

Everything that builds prompts from admitted data (train, GRPO, eval, admit's reward check)
resolves documents here and renders them with :mod:`clap.task.prompt`, so every stage shows a
model the same context for the same item.

An item may cite many documents (a TAT-QA question cites every row and paragraph of its report,
median 12, up to ~4,000 characters). With params ``task.context.docs`` N > 0 only the N its
question ranks highest are shown (BM25 over the cited documents alone, bm25s with its default
constants and English stopwords), and the one that best matches ``task.context.cues``, in their
cited order: a shorter prompt is cheaper to train on and to decode. A training item (``split`` train: its SFT,
probe and GRPO rows) always shows its evidence document, in place of the lowest ranked one, so no
training example teaches an answer its context does not hold; a held-out item is shown what its
question finds, as a served request is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from clap.errors import ClapError
from clap.task.answer import EVERY_DOC, ContextSpec


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


def _scores(query: str, docs: list[tuple[str, str]]) -> np.ndarray:
    """BM25 score of each document of ``docs`` for ``query`` (an index of ``docs`` alone; zeros when
    the query or the documents have no word outside the stopwords)."""
    import bm25s

    # bm25s sets DEBUG: one "Building index" line per item
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    corpus = bm25s.tokenize([text for _, text in docs], stopwords="en", return_ids=False, show_progress=False)
    words = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
    if not words or not any(corpus):
        return np.zeros(len(docs))
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    return np.asarray(index.get_scores(words), dtype=np.float64)


def rank_docs(question: str, docs: list[tuple[str, str]]) -> list[int]:
    """Indices of ``docs`` best first for ``question`` (ties and unmatched documents in cited order)."""
    return [int(i) for i in np.argsort(-_scores(question, docs), kind="stable")]


def shown_docs(
    item_row: Mapping[str, Any], docs: list[tuple[str, str]], spec: ContextSpec
) -> list[tuple[str, str]]:
    """The documents of ``docs`` shown for an item, in cited order (params ``task.context``).

    Every one when ``spec.docs`` is 0 or not below their number; else the ``spec.docs`` the question
    ranks highest, plus the one that matches ``spec.cues`` best (when one matches and is not among
    them already: the paragraph that states a table's unit, "(in thousands)", is rarely one a question
    names). A training item's ``evidence_doc_id`` is always shown, in place of the lowest ranked.
    """
    if spec.docs <= 0 or len(docs) <= spec.docs:
        return docs
    keep = rank_docs(str(item_row["question"]), docs)[: spec.docs]
    evidence = item_row.get("evidence_doc_id")
    ids = [d for d, _ in docs]
    if item_row.get("split") == "train" and evidence in ids and ids.index(evidence) not in keep:
        keep = [*keep[:-1], ids.index(evidence)]
    if spec.cues:
        cue = _scores(" ".join(spec.cues), docs)
        best = int(np.argmax(cue))
        if cue[best] > 0 and best not in keep:
            keep.append(best)
    return [docs[i] for i in sorted(keep)]


def item_docs(
    item_row: Mapping[str, Any], kb_df: pd.DataFrame | Mapping[str, str], spec: ContextSpec = EVERY_DOC
) -> list[tuple[str, str]]:
    """The (doc_id, body) pairs an item provides as context, in ``context_doc_ids`` order.

    Args:
        item_row: an item (mapping or pandas row) with ``item_id``, ``question``, ``split``,
            ``evidence_doc_id`` and ``context_doc_ids`` (JSON list text or list).
        kb_df: the knowledge base frame, or a ``doc_id -> body`` mapping from
            :func:`kb_bodies` (build it once when resolving many items).
        spec: params ``task.context``: which cited documents are shown (:func:`shown_docs`;
            the default: every one).

    Returns:
        One (doc_id, body) per shown document; ``[]`` for an item without context.

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
    return shown_docs(item_row, [(d, bodies[d]) for d in ids], spec)
