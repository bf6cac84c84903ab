"""The cross-batch summary (CLAP's table): base -> candidate per batch, the mean, and the
batches that regressed, flagged even when the mean improved; per batch the training health
(detector alarm), the offline decision (held-out eval, training, admission) and the release
decision (the gate with its application-chain checks). The plot data (:func:`plot_frame`) has
per batch the two deltas a decision rests on: the offline pass-rate delta against the gate's
baseline and the chain's value delta (replay's adapter contribution, B - A), each with the
batch's decision."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from clap import io
from clap.errors import ClapError
from clap.judge.gating import DECISIONS
from clap.params import bad_param

LOWER_IS_BETTER = frozenset(
    {"hallucination_rate", "wrong_fact_rate", "p50_latency_ms", "p95_latency_ms", "mean_new_tokens"}
)


@dataclasses.dataclass(frozen=True)
class SummaryParams:
    """Params section ``summary``."""

    metrics: list[str]
    regression_metrics: list[str]
    regression_tolerance: float

    def __post_init__(self) -> None:
        if not set(self.regression_metrics) <= set(self.metrics):
            raise bad_param(
                "summary.regression_metrics", "summary.regression_metrics must be a subset of summary.metrics"
            )


def _get(record: dict[str, Any], key: str, file: Path) -> Any:
    if key not in record:
        raise ClapError(f"metrics file lacks {key!r}", file=file, column=key, rule="missing_metric")
    return record[key]


def _record(metrics_dir: Path, stage: str, batch: str) -> tuple[dict[str, Any], Path]:
    path = metrics_dir / stage / f"{batch}.json"
    record = io.read_json(path)
    if not isinstance(record, dict):
        raise ClapError("metrics file must be a flat JSON object", file=path, rule="corrupt_metrics")
    return record, path


def batch_row(metrics_dir: Path | str, batch: str, p: SummaryParams) -> dict[str, Any]:
    """One batch: training health, offline and release decision, per metric base, candidate and
    delta (None without a candidate), the gate's paired pass-rate delta against its baseline and
    the replay's value delta B - A (None where not measured)."""
    (ev, eval_path), (gate, gate_path), (train, train_path), (replay, replay_path) = (
        _record(Path(metrics_dir), stage, batch) for stage in ("eval", "gate", "train", "replay")
    )
    row: dict[str, Any] = {
        "batch": batch,
        "health": _get(train, "health", train_path),
        "alarm_step": int(_get(train, "detector_alarm_step", train_path)),
        "alarm_fraction": float(_get(train, "alarm_fraction", train_path)),
        "offline_decision": _get(gate, "offline_decision", gate_path),
        "decision": _get(gate, "decision", gate_path),
        "rule": _get(gate, "rule", gate_path),
        "production_decision": _get(gate, "production_decision", gate_path),
        "production_rule": _get(gate, "production_rule", gate_path),
        "has_candidate": bool(_get(ev, "has_candidate", eval_path)),
        "certified": bool(_get(gate, "certified", gate_path)),
        "certification": _get(gate, "certification", gate_path),
    }
    for m in p.metrics:
        base = float(_get(ev, f"base_{m}", eval_path))
        cand = float(_get(ev, f"candidate_{m}", eval_path)) if row["has_candidate"] else None
        row.update(
            {f"base_{m}": base, f"candidate_{m}": cand, f"delta_{m}": None if cand is None else cand - base}
        )
    row["regressed"] = is_regressed(row, p)
    if row["has_candidate"]:
        row["gate_baseline"] = _get(gate, "baseline", gate_path)
        row["offline_pass_rate_delta"] = float(_get(gate, "delta", gate_path))
    else:
        row["gate_baseline"], row["offline_pass_rate_delta"] = "", None
    chain_ran = _get(replay, "A_run", replay_path) and _get(replay, "B_run", replay_path)
    row["chain_value_delta"] = (
        float(_get(replay, "adapter_contribution_value", replay_path)) if chain_ran else None
    )
    return row


def is_regressed(row: dict[str, Any], p: SummaryParams) -> bool:
    """The candidate is worse than base by more than the tolerance on any regression metric."""
    for m in p.regression_metrics:
        delta = row[f"delta_{m}"]
        worse = None if delta is None else (delta if m in LOWER_IS_BETTER else -delta)
        if worse is not None and worse > p.regression_tolerance:
            return True
    return False


