"""Runtime risk diagnosis of a GRPO probe: KL, reward trajectory, completion length, finite loss.

CLAP's lesson: a batch can pass static admission (rank-pass rate 1.0, a healthy reward
margin) and still blow up at runtime (KL peaks of 168 to 6712). The signals here read the
per-step values TRL's ``GRPOTrainer`` logs (``kl``, ``reward``, ``reward_std``,
``frac_reward_zero_std``, ``completions/mean_length``, ``completions/clipped_ratio``,
``loss``, ``grad_norm``) and are plain functions over the curve rows; :class:`GrpoDiagnosis`
is the thin ``TrainerCallback`` that applies them and stops the run with ``health = hold``.
Logged values are already reduced across ranks, so a stop is rank-identical under torchrun.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clap.train.grpo_noise import RewardTests, decline_pvalue, plateau_pvalue
from clap.train.grpo_policy import GrpoThresholds

LOG_KEYS = {
    "kl": "kl",
    "reward": "reward",
    "reward_std": "reward_std",
    "completion_length": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "loss": "loss",
    "grad_norm": "grad_norm",
}
SIGNALS = (
    "nonfinite",
    "kl_peak",
    "kl_trend",
    "reward_collapse",
    "zero_variance",
    "reward_plateau",
    "length_drift",
    "clipped",
)


@dataclass(frozen=True)
class Signal:
    """The runtime signal that fired: its name, the value seen and the bound it crossed."""

    name: str
    step: int
    value: float
    threshold: float
    detail: str


def curve_row(step: int, logs: dict[str, Any]) -> dict[str, Any]:
    """One curve row from a TRL log dict (absent or all-NaN metrics are None)."""
    row: dict[str, Any] = {"step": int(step)}
    for col, key in LOG_KEYS.items():
        v = logs.get(key)
        row[col] = None if v is None else float(v)
    return row


def _series(rows: Sequence[dict[str, Any]], col: str) -> list[float]:
    return [float(r[col]) for r in rows if r.get(col) is not None]


def slope(values: Sequence[float]) -> float:
    """Least-squares slope per step of ``values`` (0.0 for fewer than two points)."""
    if len(values) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(values), dtype=float), np.asarray(values, dtype=float), 1)[0])


def _run_length(rows: Sequence[dict[str, Any]], test) -> int:
    """How many of the latest rows in a row satisfy ``test``."""
    n = 0
    for r in reversed(rows):
        if not test(r):
            break
        n += 1
    return n


def nonfinite_signal(rows: Sequence[dict[str, Any]]) -> Signal | None:
    """Loss, gradient norm, KL or reward of the latest step is NaN/inf (None for the loss: all NaN)."""
    last = rows[-1]
    for col in ("loss", "grad_norm", "kl", "reward"):
        v = last.get(col)
        if (col == "loss" and v is None) or (v is not None and not math.isfinite(v)):
            return Signal(
                "nonfinite", last["step"], float("nan") if v is None else v, 0.0, f"{col} is not finite"
            )
    return None


def kl_signals(rows: Sequence[dict[str, Any]], t: GrpoThresholds) -> Signal | None:
    """KL above its bound at this step (peak), or rising faster than ``max_kl_slope`` over the window (trend)."""
    step, kl = rows[-1]["step"], _series(rows, "kl")
    if not kl:
        return None
    if kl[-1] > t.max_kl:
        return Signal("kl_peak", step, kl[-1], t.max_kl, f"KL {kl[-1]:.4g} > {t.max_kl:g}")
    if t.kl_window >= 2 and len(kl) >= t.kl_window:
        s = slope(kl[-t.kl_window :])
        if s > t.max_kl_slope:
            return Signal(
                "kl_trend",
                step,
                s,
                t.max_kl_slope,
                f"KL slope {s:.4g}/step over {t.kl_window} steps > {t.max_kl_slope:g}",
            )
    return None


def reward_signals(rows: Sequence[dict[str, Any]], t: GrpoThresholds, tests: RewardTests) -> Signal | None:
    """Reward collapse or plateau beyond sampling noise (:mod:`clap.train.grpo_noise`), or zero-variance
    groups for too long."""
    step, reward = rows[-1]["step"], _series(rows, "reward")
    drop = max(reward) - reward[-1] if reward else 0.0
    if step in tests.collapse_steps and drop > t.max_reward_drop:
        declining, p = decline_pvalue(reward)
        if p <= tests.collapse_step_level:
            return Signal(
                "reward_collapse",
                step,
                p,
                tests.collapse_step_level,
                f"reward {reward[-1]:.4g} is {drop:.4g} below its best {max(reward):.4g} (> {t.max_reward_drop:g}) "
                f"and falling beyond sampling noise: {declining} of {len(reward) * (len(reward) - 1) // 2} "
                f"step pairs decline, Kendall p {p:.3g} <= {tests.collapse_step_level:.3g}",
            )
    flat = _run_length(
        rows, lambda r: r.get("frac_reward_zero_std") is not None and r["frac_reward_zero_std"] >= 1.0
    )
    if t.zero_std_patience > 0 and flat >= t.zero_std_patience:
        return Signal(
            "zero_variance",
            step,
            float(flat),
            float(t.zero_std_patience),
            f"every group had zero reward variance for {flat} steps (no learning signal)",
        )
    if step in tests.plateau_steps:
        window = rows[-t.plateau_window :]
        found = plateau_pvalue(
            [r.get("reward") for r in window], [r.get("reward_std") for r in window], tests.group_size
        )
        if found is not None and found[1] <= tests.plateau_step_level:
            f, p = found
            return Signal(
                "reward_plateau",
                step,
                p,
                tests.plateau_step_level,
                f"mean reward over {t.plateau_window} steps varies less than its groups' sampling noise: "
                f"F {f:.3g}, lower-tail p {p:.3g} <= {tests.plateau_step_level:.3g}",
            )
    return None


def length_signals(rows: Sequence[dict[str, Any]], t: GrpoThresholds) -> Signal | None:
    """Completion length drifting from the first step's, or too many completions cut at the budget."""
    step, lengths = rows[-1]["step"], _series(rows, "completion_length")
    if len(lengths) >= 2 and lengths[0] > 0:
        drift = lengths[-1] / lengths[0] - 1.0
        if abs(drift) > t.max_length_drift:
            return Signal(
                "length_drift",
                step,
                drift,
                t.max_length_drift,
                f"mean completion length {lengths[0]:.1f} -> {lengths[-1]:.1f} ({drift:+.0%})",
            )
    clipped = _run_length(
        rows, lambda r: r.get("clipped_ratio") is not None and r["clipped_ratio"] > t.max_clipped_ratio
    )
    if t.clipped_patience > 0 and clipped >= t.clipped_patience:
        value = float(rows[-1]["clipped_ratio"])
        return Signal(
            "clipped",
            step,
            value,
            t.max_clipped_ratio,
            f"clipped ratio > {t.max_clipped_ratio:g} for {clipped} steps (completions cut at the budget)",
        )
    return None


