"""Smoke run of stages/replay.py on a tiny batch with a tiny adapter (in-process through clap.stage.main)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml
from conftest import make_tiny_adapter, run_stage, stage_params_dir, write_tiny_admitted

from clap import io
from clap.task.answer import load_answer_schema
from schemas.normalized import validate_frame
from schemas.replay import ReplayRequests, replay_cases

ROOT = Path(__file__).resolve().parents[2]
ANSWER = load_answer_schema(ROOT / "params.yaml")

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
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["replay"]["latency"].update(requests=2, warmup=1)  # the tiny batch has 3 replay cases
    params["chain"]["max_new_tokens"] = 6  # holds none of the gold answers: counted, said, in the report
    run = run_stage(
        "replay",
        *(admitted, tiny_base, adapter, data, report, metrics, plot),
        cwd=stage_params_dir(tmp_path / "repo", params),
    )
    assert run.returncode == 0, run.stderr
    assert (
        "3 cases" in run.stdout and "3 gold answers need more tokens than chain.max_new_tokens" in run.stdout
    )

    cases = validate_frame(replay_cases(ANSWER), io.read_parquet(data / "cases.parquet"), "cases.parquet")
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
        "adapter_request_latency_cost_ms",
        "wall_s",
    } <= set(m)
    # latency as a `clap serve` user meets it: exactly the sample's single requests, per RAG condition
    requests = validate_frame(ReplayRequests, io.read_parquet(data / "request_timings.parquet"), "requests")
    assert requests.groupby("condition").size().to_dict() == {"A": 2, "B": 2}
    assert (requests["batch_size"] == 1).all() and (requests["request_ms"] > 0).all()
    for c in "AB":
        ms = requests[requests["condition"] == c]["request_ms"]
        assert m[f"{c}_requests"] == 2 and m[f"{c}_request_p95_ms"] >= m[f"{c}_request_p50_ms"] > 0
        assert min(ms) <= m[f"{c}_request_p50_ms"] <= m[f"{c}_request_p95_ms"] <= max(ms)
    assert m["adapter_request_latency_cost_ms"] == pytest.approx(
        m["B_request_p95_ms"] - m["A_request_p95_ms"], abs=1e-5
    )
    assert m["A_items_per_s"] > 0  # batched throughput: reported beside it, never gated
    text = (report / "report.md").read_text(encoding="utf-8")
    assert "| B | adapter | on |" in text and f"reports/gate/{batch}/report.md" in text
    assert "2 sampled cases sent one at a time" in text
    assert m["gold_over_budget"] == 3 and "**3 of 3 cases' gold answers need more tokens" in text
    with plot.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 and {r["condition"] for r in rows} == set("ABCD")


def test_replay_stage_refuses_a_latency_sample_larger_than_the_batch(tiny_base, tmp_path):
    batch = "2026-01"
    admitted = write_tiny_admitted(tmp_path / "data/admitted" / batch, n_sft=2, n_probe=3, seed=11)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["replay"]["latency"].update(requests=3, warmup=1)  # 4 cases needed, 3 there
    outs = [tmp_path / p for p in ("d", "r", "m.json", "p.csv")]
    run = run_stage(
        "replay",
        *(admitted, tiny_base, tmp_path / "no-adapter", *outs),
        cwd=stage_params_dir(tmp_path / "repo", params),
    )
    assert run.returncode == 2 and "replay.latency" in run.stderr and not outs[2].exists()
