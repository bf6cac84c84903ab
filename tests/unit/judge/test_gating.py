"""clap.judge.gating: every decision path, the baseline choice, loud inputs, evidence and report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from clap import params
from clap.errors import ClapError
from clap.judge.gate_report import evidence_bundle, render_report
from clap.judge.gating import (
    DECISION_CODE,
    ChainPolicy,
    Check,
    GateParams,
    SlicePolicy,
    bound_check,
    chain_checks,
    decide,
    flat_metrics,
    run_gate,
)
from clap.judge.scored import scored_columns
from clap.judge.stats import rule_mde, rule_power, rule_required_pairs
from clap.task.answer import load_answer_schema

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
SCORED_COLUMNS = scored_columns(ANSWER)

HEALTH = {
    "ok": "promote",
    "stopped": "hold",
    "alarm": "reject",
    "nan": "reject",
    "skipped": "reject",
    "over_budget": "hold",
}
P = GateParams(
    baseline="incumbent",
    alpha=0.05,
    delta_star=0.06,
    lcb_floor=0.0,
    power=0.8,
    planning_discordance=0.2,
    planning_delta=0.10,
    max_hallucination_rate=0.05,
    max_wrong_fact_rate=0.15,
    max_regressed_rate=0.10,
    max_p95_latency_ms=5000.0,
    risk_alpha=0.05,
    near_bound=0.8,
    health=HEALTH,
    min_prompt_masked=0.95,
    unmasked="reject",
    max_regressed_samples=3,
    slices=SlicePolicy(alpha=0.05, regression="hold"),
    chain=ChainPolicy(
        core_tolerance=0.05,
        evidence_tolerance=0.05,
        value_tolerance=0.05,
        min_value_accuracy=0.5,
        latency_soft_budget_ms=500.0,
    ),
)
MASKED = {
    "masked_tokens_fraction": 0.6,
    "label_tokens": 1000,
    "prompt_tokens": 600,
}  # every prompt token masked
OK_TRAIN, ADMITTED = {"trained": 1, "health": "ok", **MASKED}, {"admitted": 1}
SHA = {"candidate": "c" * 64, "incumbent": "i" * 64}


def frames(passes: dict[str, list[bool]], *, halluc: int = 0, wrong: int = 0):
    """Scored frame and eval manifest for models with the given pass vectors (same items, same order)."""
    n = len(next(iter(passes.values())))
    rows = []
    for role, ok in passes.items():
        failed = [i for i, good in enumerate(ok) if not good]
        bad_value = {i: k for k, i in enumerate(failed)} if role == "candidate" else {}  # rank among failures
        for i, good in enumerate(ok):
            row = dict.fromkeys(SCORED_COLUMNS)
            row.update(
                model=role,
                position=i,
                item_id=f"e{i:03d}",
                metric=["oee", "scrap_rate"][i % 2],
                line=f"L{i % 3 + 1}",
                shift="A",
                source_system=["mes", "qms"][i % 2],
                question_type="kpi_lookup",
                output=f"{role} answer {i}",
                overall=1.0 if good else 0.5,
                hallucination=bad_value.get(i, 1e9) < halluc,
                wrong_fact=halluc <= bad_value.get(i, -1) < halluc + wrong,
            )
            row["pass"] = good
            rows.append(row)
    meta_models = [
        {
            "role": r,
            "adapter_sha256": SHA.get(r, ""),
            "batch": {"candidate": "2026-02", "incumbent": "2026-01"}.get(r, ""),
            "adapter_dir": None,
        }
        for r in passes
    ]
    meta = {
        "models": meta_models,
        "production": {},
        "datasets": {"eval.parquet": "e" * 64},
        "base_sha256": "b" * 64,
        "n_items": n,
    }
    return pd.DataFrame(rows, columns=SCORED_COLUMNS), meta


def vectors(n: int, wins: int, losses: int, base_right: int) -> tuple[list[bool], list[bool]]:
    """Candidate and baseline pass vectors with exactly ``wins`` b and ``losses`` c."""
    base = np.zeros(n, bool)
    base[:base_right] = True
    cand = base.copy()
    cand[base_right : base_right + wins] = True
    cand[:losses] = False
    return cand.tolist(), base.tolist()


def gate(passes, train=OK_TRAIN, admit=ADMITTED, p=P, replay=None, **kw):
    scored, meta = frames(passes, **kw)
    return run_gate(
        scored, meta, train, admit, p, replay=_chain() if replay is None else replay, slices=ANSWER.slices
    )


def test_clear_gain_with_low_risk_promotes():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    r = gate({"base": base, "candidate": cand})
    assert (r.decision, r.rule) == ("promote", "all_checks_passed")  # no check capped the decision
    assert r.numbers["baseline"] == "base" and r.numbers["b"] == 20 and r.numbers["c"] == 1
    assert r.numbers["pvalue"] < 0.05 and r.numbers["lcb"] > 0


def test_incumbent_is_the_baseline_when_in_production():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    r = gate({"base": [False] * 60, "candidate": cand, "incumbent": base})
    assert r.numbers["baseline"] == "incumbent" and r.numbers["b"] == 20
    only_base = gate(
        {"base": base, "candidate": cand, "incumbent": [False] * 60},
        p=dataclasses.replace(P, baseline="base"),
    )
    assert only_base.numbers["baseline"] == "base"


def test_candidate_that_is_the_incumbent_is_compared_with_base_and_says_so():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    scored, meta = frames({"base": base, "candidate": cand})
    meta["production"] = {"role": "incumbent", "batch": "2026-02", "adapter_sha256": SHA["candidate"]}
    r = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert r.numbers["baseline"] == "base" and "IS the production adapter" in r.numbers["baseline_reason"]


def test_gain_below_margin_rejects_even_if_significant():
    cand, base = vectors(2000, wins=60, losses=10, base_right=500)  # p ~ 4e-10, delta = 0.025 < delta*
    r = gate({"base": base, "candidate": cand})
    assert (r.decision, r.rule) == ("reject", "quality") and r.numbers["pvalue"] < 1e-6


def test_no_change_rejects_and_no_discordance_means_p_one():
    cand, base = vectors(60, wins=0, losses=0, base_right=10)
    r = gate({"base": base, "candidate": cand})
    assert r.decision == "reject" and r.numbers["pvalue"] == 1.0 and r.numbers["rule_mde_observed"] == 1.0


def test_large_but_inconclusive_gain_holds():
    cand, base = vectors(20, wins=3, losses=1, base_right=5)  # delta .10 >= delta*, p = .31
    r = gate({"base": base, "candidate": cand})
    assert (r.decision, r.rule) == ("hold", "quality")


def test_risk_near_bound_canaries_and_over_bound_rejects():
    cand, base = vectors(100, wins=30, losses=0, base_right=20)
    near = gate({"base": base, "candidate": cand}, halluc=4)  # 4 % vs bound 5 %
    assert (near.decision, near.rule) == ("canary", "hallucination_rate")
    noise = gate({"base": base, "candidate": cand}, halluc=6)  # 6 % > 5 %, but the 95 % lower bound is 2.6 %
    assert (noise.decision, noise.rule) == ("hold", "hallucination_rate")
    assert noise.numbers["hallucination_rate_lcb"] == pytest.approx(0.0264, abs=1e-4)
    over = gate({"base": base, "candidate": cand}, halluc=12)  # lower bound 7.1 % > 5 %
    assert (over.decision, over.rule) == ("reject", "hallucination_rate")
    slow = gate({"base": base, "candidate": cand}, replay=_chain(b_p95=6000.0))  # per request, replay B
    assert (slow.decision, slow.rule) == ("reject", "request_p95_latency_ms")
    assert slow.numbers["request_p95_latency_ms"] == 6000.0 and slow.numbers["latency_requests"] == 8
    near_slow = gate(
        {"base": base, "candidate": cand}, replay=_chain(b_p95=4500.0)
    )  # 0.9 x the 5000 ms bound
    assert (near_slow.decision, near_slow.rule) == ("canary", "request_p95_latency_ms")


def test_regressions_are_counted_bounded_and_sliced():
    cand, base = vectors(100, wins=40, losses=12, base_right=30)
    r = gate({"base": base, "candidate": cand})  # 12 % > 10 %, lower bound 7.1 %: not conclusive
    assert r.numbers["regressed_count"] == 12 and r.rule == "regressed_rate" and r.decision == "hold"
    assert (
        gate({"base": base, "candidate": vectors(100, wins=60, losses=20, base_right=30)[0]}).decision
        == "reject"
    )  # 20 %: LCB 13.7 %
    ev = evidence_bundle(
        r, "2026-02", frames({"base": base, "candidate": cand})[1], "f" * 64, {"gate": {"alpha": 0.05}}, P
    )
    assert ev["regressed"]["item_ids"] == [f"e{i:03d}" for i in range(12)]
    assert ev["regressed"]["by_slice"]["metric"] == {"oee": 6, "scrap_rate": 6}
    assert (
        list(ev["regressed"]["by_slice"])
        == list(ANSWER.slices)
        == ["metric", "line", "shift", "source_system", "question_type"]
    )  # each vocabulary key field, then params task.slice_columns
    assert (
        len(ev["regressed"]["samples"]) == 3
        and ev["regressed"]["samples"][0]["output_baseline"] == "base answer 0"
    )


@pytest.mark.parametrize(
    "health, decision", [("nan", "reject"), ("alarm", "reject"), ("stopped", "hold"), ("skipped", "reject")]
)
def test_training_health_caps_the_decision(health, decision):
    cand, base = vectors(60, wins=20, losses=0, base_right=10)
    r = gate({"base": base, "candidate": cand}, train={"trained": 1, "health": health, **MASKED})
    assert (r.decision, r.rule) == (decision, "training_health")


@pytest.mark.parametrize(
    "fraction, decision", [(0.6, "promote"), (0.58, "promote"), (0.5, "reject"), (0.0, "reject")]
)
def test_loss_on_prompt_tokens_caps_the_decision(fraction, decision):
    cand, base = vectors(60, wins=20, losses=0, base_right=10)
    r = gate({"base": base, "candidate": cand}, train={**OK_TRAIN, "masked_tokens_fraction": fraction})
    check = next(c for c in r.checks if c.name == "loss_masking")
    assert r.decision == decision and check.cap == decision
    assert check.detail == f"{fraction * 1000 / 600:.1%} of prompt tokens masked from the loss (minimum 95%)"
    assert r.rule == ("loss_masking" if decision == "reject" else "all_checks_passed")
    with pytest.raises(ClapError, match="masked_tokens_fraction"):
        gate({"base": base, "candidate": cand}, train={"trained": 1, "health": "ok"})


def test_health_detail_names_the_alarm_the_stop_and_the_skip():
    cand, base = vectors(60, wins=20, losses=0, base_right=10)
    alarm = {
        "trained": 1,
        "health": "alarm",
        "detector_alarm_step": 30,
        "planned_steps": 32,
        "detector_max_log_e": 3.1,
        "detector_log_threshold": 2.996,
        "stop_step": 30,
        **MASKED,
    }
    detail = next(
        c.detail
        for c in gate({"base": base, "candidate": cand}, train=alarm).checks
        if c.name == "training_health"
    )
    assert (
        detail
        == "training health 'alarm': TBDL detector alarm at step 30 of 32 (max log E 3.10 >= 3.00); training stopped at step 30"
    )
    skipped = gate(
        {"base": base}, train={"trained": 0, "health": "skipped", "skip_reason": "batch not admitted"}
    )
    assert "not trained (batch not admitted)" in next(
        c.detail for c in skipped.checks if c.name == "training_health"
    )


def test_not_admitted_or_not_trained_rejects():
    cand, base = vectors(60, wins=20, losses=0, base_right=10)
    assert gate({"base": base, "candidate": cand}, admit={"admitted": 0}).rule == "admission"
    r = gate({"base": base}, train={"trained": 0, "health": "skipped"}, admit={"admitted": 0})
    assert r.decision == "reject" and {c.name for c in r.checks} == {
        "admission",
        "training_health",
        "loss_masking",
        "candidate",
    }
    ev = evidence_bundle(r, "2026-03", frames({"base": base})[1], "f" * 64, {}, P)
    assert ev["regressed"]["count"] == 0 and ev["adapter_sha256"] == "" and "**REJECT**" in render_report(ev)
    assert "delta" not in flat_metrics(r) and flat_metrics(r)["check_candidate"] == "reject"


def test_a_batch_held_over_budget_is_held_not_rejected():
    """Not trained because its estimated cost was over budget (release.cost.over_budget: hold): no
    candidate, and the training health's policy caps the `candidate` check too (nothing was spent)."""
    base = vectors(60, wins=0, losses=0, base_right=10)[1]
    held = {
        "trained": 0,
        "health": "over_budget",
        "skip_reason": "over budget: estimated 9000 s vs budget 7200 s",
    }
    r = gate({"base": base}, train=held, replay=_chain(adapter=False))
    caps = {c.name: c.cap for c in r.checks}
    assert (r.decision, r.rule) == ("hold", "training_health") and caps["candidate"] == "hold"
    assert "not trained (training health 'over_budget': over budget: estimated 9000 s" in next(
        c.detail for c in r.checks if c.name == "candidate"
    )
    trained_without_candidate = gate({"base": base}, train=OK_TRAIN, replay=_chain(adapter=False))
    assert (trained_without_candidate.decision, trained_without_candidate.rule) == ("reject", "candidate")


