"""The gate report's detector picture (clap.judge.detector_plot): curves in, SVG text and one reading out."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from clap import io
from clap.errors import ClapError
from clap.judge import detector_plot as dp
from clap.judge.gate_report import render_report

ROOT = Path(__file__).resolve().parents[3]
THR = 2.995732273553991
SVG = "{http://www.w3.org/2000/svg}"


def rows(log_e: list[float | None], *, threshold: float = THR) -> list[dict[str, float | None]]:
    """One row per step: a falling training loss, a flat probe loss, the given log E (None: no check)."""
    return [
        {
            "step": float(i + 1),
            "loss": 1.0 / (i + 1),
            "probe_loss": None if e is None else 0.9,
            "log_e": e,
            "log_threshold": None if e is None else threshold,
        }
        for i, e in enumerate(log_e)
    ]


ALARM = rows([0.1, 0.8, 1.9, 3.1])  # crosses at step 4
CLEAN = rows([0.1, 0.4, 0.2, 0.05])  # max 0.4 at step 2


def series(svg: str) -> dict[str, ET.Element]:
    """The SVG's data-series elements by name (the text parses as XML)."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return {el.get("data-series"): el for el in root.iter() if el.get("data-series")}


def test_svg_with_an_alarm_draws_both_losses_log_e_the_threshold_and_the_alarm():
    svg = dp.detector_svg(ALARM, alarm_step=4, planned_steps=8, title="Batch x")
    found = series(svg)
    assert set(found) == {"loss", "probe_loss", "log_e", "log_threshold", "alarm"}
    assert found["loss"].tag == f"{SVG}polyline" and found["log_e"].tag == f"{SVG}polyline"
    assert len(found["loss"].get("points").split()) == 4 and len(found["log_e"].get("points").split()) == 4
    assert found["log_threshold"].tag == f"{SVG}line"
    assert found["alarm"].get("data-step") == "4" and "alarm at step 4" in svg
    # the alarm marker sits on the last log E point, at or above the threshold line
    circle = found["alarm"].find(f"{SVG}circle")
    last = found["log_e"].get("points").split()[-1].split(",")
    assert (circle.get("cx"), circle.get("cy")) == tuple(last)
    assert float(circle.get("cy")) <= float(found["log_threshold"].get("y1"))
    assert svg == dp.detector_svg(ALARM, alarm_step=4, planned_steps=8, title="Batch x")  # deterministic


def test_svg_without_an_alarm_has_no_marker():
    found = series(dp.detector_svg(CLEAN, alarm_step=-1, planned_steps=4))
    assert set(found) == {"loss", "probe_loss", "log_e", "log_threshold"}


def test_svg_marks_a_crossing_even_when_the_record_has_no_alarm_step():
    """stop_on_alarm aside, the picture shows where log E reached the line (the record's step wins when set)."""
    assert series(dp.detector_svg(ALARM, alarm_step=-1, planned_steps=4))["alarm"].get("data-step") == "4"


def test_svg_of_a_run_without_detector_checks_draws_the_losses_only():
    no_checks = rows([None, None, None])
    svg = dp.detector_svg(no_checks, alarm_step=-1, planned_steps=3)
    assert set(series(svg)) == {"loss"} and "no detector check in this run" in svg


def test_sparse_checks_skip_steps_without_a_value():
    """fewer checks than steps (a probe pool smaller than the run): steps without a check have empty cells; the polyline joins the checks."""
    sparse = rows([None, 0.3, None, 0.9])
    assert (
        len(series(dp.detector_svg(sparse, alarm_step=-1, planned_steps=4))["log_e"].get("points").split())
        == 2
    )


def test_no_rows_no_svg():
    with pytest.raises(ClapError):
        dp.detector_svg([], alarm_step=-1, planned_steps=0)


