"""The GRPO probe's light side: params, static verdict, curve columns, and what the gate and summary make of a probe.

Kept free of torch/transformers imports so the gate and summary stages stay light;
the probe run itself is :mod:`clap.grpo`, its runtime signals :mod:`clap.grpo_diagnosis`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from clap import io
from clap.errors import ClapError
from clap.gating import Check

STATIC_KEYS = ("rank_pass_rate", "reward_margin", "reward_variance_min")
CURVE_COLUMNS = ("step", "kl", "reward", "reward_std", "completion_length", "clipped_ratio", "frac_reward_zero_std", "loss", "grad_norm")


@dataclass(frozen=True)
class GrpoThresholds:
    """params.yaml ``grpo.thresholds``: the pre-registered runtime bounds (see the comments there)."""

    max_kl: float
    kl_window: int
    max_kl_slope: float
    max_reward_drop: float
    zero_std_patience: int
    plateau_window: int
    plateau_tol: float
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
    torch_threads: int
    max_steps: int
    lr: float
    beta: float
    num_generations: int
    prompts_per_step: int
    max_completion_length: int
    temperature: float
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: Sequence[str]
    inject_kl_at_step: int
    inject_kl_noise_std: float
    thresholds: GrpoThresholds

    def __post_init__(self) -> None:
        ok_enabled = isinstance(self.enabled, bool) or (isinstance(self.enabled, list) and all(isinstance(b, str) for b in self.enabled))
        if not ok_enabled or self.start_from not in ("base", "sft") or self.beta <= 0 or self.num_generations < 2:
            raise ClapError("grpo: enabled must be true, false or a list of batch names; start_from base|sft; beta > 0 "
                            "(else TRL logs no KL); num_generations >= 2", file="params.yaml", column="grpo", rule="bad_params")


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
        raise ClapError(f"admission metrics lack {missing}", file=file, column=missing[0], rule="missing_metric")
    passed = all(int(admit[f"{k}_passed"]) == 1 for k in STATIC_KEYS)
    return {"admitted": int(admit["admitted"]), "static_verdict": "pass" if passed else "fail",
            **{f"static_{k}": float(admit[k]) for k in STATIC_KEYS}}


# --- gate and summary ---------------------------------------------------------------------
def candidate_decision(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """(decision, rule, why) of the batch's GRPO candidate.

    Held probe -> hold (the runtime signal is the rule). A probe that finished stable is
    still "hold": the pipeline has no paired held-out evaluation of the GRPO adapter, and a
    GRPO adapter is only ever promoted through the same gate as SFT (paired McNemar, risk
    bounds, replay). Not run -> "not_run".
    """
    if int(record["run"]) == 0:
        return "not_run", "grpo_not_run", f"probe not run ({record['stop_reason']})"
    if record["health"] == "hold":
        return "hold", f"grpo_{record['stop_reason']}", f"probe held at step {record['stop_step']}: {record['stop_detail']}"
    return "hold", "grpo_not_evaluated", "probe stable, but the GRPO adapter has no paired held-out evaluation: it cannot be promoted"


def sft_checks(record: Mapping[str, Any], p: GrpoParams) -> list[Check]:
    """The check a held probe adds to the SFT gate: none unless ``grpo.hold_sft_on_hold`` says so."""
    if not p.hold_sft_on_hold or record["health"] != "hold":
        return []
    return [Check("grpo_probe", "hold", f"GRPO probe held at step {record['stop_step']} ({record['stop_reason']}: {record['stop_detail']}); grpo.hold_sft_on_hold")]


def gate_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """Flat gate-metrics fields of the GRPO candidate: decision, rule, static vs runtime."""
    decision, rule, _ = candidate_decision(record)
    return {"grpo_decision": decision, "grpo_rule": rule, "grpo_health": record["health"], "grpo_kl_peak": record["kl_peak"],
            "grpo_static_verdict": record["static_verdict"], "grpo_runtime_verdict": record["runtime_verdict"]}


def evidence_section(record: Mapping[str, Any], record_sha256: str) -> dict[str, Any]:
    """The GRPO part of the gate's evidence bundle: the decision, why, and the probe record (KL evidence)."""
    decision, rule, why = candidate_decision(record)
    return {"decision": decision, "rule": rule, "reason": why, "record_sha256": record_sha256, "record": dict(record)}


def fmt(value: Any) -> str:
    """A record number for markdown: 4 significant digits; text (e.g. "nan") as is."""
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def report_section(record: Mapping[str, Any]) -> str:
    """The GRPO-candidate section of the gate report: decision, why, static vs runtime."""
    decision, rule, why = candidate_decision(record)
    lines = ["", f"## GRPO candidate: **{decision.upper()}** (rule: `{rule}`)", "", f"{why}.", "",
             "| static admission (D_grpo) | runtime probe |", "|---|---|",
             f"| {record['static_verdict']}: rank-pass rate {fmt(record['static_rank_pass_rate'])}, reward margin "
             f"{fmt(record['static_reward_margin'])} | {record['runtime_verdict']}: KL peak {fmt(record['kl_peak'])}, reward final "
             f"{fmt(record['reward_final'])}, {record['steps']} steps |", "",
             "The KL evidence (peak, step, the signal that fired, the thresholds) is in `evidence.json` under `grpo`."]
    return "\n".join(lines) + "\n"


def static_runtime_row(metrics_dir: Path | str, batch: str) -> dict[str, Any]:
    """One summary row: static admission (rank-pass rate, margin) vs runtime (KL peak, GRPO decision)."""
    path = Path(metrics_dir) / "grpo" / f"{batch}.json"
    record = io.read_json(path)
    keys = ("static_verdict", "static_rank_pass_rate", "static_reward_margin", "runtime_verdict", "kl_peak", "stop_reason")
    missing = [k for k in keys if k not in record]
    if missing:
        raise ClapError(f"GRPO probe record lacks {missing}", file=path, column=missing[0], rule="missing_metric")
    return {"batch": batch, **{k: record[k] for k in keys}, "grpo_decision": candidate_decision(record)[0]}


def render_static_runtime(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary's static-vs-runtime table (markdown) and its one-line lesson."""
    lines = ["", "## GRPO probe: static admission vs runtime", "",
             "| batch | static (rank-pass rate, margin) | runtime (KL peak, stop) | GRPO decision |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['static_verdict']} ({fmt(r['static_rank_pass_rate'])}, {fmt(r['static_reward_margin'])}) | "
                     f"{r['runtime_verdict']} ({fmt(r['kl_peak'])}, {r['stop_reason']}) | {r['grpo_decision']} |")
    both = [r["batch"] for r in rows if r["static_verdict"] == "pass" and r["runtime_verdict"] == "hold"]
    if both:
        lines += ["", f"Static admission passed but the runtime probe was held: **{', '.join(both)}**."]
    return "\n".join(lines) + "\n"


def summary_fields(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Flat summary counts of the probe: runs, holds, and static-pass-but-runtime-hold batches."""
    return {"grpo_probes_run": sum(r["runtime_verdict"] != "not_run" for r in rows),
            "grpo_probes_held": sum(r["runtime_verdict"] == "hold" for r in rows),
            "grpo_static_pass_runtime_hold": sum(r["static_verdict"] == "pass" and r["runtime_verdict"] == "hold" for r in rows)}