def test_missing_or_unknown_inputs_are_loud():
    cand, base = vectors(60, wins=20, losses=0, base_right=10)
    with pytest.raises(ClapError, match="admitted"):
        gate({"base": base, "candidate": cand}, admit={})
    with pytest.raises(ClapError, match="0 or 1"):
        gate({"base": base, "candidate": cand}, admit={"admitted": "yes"})
    with pytest.raises(ClapError, match="health"):
        gate({"base": base, "candidate": cand}, train={"trained": 1})
    with pytest.raises(ClapError, match="no entry"):
        gate({"base": base, "candidate": cand}, train={"trained": 1, "health": "weird"})
    scored, meta = frames({"base": base, "candidate": cand})
    with pytest.raises(ClapError, match="pair"):
        run_gate(scored.iloc[:-1], meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)


def test_bound_check_edges():
    assert bound_check("x", 0.05, 0.05, P).cap == "canary"  # at the bound: within, but near it
    assert bound_check("x", 0.0, 0.05, P).cap == "promote"
    assert bound_check("x", 0.0501, 0.05, P).cap == "reject"  # no lower bound given (latency): over is over
    assert bound_check("x", 0.075, 0.05, P, lcb=0.0208).cap == "hold"
    assert bound_check("x", 0.15, 0.05, P, lcb=0.0674).cap == "reject"