def test_reading_lines():
    assert dp.reading(ALARM, alarm_step=4, planned_steps=8) == (
        "log E crossed log(1/\u03b1) = 3.00 at step 4 of 8 (log E 3.10): the detector alarmed."
    )
    assert dp.reading(CLEAN, alarm_step=-1, planned_steps=4) == (
        "log E never crossed log(1/\u03b1) = 3.00; max log E 0.40 at step 2 of 4."
    )
    assert dp.reading([], alarm_step=-1, planned_steps=0).startswith("not trained")
    assert dp.reading(rows([None, None]), alarm_step=-1, planned_steps=2).startswith("no detector check")


def test_read_curves(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("step,loss,probe_loss,log_e,log_threshold\n1,0.5,,,\n2,nan,0.4,0.1,3.0\n")
    got = dp.read_curves(path)
    assert got[0] == {"step": 1.0, "loss": 0.5, "probe_loss": None, "log_e": None, "log_threshold": None}
    assert got[1]["log_e"] == 0.1 and got[1]["loss"] != got[1]["loss"]  # nan
    path.write_text("step,loss,probe_loss,log_e,log_threshold\n")  # an untrained batch: the header alone
    assert dp.read_curves(path) == []
    with pytest.raises(ClapError, match="no training curves"):
        dp.read_curves(tmp_path / "missing.csv")
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ClapError, match="step"):
        dp.read_curves(path)


def test_evidence_and_report_lines():
    ev = dp.evidence_section(ALARM, {"detector_alarm_step": 4, "planned_steps": 8}, "h" * 64)
    assert (ev["alarm_step"], ev["max_log_e_step"], ev["svg"]) == (4, 4, "detector.svg")
    lines = dp.report_lines({"batch": "b", "detector": ev})
    assert "![detector](detector.svg)" in lines and any("at step 4 of 8" in line for line in lines)
    untrained = dp.evidence_section([], {"trained": 0}, "h" * 64)
    lines = dp.report_lines({"batch": "b", "detector": untrained})
    assert untrained["svg"] == "" and not any("![" in line for line in lines)
    assert any("not trained" in line for line in lines)
    assert dp.report_lines({"batch": "b"}) == []  # evidence written before the detector section


def test_render_report_embeds_the_picture_after_the_checks():
    evidence = {
        "batch": "b",
        "decision": "reject",
        "rule": "training_health",
        "production_decision": "reject",
        "numbers": {"baseline": "base", "baseline_reason": "no adapter in production"},
        "reasons": [{"name": "training_health", "cap": "reject", "detail": "alarm"}],
        "regressed": {"count": 0, "by_slice": {}, "item_ids": []},
        "base_sha256": "b" * 64,
        "adapter_sha256": "",
        "eval_items_sha256": "e" * 64,
        "git_commit": "c" * 40,
        "detector": dp.evidence_section(ALARM, {"detector_alarm_step": 4, "planned_steps": 8}, "h" * 64),
    }
    report = render_report(evidence)
    assert report.index("| training_health |") < report.index("![detector](detector.svg)")
    assert "What the TBDL detector saw (`plots/train/b.csv`): log E crossed" in report


@pytest.mark.parametrize("batch", sorted(p.stem for p in (ROOT / "plots/train").glob("*.csv")))
def test_committed_curves_agree_with_the_training_record(batch):
    """The picture's crossing is the alarm the training record states (the detector and its curves agree)."""
    curves = dp.read_curves(ROOT / "plots/train" / f"{batch}.csv")
    record = io.read_json(ROOT / "metrics/train" / f"{batch}.json")
    hit = dp.crossing(curves)
    assert (int(hit[0]) if hit else -1) == record["detector_alarm_step"]
    assert dp.threshold(curves) == pytest.approx(record["detector_log_threshold"])


def test_curves_hash_ignores_timing_columns():
    rows = [
        {
            "step": 1.0,
            "loss": 0.9,
            "probe_loss": 1.0,
            "log_e": 0.1,
            "log_threshold": 3.0,
            "tokens_per_s": 120.0,
        }
    ]
    slower = [{**rows[0], "tokens_per_s": 80.0}]
    assert dp.curves_sha256(rows) == dp.curves_sha256(slower)
    assert dp.curves_sha256(rows) != dp.curves_sha256([{**rows[0], "log_e": 0.2}])
