"""clap.judge.summary: the cross-batch table never lets a mean hide a regressed batch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clap import io
from clap.errors import ClapError
from clap.judge.summary import SummaryParams, batch_row, plot_frame, render_markdown, summarize

P = SummaryParams(
    metrics=["overall", "pass_rate", "hallucination_rate"],
    regression_metrics=["overall", "hallucination_rate"],
    regression_tolerance=0.0,
)


def write_batch(
    root: Path,
    batch: str,
    base: dict,
    cand: dict | None,
    decision: str,
    *,
    offline: str | None = None,
    alarm: int = -1,
) -> None:
    ev = {"has_candidate": int(cand is not None), **{f"base_{k}": v for k, v in base.items()}}
    ev.update({f"candidate_{k}": v for k, v in (cand or {}).items()})
    io.write_json(root / "eval" / f"{batch}.json", ev)
    io.write_json(
        root / "gate" / f"{batch}.json",
        {
            "decision": decision,
            "rule": "chain_core_fields" if offline else "quality",
            "offline_decision": offline or decision,
        },
    )
    io.write_json(
        root / "train" / f"{batch}.json",
        {
            "health": "alarm" if alarm > 0 else "ok",
            "detector_alarm_step": alarm,
            "alarm_fraction": alarm / 32 if alarm > 0 else -1.0,
        },
    )


@pytest.fixture
def metrics_dir(tmp_path):
    write_batch(
        tmp_path,
        "2026-01",
        {"overall": 0.80, "pass_rate": 0.50, "hallucination_rate": 0.03},
        {"overall": 0.90, "pass_rate": 0.70, "hallucination_rate": 0.01},
        "promote",
    )
    write_batch(
        tmp_path,
        "2026-03",
        {"overall": 0.80, "pass_rate": 0.50, "hallucination_rate": 0.03},
        {"overall": 0.79, "pass_rate": 0.52, "hallucination_rate": 0.03},
        "reject",
        alarm=27,
    )
    write_batch(
        tmp_path,
        "2026-04",
        {"overall": 0.80, "pass_rate": 0.50, "hallucination_rate": 0.02},
        {"overall": 0.85, "pass_rate": 0.55, "hallucination_rate": 0.04},
        "canary",
        offline="promote",
    )
    write_batch(
        tmp_path, "2026-05", {"overall": 0.70, "pass_rate": 0.40, "hallucination_rate": 0.05}, None, "reject"
    )
    return tmp_path


def test_regressed_batches_are_flagged_even_when_the_mean_improves(metrics_dir):
    rows = [batch_row(metrics_dir, b, P) for b in ("2026-01", "2026-03", "2026-04", "2026-05")]
    flat = summarize(rows, P)
    assert flat["mean_delta_overall"] == pytest.approx((0.10 - 0.01 + 0.05) / 3, abs=1e-6)
    assert flat["regressed_batches"] == "2026-03,2026-04"  # overall dropped; hallucinations rose
    assert flat["mean_improved_but_batch_regressed"] is True
    assert (flat["n_batches"], flat["n_with_candidate"], flat["n_regressed_batches"]) == (4, 3, 2)
    assert (
        flat["decisions_promote"],
        flat["decisions_canary"],
        flat["decisions_hold"],
        flat["decisions_reject"],
    ) == (1, 1, 0, 2)
    assert flat["n_detector_alarms"] == 1
    md = render_markdown(rows, flat, P)
    assert (
        "| 2026-03 | alarm (alarm at step 27, 84% of steps) | reject | **reject** | 0.8 → 0.79 (-0.01)" in md
    )
    assert "**REGRESSED**" in md and "even though the mean improved" in md
    assert (
        "| 2026-04 | ok | promote | **canary** |" in md
        and "2026-04: canary by rule `chain_core_fields`" in md
    )
    assert "no candidate" in md and "mean (3 trained)" in md
    plot = plot_frame(rows, P)
    assert list(plot["batch"]) == ["2026-01", "2026-03", "2026-04", "2026-05"] and plot["overall_delta"].iloc[
        1
    ] == pytest.approx(-0.01)


def test_missing_batch_or_metric_is_loud(metrics_dir):
    with pytest.raises(ClapError):
        batch_row(metrics_dir, "2026-09", P)
    io.write_json(metrics_dir / "eval" / "2026-06.json", {"has_candidate": 1, "base_overall": 0.5})
    for stage in ("gate", "train"):
        shutil.copy(metrics_dir / stage / "2026-01.json", metrics_dir / stage / "2026-06.json")
    with pytest.raises(ClapError, match="candidate_overall"):
        batch_row(metrics_dir, "2026-06", P)


def test_regression_metrics_must_be_tabulated():
    with pytest.raises(ClapError):
        SummaryParams(metrics=["overall"], regression_metrics=["pass_rate"], regression_tolerance=0.0)