def test_flat_metrics_and_report():
    cand, base = vectors(60, wins=20, losses=2, base_right=10)
    r = gate({"base": base, "candidate": cand})
    flat = flat_metrics(r)
    assert flat["decision_code"] == DECISION_CODE[flat["decision"]] and flat["check_quality"] == "promote"
    assert all(isinstance(v, (int, float, str, bool)) for v in flat.values())  # flat: DVC drops lists
    ev = evidence_bundle(r, "2026-02", frames({"base": base, "candidate": cand})[1], "f" * 64, {}, P)
    md = render_report(ev)
    assert (
        "# Gate 2026-02: **PROMOTE**" in md and "by metric" in md and ev["adapter_sha256"] == SHA["candidate"]
    )
    assert DECISION_CODE == {"reject": 0, "hold": 1, "canary": 2, "promote": 3}
    assert f"{P.power:.0%} power from a true gain of" in md  # the report states gate.power, not a constant
    p90 = dataclasses.replace(P, power=0.9)
    r90 = run_gate(
        *frames({"base": base, "candidate": cand}),
        OK_TRAIN,
        ADMITTED,
        p90,
        replay=_chain(),
        slices=ANSWER.slices,
    )
    md90 = render_report(
        evidence_bundle(r90, "2026-02", frames({"base": base, "candidate": cand})[1], "f" * 64, {}, p90)
    )
    assert "90% power from a true gain of" in md90 and "N needed for 90% power" in md90


