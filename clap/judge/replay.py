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
carries the value). A batch without a trained adapter runs A and C only.

Latency as a user of ``clap serve`` meets it: with both rag models loaded, a fixed, seeded
sample of the cases (params ``replay.latency``) is answered one request at a time
(``Chain.answer([q], rag=True, batch_size=1)``, as serving does) after a few uncounted warm-up
requests, each case by A and B in turn (the order alternating, so load that drifts falls on both
alike); each request's wall clock (retrieval + prompt + generation + parse) is its latency.
``A_/B_request_p50_ms`` and ``_p95_ms`` and the adapter's cost (B request p95 - A request p95)
are what the gate reads; the batched conditions' apportioned latency and throughput (items/s)
are reported only, as diagnostics.

Replay measures; it does not decide. Its numbers (``metrics/replay/<b>.json``) are read by
the gate stage, which runs after it: the chain checks (:func:`clap.judge.gating.chain_checks`,
policy ``gate.chain``) cap the release decision like every other gate check. So a change of
release policy re-runs the gate, never these generations.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from clap.chain.chain import Chain, ChainAnswer, ChainParams, build_index, load_chain
from clap.chain.grounding import AnswerSpace
from clap.errors import ClapError
from clap.judge.evaluation import EvalParams, score_generations
from clap.judge.scored import scored_columns
from clap.model.base import default_device
from clap.model.engine import engine_label, model_config
from clap.model.memo import base_memo
from clap.params import check_keys
from clap.progress import Progress
from clap.task.answer import AnswerSchema
from clap.task.scoring import ScoringParams

CONDITIONS: dict[str, tuple[str, bool]] = {
    "A": ("base", True),
    "B": ("adapter", True),
    "C": ("base", False),
    "D": ("adapter", False),
}


