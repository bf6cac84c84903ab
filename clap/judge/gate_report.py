"""The gate's evidence bundle and report: what :func:`clap.judge.gating.run_gate` decided, rendered.

:mod:`clap.judge.gating` decides (rules, checks, the decision and its rule); this module only
formats a decided :class:`~clap.judge.gating.GateResult` into the evidence bundle (JSON: every
number, check and regressed sample a reviewer needs) and the Markdown report a pull request shows.
Nothing here changes a decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from clap import vcs
from clap.judge import detector_plot
from clap.judge.gating import (
    DECISION_CODE,
    Check,
    GateParams,
    GateResult,
    IncumbentVerdict,
    offline_decision,
    regressions_by_slice,
)


def regressed_samples(regressed: pd.DataFrame, limit: int, slices: Sequence[str]) -> list[dict[str, Any]]:
    """The first ``limit`` regressed items with both answers (for the evidence bundle)."""
    cols = ["item_id", *slices, "output_baseline", "output"]
    rows = regressed[cols].head(limit).rename(columns={"output": "output_candidate"})
    return rows.to_dict("records")


def evidence_bundle(
    result: GateResult,
    batch: str,
    meta: Mapping[str, Any],
    items_sha256: str,
    params_used: Mapping[str, Any],
    p: GateParams,
) -> dict[str, Any]:
    """Everything the decision rests on: hashes of data, params, models and records; the regressions."""
    models = {m["role"]: m for m in meta["models"]}
    return {
        "batch": batch,
        "decision": result.decision,
        "decision_code": DECISION_CODE[result.decision],
        "rule": result.rule,
        "production_decision": result.production[0],
        "production_rule": result.production[1],
        "incumbent_verdict": incumbent_section(result.incumbent),
        "reasons": [dataclasses.asdict(c) for c in result.checks],
        "numbers": result.numbers,
        "datasets_sha256": dict(meta["datasets"]),
        "params": dict(params_used),
        "base_sha256": meta["base_sha256"],
        "adapter_sha256": models.get("candidate", {}).get("adapter_sha256", ""),
        "incumbent": models.get("incumbent", {}),
        "eval_items_sha256": items_sha256,
        "git_commit": vcs.commit_or_unknown(),
        "regressed": {
            "count": int(len(result.regressed)),
            "item_ids": [str(i) for i in result.regressed["item_id"]],
            "by_slice": regressions_by_slice(result.regressed, result.slice_columns),
            "samples": regressed_samples(result.regressed, p.max_regressed_samples, result.slice_columns),
        },
        "slices": {
            "alpha": p.slices.alpha,
            "regressed": [s for s in result.slices if s["p_adjusted"] < p.slices.alpha],
            "tests": list(result.slices),
        },
        **(
            {"answer_metric": {"name": "tatqa", "rows": result.answer_metric}} if result.answer_metric else {}
        ),
    }


def incumbent_section(v: IncumbentVerdict) -> dict[str, Any]:
    """The evidence bundle's incumbent verdict: decision, rule, why, each check, its numbers and the
    adapter judged (batch, sha256)."""
    return {
        "decision": v.decision,
        "rule": v.rule,
        "reason": v.reason,
        "adapter": dict(v.adapter),
        "checks": [dataclasses.asdict(c) for c in v.checks],
        "numbers": dict(v.numbers),
    }


def incumbent_lines(evidence: Mapping[str, Any]) -> list[str]:
    """The report's incumbent section and, when it differs from the candidate's, the production decision."""
    inc = evidence.get("incumbent_verdict") or {}
    if not inc or inc["decision"] == "n/a":
        return ["", f"Incumbent: n/a ({inc.get('reason', 'no adapter in production')})."]
    who = inc["adapter"]
    lines = [
        "",
        f"Incumbent (production adapter, batch {who.get('batch')}, sha256 `{str(who.get('adapter_sha256'))[:12]}`) "
        f"on this batch's items against the base: **{inc['decision'].upper()}** (rule: `{inc['rule']}`).",
        "",
        "| incumbent check | verdict | detail |",
        "|---|---|---|",
        *[f"| {c['name']} | {c['cap']} | {c['detail']} |" for c in inc["checks"]],
    ]
    if evidence["production_decision"] == "rollback":
        lines += [
            "",
            f"Production: **ROLLBACK** (rule `{evidence['production_rule']}`): the incumbent fails and the candidate "
            f"({evidence['decision']}) is not releasable. `clap rollback --batch {evidence['batch']}` acts on it.",
        ]
    elif inc["decision"] == "rollback":
        lines += [
            "",
            f"Production: **{evidence['production_decision'].upper()}**: the incumbent fails, and releasing this "
            "candidate replaces it.",
        ]
    return lines


CHAIN_REPORTED = (
    ("value", "value_accuracy"),
    ("core fields", "core_accuracy"),
    ("answer evidence", "answer_evidence_rate"),
)


def answer_metric_lines(evidence: Mapping[str, Any], baseline: str) -> list[str]:
    """The report's TAT-QA EM/F1 table (baseline and candidate, overall and per slice value); none
    when eval did not score them (params ``eval.answer_metric: none``)."""
    rows = evidence.get("answer_metric", {}).get("rows", [])
    if not rows:
        return []
    lines = [
        "",
        f"TAT-QA exact match and numeracy-focused F1 (`eval.answer_metric: tatqa`), {baseline} → candidate. "
        "Reported only: the gate's decision does not use them (clap's own fields decide).",
        "",
        "| slice | items | EM baseline | EM candidate | F1 baseline | F1 candidate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        name = "all items" if r["slice"] == "all" else f"{r['slice']} = {r['value']}"
        lines.append(
            f"| {name} | {r['n']} | {r['baseline_em']:.3f} | {r['candidate_em']:.3f} "
            f"| {r['baseline_f1']:.3f} | {r['candidate_f1']:.3f} |"
        )
    return lines


def render_report(evidence: Mapping[str, Any]) -> str:
    """A short, PR-ready markdown report of one gate decision."""
    n = evidence["numbers"]
    lines = [
        f"# Gate {evidence['batch']}: **{evidence['decision'].upper()}** (rule: `{evidence['rule']}`)"
        + (
            f"; production: **{evidence['production_decision'].upper()}**"
            if evidence["production_decision"] != evidence["decision"]
            else ""
        ),
        "",
        f"Baseline: **{n['baseline']}** — {n['baseline_reason']}.",
        "",
        "| check | allows | detail |",
        "|---|---|---|",
        *[f"| {c['name']} | {c['cap']} | {c['detail']} |" for c in evidence["reasons"]],
    ]
    lines += incumbent_lines(evidence)
    lines += detector_plot.report_lines(evidence)
    if "delta" in n:
        power = f"{n['rule_power_target']:.0%}"  # gate.power: the MDE and the N needed are computed at it
        lines += [
            "",
            f"Quality: pass rate {n['baseline_pass_rate']:.3f} → {n['candidate_pass_rate']:.3f}, overall {n['baseline_overall']:.3f} → {n['candidate_overall']:.3f}; "
            "the gate's whole quality rule (p < alpha, delta >= delta*, LCB >= floor; exact enumeration): "
            f"promotes a true gain of exactly delta* with probability {n['rule_power_at_delta_star']:.2f} at N={n['n_items']} and the planned discordance"
            + (
                f", {n['rule_power_at_delta_star_observed']:.2f} at the observed discordance {n['discordance']:.2f}"
                if n["rule_power_at_delta_star_observed"] >= 0
                else f" (observed discordance {n['discordance']:.2f} is below delta*)"
            )
            + f"; {power} power from a true gain of {n['rule_mde_observed']:.3f} (observed discordance), "
            f"{n['rule_mde_planned']:.3f} (planned); N needed for {power} power at gate.planning_delta and the planned discordance: {n['rule_n_required_planned']}. "
            "The LCB is Tango's score bound: approximate (worst measured coverage 91-94 % at N = 40-300, not 95 %).",
        ]
    sl = evidence.get("slices", {})
    if sl.get("regressed"):
        lines += [
            "",
            f"Regressed slices (Holm over {len(sl['tests'])} slices, family-wise alpha {sl['alpha']}):",
        ]
        lines += [
            f"- {s['slice']} = {s['value']}: b={s['b']}, c={s['c']} (of {s['n']}), p={s['pvalue']:.3g}, Holm-adjusted p={s['p_adjusted']:.3g}"
            for s in sl["regressed"]
        ]
    lines += answer_metric_lines(evidence, n.get("baseline", "baseline"))
    chain = evidence.get("replay", {})
    if chain.get("A_run") and chain.get("B_run"):
        lines += [
            "",
            f"Application chain ({chain['n_cases']} replay cases, `reports/replay/{evidence['batch']}/report.md`), A base+RAG → B adapter+RAG: "
            + ", ".join(
                f"{label} {chain[f'A_{k}']:.3f} → {chain[f'B_{k}']:.3f}" for label, k in CHAIN_REPORTED
            )
            + f"; the decision without these `chain_*` checks: {offline_decision(Check(**c) for c in evidence['reasons'])[0]}.",
            "",
            f"Latency as a `clap serve` user meets it ({chain['B_requests']} single requests through the chain per model, "
            f"after warm-up): p50 {chain['A_request_p50_ms']:.0f} → {chain['B_request_p50_ms']:.0f} ms, "
            f"p95 {chain['A_request_p95_ms']:.0f} → {chain['B_request_p95_ms']:.0f} ms "
            f"(adapter cost {chain['adapter_request_latency_cost_ms']:+.0f} ms); the latency checks read these. "
            "Batched throughput and apportioned per-item latency (metrics/eval, metrics/replay) are reported only.",
        ]
    reg = evidence["regressed"]
    lines += ["", f"Regressed items (baseline right, candidate wrong): {reg['count']}"]
    for col, counts in reg["by_slice"].items():
        if counts:
            lines.append(f"- by {col}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if reg["item_ids"]:
        lines.append(f"- IDs: {', '.join(reg['item_ids'])}")
    lines += [
        "",
        f"Evidence: `evidence.json` — base `{evidence['base_sha256'][:12]}`, adapter `{(evidence['adapter_sha256'] or 'none')[:12]}`, "
        f"eval items `{evidence['eval_items_sha256'][:12]}`, commit `{evidence['git_commit'][:12]}`.",
        "",
    ]
    return "\n".join(lines)
