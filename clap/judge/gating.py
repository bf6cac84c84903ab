"""The post-training gate: promote(M') iff quality(M') >= quality(M) and risk(M') <= tau.

Each check caps the decision (promote > canary > hold > reject); the decision is the
lowest cap and the rule is the check that set it, so every outcome carries the exact
reason and all the others. Quality: one-sided exact McNemar on paired pass/fail against
the baseline M with a pre-registered margin delta* and a lower confidence bound (the power,
MDE and N reported are of that whole rule, :func:`clap.judge.stats.rule_power`); slices: a
Holm-adjusted one-sided exact regression test per slice caps the decision (``gate.slices``); risk:
hallucination and wrong-fact rates, regressed items, and the p95 per-request latency of
adapter+RAG (measured by replay one request at a time, as ``clap serve`` answers: eval's
batched, apportioned latency and throughput are diagnostics, never gated) against bounds; plus
the training health and the admission verdict; and the application-chain replay's numbers
(``chain_*`` checks, policy ``gate.chain``: the gate stage runs after replay). Mapping
(research notes, Argo Rollouts):
inconclusive -> hold, failed -> reject, quality passes with a risk near its bound ->
canary, not admitted or training failed -> reject. A rate over its bound is "failed" only
when its exact one-sided lower bound is over it too; at the demo's N = 40 one extra
hallucination (3/40 against 0.05) is noise, so it holds for a human instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from clap.errors import ClapError
from clap.judge.stats import (
    PairedResult,
    Rule,
    discordant_counts,
    holm,
    paired_test,
    rate_lcb,
    rule_mde,
    rule_power,
    rule_required_pairs,
    slice_regression_pvalue,
)
from clap.params import check_keys

DECISIONS = ("reject", "hold", "canary", "promote")  # index = decision code in the flat metrics
DECISION_CODE = {d: i for i, d in enumerate(DECISIONS)}
CHAIN_PREFIX = "chain_"  # names of the checks on the application-chain replay
RELEASABLE = (
    "promote",
    "canary",
)  # what `clap release` accepts (clap.release.approval.RELEASABLE, tested equal)
INCUMBENT_VERDICTS = ("keep", "rollback", "n/a")  # the production adapter on this batch's items
PRODUCTION_DECISIONS = (*DECISIONS, "rollback")  # the batch's decision for production


@dataclasses.dataclass(frozen=True)
class ChainPolicy:
    """Params ``gate.chain``: what the application-chain replay (metrics/replay) must show."""

    core_tolerance: float
    evidence_tolerance: float
    value_tolerance: float
    min_value_accuracy: float
    latency_soft_budget_ms: float

    def __post_init__(self) -> None:
        check_keys(
            {
                "gate.chain.core_tolerance": self.core_tolerance >= 0,
                "gate.chain.evidence_tolerance": self.evidence_tolerance >= 0,
                "gate.chain.value_tolerance": self.value_tolerance >= 0,
                "gate.chain.latency_soft_budget_ms": self.latency_soft_budget_ms >= 0,
                "gate.chain.min_value_accuracy": 0 <= self.min_value_accuracy <= 1,
            },
            "gate.chain: tolerances and latency budget >= 0, min_value_accuracy in [0, 1]",
        )


@dataclasses.dataclass(frozen=True)
class SlicePolicy:
    """Params ``gate.slices``: per-slice paired tests for regression (Holm over every slice)."""

    alpha: float
    regression: str

    def __post_init__(self) -> None:
        check_keys(
            {
                "gate.slices.alpha": 0.0 < self.alpha < 1.0,
                "gate.slices.regression": self.regression in DECISIONS,
            },
            f"gate.slices: 0 < alpha < 1 and regression one of {DECISIONS}",
        )


@dataclasses.dataclass(frozen=True)
class GateParams:
    """Params section ``gate`` (the pre-registered release policy)."""

    baseline: str
    alpha: float
    delta_star: float
    lcb_floor: float
    power: float
    planning_discordance: float
    planning_delta: float
    max_hallucination_rate: float
    max_wrong_fact_rate: float
    max_regressed_rate: float
    max_p95_latency_ms: float
    risk_alpha: float
    near_bound: float
    health: dict[str, str]
    min_prompt_masked: float
    unmasked: str
    max_regressed_samples: int
    slices: SlicePolicy
    chain: ChainPolicy

    def __post_init__(self) -> None:
        bad = {k: v for k, v in {**self.health, "unmasked": self.unmasked}.items() if v not in DECISIONS}
        check_keys(
            {
                "gate.baseline": self.baseline in ("incumbent", "base"),
                **{f"gate.health.{k}": v in DECISIONS for k, v in self.health.items()},
                "gate.unmasked": self.unmasked in DECISIONS,
                "gate.near_bound": 0.0 < self.near_bound <= 1.0,
                "gate.risk_alpha": 0.0 < self.risk_alpha < 1.0,
                "gate.min_prompt_masked": 0.0 <= self.min_prompt_masked <= 1.0,
                "gate.alpha": 0.0 < self.alpha < 1.0,
                "gate.power": 0.0 < self.power < 1.0,
                "gate.delta_star": 0.0 <= self.delta_star,
                "gate.planning_delta": self.delta_star < self.planning_delta,
                "gate.planning_discordance": self.planning_delta <= self.planning_discordance <= 1.0,
            },
            f"gate: baseline must be incumbent|base, health and unmasked values one of {DECISIONS}, 0 < near_bound <= 1, 0 < risk_alpha < 1, "
            f"0 <= min_prompt_masked <= 1, 0 < alpha, power < 1, 0 <= delta_star < planning_delta <= planning_discordance <= 1 "
            f"(bad decisions: {bad})",
        )

    @property
    def rule(self) -> Rule:
        """The quality rule :func:`quality_check` promotes by, for its power figures."""
        return Rule(self.alpha, self.delta_star, self.lcb_floor)


@dataclasses.dataclass(frozen=True)
class Check:
    """One gate check: the best decision it allows and why."""

    name: str
    cap: str
    detail: str


@dataclasses.dataclass(frozen=True)
class GateResult:
    """The decision with its rule, every check, and the numbers behind them."""

    decision: str
    rule: str
    checks: list[Check]
    numbers: dict[str, Any]
    regressed: pd.DataFrame
    slices: list[dict[str, Any]]
    slice_columns: tuple[str, ...]  # the item columns results are broken down by (the answer's slices)
    answer_metric: list[
        dict[str, Any]
    ]  # TAT-QA EM/F1 of baseline and candidate (:func:`answer_metric_table`)
    incumbent: IncumbentVerdict  # the production adapter on these items (:func:`incumbent_verdict`)

    @property
    def production(self) -> tuple[str, str]:
        """(decision, rule) for production: :func:`production_decision`."""
        return production_decision(self.decision, self.rule, self.incumbent)


@dataclasses.dataclass(frozen=True)
class IncumbentVerdict:
    """The production adapter judged on this batch's held-out items against the base.

    ``decision`` is keep, rollback or n/a (nothing in production, or no items); ``rule`` the
    check that decided it (``all_checks_passed`` for keep, ``no_incumbent`` for n/a); each
    check's ``cap`` is keep or rollback. ``adapter`` names the adapter judged (batch, sha256):
    `clap rollback --batch` refuses to act when another adapter is in production by then.
    """

    decision: str
    rule: str
    reason: str
    checks: list[Check]
    numbers: dict[str, Any]
    adapter: dict[str, Any]


def choose_baseline(meta: Mapping[str, Any], p: GateParams) -> tuple[str, str]:
    """(baseline role, why): the incumbent when policy and availability allow, else the base."""
    models = {m["role"]: m for m in meta["models"]}
    if p.baseline == "base":
        return "base", "policy compares against the base model"
    if "incumbent" in models:
        inc = models["incumbent"]
        return (
            "incumbent",
            f"incumbent adapter in production (batch {inc['batch']}, sha256 {inc['adapter_sha256'][:12]})",
        )
    production = meta.get("production") or {}
    if production and models.get("candidate", {}).get("adapter_sha256") == production.get("adapter_sha256"):
        return (
            "base",
            f"the candidate IS the production adapter (batch {production.get('batch')}); compared against the base, not itself",
        )
    return "base", "no adapter in production: compared against the base model"


def admission_check(admit: Mapping[str, Any]) -> Check:
    """Reject a batch the pre-training gate did not admit."""
    admitted = _require(admit, "admitted", "metrics/admit")
    if admitted not in (0, 1):  # True/False compare equal to 1/0
        raise ClapError(
            f"metrics/admit 'admitted' must be 0 or 1, got {admitted!r}", column="admitted", rule="bad_metric"
        )
    if admitted == 1:
        return Check("admission", "promote", "batch admitted by the pre-training gate")
    return Check("admission", "reject", "batch NOT admitted by the pre-training gate")


def health_check(train: Mapping[str, Any], p: GateParams) -> Check:
    """Cap by training health (policy map, e.g. nan/alarm/skipped -> reject, stopped -> hold)."""
    health = str(_require(train, "health", "metrics/train"))
    if health not in p.health:
        raise ClapError(
            f"training health {health!r} has no entry in params gate.health {sorted(p.health)}",
            column="health",
            rule="unknown_health",
        )
    return Check("training_health", p.health[health], f"training health {health!r}{_health_detail(train)}")


def masking_check(train: Mapping[str, Any], p: GateParams) -> Check:
    """Cap when the training loss covered prompt tokens: the share of prompt tokens whose labels
    were masked, measured on the trainer's own dataset (TRL trains on the prompt of
    ``messages``/``text`` datasets unless told; the loss still falls and the detector may not see it)."""
    if not train.get("trained", 1):
        return Check("loss_masking", "promote", "not trained")
    masked = float(_require(train, "masked_tokens_fraction", "metrics/train")) * float(
        _require(train, "label_tokens", "metrics/train")
    )
    share = masked / max(float(_require(train, "prompt_tokens", "metrics/train")), 1.0)
    text = f"{share:.1%} of prompt tokens masked from the loss (minimum {p.min_prompt_masked:.0%})"
    return Check("loss_masking", p.unmasked if share < p.min_prompt_masked else "promote", text)


def _health_detail(train: Mapping[str, Any]) -> str:
    """What the training record says about its health: the alarm, the stop, or why it was skipped."""
    if not train.get("trained", 1):
        return f": not trained ({train.get('skip_reason', 'no reason recorded')})"
    parts = []
    if int(train.get("detector_alarm_step", -1)) > 0:
        parts.append(
            f"TBDL detector alarm at step {train['detector_alarm_step']} of {train.get('planned_steps', '?')} "
            f"(max log E {float(train.get('detector_max_log_e', float('nan'))):.2f} >= {float(train.get('detector_log_threshold', float('nan'))):.2f})"
        )
    if int(train.get("stop_step", -1)) > 0:
        parts.append(f"training stopped at step {train['stop_step']}")
    return ": " + "; ".join(parts) if parts else ""


def candidate_missing_check(train: Mapping[str, Any], p: GateParams) -> Check:
    """No candidate was evaluated. When training did not run, its health says why and the
    ``gate.health`` policy caps (skipped -> reject; over_budget -> hold: nothing was spent, a human
    may raise the budget); a trained batch without a candidate is a reject."""
    if not train.get("trained", 1):
        health = str(_require(train, "health", "metrics/train"))
        return Check(
            "candidate",
            p.health[health],
            f"no candidate adapter: not trained (training health {health!r}: {train.get('skip_reason', 'no reason recorded')})",
        )
    return Check("candidate", "reject", "no trained candidate adapter was evaluated")


def quality_check(test: PairedResult, p: GateParams) -> Check:
    """Pass: p < alpha, delta >= delta* and LCB >= floor; gain below delta*: fail; else inconclusive."""
    stats = f"b={test.b}, c={test.c}, N={test.n}, delta={test.delta:+.3f}, p={test.pvalue:.4f}, LCB={test.lcb:+.3f}"
    if test.delta < p.delta_star:
        return Check(
            "quality", "reject", f"gain below the pre-registered margin delta*={p.delta_star} ({stats})"
        )
    if test.pvalue < p.alpha and test.lcb >= p.lcb_floor:
        return Check("quality", "promote", f"significant gain >= delta* ({stats})")
    return Check(
        "quality",
        "hold",
        f"gain >= delta* but not conclusive at alpha={p.alpha}, LCB floor {p.lcb_floor} ({stats})",
    )


def bound_check(
    name: str, value: float, bound: float, p: GateParams, unit: str = "", *, lcb: float | None = None
) -> Check:
    """A risk against its bound: over -> reject, within near_bound x bound of it -> canary.

    With ``lcb`` (the rate's exact one-sided lower bound) a value over the bound rejects only
    when the lower bound is over it too; otherwise the excess may be sampling noise: hold.
    """
    text = f"{name} {value:.4g}{unit} vs bound {bound:g}{unit}"
    eps = 1e-12 * max(1.0, abs(bound))  # rates are ratios of counts: 4/100 must meet 0.8 x 0.05
    if value > bound + eps:
        if lcb is None or lcb > bound + eps:
            return Check(
                name,
                "reject",
                f"{text}: over the bound"
                + ("" if lcb is None else f" ({1 - p.risk_alpha:.0%} lower bound {lcb:.4g})"),
            )
        return Check(
            name,
            "hold",
            f"{text}: over the bound, but not beyond sampling noise ({1 - p.risk_alpha:.0%} lower bound {lcb:.4g} <= bound)",
        )
    if value >= p.near_bound * bound - eps:
        return Check(name, "canary", f"{text}: near the bound (>= {p.near_bound:g} x bound)")
    return Check(name, "promote", f"{text}: within")


def paired_frame(scored: pd.DataFrame, candidate: str, baseline: str, slices: Sequence[str]) -> pd.DataFrame:
    """Candidate and baseline rows side by side per item, in eval order."""
    cols = ["item_id", "position", *slices, "pass", "output", "overall"]
    c = scored[scored["model"] == candidate][cols].set_index("item_id")
    b = scored[scored["model"] == baseline][["item_id", "pass", "output", "overall"]].set_index("item_id")
    if len(c) == 0 or len(b) == 0 or set(c.index) != set(b.index):
        raise ClapError(
            f"eval records do not pair {candidate!r} with {baseline!r} on the same items",
            rule="unpaired_eval",
        )
    return c.join(b, rsuffix="_baseline").sort_values("position").reset_index()


def answer_metric_table(
    scored: pd.DataFrame, candidate: str, baseline: str, slices: Sequence[str]
) -> list[dict[str, Any]]:
    """TAT-QA's mean EM and F1 (eval's per-item ``em``/``f1``, params ``eval.answer_metric: tatqa``) of
    the baseline and the candidate, over all items (slice ``all``) and per value of each slice column,
    with the number of items; ``[]`` when eval did not score them. Reported only: no check reads it."""
    if not {"em", "f1"} <= set(scored.columns):
        return []
    cols = ["item_id", *slices, "em", "f1"]
    c = scored[scored["model"] == candidate][cols].set_index("item_id")
    b = scored[scored["model"] == baseline][["item_id", "em", "f1"]].set_index("item_id")
    pairs = c.join(b, rsuffix="_baseline")

    def row(name: str, value: str, part: pd.DataFrame) -> dict[str, Any]:
        return {
            "slice": name,
            "value": value,
            "n": int(len(part)),
            **{f"baseline_{m}": float(part[f"{m}_baseline"].astype(float).mean()) for m in ("em", "f1")},
            **{f"candidate_{m}": float(part[m].astype(float).mean()) for m in ("em", "f1")},
        }

    rows = [row("all", "", pairs)]
    for col in slices:
        rows += [row(col, str(v), part) for v, part in pairs.groupby(col, sort=True)]
    return rows


def regressed_items(pairs: pd.DataFrame) -> pd.DataFrame:
    """Items the baseline got right and the candidate got wrong."""
    return pairs[pairs["pass_baseline"] & ~pairs["pass"]].reset_index(drop=True)


def regressions_by_slice(regressed: pd.DataFrame, slices: Sequence[str]) -> dict[str, dict[str, int]]:
    """Count of regressed items per value of each slice column (the key fields, source, ...)."""
    return {s: {str(k): int(v) for k, v in regressed[s].value_counts().sort_index().items()} for s in slices}


def slice_tests(pairs: pd.DataFrame, slices: Sequence[str]) -> list[dict[str, Any]]:
    """Every slice (each value of each column in ``slices``) with its paired counts and the one-sided
    exact regression p-value P(Bin(b + c, 1/2) >= c), Holm-adjusted over all of them.

    A slice without discordant pairs is listed with p = 1 (it can never be significant).
    """
    rows = []
    for col in slices:
        for value, part in pairs.groupby(col, sort=True):
            b = int((part["pass"] & ~part["pass_baseline"]).sum())
            c = int((~part["pass"] & part["pass_baseline"]).sum())
            rows.append(
                {
                    "slice": col,
                    "value": str(value),
                    "n": int(len(part)),
                    "b": b,
                    "c": c,
                    "pvalue": slice_regression_pvalue(b, c),
                }
            )
    for row, adjusted in zip(rows, holm([r["pvalue"] for r in rows]) if rows else []):
        row["p_adjusted"] = float(adjusted)
    return rows


def slice_check(slices: Sequence[Mapping[str, Any]], p: SlicePolicy) -> Check:
    """Cap at ``gate.slices.regression`` when any slice regresses significantly after Holm
    (adjusted p < ``gate.slices.alpha``): an average gain never hides a regressed slice."""
    bad = [s for s in slices if s["p_adjusted"] < p.alpha]
    if not bad:
        return Check(
            "slice_regression",
            "promote",
            f"no slice regresses at family-wise alpha={p.alpha} (Holm over {len(slices)} slices)",
        )
    named = "; ".join(
        f"{s['slice']}={s['value']} (b={s['b']}, c={s['c']}, p={s['pvalue']:.3g}, Holm p={s['p_adjusted']:.3g})"
        for s in bad
    )
    return Check(
        "slice_regression",
        p.regression,
        f"{len(bad)} slice(s) regress at family-wise alpha={p.alpha} (Holm over {len(slices)} slices): {named}",
    )


def _chain_not_worse(name: str, m: Mapping[str, Any], key: str, tol: float) -> Check:
    a, b = float(_require(m, f"A_{key}", "metrics/replay")), float(_require(m, f"B_{key}", "metrics/replay"))
    text = f"chain B {b:.3f} vs A {a:.3f} (tolerance {tol:g})"
    if b < a - tol - 1e-12:  # rates are ratios of counts: equality must not flip on float noise
        return Check(name, "hold", f"{text}: the adapter is worse inside the chain than the base")
    return Check(name, "promote", f"{text}: not worse")


def chain_checks(replay: Mapping[str, Any], p: ChainPolicy) -> list[Check]:
    """The replay's numbers (A base+RAG, B adapter+RAG) against ``gate.chain``: B not worse than A
    on core fields, answer evidence and value; B's value accuracy over a floor (an adapter that
    wins offline but not inside the application chain is held); the adapter's per-request p95
    latency cost (B request p95 - A request p95) over a soft budget caps at canary."""
    if not _require(replay, "n_cases", "metrics/replay"):
        return [Check("chain_cases", "hold", "no replay cases: the chain was not exercised")]
    if not (_require(replay, "A_run", "metrics/replay") and _require(replay, "B_run", "metrics/replay")):
        return [
            Check(
                "chain_adapter",
                "hold",
                "no trained adapter: replay conditions B and D not run, nothing to release",
            )
        ]
    checks = [
        _chain_not_worse("chain_core_fields", replay, "core_accuracy", p.core_tolerance),
        _chain_not_worse("chain_answer_evidence", replay, "answer_evidence_rate", p.evidence_tolerance),
        _chain_not_worse("chain_value", replay, "value_accuracy", p.value_tolerance),
    ]
    b = float(replay["B_value_accuracy"])
    floor = f"chain B value accuracy {b:.3f} vs floor {p.min_value_accuracy:g}"
    checks.append(
        Check(
            "chain_value_floor",
            "hold",
            f"{floor}: the offline gain does not carry into the application chain",
        )
        if b < p.min_value_accuracy - 1e-12
        else Check("chain_value_floor", "promote", f"{floor}: the chain answers")
    )
    cost = float(_require(replay, "adapter_request_latency_cost_ms", "metrics/replay"))
    over = cost > p.latency_soft_budget_ms
    checks.append(
        Check(
            "chain_latency_cost",
            "canary" if over else "promote",
            f"adapter per-request p95 latency cost in the chain {cost:+.0f} ms vs soft budget {p.latency_soft_budget_ms:g} ms"
            + (": over, canary first" if over else ""),
        )
    )
    return checks


def decide(checks: Sequence[Check]) -> tuple[str, str]:
    """(decision, rule): the lowest cap and the first check that set it (``all_checks_passed`` when none capped)."""
    low = min(checks, key=lambda c: DECISION_CODE[c.cap])
    return low.cap, (low.name if low.cap != "promote" else "all_checks_passed")


def offline_decision(checks: Iterable[Check]) -> tuple[str, str]:
    """(decision, rule) without the ``chain_*`` checks: held-out eval, training and admission only."""
    return decide([c for c in checks if not c.name.startswith(CHAIN_PREFIX)])


def _require(record: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in record:
        raise ClapError(f"{what} record lacks {key!r}", column=key, rule="missing_metric")
    return record[key]


def request_latency_checks(replay: Mapping[str, Any], p: GateParams) -> tuple[list[Check], dict[str, float]]:
    """The candidate's p95 per-request latency (metrics/replay ``B_request_p95_ms``: adapter+RAG
    answering one request at a time, as ``clap serve`` does) against ``max_p95_latency_ms``.

    A risk check, not a ``chain_*`` one: it counts in the offline decision too. No replay
    condition B (no adapter, no cases): no check (the candidate and chain checks already cap)."""
    if not _require(replay, "B_run", "metrics/replay"):
        return [], {}
    value = float(_require(replay, "B_request_p95_ms", "metrics/replay"))
    n = int(_require(replay, "B_requests", "metrics/replay"))
    if n < 1:
        raise ClapError(
            "metrics/replay B_requests must be >= 1: no per-request latency was measured",
            column="B_requests",
            rule="missing_metric",
        )
    check = bound_check("request_p95_latency_ms", value, p.max_p95_latency_ms, p, " ms")
    detail = f"{check.detail} (adapter+RAG, {n} single requests through the chain)"
    return [Check(check.name, check.cap, detail)], {"request_p95_latency_ms": value, "latency_requests": n}


def risk_checks(
    scored: pd.DataFrame, regressed: pd.DataFrame, p: GateParams
) -> tuple[list[Check], dict[str, float]]:
    """Hallucination, wrong-fact and regression checks of the candidate (latency:
    :func:`request_latency_checks`, on the replay's per-request timings)."""
    cand = scored[scored["model"] == "candidate"]
    n = len(cand)
    counts = {
        "hallucination": int(cand["hallucination"].sum()),
        "wrong_fact": int(cand["wrong_fact"].sum()),
        "regressed": int(len(regressed)),
    }
    bounds = {
        "hallucination": p.max_hallucination_rate,
        "wrong_fact": p.max_wrong_fact_rate,
        "regressed": p.max_regressed_rate,
    }
    numbers: dict[str, float] = {"regressed_count": counts["regressed"]}
    checks = []
    for name, k in counts.items():
        rate, lcb = k / n, rate_lcb(k, n, p.risk_alpha)
        numbers.update({f"{name}_rate": rate, f"{name}_rate_lcb": lcb})
        checks.append(bound_check(f"{name}_rate", rate, bounds[name], p, lcb=lcb))
    return checks, numbers


def quality_numbers(test: PairedResult, pairs: pd.DataFrame, p: GateParams) -> dict[str, Any]:
    """Flat quality numbers: the test, pass rates and overall of both sides, and the power
    figures of the gate's whole quality rule (:class:`clap.judge.stats.Rule`, exact enumeration):
    its MDE at the N used, the N it needs to promote ``planning_delta`` with ``power``, and its
    power at a true gain of exactly delta* (-1 where the observed discordance is below delta*:
    no such gain is possible there)."""
    rule = p.rule
    observed = test.discordance >= p.delta_star and test.discordance > 0
    return {
        "n_items": test.n,
        "b": test.b,
        "c": test.c,
        "delta": test.delta,
        "pvalue": test.pvalue,
        "lcb": test.lcb,
        "discordance": test.discordance,
        "candidate_pass_rate": float(pairs["pass"].mean()),
        "baseline_pass_rate": float(pairs["pass_baseline"].mean()),
        "candidate_overall": float(pairs["overall"].mean()),
        "baseline_overall": float(pairs["overall_baseline"].mean()),
        "rule_power_target": p.power,
        "rule_mde_observed": rule_mde(test.n, test.discordance, rule, p.power),
        "rule_mde_planned": rule_mde(test.n, p.planning_discordance, rule, p.power),
        "rule_power_at_delta_star": rule_power(test.n, p.delta_star, p.planning_discordance, rule),
        "rule_power_at_delta_star_observed": (
            rule_power(test.n, p.delta_star, test.discordance, rule) if observed else -1.0
        ),
        "rule_n_required_planned": rule_required_pairs(
            p.planning_delta, p.planning_discordance, rule, p.power
        ),
    }


def incumbent_rows(meta: Mapping[str, Any]) -> tuple[str | None, dict[str, Any], str]:
    """(role of the scored rows that are the production adapter's answers, its identity, why).

    The ``incumbent`` rows when eval scored one; the ``candidate`` rows when the candidate IS the
    production adapter (eval then leaves the incumbent out: same weights); None with nothing in
    production."""
    models = {m["role"]: m for m in meta["models"]}
    if "incumbent" in models:
        inc = models["incumbent"]
        return "incumbent", {"batch": inc["batch"], "adapter_sha256": inc["adapter_sha256"]}, "incumbent"
    production = meta.get("production") or {}
    if production and models.get("candidate", {}).get("adapter_sha256") == production.get("adapter_sha256"):
        who = {"batch": production.get("batch"), "adapter_sha256": production["adapter_sha256"]}
        return "candidate", who, "the candidate IS the production adapter: its answers are the incumbent's"
    return None, {}, "no adapter in production"


def _incumbent_bound(name: str, k: int, n: int, bound: float, p: GateParams) -> Check:
    """The incumbent's rate against the candidate's bound: rollback only beyond noise (LCB over it)."""
    rate, lcb = k / n, rate_lcb(k, n, p.risk_alpha)
    text = f"incumbent {name} {rate:.4g} ({k}/{n}) vs bound {bound:g}, {1 - p.risk_alpha:.0%} lower bound {lcb:.4g}"
    eps = 1e-12 * max(1.0, abs(bound))
    if lcb > bound + eps:
        return Check(f"incumbent_{name}", "rollback", f"{text}: over the bound beyond sampling noise")
    return Check(f"incumbent_{name}", "keep", f"{text}: not over the bound beyond noise")


def incumbent_verdict(scored: pd.DataFrame, meta: Mapping[str, Any], p: GateParams) -> IncumbentVerdict:
    """Keep or roll back the production adapter, judged on this batch's held-out items.

    ``incumbent_quality``: paired one-sided exact McNemar of the incumbent against the base on
    the same items, P(Bin(b + c, 1/2) >= c) with b incumbent-only and c base-only passes;
    p < ``gate.alpha`` is worse than the base beyond noise. ``incumbent_hallucination_rate``,
    ``incumbent_wrong_fact_rate``: the candidate's bounds, crossed beyond noise (the exact
    ``1 - gate.risk_alpha`` lower bound over the bound). Any of them fails: rollback.
    Independent of ``gate.baseline`` (the base is scored whenever there is an incumbent)."""
    role, who, why = incumbent_rows(meta)
    models = set(scored.get("model", pd.Series(dtype=str)))
    if role is None or role not in models:
        reason = why if role is None else "the production adapter was not evaluated on these items"
        return IncumbentVerdict("n/a", "no_incumbent", reason, [], {}, who)
    pairs = paired_frame(scored, role, "base", ())
    inc, base = pairs["pass"].to_numpy(bool), pairs["pass_baseline"].to_numpy(bool)
    n, b, c = discordant_counts(inc, base)
    pvalue = slice_regression_pvalue(b, c)
    stats = f"b={b} incumbent-only, c={c} base-only passes, N={n}, p={pvalue:.4g}"
    quality = (
        Check(
            "incumbent_quality", "rollback", f"worse than the base beyond noise ({stats} < alpha={p.alpha})"
        )
        if pvalue < p.alpha
        else Check(
            "incumbent_quality", "keep", f"not worse than the base beyond noise ({stats}, alpha={p.alpha})"
        )
    )
    rows = scored[scored["model"] == role]
    counts = {
        "hallucination_rate": int(rows["hallucination"].sum()),
        "wrong_fact_rate": int(rows["wrong_fact"].sum()),
    }
    bounds = {"hallucination_rate": p.max_hallucination_rate, "wrong_fact_rate": p.max_wrong_fact_rate}
    checks = [quality, *(_incumbent_bound(k, counts[k], n, bounds[k], p) for k in counts)]
    failed = next((ch for ch in checks if ch.cap == "rollback"), None)
    numbers: dict[str, Any] = {
        "incumbent_n_items": n,
        "incumbent_b": b,
        "incumbent_c": c,
        "incumbent_delta": (b - c) / n,
        "incumbent_pvalue": pvalue,
        "incumbent_pass_rate": float(inc.mean()),
        "incumbent_base_pass_rate": float(base.mean()),
    }
    for k, count in counts.items():
        numbers[f"incumbent_{k}"] = count / n
        numbers[f"incumbent_{k}_lcb"] = rate_lcb(count, n, p.risk_alpha)
    if failed is None:
        return IncumbentVerdict("keep", "all_checks_passed", why, checks, numbers, who)
    return IncumbentVerdict("rollback", failed.name, why, checks, numbers, who)


def production_decision(decision: str, rule: str, incumbent: IncumbentVerdict) -> tuple[str, str]:
    """(decision, rule) for production: ``rollback`` (the incumbent's rule) when the incumbent fails
    and the candidate is not releasable; otherwise the candidate's own. A releasable candidate
    (promote, canary) replaces the failing incumbent when it is released, so the batch's
    decision stays the candidate's."""
    if incumbent.decision == "rollback" and decision not in RELEASABLE:
        return "rollback", incumbent.rule
    return decision, rule


def run_gate(
    scored: pd.DataFrame,
    meta: Mapping[str, Any],
    train: Mapping[str, Any],
    admit: Mapping[str, Any],
    p: GateParams,
    extra_checks: Sequence[Check] = (),
    *,
    replay: Mapping[str, Any] | None,
    slices: Sequence[str],
) -> GateResult:
    """Apply the gate policy to one batch's eval records and training/admission records.

    ``replay`` (metrics/replay) gives the candidate's per-request latency
    (:func:`request_latency_checks`); the gate stage always passes it; calibration, which runs
    no replay, says ``replay=None`` and so applies no latency bound. ``extra_checks`` cap the decision
    too, listed after the gate's own (so on a tie the rule names an offline check): a held GRPO
    probe when params say it holds SFT, the chain checks. ``slices`` are the item columns of the
    scored frame the results are broken down by (the declared answer's, ``AnswerSchema.slices``).
    """
    checks = [admission_check(admit), health_check(train, p), masking_check(train, p)]
    baseline, why = choose_baseline(meta, p)
    numbers: dict[str, Any] = {"baseline": baseline, "baseline_reason": why}
    regressed = pd.DataFrame(
        columns=["item_id", *slices, "output", "output_baseline"]
    )  # none without a candidate
    tested: list[dict[str, Any]] = []
    metric_rows: list[dict[str, Any]] = []
    if "candidate" not in set(scored.get("model", pd.Series(dtype=str))):
        checks.append(candidate_missing_check(train, p))
    else:
        pairs = paired_frame(scored, "candidate", baseline, slices)
        test = paired_test(pairs["pass"].to_numpy(bool), pairs["pass_baseline"].to_numpy(bool), p.alpha)
        regressed = regressed_items(pairs)
        risks, risk_numbers = risk_checks(scored, regressed, p)
        latency, latency_numbers = request_latency_checks(replay, p) if replay is not None else ([], {})
        tested = slice_tests(pairs, slices)
        slice_cap = slice_check(tested, p.slices)
        checks += [quality_check(test, p), slice_cap, *risks, *latency]
        numbers.update(quality_numbers(test, pairs, p), **risk_numbers, **latency_numbers)
        numbers.update(
            slices_tested=len(tested),
            slices_regressed=sum(s["p_adjusted"] < p.slices.alpha for s in tested),
        )
        metric_rows = answer_metric_table(scored, "candidate", baseline, slices)
        if metric_rows:  # reported beside clap's fields; no check reads them
            overall = metric_rows[0]
            numbers.update(
                {k: overall[k] for k in ("baseline_em", "candidate_em", "baseline_f1", "candidate_f1")}
            )
    checks += extra_checks
    decision, rule = decide(checks)
    incumbent = incumbent_verdict(scored, meta, p)
    return GateResult(
        decision, rule, checks, numbers, regressed, tested, tuple(slices), metric_rows, incumbent
    )


def flat_metrics(result: GateResult) -> dict[str, Any]:
    """The flat gate metrics: decision (text and code), rule, the decision without the chain
    checks (``offline_*``: held-out eval, training and admission only), numbers, each check's cap."""
    offline = offline_decision(result.checks)
    out = {
        "decision": result.decision,
        "decision_code": DECISION_CODE[result.decision],
        "rule": result.rule,
        "offline_decision": offline[0],
        "offline_rule": offline[1],
    }
    out.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in result.numbers.items()})
    out.update({f"check_{c.name}": c.cap for c in result.checks})
    inc = result.incumbent
    out.update(
        production_decision=result.production[0],
        production_rule=result.production[1],
        incumbent_decision=inc.decision,
        incumbent_rule=inc.rule,
    )
    out.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in inc.numbers.items()})
    out.update({f"check_{c.name}": c.cap for c in inc.checks})
    return out
