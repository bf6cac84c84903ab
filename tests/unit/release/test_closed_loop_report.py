"""benchmarks/closed_loop.py without running the loop: records read loudly, regressions flagged, params set."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("closed_loop", ROOT / "benchmarks" / "closed_loop.py")
loop = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("closed_loop", loop)  # dataclasses look their module up
_spec.loader.exec_module(loop)

GATE = {"decision": "promote", "rule": "all_checks_passed", "baseline": "incumbent", "b": 9, "c": 2,
        "pvalue": 0.03, "delta": 0.175, "baseline_pass_rate": 0.4, "candidate_pass_rate": 0.575}  # fmt: skip
REPLAY = {
    "has_adapter": 1,
    "adapter_contribution_value": 0.25,
    "A_value_accuracy": 0.5,
    "B_value_accuracy": 0.75,
}


def _records(root: Path, batch: str, gate: dict, replay: dict, incumbent: dict) -> None:
    files = {
        f"metrics/gate/{batch}.json": gate,
        f"metrics/replay/{batch}.json": replay,
        f"metrics/eval/{batch}.json": {"base_pass_rate": 0.1},
        f"reports/gate/{batch}/evidence.json": {"adapter_sha256": "ab" * 32, "incumbent": incumbent},
        f"records/warm_start/{batch}.json": {
            "from_batch": incumbent.get("batch", ""),
            "adapter_sha256": "cd" * 32,
        },
    }
    for rel, record in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(record))


def test_the_baseline_names_the_incumbent_batch(tmp_path):
    _records(tmp_path, "2026-02", GATE, REPLAY, {"batch": "2026-01", "adapter_sha256": "cd" * 32})
    row = loop.batch_row(tmp_path, "2026-02")
    assert (row["baseline_batch"], row["b"], row["c"], row["chain_delta"]) == ("2026-01", 9, 2, 0.25)
    assert row["incumbent_sha256"] == "cd" * 32
    assert (row["trained_from"], row["trained_from_sha256"]) == ("2026-01", "cd" * 32)


@pytest.mark.parametrize(
    ("where", "key"),
    [("gate", "b"), ("gate", "pvalue"), ("gate", "rule"), ("replay", "adapter_contribution_value")],
)
def test_a_missing_key_fails_loudly_naming_it(tmp_path, where, key):
    gate, replay = dict(GATE), dict(REPLAY)
    (gate if where == "gate" else replay).pop(key)
    _records(tmp_path, "2026-02", gate, replay, {"batch": "2026-01"})
    with pytest.raises(loop.LoopError, match=key):
        loop.batch_row(tmp_path, "2026-02")


def test_an_incumbent_baseline_without_an_incumbent_batch_fails(tmp_path):
    _records(tmp_path, "2026-02", GATE, REPLAY, {})
    with pytest.raises(loop.LoopError, match="names no incumbent batch"):
        loop.batch_row(tmp_path, "2026-02")


def _row(batch, delta, chain, decision="promote", rule="all_checks_passed"):
    return {"batch": batch, "delta": delta, "chain_delta": chain, "decision": decision, "rule": rule,
            "baseline_batch": "base"}  # fmt: skip


def test_a_regressed_batch_is_flagged_under_a_positive_mean():
    rows = [
        _row("2026-01", 0.30, 0.20),
        _row("2026-02", -0.05, 0.10, "reject", "quality"),
        _row("2026-05", 0.02, 0.05, "hold", "chain_value"),
        _row("2026-06", 0.01, 0.0, "reject", "quality"),  # not better enough is not a regression
    ]
    s = loop.summarize({"rows": rows})
    assert s["mean_offline_delta"] == pytest.approx(0.07)
    assert [g["batch"] for g in s["regressed"]] == ["2026-02", "2026-05"]
    assert "offline delta -0.050" in s["regressed"][0]["why"] and "chain_value" in s["regressed"][1]["why"]


def test_set_params_changes_an_existing_key_only(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("# top\nbatches: [2026-01]  # which\ngate:\n  delta_star: 0.06  # margin\n")
    loop.set_params(path, {"gate.delta_star": -1.0, "batches": ["2026-01", "2026-02"]})
    text = path.read_text()
    assert "# margin" in text and "delta_star: -1.0" in text and "2026-02" in text
    with pytest.raises(loop.LoopError, match="does not exist"):
        loop.set_params(path, {"gate.delta_sta": 0.1})
