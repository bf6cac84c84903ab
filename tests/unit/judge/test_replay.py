"""clap.judge.replay: the ABCD conditions, their metrics and the report (the gate decides on them: test_gating)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import make_tiny_adapter, write_tiny_admitted

from clap.chain.chain import ChainParams
from clap.chain.retrieval import RetrievalParams
from clap.errors import ClapError
from clap.judge.evaluation import EvalParams
from clap.judge.replay import (
    CASE_COLUMNS,
    plot_rows,
    render_report,
    replay_metrics,
    run_conditions,
    score_conditions,
)
from clap.task.scoring import FieldWeights, ScoringParams
from schemas.normalized import validate_frame
from schemas.replay import ReplayCases, ReplayPlot, ReplayTimings

SP = ScoringParams(0.001, 0.01, FieldWeights(1, 2, 1, 1, 1, 1, 2))
CP = ChainParams(
    top_k=2,
    max_new_tokens=5,
    retrieval=RetrievalParams(1.5, 0.75, 2, "en", {"oee": ["oee"]}, {"A": ["early"], "B": ["late"]}),
)
RPARAMS = EvalParams(batch_size=4, max_new_tokens=5)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


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
    assert (
        set(no_rag["condition"]) == {"C", "D"}
        and (no_rag["retrieved_doc_ids"] == "[]").all()
        and not no_rag["evidence_correct"].any()
    )
    rag = cases[cases["rag"]]
    assert rag["retrieval_hit"].all()  # every tiny question names its metric, line and shift
    a, b = (rag[rag["condition"] == c].sort_values("position") for c in "AB")
    assert list(a["retrieved_doc_ids"]) == list(
        b["retrieved_doc_ids"]
    )  # one index, same retrieval for A and B
    assert list(a["output"]) != list(b["output"])  # B runs the adapter


def test_without_adapter_only_base_conditions_run(replayed):
    items, _, (cases, timings) = replayed
    assert sorted(cases["condition"].unique()) == ["A", "C"] and len(timings) == 2 * len(items)
    m = replay_metrics(cases, timings, len(items), has_adapter=False)
    assert (m["A_run"], m["B_run"], m["C_run"], m["D_run"], m["has_adapter"]) == (1, 0, 1, 0, 0)
    assert "B_core_accuracy" not in m and "adapter_contribution_core" not in m and "rag_necessity_value" in m
    report = render_report("2026-01", m)
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert (
        rows["| B"].count("not run") == 6
        and rows["| D"].count("not run") == 5
        and "not run" not in rows["| A"]
    )
    assert "reports/gate/2026-01/report.md" in report  # the decision is the gate's


def test_metrics_are_flat_and_consistent(replayed):
    items, (cases, timings), _ = replayed
    m = replay_metrics(cases, timings, len(items), has_adapter=True)
    assert all(isinstance(v, (int, float, str)) for v in m.values())
    for c in "ABCD":
        rows = cases[cases["condition"] == c]
        assert m[f"{c}_core_accuracy"] == pytest.approx(
            rows[["metric_correct", "line_correct", "shift_correct", "date_correct"]].all(axis=1).mean()
        )
        assert m[f"{c}_p95_latency_ms"] >= m[f"{c}_p50_latency_ms"] > 0
    assert m["rag_necessity_value"] == pytest.approx(m["A_value_accuracy"] - m["C_value_accuracy"])
    assert m["adapter_contribution_core"] == pytest.approx(m["B_core_accuracy"] - m["A_core_accuracy"])
    assert m["adapter_latency_cost_ms"] == pytest.approx(
        m["B_p95_latency_ms"] - m["A_p95_latency_ms"], abs=1e-5
    )
    plot = validate_frame(ReplayPlot, plot_rows(m), "plot.csv")
    assert len(plot) == 16 and set(plot["condition"]) == set("ABCD")


def test_empty_replay_runs_nothing():
    empty = pd.DataFrame(columns=["item_id", "question"])
    assert run_conditions(empty, pd.DataFrame(), "unused", None, CP, RPARAMS) == {}
    cases, timings = score_conditions(empty, {}, SP)
    m = replay_metrics(cases, timings, 0, has_adapter=True)
    assert not any(m[f"{c}_run"] for c in "ABCD") and plot_rows(m).empty


def test_params_refuse_nonsense():
    with pytest.raises(ClapError, match="eval.batch_size"):
        EvalParams(batch_size=0, max_new_tokens=5)
