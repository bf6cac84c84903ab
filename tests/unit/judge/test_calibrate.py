"""Fault-injection calibration: fault injection, the table, and the loop on the tiny model.

The tiny random model never passes the held-out eval (base and candidate pass rates are 0),
so no clean run can be promoted here: these tests check the table's shape, the faults'
deterministic signatures (NaN -> health nan, lr 0 -> an unchanged model, no loss masking
-> no masked tokens) and the loud failure, not the gate's power. The real-model run is
``benchmarks/calibration.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import write_tiny_admitted

from clap import cli
from clap.errors import ClapError
from clap.judge import calibrate as cal
from clap.task.answer import load_answer_schema
from clap.train.detector import DetectorParams, replay

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
FAULTS = [
    "loss_on_prompt",
    "lr_zero",
    "nan",
]  # the data faults differ from a clean run only in sft.parquet (tested below)
CLEAN_SEEDS = [1, 2]


def _cp(**kw) -> cal.CalibrateParams:
    base = dict(
        faults=list(cal.FAULTS),
        fault_seeds=[5],
        clean_seeds=[1, 2],
        dirty_fraction=0.5,
        nan_at_step=2,
        fail_on=["promote", "canary"],
    )
    return cal.CalibrateParams(**{**base, **kw})


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": [f"q{i}" for i in range(n)],
            "value": np.arange(n, dtype=float),
            "evidence": [f"e{i}" for i in range(n)],
        }
    )


# --- fault injection (no training) ------------------------------------------------------------
def test_derange_rows_changes_exactly_the_chosen_fraction_and_is_seeded():
    frame = _frame(10)
    out = cal.derange_rows(frame, ["value"], 0.5, np.random.default_rng(3))
    changed = out["value"] != frame["value"]
    assert changed.sum() == 5 and sorted(out.loc[changed, "value"]) == sorted(
        frame.loc[changed, "value"]
    )  # values move, none invented
    assert out["question"].equals(frame["question"]) and out["evidence"].equals(frame["evidence"])
    assert out["value"].dtype == np.float64 and frame["value"].tolist() == list(range(10))  # input untouched
    assert out.equals(cal.derange_rows(frame, ["value"], 0.5, np.random.default_rng(3)))
    assert not out.equals(cal.derange_rows(frame, ["value"], 0.5, np.random.default_rng(4)))


def test_relabel_moves_every_answer_with_its_cited_doc_and_keeps_the_questions(tmp_path):
    data = write_tiny_admitted(tmp_path / "b", n_sft=16, n_probe=2, seed=0, n_combos=16)
    sft = pd.read_parquet(data / "sft.parquet")
    copy, changed = cal.prepare_batch(data, tmp_path / "run", cal.Variant("relabel", 9), _cp(), ANSWER)
    out = pd.read_parquet(copy / "sft.parquet")
    assert changed == 16 and out.equals(cal.corrupt_sft(sft, "relabel", 0.3, seed=9, answer=ANSWER))
    assert (
        pd.read_parquet(data / "sft.parquet").equals(sft)
        and (copy / "eval.parquet").read_bytes() == (data / "eval.parquet").read_bytes()
    )
    answer_and_doc = ("metric", "line", "shift", "date", "evidence", "value", "unit", "evidence_doc_id")
    assert cal.relabel_columns(ANSWER) == answer_and_doc  # the whole answer moves with its cited doc
    assert cal.rows_changed(sft, out, cal.relabel_columns(ANSWER)) == 16
    assert out[["item_id", "question", "context_doc_ids"]].equals(
        sft[["item_id", "question", "context_doc_ids"]]
    )
    pairs = set(zip(sft["evidence"], sft["evidence_doc_id"]))
    assert set(zip(out["evidence"], out["evidence_doc_id"])) == pairs  # quote and cited doc stay together
    dirty = cal.corrupt_sft(sft, "dirty_evidence", 0.5, seed=9, answer=ANSWER)
    assert cal.rows_changed(sft, dirty, cal.relabel_columns(ANSWER)) == 8
    assert dirty["value"].equals(sft["value"])
    assert cal.corrupt_sft(sft, "lr_zero", 0.5, seed=9, answer=ANSWER) is sft


@pytest.mark.parametrize(
    "fault, admitted",
    [("clean", True), ("relabel", True), ("dirty_values", False), ("dirty_evidence", False)],
)
def test_admission_recheck_refuses_dirty_quotes_but_not_a_consistent_relabel(tmp_path, fault, admitted):
    data = write_tiny_admitted(tmp_path / "b", n_sft=16, n_probe=2, seed=0, n_combos=16)
    _, loop = cal.load_params(_tiny_params(tmp_path / "params.yaml"))
    copy, changed = cal.prepare_batch(
        data, tmp_path / "run", cal.Variant(fault, 9), _cp(), loop.scoring.answer
    )
    verdict = cal.readmit(copy, loop)
    assert verdict["admitted"] is admitted
    assert verdict["evidence_verifiable_rate"] == (1.0 if admitted else (16 - changed) / 16) and (
        fault == "clean"
    ) == (changed == 0)
    assert ("evidence_verifiable_rate" in verdict["admission_reasons"]) is not admitted


def test_plan_runs_each_fault_per_seed_then_the_clean_seeds():
    names = [v.name for v in cal.plan(_cp(faults=["nan", "relabel"], fault_seeds=[5, 6]))]
    assert names == ["nan-5", "nan-6", "relabel-5", "relabel-6", "clean-1", "clean-2"]


@pytest.mark.parametrize(
    "bad",
    [
        dict(faults=["typo"]),
        dict(fail_on=["ship"]),
        dict(dirty_fraction=0.0),
        dict(nan_at_step=0),
        dict(clean_seeds=[]),
        dict(fault_seeds=[]),
    ],
)
def test_bad_calibrate_params_are_refused(bad):
    with pytest.raises(ClapError) as e:
        _cp(**bad)
    assert (e.value.rule, e.value.column) == ("bad_params", f"calibrate.{next(iter(bad))}")


def test_each_training_fault_sets_its_knob_and_the_run_gets_its_own_seed_and_checkpoints(tmp_path):
    _, loop = cal.load_params(ROOT / "params.yaml")  # also: every knob of the section is in params.yaml
    tp, cp = loop.train, _cp()
    runs = {
        f: cal.fault_train_params(tp, cal.Variant(f, 77), cp, tmp_path)
        for f in ("loss_on_prompt", "lr_zero", "nan", "relabel")
    }
    assert (
        runs["loss_on_prompt"].loss_on_prompt
        and runs["lr_zero"].lr == 0.0
        and runs["nan"].inject_nan_at_step == 2
    )
    assert runs["relabel"] == dataclasses.replace(tp, seed=77, checkpoint_root=str(tmp_path))


# --- the loop on the tiny model (one calibration, several assertions) --------------------------
def _tiny_params(path: Path) -> Path:
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["train"].update(
        torch_threads=1, max_steps=2, batch_size=2, max_length=512, save_steps=1000, lr=1e-2, warmup_ratio=0.0
    )
    p["detector"].update(probe_draw=1)
    p["eval"].update(batch_size=8)
    p["chain"].update(max_new_tokens=8)
    p["calibrate"].update(faults=FAULTS, fault_seeds=[5], clean_seeds=CLEAN_SEEDS, nan_at_step=2)
    # the tiny batch has 2 metrics
    p["admit"]["min_distinct"] = {**p["admit"]["min_distinct"], "metric": 1}
    p["admit"]["max_key_share"] = {**p["admit"]["max_key_share"], "metric": 1.0}
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def calibrated(tiny_base, tmp_path_factory):
    """`clap calibrate` in-process on a tiny batch: (exit status, report dir, metrics, runs by name)."""
    root = tmp_path_factory.mktemp("cal")
    data = write_tiny_admitted(root / "data/admitted/tiny", n_sft=8, n_probe=4, seed=0, n_combos=8)
    before = {f.name: f.read_bytes() for f in data.iterdir()}
    status = cli.main(
        [
            "calibrate",
            str(data),
            "--base",
            str(tiny_base),
            "--report-dir",
            str(root / "reports"),
            "--metrics",
            str(root / "metrics.json"),
            "--params",
            str(_tiny_params(root / "params.yaml")),
        ]
    )
    assert {f.name: f.read_bytes() for f in data.iterdir()} == before  # faults go into copies, never in place
    runs = {r["run"]: r for r in json.loads((root / "reports/runs.json").read_text())["runs"]}
    return status, root / "reports", json.loads((root / "metrics.json").read_text()), runs


def test_table_has_one_row_per_run_and_flat_metrics(calibrated):
    status, reports, metrics, runs = calibrated
    expected = [f"{f}-5" for f in FAULTS] + [f"clean-{s}" for s in CLEAN_SEEDS]
    assert (
        status == 1 and list(runs) == expected
    )  # uncertified: the random tiny model's clean runs do not learn
    table = [line for line in (reports / "calibration.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(expected) and all(
        line.count(" | ") == table[0].count(" | ") for line in table
    )
    assert all(isinstance(v, (int, float, str, bool)) for v in metrics.values())
    assert metrics["runs"] == 5 and metrics["fault_runs"] == 3 and metrics["clean_runs"] == 2
    assert {metrics[f"{name}_decision"] for name in expected} <= {"promote", "canary", "hold", "reject"}
    assert sorted(p.stem for p in (reports / "curves").glob("*.csv")) == sorted(expected)


def test_no_fault_is_released_and_clean_rates_follow_the_rows(calibrated):
    _, _, metrics, runs = calibrated
    faults = [r for r in runs.values() if r["fault"] != cal.CLEAN]
    clean = [r for r in runs.values() if r["fault"] == cal.CLEAN]
    assert metrics["no_fault_released"] is True and not any(r["released"] or r["failed"] for r in faults)
    assert metrics["clean_false_reject_rate"] == sum(r["decision"] == "reject" for r in clean) / len(clean)
    assert all(
        r["admitted"] and r["gate_alone"] == r["decision"] for r in runs.values()
    )  # these faults leave the data alone
    assert all(
        r["baseline_pass_rate"] == 0.0 for r in runs.values()
    )  # a random tiny model: nothing can be promoted here


def test_a_scenario_whose_clean_runs_do_not_learn_is_uncertified(calibrated):
    """The tiny random model learns nothing the gate can see (pass rate 0 -> 0): every "reject" there is
    vacuous, so the controls fail the scenario, naming each positive control, instead of passing it."""
    status, reports, metrics, runs = calibrated
    clean = [r for r in runs.values() if r["fault"] == cal.CLEAN]
    assert status == 1 and metrics["verdict"] == "UNCERTIFIED" and metrics["clean_learned"] == 0
    assert all(not r["learned"] and r["failed"] and "gain below" in r["quality_detail"] for r in clean)
    report = (reports / "calibration.md").read_text()
    assert "Verdict: **UNCERTIFIED**" in report
    assert all(f"positive control {r['run']} did not learn" in report for r in clean)
    assert "negative control relabel was not run" in report  # the tiny run injects no relabel fault


def test_faults_show_their_deterministic_signatures(calibrated):
    _, _, _, runs = calibrated
    nan = runs["nan-5"]
    assert (
        nan["health"] == "nan"
        and nan["steps"] == 2
        and nan["decision"] == "reject"
        and nan["rule"] == "training_health"
    )
    lr0 = runs["lr_zero-5"]  # LoRA B stays 0: the candidate IS the base
    # same function, another kernel path (adapter attached with B = 0 vs disabled): equal up to float noise
    assert (
        lr0["health"] == "ok"
        and lr0["probe_loss_end"] == pytest.approx(lr0["probe_loss_start"], abs=1e-5)
        and lr0["b"] == lr0["c"] == 0
    )
    assert lr0["decision"] == "reject" and lr0["rule"] == "quality"
    assert (
        runs["loss_on_prompt-5"]["masked_tokens_fraction"] == 0.0 < runs["clean-1"]["masked_tokens_fraction"]
    )
    assert (runs["loss_on_prompt-5"]["decision"], runs["loss_on_prompt-5"]["rule"]) == (
        "reject",
        "loss_masking",
    )
    assert runs["clean-1"]["rows_changed"] == 0
    assert (
        runs["clean-1"]["probe_loss_end"] != runs["clean-2"]["probe_loss_end"]
    )  # the seeds make different runs


def test_recorded_curves_replay_to_the_live_detector(calibrated):
    _, reports, _, runs = calibrated
    dp = DetectorParams(**yaml.safe_load((reports.parent / "params.yaml").read_text())["detector"])
    with open(reports / "curves" / "clean-1.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["gap_increment"]]
    log_e, alarm = replay([float(r["gap_increment"]) for r in rows], dp)
    assert np.allclose(log_e, [float(r["log_e"]) for r in rows])
    assert alarm == -1 and runs["clean-1"]["detector_alarm_step"] == -1


def test_a_released_fault_fails_loudly(monkeypatch, tmp_path, capsys):
    row = dict(
        run="relabel-5",
        fault="relabel",
        seed=5,
        rows_changed=8,
        health="ok",
        steps=2,
        planned_steps=2,
        detector_alarm_step=-1,
        alarm_fraction=-1.0,
        detector_max_log_e=0.1,
        detector_log_threshold=3.0,
        train_loss_start=1.0,
        train_loss_end=0.5,
        probe_loss_start=1.0,
        probe_loss_end=0.9,
        masked_tokens_fraction=0.8,
        baseline_pass_rate=0.2,
        candidate_pass_rate=0.5,
        b=9,
        c=0,
        delta=0.3,
        pvalue=0.002,
        hallucination_rate=0.0,
        wrong_fact_rate=0.05,
        admitted=True,
        admission_reasons="",
        evidence_verifiable_rate=1.0,
        gate_alone="promote",
        gate_alone_rule="quality",
        decision="promote",
        rule="quality",
        released=True,
        failed=True,
        batch="",
        learned=True,
        quality_detail="significant gain >= delta*",
        n_items=100,
        rule_power_at_delta_star=0.31,
    )
    rows = [row, {**row, "run": "clean-1", "fault": cal.CLEAN, "failed": False}]
    fake = cal.CalibrationResult(rows, {"relabel-5": [], "clean-1": []}, cal.summarize(rows, _cp()))
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: fake)
    status = cli.main(
        [
            "calibrate",
            str(tmp_path),
            "--report-dir",
            str(tmp_path / "rep"),
            "--metrics",
            str(tmp_path / "m.json"),
            "--params",
            str(ROOT / "params.yaml"),
        ]
    )
    err = capsys.readouterr().err
    assert status == 1 and "negative control relabel-5 was promote (quality): the fault would ship" in err
    assert "FAIL: released" in (tmp_path / "rep/calibration.md").read_text()
    assert json.loads((tmp_path / "m.json").read_text())["no_fault_released"] is False