def case_columns(schema: AnswerSchema) -> list[str]:
    """Columns of the replay cases frame for the declared answer."""
    return [
        "condition",
        "model",
        "rag",
        *[c for c in scored_columns(schema) if c != "model"],
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
REQUEST_COLUMNS = [
    "condition",
    "request",
    "item_id",
    "retrieval_ms",
    "generation_ms",
    "request_ms",
    "new_tokens",
    "batch_size",
]
PLOT_METRICS = ("value_accuracy", "core_accuracy", "answer_evidence_rate", "retrieval_hit_rate")


@dataclasses.dataclass(frozen=True)
class LatencyParams:
    """Params ``replay.latency``: the per-request latency sample of the RAG conditions (A, B)."""

    requests: int
    warmup: int
    seed: int

    def __post_init__(self) -> None:
        check_keys(
            {"replay.latency.requests": self.requests >= 1, "replay.latency.warmup": self.warmup >= 0},
            "replay.latency: requests must be >= 1 and warmup >= 0",
        )


@dataclasses.dataclass(frozen=True)
class ReplayParams:
    """Params section ``replay``."""

    latency: LatencyParams


# ------------------------------------------------------------------ running the conditions


def latency_sample(n_cases: int, p: LatencyParams) -> tuple[list[int], list[int]]:
    """(measured, warm-up) case positions: a seeded draw of ``p.requests`` cases and ``p.warmup`` others."""
    if n_cases < p.requests + p.warmup:
        raise ClapError(
            f"replay.latency needs {p.requests} + {p.warmup} warm-up cases, the batch has {n_cases} replay cases",
            file="params.yaml",
            column="replay.latency",
            rule="too_few_cases",
        )
    order = [int(i) for i in np.random.default_rng(p.seed).permutation(n_cases)]
    return order[: p.requests], order[p.requests : p.requests + p.warmup]


def time_requests(chains: Mapping[str, Chain], items: pd.DataFrame, p: LatencyParams) -> pd.DataFrame:
    """Per-request latency of the RAG conditions (``chains``: condition -> its loaded chain), one request
    at a time as ``clap serve`` answers, after the uncounted warm-up requests (wall clock of the whole chain).

    Interleaved: each sampled case goes to every condition in turn, the order alternating (A B, then
    B A, ...), so load that comes and goes while the sample runs falls on A and B alike and the
    adapter's cost (B p95 - A p95) compares requests sent side by side, not one phase against another.
    Rows are returned per condition in draw order."""
    measured, warmup = latency_sample(len(items), p)
    questions, ids = list(items["question"]), list(items["item_id"])
    conds = sorted(chains)
    bar = Progress(len(conds) * (len(warmup) + len(measured)), "replay latency", "request", leave=False)
    for i in warmup:
        for cond in conds:
            chains[cond].answer([questions[i]], rag=True, batch_size=1)
            bar.update()
    rows = []
    for k, i in enumerate(measured):
        for cond in conds if k % 2 == 0 else conds[::-1]:
            start = time.perf_counter()
            (a,) = chains[cond].answer([questions[i]], rag=True, batch_size=1)
            request_ms = (time.perf_counter() - start) * 1000.0
            bar.update()
            g = a.generation
            rows.append(
                (
                    cond,
                    k,
                    ids[i],
                    a.retrieved.retrieval_ms,
                    g.batch_wall_ms,
                    request_ms,
                    g.new_tokens,
                    g.batch_size,
                )
            )
    bar.close()
    frame = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    return frame.sort_values(["condition", "request"], kind="stable", ignore_index=True)


def run_conditions(
    items: pd.DataFrame,
    kb: pd.DataFrame,
    base_dir: Any,
    adapter_dir: Any | None,
    cp: ChainParams,
    p: EvalParams,
    lp: LatencyParams,
    space: AnswerSpace,
    memo_log: dict[str, str] | None = None,
) -> tuple[dict[str, list[ChainAnswer]], pd.DataFrame]:
    """Answer every case under A and C (base) and, with an adapter, B and D; one index for all.

    Returns the answers per condition and the per-request timings of A (and B), measured with both
    models loaded, their requests interleaved (:func:`time_requests`): the two models are in memory
    together while B's conditions run. A and C read the base's kept answers when an earlier run
    generated exactly these (:mod:`clap.model.memo`; ``memo_log`` gets ``A_answers_memo`` and
    ``C_answers_memo``); the timed requests always run."""
    if items.empty:
        return {}, pd.DataFrame(columns=REQUEST_COLUMNS)
    latency_sample(len(items), lp)  # too few cases for the sample: loud before any model loads
    index = build_index(kb, cp)
    questions = list(items["question"])
    models = {"base": None} if adapter_dir is None else {"base": None, "adapter": adapter_dir}
    out: dict[str, list[ChainAnswer]] = {}
    rag_chains: dict[str, Chain] = {}
    device = default_device()
    memo = base_memo(base_dir, engine_label(cp.engine, device, model_config(base_dir)), device)
    for model, adapter in models.items():
        chain = load_chain(base_dir, adapter, index, cp, space)
        for cond, (m, rag) in CONDITIONS.items():
            if m == model:
                kept = (memo, cond) if memo is not None and adapter is None else None
                out[cond] = chain.answer(
                    questions, rag=rag, batch_size=p.batch_size, desc=f"replay {cond}", memo=kept
                )
                if rag:
                    rag_chains[cond] = chain
    if memo is not None and memo_log is not None:
        memo_log.update(memo.log)
    return dict(sorted(out.items())), time_requests(rag_chains, items, lp)


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
    scored["core_correct"] = scored[[f"{k}_correct" for k in sp.answer.keys]].all(axis=1)
    return scored[case_columns(sp.answer)]


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
        return pd.DataFrame(columns=case_columns(sp.answer)), pd.DataFrame(columns=TIMING_COLUMNS)
    return pd.concat(cases, ignore_index=True), pd.concat(times, ignore_index=True)


# ------------------------------------------------------------------ metrics


def condition_metrics(cases: pd.DataFrame, timings: pd.DataFrame) -> dict[str, float]:
    """Rates, apportioned latency and batch throughput of one condition's cases (diagnostics)."""
    wall_s = float(timings.drop_duplicates("batch_index")["batch_wall_ms"].sum()) / 1000.0
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
        "items_per_s": len(timings) / wall_s if wall_s > 0 else 0.0,
    }


