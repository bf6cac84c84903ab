"""Application-chain replay: CLAP's ABCD experiment.

The replay cases (``replay.parquet``: questions with gold answers and no context) go
through the real application chain (:mod:`clap.chain.chain`) under four conditions:

====  ==================  =========
cond  model               retrieval
====  ==================  =========
A     base                on
B     base + adapter      on
C     base                off
D     base + adapter      off
====  ==================  =========

Facts live only in the knowledge base, so C and D should score ~0 on value: A - C and
B - D measure *RAG necessity*; B - A the *adapter's contribution* inside the chain
(core fields, answer-evidence match: the quote is verbatim in the retrieved context and
carries the value), and B p95 - A p95 its latency cost. A batch without a trained adapter
runs A and C only.

Replay measures; it does not decide. Its numbers (``metrics/replay/<b>.json``) are read by
the gate stage, which runs after it: the chain checks (:func:`clap.judge.gating.chain_checks`,
policy ``gate.chain``) cap the release decision like every other gate check. So a change of
release policy re-runs the gate, never these generations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from clap.chain.chain import ChainAnswer, ChainParams, build_index, load_chain
from clap.judge.evaluation import EvalParams, score_generations
from clap.judge.scored import SCORED_COLUMNS
from clap.task.prompt import CORE_FIELDS
from clap.task.scoring import ScoringParams

CONDITIONS: dict[str, tuple[str, bool]] = {
    "A": ("base", True),
    "B": ("adapter", True),
    "C": ("base", False),
    "D": ("adapter", False),
}
CASE_COLUMNS = [
    "condition",
    "model",
    "rag",
    *[c for c in SCORED_COLUMNS if c != "model"],
    "gold_doc_id",
    "retrieved_doc_ids",
    "retrieval_hit",
    "core_correct",
]
TIMING_COLUMNS = [
    "condition",
    "item_id",
    "retrieval_ms",
    "generation_ms",
    "latency_ms",
    "batch_wall_ms",
    "batch_size",
    "batch_index",
]
PLOT_METRICS = ("value_accuracy", "core_accuracy", "answer_evidence_rate", "retrieval_hit_rate")


# ------------------------------------------------------------------ running the conditions


def run_conditions(
    items: pd.DataFrame,
    kb: pd.DataFrame,
    base_dir: Any,
    adapter_dir: Any | None,
    cp: ChainParams,
    p: EvalParams,
) -> dict[str, list[ChainAnswer]]:
    """Answer every case under A and C (base) and, with an adapter, B and D; one index for all."""
    if items.empty:
        return {}
    index = build_index(kb, cp)
    questions = list(items["question"])
    models = {"base": None} if adapter_dir is None else {"base": None, "adapter": adapter_dir}
    out: dict[str, list[ChainAnswer]] = {}
    for model, adapter in models.items():
        chain = load_chain(base_dir, adapter, index, cp)
        for cond, (m, rag) in CONDITIONS.items():
            if m == model:
                out[cond] = chain.answer(questions, rag=rag, batch_size=p.batch_size)
        del chain  # free the weights before the next model loads
    return dict(sorted(out.items()))


def case_rows(
    cond: str, items: pd.DataFrame, answers: Sequence[ChainAnswer], sp: ScoringParams
) -> pd.DataFrame:
    """Scored per-case rows of one condition (deterministic: no timings)."""
    scored = score_generations(cond, items, [a.generation for a in answers], [a.context for a in answers], sp)
    scored = scored.rename(columns={"model": "condition"})
    scored.insert(1, "model", CONDITIONS[cond][0])
    scored.insert(2, "rag", CONDITIONS[cond][1])
    scored["gold_doc_id"] = list(items["evidence_doc_id"])
    scored["retrieved_doc_ids"] = [json.dumps(a.retrieved.doc_ids) for a in answers]
    scored["retrieval_hit"] = [g in a.retrieved.doc_ids for g, a in zip(items["evidence_doc_id"], answers)]
    scored["core_correct"] = scored[[f"{k}_correct" for k in CORE_FIELDS]].all(axis=1)
    return scored[CASE_COLUMNS]


def timing_rows(cond: str, items: pd.DataFrame, answers: Sequence[ChainAnswer]) -> pd.DataFrame:
    """Per-case latency of one condition, in milliseconds (kept apart from the scored cases)."""
    rows = [
        (
            cond,
            i,
            a.retrieved.retrieval_ms,
            a.generation.latency_ms,
            a.latency_ms,
            a.generation.batch_wall_ms,
            a.generation.batch_size,
            a.generation.batch_index,
        )
        for i, a in zip(items["item_id"], answers)
    ]
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


def score_conditions(
    items: pd.DataFrame, answers: Mapping[str, Sequence[ChainAnswer]], sp: ScoringParams
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cases, timings) of every condition that ran, conditions in A-D order."""
    cases = [case_rows(c, items, a, sp) for c, a in answers.items()]
    times = [timing_rows(c, items, a) for c, a in answers.items()]
    if not cases:
        return pd.DataFrame(columns=CASE_COLUMNS), pd.DataFrame(columns=TIMING_COLUMNS)
    return pd.concat(cases, ignore_index=True), pd.concat(times, ignore_index=True)


# ------------------------------------------------------------------ metrics