def test_params_section_loads_and_bad_policy_is_refused():
    assert params.section("gate", GateParams).alpha > 0
    with pytest.raises(ClapError):
        dataclasses.replace(P, health={"ok": "ship-it"})


# --- the application-chain checks (metrics/replay under gate.chain) ----------------------------
def _chain(
    a_core=0.7,
    b_core=0.8,
    a_ev=0.3,
    b_ev=0.5,
    a_val=0.8,
    b_val=0.8,
    cost=100.0,
    n=40,
    adapter=True,
    b_p95=1100.0,
):
    """A metrics/replay record as the replay stage writes it (per-request latency: 8 requests per condition)."""
    return {
        "n_cases": n,
        "A_run": int(n > 0),
        "B_run": int(adapter and n > 0),
        "A_core_accuracy": a_core,
        "B_core_accuracy": b_core,
        "A_answer_evidence_rate": a_ev,
        "B_answer_evidence_rate": b_ev,
        "A_value_accuracy": a_val,
        "B_value_accuracy": b_val,
        "A_requests": 8,
        "B_requests": 8,
        "A_request_p50_ms": 800.0,
        "A_request_p95_ms": b_p95 - cost,
        "B_request_p50_ms": 900.0,
        "B_request_p95_ms": b_p95,
        "adapter_request_latency_cost_ms": cost,
    }


@pytest.mark.parametrize(
    "offline, numbers, expected",
    [
        ("promote", _chain(), ("promote", "all_checks_passed")),
        ("canary", _chain(), ("canary", "offline")),
        ("hold", _chain(b_core=0.9), ("hold", "offline")),  # the chain never upgrades
        ("reject", _chain(b_core=0.0), ("reject", "offline")),
        (
            "promote",
            _chain(b_core=0.6),
            ("hold", "chain_core_fields"),
        ),  # the chain contradicts the held-out eval
        ("canary", _chain(b_ev=0.2), ("hold", "chain_answer_evidence")),
        ("promote", _chain(b_val=0.7), ("hold", "chain_value")),
        (
            "promote",
            _chain(a_val=0.0, b_val=0.4),
            ("hold", "chain_value_floor"),
        ),  # better than base, still not usable in the chain
        ("promote", _chain(a_val=0.0, b_val=0.5), ("promote", "all_checks_passed")),  # exactly at the floor
        (
            "promote",
            _chain(b_core=0.65),
            ("promote", "all_checks_passed"),
        ),  # exactly at the tolerance: not worse
        ("promote", _chain(cost=900.0), ("canary", "chain_latency_cost")),
        ("canary", _chain(cost=900.0), ("canary", "offline")),
        ("promote", _chain(adapter=False), ("hold", "chain_adapter")),
        ("promote", _chain(n=0), ("hold", "chain_cases")),
    ],
)
def test_chain_checks_cap_the_decision(offline, numbers, expected):
    assert (
        decide([Check("offline", offline, "the other checks"), *chain_checks(numbers, P.chain)]) == expected
    )


