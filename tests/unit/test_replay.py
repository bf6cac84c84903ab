"""clap.replay: the ABCD conditions, their metrics and the final decision rule."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import make_tiny_adapter, write_tiny_admitted

from clap.chain import ChainParams
from clap.errors import ClapError
from clap.replay import (CASE_COLUMNS, ReplayParams, decision_metrics, final_decision, plot_rows, read_gate_decision, render_report,
                         replay_checks, replay_metrics, run_conditions, score_conditions)
from clap.retrieval import RetrievalParams
from clap.scoring import FieldWeights, ScoringParams
from schemas.normalized import validate_frame
from schemas.replay import ReplayCases, ReplayPlot, ReplayTimings

SP = ScoringParams(0.001, 0.01, FieldWeights(1, 2, 1, 1, 1, 1, 2))
CP = ChainParams(top_k=2, max_new_tokens=5, retrieval=RetrievalParams(1.5, 0.75, 2, "en", {"oee": ["oee"]}, {"A": ["early"], "B": ["late"]}))
RPARAMS = ReplayParams(batch_size=4, core_tolerance=0.05, evidence_tolerance=0.05, value_tolerance=0.05, min_value_accuracy=0.5, latency_soft_budget_ms=500.0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def replayed(tiny_base, tmp_path_factory):
    """Tiny batch (4 replay cases) replayed with and without a tiny adapter."""
    root = tmp_path_factory.mktemp("replay")
    admitted = write_tiny_admitted(root / "2026-01", n_sft=2, n_probe=4, seed=7)
    adapter = make_tiny_adapter(tiny_base, root / "adapter", seed=5)
    items, kb = pd.read_parquet(admitted / "replay.parquet"), pd.read_parquet(admitted / "kb.parquet")
    with_adapter = score_conditions(items, run_conditions(items, kb, tiny_base, adapter, CP, RPARAMS), SP)
    without = score_conditions(items, run_conditions(items, kb, tiny_base, None, CP, RPARAMS), SP)
    return items, with_adapter, without


def test_four_conditions_scored_and_schema_valid(replayed):
    items, (cases, timings), _ = replayed
    cases = validate_frame(ReplayCases, cases, "cases.parquet")
    validate_frame(ReplayTimings, timings, "timings.parquet")
    assert list(cases.columns) == CASE_COLUMNS
    assert cases.groupby("condition").size().to_dict() == {c: len(items) for c in "ABCD"}
    no_rag = cases[~cases["rag"]]
    assert set(no_rag["condition"]) == {"C", "D"} and (no_rag["retrieved_doc_ids"] == "[]").all() and not no_rag["evidence_correct"].any()
    rag = cases[cases["rag"]]
    assert rag["retrieval_hit"].all()  # every tiny question names its metric, line and shift
    a, b = (rag[rag["condition"] == c].sort_values("position") for c in "AB")
    assert list(a["retrieved_doc_ids"]) == list(b["retrieved_doc_ids"])  # one index, same retrieval for A and B
    assert list(a["output"]) != list(b["output"])  # B runs the adapter


def test_without_adapter_only_base_conditions_run(replayed):
    items, _, (cases, timings) = replayed
    assert sorted(cases["condition"].unique()) == ["A", "C"] and len(timings) == 2 * len(items)
    m = replay_metrics(cases, timings, len(items), has_adapter=False)
    assert (m["A_run"], m["B_run"], m["C_run"], m["D_run"], m["has_adapter"]) == (1, 0, 1, 0, 0)
    assert "B_core_accuracy" not in m and "adapter_contribution_core" not in m and "rag_necessity_value" in m
    report = render_report("2026-01", m, replay_checks("promote", m, RPARAMS))
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert rows["| B"].count("not run") == 6 and rows["| D"].count("not run") == 5 and "not run" not in rows["| A"]
    assert final_decision(replay_checks("promote", m, RPARAMS)) == ("hold", "adapter")


def test_metrics_are_flat_and_consistent(replayed):
    items, (cases, timings), _ = replayed
    m = replay_metrics(cases, timings, len(items), has_adapter=True)
    assert all(isinstance(v, (int, float, str)) for v in m.values())
    for c in "ABCD":
        rows = cases[cases["condition"] == c]
        assert m[f"{c}_core_accuracy"] == pytest.approx(rows[["metric_correct", "line_correct", "shift_correct", "date_correct"]].all(axis=1).mean())
        assert m[f"{c}_p95_latency_ms"] >= m[f"{c}_p50_latency_ms"] > 0
    assert m["rag_necessity_value"] == pytest.approx(m["A_value_accuracy"] - m["C_value_accuracy"])
    assert m["adapter_contribution_core"] == pytest.approx(m["B_core_accuracy"] - m["A_core_accuracy"])
    assert m["adapter_latency_cost_ms"] == pytest.approx(m["B_p95_latency_ms"] - m["A_p95_latency_ms"], abs=1e-5)
    plot = validate_frame(ReplayPlot, plot_rows(m), "plot.csv")
    assert len(plot) == 16 and set(plot["condition"]) == set("ABCD")


def _m(a_core=0.7, b_core=0.8, a_ev=0.3, b_ev=0.5, a_val=0.8, b_val=0.8, cost=100.0, n=40, adapter=True):
    return {"n_cases": n, "A_run": int(n > 0), "B_run": int(adapter and n > 0), "A_core_accuracy": a_core, "B_core_accuracy": b_core,
            "A_answer_evidence_rate": a_ev, "B_answer_evidence_rate": b_ev, "A_value_accuracy": a_val, "B_value_accuracy": b_val,
            "adapter_latency_cost_ms": cost}


@pytest.mark.parametrize("gate, numbers, expected", [
    ("promote", _m(), ("promote", "gate")),
    ("canary", _m(), ("canary", "gate")),
    ("hold", _m(b_core=0.9), ("hold", "gate")),  # replay never upgrades
    ("reject", _m(b_core=0.0), ("reject", "gate")),
    ("promote", _m(b_core=0.6), ("hold", "core_fields")),  # replay contradicts the gate
    ("canary", _m(b_ev=0.2), ("hold", "answer_evidence")),
    ("promote", _m(b_val=0.7), ("hold", "value")),
    ("promote", _m(a_val=0.0, b_val=0.4), ("hold", "chain_value")),  # better than base, still not usable in the chain
    ("promote", _m(a_val=0.0, b_val=0.5), ("promote", "gate")),  # exactly at the floor
    ("promote", _m(b_core=0.65), ("promote", "gate")),  # exactly at the tolerance: not worse
    ("promote", _m(cost=900.0), ("canary", "latency_cost")),
    ("canary", _m(cost=900.0), ("canary", "gate")),
    ("promote", _m(adapter=False), ("hold", "adapter")),
    ("promote", _m(n=0), ("hold", "replay_cases")),
])
def test_final_decision_rule(gate, numbers, expected):
    checks = replay_checks(gate, numbers, RPARAMS)
    assert final_decision(checks) == expected
    flat = decision_metrics(checks)
    assert (flat["final_decision"], flat["final_rule"], flat["gate_decision"]) == (*expected, gate)
    assert flat["final_decision_code"] == ["reject", "hold", "canary", "promote"].index(expected[0])


def test_gate_record_is_checked(tmp_path):
    assert read_gate_decision({"decision": "canary", "decision_code": 2}, "g.json") == "canary"
    for bad in ({"decision": "ship it"}, {"decision_code": 3}, ["promote"]):
        with pytest.raises(ClapError, match="no valid 'decision'"):
            read_gate_decision(bad, "g.json")


def test_empty_replay_runs_nothing():
    empty = pd.DataFrame(columns=["item_id", "question"])
    assert run_conditions(empty, pd.DataFrame(), "unused", None, CP, RPARAMS) == {}
    cases, timings = score_conditions(empty, {}, SP)
    m = replay_metrics(cases, timings, 0, has_adapter=True)
    assert not any(m[f"{c}_run"] for c in "ABCD") and plot_rows(m).empty
    assert final_decision(replay_checks("promote", m, RPARAMS)) == ("hold", "replay_cases")


def test_params_refuse_nonsense():
    with pytest.raises(ClapError, match="replay"):
        ReplayParams(batch_size=0, core_tolerance=0.05, evidence_tolerance=0.05, value_tolerance=0.05, min_value_accuracy=0.5, latency_soft_budget_ms=1.0)
    with pytest.raises(ClapError, match="min_value_accuracy"):
        ReplayParams(batch_size=1, core_tolerance=0.05, evidence_tolerance=0.05, value_tolerance=0.05, min_value_accuracy=1.5, latency_soft_budget_ms=1.0)