def request_metrics(requests: pd.DataFrame) -> dict[str, float]:
    """Per-request latency of one RAG condition: how many requests, p50 and p95 (ms)."""
    ms = requests["request_ms"]
    return {
        "requests": int(len(ms)),
        "request_p50_ms": float(np.percentile(ms, 50)),
        "request_p95_ms": float(np.percentile(ms, 95)),
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
        out["adapter_request_latency_cost_ms"] = m["B_request_p95_ms"] - m["A_request_p95_ms"]
    return out


def replay_metrics(
    cases: pd.DataFrame, timings: pd.DataFrame, requests: pd.DataFrame, n_cases: int, has_adapter: bool
) -> dict[str, Any]:
    """Flat ``<condition>_<metric>`` numbers, ``<condition>_run`` flags, the RAG conditions'
    per-request latency (``<condition>_request_*``) and the A-D deltas."""
    out: dict[str, Any] = {"n_cases": n_cases, "has_adapter": int(has_adapter)}
    for cond, (_, rag) in CONDITIONS.items():
        rows = cases[cases["condition"] == cond]
        out[f"{cond}_run"] = int(len(rows) > 0)
        if len(rows):
            out.update(
                {
                    f"{cond}_{k}": v
                    for k, v in condition_metrics(rows, timings[timings["condition"] == cond]).items()
                }
            )
            if rag:
                timed = requests[requests["condition"] == cond]
                if timed.empty:
                    raise ClapError(
                        f"replay condition {cond} ran without its per-request latency sample",
                        column=f"{cond}_request_p95_ms",
                        rule="missing_timings",
                    )
                out.update({f"{cond}_{k}": v for k, v in request_metrics(timed).items()})
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
    """The replay report: the ABCD table, per-request latency, RAG necessity and the adapter's contribution."""
    lines = [
        f"# Replay {batch}: the application chain under four conditions",
        "",
        f"{m['n_cases']} replay cases through the application chain (retrieval -> prompt -> generation -> parsing), "
        "each condition's cases generated in batches.",
        "",
        "| condition | model | RAG | value acc. | core-field acc. | answer-evidence | retrieval hit | parse rate |",
        "|---|---|---|---|---|---|---|---|",
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
        lines.append(f"| {cond} | {model} | {'on' if rag else 'off'} | " + " | ".join(cells) + " |")
    if m.get("gold_over_budget"):
        lines += [
            "",
            f"**{m['gold_over_budget']} of {m['n_cases']} cases' gold answers need more tokens than the answer "
            "budget** (`chain.max_new_tokens`): no condition can answer them right.",
        ]
    lines += [
        "",
        *_delta_lines(m),
        "",
        *_latency_lines(m),
        "",
        f"The gate decides on these numbers (policy `gate.chain`: B not worse than A, a value floor for B, the adapter's "
        f"per-request latency cost; `gate.max_p95_latency_ms` bounds B's per-request p95): see its checks in "
        f"`reports/gate/{batch}/report.md`.",
        "",
    ]
    return "\n".join(lines)


def _latency_lines(m: Mapping[str, Any]) -> list[str]:
    """Per-request latency (what the gate reads) and the batched diagnostics (reported only)."""
    rag = [c for c, (_, on) in CONDITIONS.items() if on and m.get(f"{c}_run")]
    out = ["## Latency", ""]
    if rag:
        out += [
            f"Per request, as `clap serve` answers: {m[f'{rag[0]}_requests']} sampled cases sent one at a time "
            "(`replay.latency`, after uncounted warm-up requests); wall clock of retrieval + prompt + generation + parse.",
            "",
            "| condition | requests | p50 (ms) | p95 (ms) |",
            "|---|---|---|---|",
            *[
                f"| {c} | {m[f'{c}_requests']} | {m[f'{c}_request_p50_ms']:.0f} | {m[f'{c}_request_p95_ms']:.0f} |"
                for c in rag
            ],
        ]
        if "adapter_request_latency_cost_ms" in m:
            out += [
                "",
                f"Adapter latency cost (B p95 − A p95, per request): {m['adapter_request_latency_cost_ms']:+.0f} ms.",
            ]
        out.append("")
    ran = [c for c in CONDITIONS if m.get(f"{c}_run")]
    out += (
        [
            "Diagnostics of the batched runs above (reported only, never gated): throughput and each case's share of "
            "its batch's wall time (apportioned by new tokens).",
            "",
            "| condition | items/s | apportioned p50 (ms) | apportioned p95 (ms) |",
            "|---|---|---|---|",
            *[
                f"| {c} | {m[f'{c}_items_per_s']:.2f} | {m[f'{c}_p50_latency_ms']:.0f} | {m[f'{c}_p95_latency_ms']:.0f} |"
                for c in ran
            ],
        ]
        if ran
        else ["No condition ran: no latency measured."]
    )
    return out


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
            f"answer-evidence {m['adapter_contribution_evidence']:+.3f}"
        )
    return out or ["- No condition pair ran: nothing to compare."]