def first_signal(rows: Sequence[dict[str, Any]], t: GrpoThresholds, tests: RewardTests) -> Signal | None:
    """The first runtime signal that fires at the latest row (non-finite, KL, reward, length), or None."""
    if not rows:
        return None
    for check in (
        nonfinite_signal,
        lambda r: kl_signals(r, t),
        lambda r: reward_signals(r, t, tests),
        lambda r: length_signals(r, t),
    ):
        found = check(rows)
        if found is not None:
            return found
    return None


def trajectory_summary(rows: Sequence[dict[str, Any]], t: GrpoThresholds) -> dict[str, Any]:
    """Flat KL/reward/length numbers of a run's curve rows (NaN where a series is empty)."""
    kl, reward, std = _series(rows, "kl"), _series(rows, "reward"), _series(rows, "reward_std")
    lengths, clipped, zero = (
        _series(rows, "completion_length"),
        _series(rows, "clipped_ratio"),
        _series(rows, "frac_reward_zero_std"),
    )
    finite_kl = [v for v in kl if math.isfinite(v)]
    nan = float("nan")
    peak_at = int(np.argmax(finite_kl)) if finite_kl else -1
    kl_steps = [r["step"] for r in rows if r.get("kl") is not None and math.isfinite(r["kl"])]
    return {
        "kl_peak": max(finite_kl) if finite_kl else nan,
        "kl_peak_step": kl_steps[peak_at] if peak_at >= 0 else -1,
        "kl_final": kl[-1] if kl else nan,
        "kl_slope": slope(finite_kl[-max(t.kl_window, 2) :]),
        "reward_first": reward[0] if reward else nan,
        "reward_final": reward[-1] if reward else nan,
        "reward_max": max(reward) if reward else nan,
        "reward_mean": float(np.mean(reward)) if reward else nan,
        "reward_std_final": std[-1] if std else nan,
        "reward_std_mean": float(np.mean(std)) if std else nan,
        "frac_reward_zero_std_mean": float(np.mean(zero)) if zero else nan,
        "completion_length_first": lengths[0] if lengths else nan,
        "completion_length_final": lengths[-1] if lengths else nan,
        "length_drift": lengths[-1] / lengths[0] - 1.0 if lengths and lengths[0] > 0 else nan,
        "clipped_ratio_max": max(clipped) if clipped else nan,
    }


def inject_lora_noise(model, std: float, seed: int) -> int:
    """Fault injection: add N(0, std) noise to every trainable ``default`` LoRA B matrix.

    The policy moves away from the reference (the adapter-disabled base, or the frozen
    ``ref`` copy of a continued adapter) at once, so the next step's KL blows up. Returns
    the number of tensors changed (0 raises: nothing to inject into).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad and "lora_B" in name and ".ref." not in name:
                param.add_(torch.randn(param.shape, generator=gen).to(param.device, param.dtype) * std)
                changed += 1
    if not changed:
        raise RuntimeError("no trainable LoRA B matrix to inject noise into")
    return changed


def __getattr__(name: str) -> Any:
    """``GrpoDiagnosis`` lives in clap.train.callbacks (it imports transformers' trainer: seconds)."""
    if name == "GrpoDiagnosis":
        from clap.train import callbacks

        return callbacks.GrpoDiagnosis
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
