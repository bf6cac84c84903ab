"""What the gate and the summary make of a GRPO probe record: the GRPO candidate's decision,
the check a held probe may add to the SFT gate, and the static-vs-runtime report sections."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io
from clap.errors import ClapError
from clap.judge.gating import Check
from clap.train.grpo_policy import GrpoParams


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
        return (
            "hold",
            f"grpo_{record['stop_reason']}",
            f"probe held at step {record['stop_step']}: {record['stop_detail']}",
        )
    return (
        "hold",
        "grpo_not_evaluated",
        "probe stable, but the GRPO adapter has no paired held-out evaluation: it cannot be promoted",
    )


def sft_checks(record: Mapping[str, Any], p: GrpoParams) -> list[Check]:
    """The check a held probe adds to the SFT gate: none unless ``grpo.hold_sft_on_hold`` says so."""
    if not p.hold_sft_on_hold or record["health"] != "hold":
        return []
    return [
        Check(
            "grpo_probe",
            "hold",
            f"GRPO probe held at step {record['stop_step']} ({record['stop_reason']}: {record['stop_detail']}); grpo.hold_sft_on_hold",
        )
    ]


def gate_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """Flat gate-metrics fields of the GRPO candidate: decision, rule, static vs runtime."""
    decision, rule, _ = candidate_decision(record)
    return {
        "grpo_decision": decision,
        "grpo_rule": rule,
        "grpo_health": record["health"],
        "grpo_kl_peak": record["kl_peak"],
        "grpo_static_verdict": record["static_verdict"],
        "grpo_runtime_verdict": record["runtime_verdict"],
    }


def evidence_section(record: Mapping[str, Any], record_sha256: str) -> dict[str, Any]:
    """The GRPO part of the gate's evidence bundle: the decision, why, and the probe record (KL evidence)."""
    decision, rule, why = candidate_decision(record)
    return {
        "decision": decision,
        "rule": rule,
        "reason": why,
        "record_sha256": record_sha256,
        "record": dict(record),
    }


def fmt(value: Any) -> str:
    """A record number for markdown: 4 significant digits; text (e.g. "nan") as is."""
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def report_section(record: Mapping[str, Any]) -> str:
    """The GRPO-candidate section of the gate report: decision, why, static vs runtime."""
    decision, rule, why = candidate_decision(record)
    lines = [
        "",
        f"## GRPO candidate: **{decision.upper()}** (rule: `{rule}`)",
        "",
        f"{why}.",
        "",
        "| static admission (D_grpo) | runtime probe |",
        "|---|---|",
        f"| {record['static_verdict']}: rank-pass rate {fmt(record['static_rank_pass_rate'])}, reward margin "
        f"{fmt(record['static_reward_margin'])} | {record['runtime_verdict']}: KL peak {fmt(record['kl_peak'])}, reward final "
        f"{fmt(record['reward_final'])}, {record['steps']} steps |",
        "",
        "The KL evidence (peak, step, the signal that fired, the thresholds) is in `evidence.json` under `grpo`.",
    ]
    return "\n".join(lines) + "\n"


def static_runtime_row(metrics_dir: Path | str, batch: str) -> dict[str, Any]:
    """One summary row: static admission (rank-pass rate, margin) vs runtime (KL peak, GRPO decision)."""
    path = Path(metrics_dir) / "grpo" / f"{batch}.json"
    record = io.read_json(path)
    keys = (
        "static_verdict",
        "static_rank_pass_rate",
        "static_reward_margin",
        "runtime_verdict",
        "kl_peak",
        "stop_reason",
    )
    missing = [k for k in keys if k not in record]
    if missing:
        raise ClapError(
            f"GRPO probe record lacks {missing}", file=path, column=missing[0], rule="missing_metric"
        )
    return {"batch": batch, **{k: record[k] for k in keys}, "grpo_decision": candidate_decision(record)[0]}


def render_static_runtime(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary's static-vs-runtime table (markdown) and its one-line lesson."""
    lines = [
        "",
        "## GRPO probe: static admission vs runtime",
        "",
        "| batch | static (rank-pass rate, margin) | runtime (KL peak, stop) | GRPO decision |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['static_verdict']} ({fmt(r['static_rank_pass_rate'])}, {fmt(r['static_reward_margin'])}) | "
            f"{r['runtime_verdict']} ({fmt(r['kl_peak'])}, {r['stop_reason']}) | {r['grpo_decision']} |"
        )
    both = [r["batch"] for r in rows if r["static_verdict"] == "pass" and r["runtime_verdict"] == "hold"]
    if both:
        lines += ["", f"Static admission passed but the runtime probe was held: **{', '.join(both)}**."]
    return "\n".join(lines) + "\n"


def summary_fields(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Flat summary counts of the probe: runs, holds, and static-pass-but-runtime-hold batches."""
    return {
        "grpo_probes_run": sum(r["runtime_verdict"] != "not_run" for r in rows),
        "grpo_probes_held": sum(r["runtime_verdict"] == "hold" for r in rows),
        "grpo_static_pass_runtime_hold": sum(
            r["static_verdict"] == "pass" and r["runtime_verdict"] == "hold" for r in rows
        ),
    }
