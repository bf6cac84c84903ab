"""What eval writes and the gate reads: the scored-items and timings frames of an eval folder.

Kept apart from :mod:`clap.judge.evaluation` (which loads models and generates) so that reading
an evaluation needs no model code: the gate and summary depend on this, not on the generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from clap import io
from clap.errors import ClapError
from clap.params import bad_param
from clap.task.answer import AnswerSchema

ROLES = ("base", "candidate", "incumbent")
# params ``eval.answer_metric``: none, or TAT-QA's exact match and numeracy-focused F1
# (:mod:`clap.judge.answer_metric`) beside clap's own fields, per item in the columns below
ANSWER_METRICS = ("none", "tatqa")
ANSWER_METRIC_COLUMNS = ("em", "f1")


def scored_columns(schema: AnswerSchema) -> list[str]:
    """Columns of a scored-items frame for the declared answer (its slices and fields)."""
    return (
        ["model", "position", "item_id", *schema.slices, "gold_value", "output", "parse_ok", "parse_error"]
        + [f"pred_{k}" for k in schema.names]
        + [f"{k}_correct" for k in schema.names]
        + ["pass", "overall", "hallucination", "wrong_fact", "new_tokens", "prompt_tokens"]
    )


def answer_metric_columns(answer_metric: str) -> list[str]:
    """The per-item columns params ``eval.answer_metric`` adds to a scored-items frame (none: none)."""
    if answer_metric not in ANSWER_METRICS:
        raise bad_param(
            "eval.answer_metric",
            f"eval.answer_metric must be one of {list(ANSWER_METRICS)}, got {answer_metric!r}",
        )
    return [] if answer_metric == "none" else list(ANSWER_METRIC_COLUMNS)


TIMING_COLUMNS = ["model", "item_id", "latency_ms", "batch_wall_ms", "batch_size", "batch_index"]


def check_pairing(scored: pd.DataFrame) -> None:
    """Every model answered the same items in the same order (the gate's pairing)."""
    orders = {
        role: list(g.sort_values("position")["item_id"]) for role, g in scored.groupby("model", sort=True)
    }
    first = next(iter(orders.values()), [])
    bad = [role for role, ids in orders.items() if ids != first]
    if bad:
        raise ClapError(
            f"models {bad} were not evaluated on the same items in the same order", rule="unpaired_eval"
        )


def read_scored(eval_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, Mapping[str, Any]]:
    """Read an eval folder: scored items, timings and the manifest (loud on anything missing)."""
    eval_dir = Path(eval_dir)
    scored = io.read_parquet(eval_dir / "items.parquet")
    timings = io.read_parquet(eval_dir / "timings.parquet")
    meta = io.read_json(eval_dir / "manifest.json")
    if not isinstance(meta, dict) or "models" not in meta:
        raise ClapError(
            "eval manifest lacks 'models'", file=eval_dir / "manifest.json", rule="corrupt_manifest"
        )
    if len(scored):
        check_pairing(scored)
    return scored, timings, meta