def test_chain_checks_are_part_of_the_gate_and_reported_apart():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    scored, meta = frames({"base": base, "candidate": cand})
    r = run_gate(
        scored,
        meta,
        OK_TRAIN,
        ADMITTED,
        P,
        chain_checks(_chain(b_val=0.7), P.chain),
        replay=_chain(),
        slices=ANSWER.slices,
    )
    flat = flat_metrics(r)
    assert (flat["decision"], flat["rule"], flat["offline_decision"], flat["offline_rule"]) == (
        "hold",
        "chain_value",
        "promote",
        "all_checks_passed",
    )
    ev = evidence_bundle(r, "2026-02", meta, "f" * 64, {}, P)
    ev["replay"] = _chain(b_val=0.7)
    report = render_report(ev)
    assert (
        "A base+RAG → B adapter+RAG: value 0.800 → 0.700" in report
        and "without these `chain_*` checks: promote" in report
    )
    assert (
        "8 single requests through the chain" in report
        and "p95 1000 → 1100 ms (adapter cost +100 ms)" in report
    )


def test_a_replay_record_missing_a_number_is_loud():
    record = _chain()
    del record["B_value_accuracy"]
    with pytest.raises(ClapError, match="B_value_accuracy") as e:
        chain_checks(record, P.chain)
    assert e.value.rule == "missing_metric"


def _planted(l7_regresses: bool):
    """200 items: the candidate wins 60 items broadly; the 8 items of line L7 the baseline gets
    right are all lost by the candidate (or, without the plant, kept)."""
    cand, base = vectors(200, wins=60, losses=0, base_right=40)
    scored, meta = frames({"base": base, "candidate": cand})
    l7 = scored["position"] < 8  # baseline right on items 0-39, the candidate too (no losses planted yet)
    scored.loc[l7, "line"] = "L7"
    if l7_regresses:
        scored.loc[l7 & (scored["model"] == "candidate"), "pass"] = False
    return run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)


def test_a_regressed_slice_holds_a_significant_overall_gain_and_is_named():
    clean, r = _planted(False), _planted(True)
    assert (clean.decision, clean.numbers["slices_regressed"]) == ("promote", 0)
    assert (
        r.numbers["pvalue"] < 1e-10 and r.numbers["delta"] >= P.delta_star
    )  # the overall gain is significant
    assert next(c for c in r.checks if c.name == "quality").cap == "promote"
    assert (r.decision, r.rule) == ("hold", "slice_regression")
    flat = flat_metrics(r)
    assert flat["check_slice_regression"] == "hold" and flat["slices_regressed"] == 1
    ev = evidence_bundle(r, "2026-02", frames({"base": [True]})[1], "f" * 64, {}, P)
    (bad,) = ev["slices"]["regressed"]
    m = len(ev["slices"]["tests"])
    assert (bad["slice"], bad["value"], bad["b"], bad["c"]) == ("line", "L7", 0, 8)
    assert bad["pvalue"] == pytest.approx(0.5**8) and bad["p_adjusted"] == pytest.approx(min(1, m * 0.5**8))
    adjusted = multipletests([s["pvalue"] for s in ev["slices"]["tests"]], method="holm")[1]
    assert [s["p_adjusted"] for s in ev["slices"]["tests"]] == pytest.approx(list(adjusted))
    assert {(s["slice"], s["value"]) for s in ev["slices"]["tests"]} >= {("line", "L7"), ("shift", "A")}
    md = render_report(ev)
    assert "line = L7: b=0, c=8 (of 8)" in md and "Holm-adjusted p=" in md
    assert "line=L7 (b=0, c=8" in next(c.detail for c in r.checks if c.name == "slice_regression")


def test_slice_policy_caps_at_its_param_and_needs_the_holm_level():
    softer = dataclasses.replace(P, slices=SlicePolicy(alpha=0.05, regression="canary"))
    cand, base = vectors(200, wins=60, losses=0, base_right=40)
    scored, meta = frames({"base": base, "candidate": cand})
    scored.loc[scored["position"] < 8, "line"] = "L7"
    scored.loc[(scored["position"] < 8) & (scored["model"] == "candidate"), "pass"] = False
    assert (
        run_gate(scored, meta, OK_TRAIN, ADMITTED, softer, replay=_chain(), slices=ANSWER.slices).decision
        == "canary"
    )
    few = scored["position"] < 4  # 4 losses of 4 items: p = 1/16 raw, not significant after Holm
    scored.loc[(scored["position"] < 8) & ~few, "line"] = "L1"
    scored.loc[(scored["position"] < 8) & ~few & (scored["model"] == "candidate"), "pass"] = True
    r = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert r.decision == "promote" and r.numbers["slices_regressed"] == 0
    with pytest.raises(ClapError, match="slices") as e:
        SlicePolicy(alpha=0.05, regression="maybe")
    assert (e.value.rule, e.value.column) == ("bad_params", "gate.slices.regression")


