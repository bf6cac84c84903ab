"""The GRPO probe's light side: params, thresholds, curve columns and the static admission verdict.

Kept free of torch/transformers imports so the gate and summary stages stay light; the probe
run itself is :mod:`clap.train.grpo`, its runtime signals :mod:`clap.train.grpo_diagnosis`,
and what the gate and summary make of a probe :mod:`clap.judge.grpo_gate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clap.errors import ClapError
from clap.params import check_keys

STATIC_KEYS = ("rank_pass_rate", "reward_margin", "reward_variance_min")
CURVE_COLUMNS = (
    "step",
    "kl",
    "reward",
    "reward_std",
    "completion_length",
    "clipped_ratio",
    "frac_reward_zero_std",
    "loss",
    "grad_norm",
)


@dataclass(frozen=True)
class GrpoThresholds:
    """params.yaml ``grpo.thresholds``: the pre-registered runtime bounds (see the comments there)."""

    max_kl: float
    kl_window: int
    max_kl_slope: float
    max_reward_drop: float
    reward_false_hold: float
    zero_std_patience: int
    plateau_window: int
    max_length_drift: float
    max_clipped_ratio: float
    clipped_patience: int


@dataclass(frozen=True)
class GrpoParams:
    """params.yaml ``grpo`` (see the comments there)."""

    enabled: Any  # true | false | [batch, ...]
    start_from: str
    hold_sft_on_hold: bool
    seed: int
    max_steps: int
    lr: float
    beta: float
    num_generations: int
    prompts_per_step: int
    max_completion_length: int
    temperature: float
    rollouts: str  # clap | trl
    inject_kl_at_step: int
    inject_kl_noise_std: float
    thresholds: GrpoThresholds

    def __post_init__(self) -> None:
        ok_enabled = isinstance(self.enabled, bool) or (
            isinstance(self.enabled, list) and all(isinstance(b, str) for b in self.enabled)
        )
        check_keys(
            {
                "grpo.enabled": ok_enabled,
                "grpo.start_from": self.start_from in ("base", "sft"),
                "grpo.beta": self.beta > 0,
                "grpo.num_generations": self.num_generations >= 2,
                "grpo.rollouts": self.rollouts in ("clap", "trl"),
            },
            "grpo: enabled must be true, false or a list of batch names; start_from base|sft; beta > 0 "
            "(else TRL logs no KL); num_generations >= 2; rollouts clap|trl",
        )


def probe_enabled(p: GrpoParams, batch: str) -> bool:
    """The enable switch: true (every batch), false (none) or a list of batch names."""
    return p.enabled if isinstance(p.enabled, bool) else batch in p.enabled


# --- static admission ---------------------------------------------------------------------
def static_verdict(admit: Mapping[str, Any], file: Path | str) -> dict[str, Any]:
    """The static admission numbers on D_grpo from ``metrics/admit/<b>.json``, and their verdict.

    ``static_verdict`` is "pass" when the rank-pass rate, reward margin and group-variance
    checks all passed (the checks CLAP's batches passed before blowing up at runtime).
    """
    missing = [k for k in ("admitted", *STATIC_KEYS, *(f"{k}_passed" for k in STATIC_KEYS)) if k not in admit]
    if missing:
        raise ClapError(
            f"admission metrics lack {missing}", file=file, column=missing[0], rule="missing_metric"
        )
    passed = all(int(admit[f"{k}_passed"]) == 1 for k in STATIC_KEYS)
    return {
        "admitted": int(admit["admitted"]),
        "static_verdict": "pass" if passed else "fail",
        **{f"static_{k}": float(admit[k]) for k in STATIC_KEYS},
    }
