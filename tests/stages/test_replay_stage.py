"""Smoke run of stages/replay.py on a tiny batch with a tiny adapter (in-process through clap.stage.main)."""

from __future__ import annotations

import csv

import pytest
from conftest import make_tiny_adapter, run_stage, stage_params_dir, write_tiny_admitted

from clap import io
from schemas.normalized import validate_frame
from schemas.replay import ReplayCases

pytestmark = pytest.mark.usefixtures("one_thread")  # a tiny model on a shared 2-core machine


def test_replay_stage_writes_abcd_records(tiny_base, tmp_path):
    batch = "2026-01"
    admitted = write_tiny_admitted(tmp_path / "data/admitted" / batch, n_sft=2, n_probe=3, seed=11)
    adapter = make_tiny_adapter(tiny_base, tmp_path / "models/adapters" / batch, seed=6)
    data, report, metrics, plot = (
        tmp_path / "data/replay" / batch,
        tmp_path / "reports/replay" / batch,
        tmp_path / "metrics/replay" / f"{batch}.json",
        tmp_path / "plots/replay" / f"{batch}.csv",
    )
    run = run_stage(
        "replay",
        *(admitted, tiny_base, adapter, data, report, metrics, plot),
        cwd=stage_params_dir(tmp_path / "repo"),
    )
    assert run.returncode == 0, run.stderr
    assert "3 cases" in run.stdout

    cases = validate_frame(ReplayCases, io.read_parquet(data / "cases.parquet"), "cases.parquet")
    assert cases.groupby("condition").size().to_dict() == {"A": 3, "B": 3, "C": 3, "D": 3}
    assert len(io.read_parquet(data / "timings.parquet")) == 12
    m = io.read_json(metrics)
    assert all(isinstance(v, (int, float, str)) for v in m.values())
    assert not {"decision", "final_decision", "check_core_fields"} & set(
        m
    )  # replay measures; the gate decides
    record = io.read_json(io.record_path(metrics))  # provenance: records/replay/<b>.json, not a metric
    assert not {"adapter_sha256", "cases_sha256", "base_sha256", "device"} & set(m)
    assert (
        record["adapter_sha256"] == io.sha256_file(adapter / "adapter_model.safetensors")
        and m["n_cases"] == 3
    )
    assert record["cases_sha256"] == io.sha256_file(data / "cases.parquet")
    assert {
        "A_value_accuracy",
        "B_core_accuracy",
        "D_answer_evidence_rate",
        "rag_necessity_value",
        "adapter_contribution_core",
        "adapter_latency_cost_ms",
        "wall_s",
    } <= set(m)
    text = (report / "report.md").read_text(encoding="utf-8")
    assert "| B | adapter | on |" in text and f"reports/gate/{batch}/report.md" in text
    with plot.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and {r["condition"] for r in rows} == set("ABCD")
