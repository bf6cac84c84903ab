"""clap.judge.replay: the ABCD conditions, their metrics and the report (the gate decides on them: test_gating)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import make_tiny_adapter, tiny_retrieval, write_tiny_admitted

from clap.chain.chain import ChainParams
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.errors import ClapError
from clap.judge.evaluation import EvalParams
from clap.judge.replay import (
    LatencyParams,
    case_columns,
    latency_sample,
    plot_rows,
    render_report,
    replay_metrics,
    run_conditions,
    score_conditions,
    time_requests,
)
from clap.model.engine import EngineParams
from clap.task.answer import load_answer_schema
from clap.task.scoring import ScoringParams
from schemas.normalized import validate_frame
from schemas.replay import ReplayPlot, ReplayRequests, ReplayTimings, replay_cases

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
SP = ScoringParams(0.001, 0.01, ANSWER)
SPACE = answer_space(normalize_params(ROOT / "params.yaml"), ANSWER)
OPENVINO = EngineParams("openvino", "f32")  # the product default
CP = ChainParams(
    top_k=2,
    max_new_tokens=5,
    decoding="free",
    engine=OPENVINO,
    retrieval=tiny_retrieval(),
)
RPARAMS = EvalParams(
    batch_size=4,
    max_new_tokens=5,
    decoding="free",
    free_diagnostic_items=0,
    answer_metric="none",
    engine=OPENVINO,
)
LP = LatencyParams(requests=3, warmup=1, seed=3)  # 3 of the 4 tiny cases timed, the 4th warms up


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def replayed(tiny_base, tmp_path_factory):
    """Tiny batch (4 replay cases) replayed with and without a tiny adapter: (items, (cases, timings,
    requests) with the adapter, the same without)."""
    root = tmp_path_factory.mktemp("replay")
    admitted = write_tiny_admitted(root / "2026-01", n_sft=2, n_probe=4, seed=7)
    adapter = make_tiny_adapter(tiny_base, root / "adapter", seed=5)
    items, kb = pd.read_parquet(admitted / "replay.parquet"), pd.read_parquet(admitted / "kb.parquet")
    out = []
    for a in (adapter, None):
        answers, requests = run_conditions(items, kb, tiny_base, a, CP, RPARAMS, LP, SPACE)
        out.append((*score_conditions(items, answers, SP), requests))
    return items, *out


def test_four_conditions_scored_and_schema_valid(replayed):
    items, (cases, timings, _), _ = replayed
    cases = validate_frame(replay_cases(ANSWER), cases, "cases.parquet")
    validate_frame(ReplayTimings, timings, "timings.parquet")
    assert list(cases.columns) == case_columns(ANSWER)
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
    items, _, (cases, timings, requests) = replayed
    assert sorted(cases["condition"].unique()) == ["A", "C"] and len(timings) == 2 * len(items)
    assert list(requests["condition"]) == ["A"] * LP.requests  # only the base's RAG condition is timed
    m = replay_metrics(cases, timings, requests, len(items), has_adapter=False)
    assert (m["A_run"], m["B_run"], m["C_run"], m["D_run"], m["has_adapter"]) == (1, 0, 1, 0, 0)
    assert "B_core_accuracy" not in m and "adapter_contribution_core" not in m and "rag_necessity_value" in m
    assert m["A_requests"] == LP.requests and "B_request_p95_ms" not in m
    assert "adapter_request_latency_cost_ms" not in m
    report = render_report("2026-01", m)
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert (
        rows["| B"].count("not run") == 5
        and rows["| D"].count("not run") == 4
        and "not run" not in rows["| A"]
    )
    assert "| B | " not in report.split("## Latency")[1]  # no latency row for a condition that did not run
    assert "reports/gate/2026-01/report.md" in report  # the decision is the gate's


def test_metrics_are_flat_and_consistent(replayed):
    items, (cases, timings, requests), _ = replayed
    m = replay_metrics(cases, timings, requests, len(items), has_adapter=True)
    assert all(isinstance(v, (int, float, str)) for v in m.values())
    for c in "ABCD":
        rows = cases[cases["condition"] == c]
        assert m[f"{c}_core_accuracy"] == pytest.approx(
            rows[["metric_correct", "line_correct", "shift_correct", "date_correct"]].all(axis=1).mean()
        )
        assert m[f"{c}_p95_latency_ms"] >= m[f"{c}_p50_latency_ms"] > 0 and m[f"{c}_items_per_s"] > 0
    assert m["rag_necessity_value"] == pytest.approx(m["A_value_accuracy"] - m["C_value_accuracy"])
    assert m["adapter_contribution_core"] == pytest.approx(m["B_core_accuracy"] - m["A_core_accuracy"])
    for c in "AB":  # per-request latency of the RAG conditions only
        assert m[f"{c}_request_p95_ms"] >= m[f"{c}_request_p50_ms"] > 0 and m[f"{c}_requests"] == LP.requests
    assert not {"C_requests", "D_request_p95_ms"} & set(m)
    assert m["adapter_request_latency_cost_ms"] == pytest.approx(
        m["B_request_p95_ms"] - m["A_request_p95_ms"], abs=1e-5
    )
    assert "adapter_latency_cost_ms" not in m  # the apportioned cost is not a gated figure any more
    plot = validate_frame(ReplayPlot, plot_rows(m), "plot.csv")
    assert len(plot) == 16 and set(plot["condition"]) == set("ABCD")


def test_requests_are_single_seeded_and_apart_from_the_warmup(replayed):
    items, (_, _, requests), (_, _, base_only) = replayed
    requests = validate_frame(ReplayRequests, requests, "request_timings.parquet")
    assert requests.groupby("condition").size().to_dict() == {"A": LP.requests, "B": LP.requests}
    assert (requests["batch_size"] == 1).all()  # one request at a time, as `clap serve` answers
    assert (requests["request_ms"] >= requests["retrieval_ms"] + requests["generation_ms"]).all()
    measured, warmup = latency_sample(len(items), LP)
    ids = list(items["item_id"])
    for c in "AB":  # the same seeded cases for A and B, in draw order; the warm-up case is not among them
        assert list(requests[requests["condition"] == c]["item_id"]) == [ids[i] for i in measured]
    assert list(base_only["item_id"]) == [ids[i] for i in measured]
    assert len(warmup) == LP.warmup and not set(warmup) & set(measured)
    assert latency_sample(len(items), LP) == (measured, warmup)  # seeded: the same draw every run
    assert latency_sample(len(items), LatencyParams(3, 1, seed=4)) != (measured, warmup)


class LoggedChain:
    """A stand-in chain that logs each request (condition, question) in the order it is sent."""

    def __init__(self, cond: str, log: list):
        self.cond, self.log = cond, log

    def answer(self, questions, rag, batch_size):
        assert rag and batch_size == 1 and len(questions) == 1
        self.log.append((self.cond, questions[0]))
        gen = SimpleNamespace(batch_wall_ms=1.0, new_tokens=1, batch_size=1)
        return [SimpleNamespace(retrieved=SimpleNamespace(retrieval_ms=0.0), generation=gen)]


def test_a_and_b_requests_are_interleaved_case_by_case():
    """Each sampled case goes to A and B back to back, the order alternating, so load that comes and goes
    during the sample falls on both conditions (not on one phase's model only)."""
    items = pd.DataFrame({"item_id": [f"i{k}" for k in range(6)], "question": [f"q{k}" for k in range(6)]})
    lp = LatencyParams(requests=4, warmup=2, seed=1)
    log: list = []
    requests = time_requests({c: LoggedChain(c, log) for c in "BA"}, items, lp)
    measured, warmup = latency_sample(len(items), lp)
    q = [f"q{i}" for i in warmup + measured]
    orders = ["AB", "AB", "AB", "BA", "AB", "BA"]  # warm-up cases, then the sample alternating
    assert log == [(c, q[k]) for k, order in enumerate(orders) for c in order]
    assert list(requests["condition"]) == ["A"] * 4 + ["B"] * 4  # rows per condition, in draw order
    assert list(requests["request"]) == [0, 1, 2, 3] * 2
    assert list(requests["item_id"]) == [f"i{i}" for i in measured] * 2


def test_too_small_a_replay_for_the_latency_sample_is_loud():
    with pytest.raises(ClapError, match="replay.latency") as e:
        latency_sample(4, LatencyParams(requests=4, warmup=1, seed=3))
    assert e.value.rule == "too_few_cases"
    with pytest.raises(ClapError, match="replay.latency") as e:
        LatencyParams(requests=0, warmup=1, seed=3)
    assert (e.value.rule, e.value.column) == ("bad_params", "replay.latency.requests")


def test_a_rag_condition_without_its_request_timings_is_loud(replayed):
    items, (cases, timings, requests), _ = replayed
    with pytest.raises(ClapError, match="B ran without its per-request latency") as e:
        replay_metrics(cases, timings, requests[requests["condition"] == "A"], len(items), has_adapter=True)
    assert e.value.rule == "missing_timings"


def test_report_shows_per_request_latency_and_the_batched_diagnostics(replayed):
    items, (cases, timings, requests), _ = replayed
    m = replay_metrics(cases, timings, requests, len(items), has_adapter=True)
    report = render_report("2026-01", m)
    assert f"{LP.requests} sampled cases sent one at a time" in report
    assert f"| B | {LP.requests} | {m['B_request_p50_ms']:.0f} | {m['B_request_p95_ms']:.0f} |" in report
    assert "Adapter latency cost (B p95 − A p95, per request)" in report
    assert "reported only, never gated" in report and f"| D | {m['D_items_per_s']:.2f} |" in report


def test_empty_replay_runs_nothing():
    empty = pd.DataFrame(columns=["item_id", "question"])
    answers, requests = run_conditions(empty, pd.DataFrame(), "unused", None, CP, RPARAMS, LP, SPACE)
    assert answers == {} and requests.empty
    cases, timings = score_conditions(empty, {}, SP)
    m = replay_metrics(cases, timings, requests, 0, has_adapter=True)
    assert not any(m[f"{c}_run"] for c in "ABCD") and plot_rows(m).empty
    assert "No condition ran" in render_report("2026-01", m)


def test_params_refuse_nonsense():
    with pytest.raises(ClapError, match="eval.batch_size"):
        dataclasses.replace(RPARAMS, batch_size=0)