def test_rule_power_figures_are_reported():
    cand, base = vectors(300, wins=40, losses=10, base_right=100)
    r = gate({"base": base, "candidate": cand})
    n = r.numbers
    assert n["rule_power_at_delta_star"] == pytest.approx(rule_power(300, 0.06, 0.2, P.rule))
    assert n["rule_power_at_delta_star_observed"] == pytest.approx(rule_power(300, 0.06, 50 / 300, P.rule))
    assert n["rule_mde_planned"] == pytest.approx(rule_mde(300, 0.2, P.rule, 0.8))
    assert n["rule_n_required_planned"] == rule_required_pairs(0.10, 0.2, P.rule, 0.8)
    md = render_report(evidence_bundle(r, "b", frames({"base": base, "candidate": cand})[1], "f" * 64, {}, P))
    assert "approximate" in md and f"{n['rule_power_at_delta_star']:.2f} at N=300" in md
    low = gate({"base": base, "candidate": vectors(300, wins=5, losses=5, base_right=100)[0]})
    assert low.numbers["rule_power_at_delta_star_observed"] == -1.0  # discordance 1/30 < delta*
    with pytest.raises(ClapError, match="planning_delta") as e:
        dataclasses.replace(P, planning_delta=0.05)  # below delta_star
    assert e.value.column == "gate.planning_delta"


@pytest.mark.parametrize(
    "change, column",
    [
        ({"power": 1.5}, "gate.power"),
        ({"alpha": 0.0}, "gate.alpha"),
        ({"baseline": "yesterday"}, "gate.baseline"),
        ({"near_bound": 0.0}, "gate.near_bound"),
        ({"health": {**HEALTH, "nan": "maybe"}}, "gate.health.nan"),
        ({"unmasked": "maybe"}, "gate.unmasked"),
        ({"planning_discordance": 1.5}, "gate.planning_discordance"),
    ],
)
def test_a_bad_gate_value_names_its_dotted_key(change, column):
    with pytest.raises(ClapError) as e:
        dataclasses.replace(P, **change)
    assert (e.value.rule, e.value.column, e.value.file) == ("bad_params", column, "params.yaml")
    assert f"column {column!r}" in str(e.value)


def test_a_bad_gate_chain_value_names_its_dotted_key():
    with pytest.raises(ClapError) as e:
        dataclasses.replace(P.chain, min_value_accuracy=1.5)
    assert (e.value.rule, e.value.column) == ("bad_params", "gate.chain.min_value_accuracy")
    with pytest.raises(ClapError) as e:
        dataclasses.replace(P.chain, latency_soft_budget_ms=-1.0)
    assert e.value.column == "gate.chain.latency_soft_budget_ms"


def test_latency_is_gated_per_request_from_the_replay_and_a_missing_figure_is_loud():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    r = gate({"base": base, "candidate": cand})
    check = next(c for c in r.checks if c.name == "request_p95_latency_ms")
    assert (
        check.cap == "promote"
        and "1100 ms vs bound 5000 ms" in check.detail
        and "8 single requests" in check.detail
    )
    assert flat_metrics(r)["check_request_p95_latency_ms"] == "promote"
    assert not any(c.name == "p95_latency_ms" for c in r.checks)  # eval's apportioned latency is not gated
    for key in ("B_request_p95_ms", "B_requests"):
        record = _chain()
        del record[key]
        with pytest.raises(ClapError, match=key) as e:
            gate({"base": base, "candidate": cand}, replay=record)
        assert e.value.rule == "missing_metric"
    with pytest.raises(ClapError, match="B_requests must be >= 1"):
        gate({"base": base, "candidate": cand}, replay={**_chain(), "B_requests": 0})
    record = _chain()
    del record["adapter_request_latency_cost_ms"]
    with pytest.raises(ClapError, match="adapter_request_latency_cost_ms"):
        chain_checks(record, P.chain)
    # calibration runs no replay and says so: no latency bound, the rest of the gate unchanged
    scored, meta = frames({"base": base, "candidate": cand})
    calib = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=None, slices=ANSWER.slices)
    assert calib.decision == "promote" and "request_p95_latency_ms" not in {c.name for c in calib.checks}


