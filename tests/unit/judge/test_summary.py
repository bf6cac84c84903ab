"""clap.judge.summary: the cross-batch table never lets a mean hide a regressed batch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_dvc

from clap import io
from clap.errors import ClapError
from clap.judge.summary import SummaryParams, batch_row, plot_frame, render_markdown, summarize

ROOT = Path(__file__).resolve().parents[3]
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
    chain_value: float | None = None,
    production: str | None = None,
    uncertified: str = "",
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
            "production_decision": production or decision,
            "production_rule": "incumbent_quality"
            if production
            else ("chain_core_fields" if offline else "quality"),
            **(
                {"baseline": "base", "delta": cand["pass_rate"] - base["pass_rate"]} if cand else {}
            ),  # the gate's paired delta against its baseline
            "certified": int(not uncertified),
            "certification": uncertified or "certified at commit abc1234",
        },
    )
    ran = chain_value is not None
    io.write_json(
        root / "replay" / f"{batch}.json",
        {"A_run": 1, "B_run": int(ran), **({"adapter_contribution_value": chain_value} if ran else {})},
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
        chain_value=0.75,
    )
    write_batch(
        tmp_path,
        "2026-03",
        {"overall": 0.80, "pass_rate": 0.50, "hallucination_rate": 0.03},
        {"overall": 0.79, "pass_rate": 0.52, "hallucination_rate": 0.03},
        "reject",
        alarm=27,
        chain_value=-0.05,
        production="rollback",
    )
    write_batch(
        tmp_path,
        "2026-04",
        {"overall": 0.80, "pass_rate": 0.50, "hallucination_rate": 0.02},
        {"overall": 0.85, "pass_rate": 0.55, "hallucination_rate": 0.04},
        "canary",
        offline="promote",
        chain_value=0.4,
    )
    write_batch(
        tmp_path,
        "2026-05",
        {"overall": 0.70, "pass_rate": 0.40, "hallucination_rate": 0.05},
        None,
        "reject",
        uncertified="the params changed since the certification of commit abc1234",
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
    assert flat["n_detector_alarms"] == 1 and flat["n_rollbacks"] == 1
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
    assert "- 2026-03: reject by rule `quality`; production: **rollback** by rule `incumbent_quality`" in md
    assert "- 2026-01: promote by rule `quality`\n" in md  # production follows the decision: not repeated
    assert (  # a decision made in an uncertified scenario says so; a certified one is not annotated
        "- 2026-05: reject by rule `quality` (scenario **UNCERTIFIED**: the params changed since the "
        "certification of commit abc1234)" in md
    )
    plot = plot_frame(rows)
    assert list(zip(plot["batch"], plot["kind"], plot["delta"], plot["decision"])) == [
        ("2026-01", "offline_pass_rate", pytest.approx(0.2), "promote"),
        ("2026-01", "chain_value", 0.75, "promote"),
        ("2026-03", "offline_pass_rate", pytest.approx(0.02), "reject"),
        ("2026-03", "chain_value", -0.05, "reject"),
        ("2026-04", "offline_pass_rate", pytest.approx(0.05), "canary"),
        ("2026-04", "chain_value", 0.4, "canary"),
        ("2026-05", "no_candidate", 0.0, "reject"),  # still on the plot, labelled
    ]
    assert plot["series"].iloc[5] == "2026-04 chain value B - A: canary" and plot["series"].is_unique
    assert plot["offline_decision"].iloc[4] == "promote"


def test_dvc_draws_the_cross_batch_plot(metrics_dir, tmp_path):
    """dvc.yaml's top-level plot on plot_frame's csv: every bar has a number on x and a label on y."""
    rows = [batch_row(metrics_dir, b, P) for b in ("2026-01", "2026-03", "2026-04", "2026-05")]
    repo = tmp_path / "repo"
    (repo / "plots").mkdir(parents=True)
    plot_frame(rows).to_csv(repo / "plots" / "summary.csv", index=False, lineterminator="\n")
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}))
    assert run_dvc(repo, "init", "--no-scm", "-q").returncode == 0
    shown = run_dvc(repo, "plots", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    (spec,) = json.loads(shown.stdout)["data"]["cross_batch_deltas"]
    enc, values = spec["content"]["encoding"], spec["content"]["data"]["values"]
    assert (enc["x"]["type"], enc["y"]["type"]) == ("quantitative", "nominal")
    assert len(values) == 7 and all(v[enc["y"]["field"]] for v in values)
    assert [float(v[enc["x"]["field"]]) for v in values] == pytest.approx(
        [0.2, 0.75, 0.02, -0.05, 0.05, 0.4, 0.0]
    )


def test_missing_batch_or_metric_is_loud(metrics_dir):
    with pytest.raises(ClapError):
        batch_row(metrics_dir, "2026-09", P)
    io.write_json(metrics_dir / "eval" / "2026-06.json", {"has_candidate": 1, "base_overall": 0.5})
    for stage in ("gate", "train"):
        shutil.copy(metrics_dir / stage / "2026-01.json", metrics_dir / stage / "2026-06.json")
    shutil.copy(metrics_dir / "replay" / "2026-01.json", metrics_dir / "replay" / "2026-06.json")
    with pytest.raises(ClapError, match="candidate_overall"):
        batch_row(metrics_dir, "2026-06", P)
    io.write_json(
        metrics_dir / "replay" / "2026-01.json", {"A_run": 1, "B_run": 1}
    )  # B ran: its delta must be there
    with pytest.raises(ClapError, match="adapter_contribution_value"):
        batch_row(metrics_dir, "2026-01", P)


def test_regression_metrics_must_be_tabulated():
    with pytest.raises(ClapError):
        SummaryParams(metrics=["overall"], regression_metrics=["pass_rate"], regression_tolerance=0.0)
