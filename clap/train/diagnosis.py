"""Runtime diagnosis of a training run: finite loss/grad checks, curves, the online TBDL detector.

:class:`Diagnosis` is a transformers ``TrainerCallback``; the decisions live in plain
functions/classes here and in :mod:`clap.train.detector`. Every decision that stops training is
rank-identical under torchrun: logged ``loss``/``grad_norm`` are already reduced across
ranks, and the probe losses each rank computes are replaced by rank 0's (broadcast).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clap.train import detector as det

CURVE_COLUMNS = (
    "step",
    "loss",
    "grad_norm",
    "learning_rate",
    "tokens_per_s",
    "probe_loss",
    "train_ref_loss",
    "probe_ref_loss",
    "gap_increment",
    "log_e",
    "log_threshold",
)
STATE_FILE = "clap_diagnosis.json"


def token_mean(scores: Sequence[tuple[float, int]]) -> float:
    """Token-weighted mean loss of (nll_sum, n_tokens) pairs (the training loss's own weighting)."""
    tokens = sum(n for _, n in scores)
    return sum(s for s, _ in scores) / max(tokens, 1)


def probe_order(n_items: int, seed: int) -> list[int]:
    """The pre-registered order in which probe items are drawn (seeded permutation)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n_items)]


def shared(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (identity when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def gathered(items: list[Any]) -> list[Any]:
    """Every rank's ``items``, concatenated in rank order (``items`` when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        boxes: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(boxes, items)
        return [x for box in boxes for x in box]
    return items


def is_finite(value: Any) -> bool:
    """False for None, NaN and +-inf."""
    return value is not None and math.isfinite(float(value))


@dataclass
class DiagState:
    """Everything the callback must carry across a checkpoint resume."""

    # per probe item (pool order), base model; None: an item the run never draws (not scored)
    probe_base: list[tuple[float, int] | None] = field(default_factory=list)
    draws: int = 0  # probe draws consumed
    drawn: list[list[Any]] = field(
        default_factory=list
    )  # per draw: [item indices, [[nll, tokens] at its check]]
    eprocess: dict[str, Any] | None = None
    alarm_step: int = -1
    health: str = "ok"
    stop_step: int = -1
    planned_steps: int = 0
    score_seconds: float = 0.0  # time spent scoring probe items and check batches (detector overhead)
    rows: list[dict[str, Any]] = field(default_factory=list)


# The TrainerCallback classes live in clap.train.callbacks: importing transformers' trainer takes seconds
# (torch, peft), which a stage that does not train (a batch not admitted, a probe not run) need not pay.
def __getattr__(name: str) -> Any:
    if name in ("Diagnosis", "TrainProgress", "quiet_trainer"):
        from clap.train import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def logged_tokens(log_history: list[dict[str, Any]]) -> float:
    """Tokens trained so far by a Trainer's log history (its last ``num_tokens``), 0 if none."""
    return next((float(h["num_tokens"]) for h in reversed(log_history) if "num_tokens" in h), 0.0)


def as_text_if_nonfinite(value: Any) -> Any:
    """NaN/inf as the strings 'nan'/'inf'/'-inf' (JSON has no such numbers); other values unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def from_text(value: Any) -> Any:
    """Inverse of :func:`as_text_if_nonfinite`."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def poison_lora(model) -> None:
    """Fault injection: set the first trainable LoRA weight to NaN (the next loss is NaN)."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_" in name:
            with torch.no_grad():
                param.fill_(float("nan"))
            return
    raise RuntimeError("no trainable LoRA parameter to poison")


def curves_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] = CURVE_COLUMNS) -> str:
    """The curves as CSV text (empty cells where a column has no value at that step).

    ``columns`` defaults to the training curves; the GRPO probe passes its own.
    """

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else str(v).lower()
        return str(v)

    lines = [",".join(columns)] + [",".join(cell(r[c]) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


def detector_constants(p: det.DetectorParams) -> dict[str, Any]:
    """The pre-registered detector constants, flat, for the training record."""
    return {
        "detector_alpha": p.alpha,
        "detector_clip": p.clip,
        "detector_null_gap": p.null_gap,
        "detector_m0": det.null_mean(p),
        "detector_lambdas": json.dumps(list(p.lambdas)),
        "detector_weights": json.dumps(list(p.weights)),
        "detector_process": p.process,
        "detector_probe_draw": p.probe_draw,
        "detector_seed": p.seed,
    }