# --- the incumbent's verdict and the production decision ---------------------------------------
def _incumbent_vectors(
    n: int, base_right: int, inc_only: int, base_only: int
) -> tuple[list[bool], list[bool]]:
    """Incumbent and base pass vectors with exactly ``inc_only`` incumbent-only and ``base_only`` base-only passes."""
    base = np.zeros(n, bool)
    base[:base_right] = True
    inc = base.copy()
    inc[:base_only] = False
    inc[base_right : base_right + inc_only] = True
    return inc.tolist(), base.tolist()


def test_incumbent_worse_than_base_beyond_noise_rolls_back_with_evidence():
    inc, base = _incumbent_vectors(60, base_right=20, inc_only=1, base_only=10)
    cand = inc  # the candidate is no better than the incumbent: rejected on quality
    r = gate({"base": base, "candidate": cand, "incumbent": inc})
    assert (r.decision, r.rule) == ("reject", "quality")  # the candidate's own decision is unchanged
    v = r.incumbent
    assert (v.decision, v.rule) == ("rollback", "incumbent_quality")
    # one-sided exact McNemar, incumbent vs base: P(Bin(11, 1/2) >= 10) = (11 + 1) / 2048
    assert v.numbers["incumbent_pvalue"] == pytest.approx(12 / 2048, rel=1e-9)
    assert (v.numbers["incumbent_b"], v.numbers["incumbent_c"], v.numbers["incumbent_n_items"]) == (1, 10, 60)
    assert v.numbers["incumbent_delta"] == pytest.approx(-9 / 60)
    assert v.numbers["incumbent_pass_rate"] == pytest.approx(11 / 60)
    assert v.numbers["incumbent_base_pass_rate"] == pytest.approx(20 / 60)
    assert r.production == ("rollback", "incumbent_quality")
    flat = flat_metrics(r)
    assert flat["decision"] == "reject" and flat["production_decision"] == "rollback"
    assert flat["incumbent_decision"] == "rollback" and flat["incumbent_rule"] == "incumbent_quality"
    assert (
        flat["check_incumbent_quality"] == "rollback" and flat["check_incumbent_hallucination_rate"] == "keep"
    )
    assert all(isinstance(x, (int, float, str, bool)) for x in flat.values())
    ev = evidence_bundle(
        r, "2026-02", frames({"base": base, "candidate": cand, "incumbent": inc})[1], "f" * 64, {}, P
    )
    assert ev["decision"] == "reject" and ev["production_decision"] == "rollback"
    section = ev["incumbent_verdict"]
    assert section["decision"] == "rollback" and section["adapter"] == {
        "batch": "2026-01",
        "adapter_sha256": SHA["incumbent"],
    }
    assert [c["name"] for c in section["checks"]] == [
        "incumbent_quality",
        "incumbent_hallucination_rate",
        "incumbent_wrong_fact_rate",
    ]
    md = render_report(ev)
    assert (
        "Production: **ROLLBACK**" in md
        and "clap rollback --batch 2026-02" in md
        and "b=1 incumbent-only, c=10 base-only passes, N=60" in md
    )
    assert md.startswith("# Gate 2026-02: **REJECT** (rule: `quality`); production: **ROLLBACK**\n")


@pytest.mark.parametrize(
    "inc_only, base_only, pvalue, verdict",
    [
        (1, 8, 10 / 512, "rollback"),  # P(Bin(9, 1/2) >= 8)
        (1, 6, 8 / 128, "keep"),  # P(Bin(7, 1/2) >= 6) = 0.0625 >= alpha: may be noise
        (5, 5, 0.623046875, "keep"),  # P(Bin(10, 1/2) >= 5)
        (0, 0, 1.0, "keep"),  # the incumbent answers exactly like the base
    ],
)
def test_incumbent_verdict_follows_the_exact_test_at_the_gate_alpha(inc_only, base_only, pvalue, verdict):
    inc, base = _incumbent_vectors(60, base_right=20, inc_only=inc_only, base_only=base_only)
    v = gate({"base": base, "candidate": inc, "incumbent": inc}).incumbent
    assert v.numbers["incumbent_pvalue"] == pytest.approx(pvalue, rel=1e-9) and v.decision == verdict
    assert v.rule == ("incumbent_quality" if verdict == "rollback" else "all_checks_passed")


def test_incumbent_equal_to_base_is_kept_and_production_follows_the_candidate():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    r = gate({"base": base, "candidate": cand, "incumbent": base})
    assert r.incumbent.decision == "keep" and r.incumbent.numbers["incumbent_pvalue"] == 1.0
    assert r.decision == "promote" and r.production == ("promote", "all_checks_passed")
    assert "**KEEP**" in render_report(
        evidence_bundle(r, "2026-02", frames({"base": base})[1], "f" * 64, {}, P)
    )