def condition_metrics(cases: pd.DataFrame, timings: pd.DataFrame) -> dict[str, float]:
    """Rates and latency of one condition's cases."""
    return {
        "value_accuracy": float(cases["value_correct"].mean()),
        "core_accuracy": float(cases["core_correct"].mean()),
        "answer_evidence_rate": float(cases["evidence_correct"].mean()),
        "retrieval_hit_rate": float(cases["retrieval_hit"].mean()),
        "pass_rate": float(cases["pass"].mean()),
        "parse_rate": float(cases["parse_ok"].mean()),
        "overall": float(cases["overall"].mean()),
        "hallucination_rate": float(cases["hallucination"].mean()),
        "p50_latency_ms": float(np.percentile(timings["latency_ms"], 50)),
        "p95_latency_ms": float(np.percentile(timings["latency_ms"], 95)),
    }


def _deltas(m: Mapping[str, Any]) -> dict[str, float]:
    """RAG necessity (A - C, B - D) and adapter contribution (B - A), for the conditions that ran."""
    pairs = {
        "rag_necessity": ("A", "C"),
        "rag_necessity_adapter": ("B", "D"),
        "adapter_contribution": ("B", "A"),
    }
    out: dict[str, float] = {}
    for name, (x, y) in pairs.items():
        if m.get(f"{x}_run") and m.get(f"{y}_run"):
            for short, key in (
                ("value", "value_accuracy"),
                ("core", "core_accuracy"),
                ("evidence", "answer_evidence_rate"),
            ):
                out[f"{name}_{short}"] = m[f"{x}_{key}"] - m[f"{y}_{key}"]
    if m.get("A_run") and m.get("B_run"):
        out["adapter_latency_cost_ms"] = m["B_p95_latency_ms"] - m["A_p95_latency_ms"]
    return out


def replay_metrics(
    cases: pd.DataFrame, timings: pd.DataFrame, n_cases: int, has_adapter: bool
) -> dict[str, Any]:
    """Flat ``<condition>_<metric>`` numbers, ``<condition>_run`` flags and the A-D deltas."""
    out: dict[str, Any] = {"n_cases": n_cases, "has_adapter": int(has_adapter)}
    for cond in CONDITIONS:
        rows = cases[cases["condition"] == cond]
        out[f"{cond}_run"] = int(len(rows) > 0)
        if len(rows):
            out.update(
                {
                    f"{cond}_{k}": v
                    for k, v in condition_metrics(rows, timings[timings["condition"] == cond]).items()
                }
            )
    out.update(_deltas(out))
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


# ------------------------------------------------------------------ report and plot data


def plot_rows(m: Mapping[str, Any]) -> pd.DataFrame:
    """``condition, metric, value, series`` rows of the conditions that ran (a dvc bar chart)."""
    rows = [
        (c, k, float(m[f"{c}_{k}"]), f"{c} {k}")
        for k in PLOT_METRICS
        for c in CONDITIONS
        if m.get(f"{c}_run")
    ]
    return pd.DataFrame(rows, columns=["condition", "metric", "value", "series"])


def _cell(m: Mapping[str, Any], cond: str, key: str, fmt: str) -> str:
    return format(m[f"{cond}_{key}"], fmt) if m.get(f"{cond}_run") else "not run"


def render_report(batch: str, m: Mapping[str, Any]) -> str:
    """The replay report: the ABCD table, RAG necessity and the adapter's contribution."""
    lines = [
        f"# Replay {batch}: the application chain under four conditions",
        "",
        f"{m['n_cases']} replay cases through the application chain (retrieval -> prompt -> generation -> parsing); "
        "latency = retrieval + the case's share of its batched generation.",
        "",
        "| condition | model | RAG | value acc. | core-field acc. | answer-evidence | retrieval hit | parse rate | p95 latency (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cond, (model, rag) in CONDITIONS.items():
        cells = [
            _cell(m, cond, k, ".3f")
            if rag or k != "retrieval_hit_rate"
            else "—"  # nothing retrieved without RAG
            for k in (
                "value_accuracy",
                "core_accuracy",
                "answer_evidence_rate",
                "retrieval_hit_rate",
                "parse_rate",
            )
        ]
        lines.append(
            f"| {cond} | {model} | {'on' if rag else 'off'} | "
            + " | ".join(cells)
            + f" | {_cell(m, cond, 'p95_latency_ms', '.0f')} |"
        )
    lines += [
        "",
        *_delta_lines(m),
        "",
        f"The gate decides on these numbers (policy `gate.chain`: B not worse than A, a value floor for B, the adapter's "
        f"latency cost): see its `chain_*` checks in `reports/gate/{batch}/report.md`.",
        "",
    ]
    return "\n".join(lines)


def _delta_lines(m: Mapping[str, Any]) -> list[str]:
    out = []
    if "rag_necessity_value" in m:
        out.append(
            f"- RAG necessity (A − C): value {m['rag_necessity_value']:+.3f}, core {m['rag_necessity_core']:+.3f}"
            + (
                f"; adapter (B − D): value {m['rag_necessity_adapter_value']:+.3f}, core {m['rag_necessity_adapter_core']:+.3f}"
                if "rag_necessity_adapter_value" in m
                else ""
            )
        )
    if "adapter_contribution_core" in m:
        out.append(
            f"- Adapter contribution (B − A): value {m['adapter_contribution_value']:+.3f}, core {m['adapter_contribution_core']:+.3f}, "
            f"answer-evidence {m['adapter_contribution_evidence']:+.3f}; latency cost (B p95 − A p95) {m['adapter_latency_cost_ms']:+.0f} ms"
        )
    return out or ["- No condition pair ran: nothing to compare."]