def summarize(rows: Sequence[dict[str, Any]], p: SummaryParams) -> dict[str, Any]:
    """Flat summary: means over batches with a candidate, regressed batches, decision counts."""
    trained = [r for r in rows if r["has_candidate"]]
    regressed = [r["batch"] for r in rows if r["regressed"]]
    out: dict[str, Any] = {
        "n_batches": len(rows),
        "n_with_candidate": len(trained),
        "n_regressed_batches": len(regressed),
        "regressed_batches": ",".join(regressed),
    }
    out.update({f"decisions_{d}": sum(r["decision"] == d for r in rows) for d in DECISIONS})
    out["n_detector_alarms"] = sum(r["alarm_step"] > 0 for r in rows)
    out["n_rollbacks"] = sum(r["production_decision"] == "rollback" for r in rows)
    for m in p.metrics if trained else ():
        for kind in ("base", "candidate", "delta"):
            out[f"mean_{kind}_{m}"] = round(sum(r[f"{kind}_{m}"] for r in trained) / len(trained), 6)
    main = p.regression_metrics[0] if p.regression_metrics else None
    improved = bool(
        main
        and trained
        and (out[f"mean_delta_{main}"] < 0 if main in LOWER_IS_BETTER else out[f"mean_delta_{main}"] > 0)
    )
    out["mean_improved_but_batch_regressed"] = improved and bool(regressed)
    return out


def _training(row: dict[str, Any]) -> str:
    """Training health, with the detector's alarm step and its fraction of the planned steps."""
    if row["alarm_step"] > 0:
        return f"{row['health']} (alarm at step {row['alarm_step']}, {row['alarm_fraction']:.0%} of steps)"
    return row["health"]


def _cell(row: dict[str, Any], m: str) -> str:
    if row[f"candidate_{m}"] is None:
        return f"{row[f'base_{m}']:.4g} → —"
    return f"{row[f'base_{m}']:.4g} → {row[f'candidate_{m}']:.4g} ({row[f'delta_{m}']:+.4g})"


def render_markdown(rows: Sequence[dict[str, Any]], flat: dict[str, Any], p: SummaryParams) -> str:
    """The cross-batch table (base → candidate (delta) per metric), the mean row and the flags."""
    head = ["batch", "training", "offline", "decision", *p.metrics, "regressed"]
    lines = [
        "# Cross-batch summary (base → candidate)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        flag = "**REGRESSED**" if r["regressed"] else ("no candidate" if not r["has_candidate"] else "")
        lines.append(
            f"| {r['batch']} | {_training(r)} | {r['offline_decision']} | **{r['decision']}** | "
            + " | ".join(_cell(r, m) for m in p.metrics)
            + f" | {flag} |"
        )
    if flat["n_with_candidate"]:
        means = [
            f"{flat[f'mean_base_{m}']:.4g} → {flat[f'mean_candidate_{m}']:.4g} ({flat[f'mean_delta_{m}']:+.4g})"
            for m in p.metrics
        ]
        lines.append(f"| mean ({flat['n_with_candidate']} trained) | | | | " + " | ".join(means) + " | |")
    lines += [
        "",
        "Decisions (offline: held-out eval, training, admission; decision: with the application-chain checks): "
        + ", ".join(f"{d} {flat[f'decisions_{d}']}" for d in reversed(DECISIONS))
        + ".",
    ]
    lines += [
        f"- {r['batch']}: {r['decision']} by rule `{r['rule']}`"
        + ("" if r["certified"] else f" (scenario **UNCERTIFIED**: {r['certification']})")
        + (
            f"; production: **{r['production_decision']}** by rule `{r['production_rule']}` (the incumbent fails on these items)"
            if r["production_decision"] != r["decision"]
            else ""
        )
        for r in rows
    ]
    if flat["regressed_batches"]:
        note = " even though the mean improved" if flat["mean_improved_but_batch_regressed"] else ""
        lines.append(
            f"Regressed batches (candidate worse than base on {', '.join(p.regression_metrics)}){note}: **{flat['regressed_batches']}**."
        )
    return "\n".join(lines) + "\n"


PLOT_COLUMNS = ["batch", "kind", "delta", "decision", "offline_decision", "series"]


def plot_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """`dvc plots` data: a row per batch x delta (``offline_pass_rate``: the gate's paired pass-rate
    delta against its baseline; ``chain_value``: replay's value accuracy B - A), each with the
    batch's decisions; ``series`` (the bar label) names the batch, the delta and the decision. A
    batch without a candidate gets one ``no_candidate`` row at 0 so it still shows."""
    data = []
    for r in rows:
        deltas = [
            ("offline_pass_rate", f"offline pass rate vs {r['gate_baseline']}", r["offline_pass_rate_delta"]),
            ("chain_value", "chain value B - A", r["chain_value_delta"]),
        ]
        present = [d for d in deltas if d[2] is not None] or [("no_candidate", "no candidate", 0.0)]
        data += [
            (
                r["batch"],
                kind,
                round(value, 6),
                r["decision"],
                r["offline_decision"],
                f"{r['batch']} {label}: {r['decision']}",
            )
            for kind, label, value in present
        ]
    return pd.DataFrame(data, columns=PLOT_COLUMNS)