def test_a_releasable_candidate_replaces_a_failing_incumbent():
    inc, base = _incumbent_vectors(60, base_right=20, inc_only=1, base_only=10)
    cand = [True] * 40 + [False] * 20  # far better than the incumbent (and the base)
    r = gate({"base": base, "candidate": cand, "incumbent": inc})
    assert r.incumbent.decision == "rollback" and r.decision == "promote"
    assert r.production == ("promote", "all_checks_passed")
    md = render_report(evidence_bundle(r, "2026-02", frames({"base": base})[1], "f" * 64, {}, P))
    assert "releasing this candidate replaces it" in md


@pytest.mark.parametrize("held", ["hold", "reject"])
def test_a_held_or_rejected_candidate_with_a_failing_incumbent_is_a_rollback(held):
    inc, base = _incumbent_vectors(60, base_right=20, inc_only=1, base_only=10)
    r = gate(
        {"base": base, "candidate": [True] * 40 + [False] * 20, "incumbent": inc},
        train={**OK_TRAIN, "health": {"hold": "stopped", "reject": "nan"}[held]},
    )
    assert r.decision == held and r.production == ("rollback", "incumbent_quality")


def test_incumbent_over_a_risk_bound_beyond_noise_rolls_back():
    inc, base = _incumbent_vectors(100, base_right=30, inc_only=0, base_only=0)  # as good as the base
    scored, meta = frames({"base": base, "candidate": inc, "incumbent": inc})
    rows = scored.index[scored["model"] == "incumbent"]
    scored.loc[rows[:12], "hallucination"] = True  # 12 % vs 5 %: lower bound 7.1 %
    r = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert (r.incumbent.decision, r.incumbent.rule) == ("rollback", "incumbent_hallucination_rate")
    assert r.incumbent.numbers["incumbent_hallucination_rate"] == pytest.approx(0.12)
    assert r.incumbent.numbers["incumbent_hallucination_rate_lcb"] == pytest.approx(0.0708, abs=1e-4)
    scored.loc[rows[:12], "hallucination"] = False
    scored.loc[rows[:6], "hallucination"] = True  # 6 %: over, but its lower bound 2.6 % is not
    noise = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert noise.incumbent.decision == "keep"
    assert noise.incumbent.numbers["incumbent_hallucination_rate_lcb"] == pytest.approx(0.0264, abs=1e-4)
    scored.loc[rows[:20], "wrong_fact"] = True  # 20 % vs 15 %: lower bound 13.7 %, not beyond noise
    assert (
        run_gate(
            scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices
        ).incumbent.decision
        == "keep"
    )
    scored.loc[rows[:30], "wrong_fact"] = True  # 30 %: lower bound 22.4 % > 15 %
    wrong = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert wrong.incumbent.rule == "incumbent_wrong_fact_rate"


def test_no_incumbent_means_no_rollback_verdict():
    cand, base = vectors(60, wins=20, losses=1, base_right=10)
    r = gate({"base": base, "candidate": cand})
    assert (r.incumbent.decision, r.incumbent.rule) == ("n/a", "no_incumbent") and r.incumbent.numbers == {}
    flat = flat_metrics(r)
    assert (
        flat["incumbent_decision"] == "n/a" and flat["production_decision"] == flat["decision"] == "promote"
    )
    assert not any(k.startswith(("incumbent_p", "check_incumbent")) for k in flat)
    md = render_report(evidence_bundle(r, "2026-02", frames({"base": base})[1], "f" * 64, {}, P))
    assert "Incumbent: n/a (no adapter in production)" in md and "Production:" not in md
    untrained = gate({"base": base}, train={"trained": 0, "health": "skipped"}, admit={"admitted": 0})
    assert untrained.incumbent.decision == "n/a" and untrained.production == ("reject", "admission")


def test_the_candidate_that_is_the_production_adapter_is_judged_as_the_incumbent():
    inc, base = _incumbent_vectors(60, base_right=20, inc_only=1, base_only=10)
    scored, meta = frames({"base": base, "candidate": inc})
    meta["production"] = {"role": "incumbent", "batch": "2026-02", "adapter_sha256": SHA["candidate"]}
    r = run_gate(scored, meta, OK_TRAIN, ADMITTED, P, replay=_chain(), slices=ANSWER.slices)
    assert r.incumbent.decision == "rollback" and "IS the production adapter" in r.incumbent.reason
    assert r.incumbent.adapter == {"batch": "2026-02", "adapter_sha256": SHA["candidate"]}


def test_the_gate_and_release_agree_on_what_is_releasable():
    from clap.judge.gating import PRODUCTION_DECISIONS, RELEASABLE
    from clap.release.approval import RELEASABLE as RELEASE_ACCEPTS

    assert RELEASABLE == RELEASE_ACCEPTS and set(PRODUCTION_DECISIONS) == {*DECISION_CODE, "rollback"}
