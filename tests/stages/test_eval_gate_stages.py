"""Smoke runs of stages/eval.py -> stages/gate.py -> stages/summary.py on a tiny batch (in-process
through clap.stage.main, in a folder with the repository's params.yaml).

The replay record the gate reads is written as stages/replay.py writes it (its own smoke test runs it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_tiny_adapter, run_stage, stage_params_dir, write_tiny_admitted

from clap import io, params
from clap.judge import detector_plot

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")  # a tiny model on a shared 2-core machine


def test_eval_gate_summary_chain(tiny_base, tmp_path):
    batch = "2026-01"
    repo = stage_params_dir(tmp_path / "repo")

    def stage(name: str, *args: Path | str):
        return run_stage(name, *args, cwd=repo)

    admitted = write_tiny_admitted(tmp_path / "data/admitted" / batch, n_sft=4, n_probe=6, seed=5)
    adapter = make_tiny_adapter(tiny_base, tmp_path / "models/adapters" / batch, seed=3)
    metrics, eval_dir, report = (
        tmp_path / "metrics",
        tmp_path / "data/eval" / batch,
        tmp_path / "reports/gate" / batch,
    )

    ev = stage(
        "eval",
        admitted,
        tiny_base,
        adapter,
        tmp_path / "releases/production.json",
        eval_dir,
        metrics / "eval" / f"{batch}.json",
    )
    assert ev.returncode == 0, ev.stderr
    items = io.read_parquet(eval_dir / "items.parquet")
    assert sorted(items["model"].unique()) == ["base", "candidate"] and len(items) == 12
    flat_eval = io.read_json(metrics / "eval" / f"{batch}.json")
    assert (
        flat_eval["has_candidate"] == 1
        and flat_eval["n_items"] == 6
        and "candidate_p95_latency_ms" in flat_eval
    )

    # the upstream records as those stages write them: metrics plus <name>.record.json beside them
    io.write_metrics_and_record(
        tmp_path / "train.json",
        None,
        {
            "trained": 1,
            "health": "ok",
            "masked_tokens_fraction": 0.6,
            "label_tokens": 100,
            "prompt_tokens": 60,
        },
    )
    io.write_metrics_and_record(tmp_path / "admit.json", None, {"admitted": 1})
    # the curves as the train stage writes plots/train/<b>.csv (here a detector check every other step)
    curves = tmp_path / "curves.csv"
    curves.write_text(
        "step,loss,grad_norm,learning_rate,tokens_per_s,probe_loss,gap_increment,log_e,log_threshold\n"
        "1,0.9,1.0,0.0,10.0,,,,\n2,0.7,1.0,0.001,10.0,0.8,0.05,0.25,2.99\n3,0.5,1.0,0.001,10.0,,,,\n"
        "4,0.4,1.0,0.001,10.0,0.75,0.02,0.41,2.99\n"
    )
    chain = {
        "n_cases": 3,
        "A_run": 1,
        "B_run": 1,
        "A_requests": 8,
        "B_requests": 8,
        "A_request_p50_ms": 300.0,
        "A_request_p95_ms": 400.0,
        "B_request_p50_ms": 330.0,
        "B_request_p95_ms": 440.0,
        "adapter_request_latency_cost_ms": 40.0,
        "cases_sha256": "c" * 64,
        **{
            f"{c}_{k}": v
            for c, v in (("A", 0.0), ("B", 0.0))
            for k in ("core_accuracy", "answer_evidence_rate", "value_accuracy")
        },
    }
    io.write_metrics_and_record(tmp_path / "replay.json", None, chain)
    assert io.read_json(tmp_path / "replay.record.json") == {"cases_sha256": "c" * 64}
    gate = stage(
        "gate",
        eval_dir,
        tmp_path / "train.json",
        curves,
        tmp_path / "admit.json",
        tmp_path / "replay.json",
        report,
        metrics / "gate" / f"{batch}.json",
    )
    assert gate.returncode == 0, gate.stderr
    decision = io.read_json(metrics / "gate" / f"{batch}.json")
    assert (decision["decision"], decision["rule"], decision["decision_code"]) == (
        "reject",
        "quality",
        0,
    )  # random models: no gain
    assert (
        decision["offline_decision"] == "reject" and decision["check_chain_value_floor"] == "hold"
    )  # B gets no value right
    evidence = io.read_json(report / "evidence.json")
    assert evidence["eval_items_sha256"] == io.sha256_file(eval_dir / "items.parquet")
    assert evidence["datasets_sha256"]["eval.parquet"] == io.sha256_file(admitted / "eval.parquet")
    assert set(evidence["params"]) >= {"gate", "scoring", "eval"} and evidence["git_commit"]
    assert evidence["replay"] == chain  # the replay's metrics and record: the hashes stay in the evidence
    # latency is gated on the replay's per-request p95 of B, not on eval's apportioned timings
    assert (
        decision["request_p95_latency_ms"] == 440.0 and decision["check_request_p95_latency_ms"] == "promote"
    )
    assert "p95_latency_ms" not in decision and "check_p95_latency_ms" not in decision
    gate_record = io.read_json(tmp_path / "records" / "gate" / f"{batch}.json")
    assert {"torch_version", "train_seed", "train_determinism"} <= set(gate_record)
    for kind in ("eval", "gate"):  # what a reviewer compares: no hash or version strings
        flat = io.read_json(metrics / kind / f"{batch}.json")
        assert not [
            k for k, v in flat.items() if io.is_record_value(v) or "sha256" in k or k.endswith("_version")
        ]
    assert io.read_json(tmp_path / "records" / "eval" / f"{batch}.json")["sha256_items"] == io.sha256_file(
        eval_dir / "items.parquet"
    )
    text = (report / "report.md").read_text()
    assert "**REJECT**" in text
    # what the detector saw: the reading, the picture beside the report, its numbers in the evidence
    assert "log E never crossed log(1/\u03b1) = 2.99; max log E 0.41 at step 4." in text
    assert (
        "![detector](detector.svg)" in text and 'data-series="log_e"' in (report / "detector.svg").read_text()
    )
    assert evidence["detector"]["curves_sha256"] == detector_plot.curves_sha256(
        detector_plot.read_curves(curves)
    )

    untrained = tmp_path / "untrained.csv"  # a batch not trained: the header alone
    untrained.write_text(curves.read_text().splitlines()[0] + "\n")
    none = stage(
        "gate",
        eval_dir,
        tmp_path / "train.json",
        untrained,
        tmp_path / "admit.json",
        tmp_path / "replay.json",
        tmp_path / "untrained-report",
        tmp_path / "untrained.json",
    )
    assert none.returncode == 0, none.stderr
    assert "not trained: no training curves" in (tmp_path / "untrained-report/report.md").read_text()
    assert not (tmp_path / "untrained-report/detector.svg").exists()

    no_request_latency = {k: v for k, v in chain.items() if k != "B_request_p95_ms"}
    io.write_metrics_and_record(tmp_path / "replay-old.json", None, no_request_latency)
    loud = stage(
        "gate",
        eval_dir,
        tmp_path / "train.json",
        curves,
        tmp_path / "admit.json",
        tmp_path / "replay-old.json",
        tmp_path / "loud-report",
        tmp_path / "loud.json",
    )
    assert (
        loud.returncode == 2 and "B_request_p95_ms" in loud.stderr and not (tmp_path / "loud.json").exists()
    )

    broken = stage(
        "gate",
        eval_dir,
        tmp_path / "missing-train.json",
        curves,
        tmp_path / "admit.json",
        tmp_path / "replay.json",
        report,
        tmp_path / "g.json",
    )
    assert broken.returncode == 2 and broken.stderr.startswith("error:") and "Traceback" not in broken.stderr

    # the training record as that stage writes it (its own smoke test runs it)
    io.write_json(
        metrics / "train" / f"{batch}.json",
        {"health": "ok", "detector_alarm_step": -1, "alarm_fraction": -1.0},
    )
    io.write_json(metrics / "replay" / f"{batch}.json", {**chain, "adapter_contribution_value": 0.0})
    for other in params.raw_section(
        "batches", ROOT / "params.yaml"
    ):  # the summary covers every configured batch
        for kind in ("eval", "gate", "train", "replay"):
            if other != batch:
                shutil.copy(metrics / kind / f"{batch}.json", metrics / kind / f"{other}.json")
    out = stage(
        "summary", metrics, tmp_path / "summary.md", tmp_path / "summary.json", tmp_path / "summary.csv"
    )
    assert out.returncode == 0, out.stderr
    assert io.read_json(tmp_path / "summary.json")["decisions_reject"] == len(
        params.raw_section("batches", ROOT / "params.yaml")
    )
    plot = pd.read_csv(tmp_path / "summary.csv")
    assert set(plot["kind"]) == {"offline_pass_rate", "chain_value"} and set(plot["decision"]) == {"reject"}
