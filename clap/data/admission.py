"""admit: the pre-training gate, recomputed from the normalized data (never from normalize's metrics).

It selects the admitted splits deterministically and checks, each with value, threshold
and pass/fail: zero train/held-out overlap (by ID and normalized input hash), minimum
split sizes, metric/line/shift balance, evidence verifiability, the GRPO reward check of
the CLAP paper (the reference answer must out-score K perturbed answers under the eval
reward: rank-pass rate, mean reward margin, non-zero group variance) and a label-shuffle
canary. The verdict is the conjunction of the blocking checks.

Static admission is necessary, not sufficient: a batch whose answers were permuted across
items passes every check here (values, quotes and documents stay mutually consistent) and
is meant to be caught at runtime by the TBDL detector and the held-out gate.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from clap.task.context import item_docs, kb_bodies, parse_doc_ids
from clap.errors import ClapError
from clap.io import logical_hash
from clap.data.normalize import Vocab, evidence_status
from clap.task.prompt import ANSWER_FIELDS, format_answer, gold_answer
from clap.task.scoring import context_text

RewardFn = Callable[[str, Mapping[str, Any], str], float]
SPLITS = ("sft", "grpo", "eval", "probe", "replay")
TRAIN_SPLITS = ("sft", "grpo")
HELD_SPLITS = ("eval", "probe", "replay")
LABEL_FIELDS = ("metric", "value", "unit", "line", "shift", "date")
# Fixed random-stream index per use, so adding a split never reshuffles another one.
_STREAMS = {"sft": 0, "grpo": 1, "eval": 2, "replay": 3, "canary": 4}


@dataclasses.dataclass(frozen=True)
class SplitSizes:
    """Items per admitted split (params ``sizes``, and ``admit.min_sizes``)."""

    sft: int
    grpo: int
    eval: int
    probe: int
    replay: int


@dataclasses.dataclass(frozen=True)
class AdmitParams:
    """Params section ``admit`` (see the comments in params.yaml)."""

    seed: int
    min_sizes: SplitSizes
    max_metric_share: float
    min_metrics: int
    min_line_coverage: float
    min_shift_coverage: float
    min_evidence_verifiable_rate: float
    perturbations: list
    min_rank_pass_rate: float
    min_reward_margin: float
    min_reward_variance: float
    min_label_shuffle_changed: float


@dataclasses.dataclass(frozen=True)
class Check:
    """One admission check: ``passed`` is ``value <op> threshold``; only blocking checks decide."""

    name: str
    value: float
    op: str
    threshold: float
    blocking: bool
    passed: bool
    detail: str


_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "==": operator.eq}


def check(name: str, value: float, op: str, threshold: float, *, blocking: bool = True, detail: str = "") -> Check:
    """Build a :class:`Check`; ``value`` must be a finite number."""
    value = float(value)
    if not np.isfinite(value):
        raise ClapError(f"admission check {name} computed a non-finite value {value}", rule="non_finite_check")
    return Check(name, value, op, float(threshold), blocking, bool(_OPS[op](value, threshold)), detail)


# --------------------------------------------------------------------------- selection


def select(pool: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """A seeded permutation of ``pool`` (sorted by item_id first, so input order does not matter), first ``n``."""
    ordered = pool.sort_values("item_id", kind="stable").reset_index(drop=True)
    return ordered.iloc[rng.permutation(len(ordered))[:n]].reset_index(drop=True)


def select_splits(pools: Mapping[str, pd.DataFrame], sizes: SplitSizes, seed: int) -> dict[str, pd.DataFrame]:
    """The admitted splits: sft, grpo, eval, probe (held-out items after the eval ones, never in training), replay."""
    rng = {k: np.random.default_rng([seed, i]) for k, i in _STREAMS.items()}
    out = {name: select(pools[name], getattr(sizes, name), rng[name]) for name in ("sft", "grpo", "replay")}
    held = select(pools["eval"], len(pools["eval"]), rng["eval"])
    out["eval"] = held.iloc[: sizes.eval].reset_index(drop=True)
    rest = held.iloc[sizes.eval :]
    training = pd.concat([pools["sft"], pools["grpo"]])
    clean = ~rest["item_id"].isin(training["item_id"]) & ~rest["input_hash"].isin(training["input_hash"])
    out["probe"] = rest[clean].iloc[: sizes.probe].reset_index(drop=True)
    return out


# --------------------------------------------------------------------------- static checks


def overlap_pairs(frames: Mapping[str, pd.DataFrame], pairs: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Items shared by ID or by input hash, per ``a__b`` pair of frames."""
    out = {}
    for a, b in pairs:
        fa, fb = frames[a], frames[b]
        shared = fa["item_id"].isin(fb["item_id"]) | fa["input_hash"].isin(fb["input_hash"])
        out[f"{a}__{b}"] = int(shared.sum())
    return out


def overlap_checks(pools: Mapping[str, pd.DataFrame], admitted: Mapping[str, pd.DataFrame]) -> list[Check]:
    """Zero overlap between training and held-out data, in the pools and in the admitted splits."""
    pool_pairs = [(t, h) for t in TRAIN_SPLITS for h in ("eval", "replay")] + [("replay", "eval")]
    adm_pairs = [(t, h) for t in TRAIN_SPLITS for h in HELD_SPLITS] + [("replay", "eval"), ("replay", "probe"), ("probe", "eval")]
    found = [("pool_overlap", overlap_pairs(pools, pool_pairs)), ("admitted_overlap", overlap_pairs(admitted, adm_pairs))]
    return [check(name, sum(c.values()), "==", 0, detail=", ".join(f"{k}={v}" for k, v in c.items() if v)) for name, c in found]


def size_checks(admitted: Mapping[str, pd.DataFrame], sizes: SplitSizes, minimum: SplitSizes) -> list[Check]:
    """Blocking minimum size per split, and a non-blocking check that the requested size was met."""
    out = []
    for name in SPLITS:
        n = len(admitted[name])
        out.append(check(f"size_{name}", n, ">=", getattr(minimum, name), detail="admit.min_sizes"))
        out.append(check(f"requested_{name}", n, ">=", getattr(sizes, name), blocking=False, detail="sizes (fewer items than requested)"))
    return out


def _coverage(train: pd.Series, held: pd.Series) -> float:
    wanted = set(held)
    return len(wanted & set(train)) / len(wanted) if wanted else 1.0


def balance_checks(sft: pd.DataFrame, held: pd.DataFrame, p: AdmitParams) -> list[Check]:
    """No metric dominates D_sft, enough metrics, and every held-out line/shift is trained on."""
    shares = sft["metric"].value_counts(normalize=True)
    top = (float(shares.iloc[0]), str(shares.index[0])) if len(shares) else (1.0, "none")
    return [
        check("max_metric_share", top[0], "<=", p.max_metric_share, detail=f"most frequent metric: {top[1]}"),
        check("distinct_metrics", sft["metric"].nunique(), ">=", p.min_metrics),
        check("line_coverage", _coverage(sft["line"], held["line"]), ">=", p.min_line_coverage, detail="held-out lines present in D_sft"),
        check("shift_coverage", _coverage(sft["shift"], held["shift"]), ">=", p.min_shift_coverage, detail="held-out shifts present in D_sft"),
    ]


def evidence_verifiable(items: pd.DataFrame, bodies: Mapping[str, str], vocab: Vocab) -> pd.Series:
    """Per item: the quote is in its cited document's body and carries the (canonical) value."""

    def ok(row: Mapping[str, Any]) -> bool:
        body = bodies.get(row["evidence_doc_id"])
        return body is not None and evidence_status(row["evidence"], body, row["value"], None, vocab)[0] in ("ok", "repaired")

    return pd.Series([ok(r) for r in items.to_dict("records")], index=items.index, dtype=bool)


# --------------------------------------------------------------------------- GRPO reward check


def _other(value: str, options: Sequence[str]) -> str:
    """The next option after ``value`` (sorted, cyclic) that differs from it; ``"other"`` if none does."""
    ordered = sorted(set(options) - {value})
    return next((o for o in ordered if o > value), ordered[0] if ordered else "other")


def _other_doc_quote(row: Mapping[str, Any], bodies: Mapping[str, str], vocab: Vocab) -> str:
    """A quote from another document (the item's context first) that does not carry the value."""
    ctx = parse_doc_ids(row["context_doc_ids"])
    for doc in [*ctx, *sorted(bodies)]:
        body = bodies[doc]
        if doc != row["evidence_doc_id"] and evidence_status(body, body, row["value"], None, vocab)[0] != "ok":
            return body
    return ""


def perturbed_answers(row: Mapping[str, Any], names: Sequence[str], domain: Mapping[str, Sequence[str]], bodies: Mapping[str, str], vocab: Vocab) -> dict[str, str]:
    """The K perturbed completions of one item, by perturbation name (params ``admit.perturbations``).

    ``wrong_value`` (value moved by max(1, 10%)), ``wrong_metric``/``wrong_line``/``wrong_shift``
    (another value seen in the batch), ``wrong_date`` (next day), ``other_doc_evidence`` (a
    quote from another document without the value), ``unparseable`` (truncated JSON).
    """
    gold = gold_answer(row)
    ref = format_answer(gold)
    builders: dict[str, Callable[[], Any]] = {
        "wrong_value": lambda: {**gold, "value": gold["value"] + max(1.0, abs(gold["value"]) * 0.1)},
        "wrong_metric": lambda: {**gold, "metric": _other(gold["metric"], domain["metric"])},
        "wrong_line": lambda: {**gold, "line": _other(gold["line"], domain["line"])},
        "wrong_shift": lambda: {**gold, "shift": _other(gold["shift"], domain["shift"])},
        "wrong_date": lambda: {**gold, "date": (dt.date.fromisoformat(gold["date"]) + dt.timedelta(days=1)).isoformat()},
        "other_doc_evidence": lambda: {**gold, "evidence": _other_doc_quote(row, bodies, vocab)},
        "unparseable": lambda: ref[: len(ref) // 2],
    }
    unknown = sorted(set(names) - set(builders))
    if unknown:
        raise ClapError(f"unknown perturbation(s) {unknown}; known: {sorted(builders)}", file="params.yaml", column="admit.perturbations", rule="bad_params")
    built = {name: builders[name]() for name in names}
    return {name: v if isinstance(v, str) else format_answer(v) for name, v in built.items()}


def reward_table(grpo: pd.DataFrame, kb: pd.DataFrame, names: Sequence[str], domain: Mapping[str, Sequence[str]], vocab: Vocab, reward_fn: RewardFn) -> pd.DataFrame:
    """Rewards of the reference answer (column ``reference``) and of each perturbation, one row per item."""
    bodies = kb_bodies(kb)
    rows = []
    for row in grpo.to_dict("records"):
        gold, ctx = gold_answer(row), context_text(item_docs(row, bodies))
        texts = {"reference": format_answer(gold), **perturbed_answers(row, names, domain, bodies, vocab)}
        rows.append({"item_id": row["item_id"], **{k: float(reward_fn(t, gold, ctx)) for k, t in texts.items()}})
    return pd.DataFrame(rows, columns=["item_id", "reference", *names])


def reward_checks(table: pd.DataFrame, names: Sequence[str], p: AdmitParams) -> tuple[list[Check], dict[str, float]]:
    """Rank-pass rate, mean margin (reference minus mean perturbed) and minimum group variance."""
    if table.empty:
        stats = {"rank_pass_rate": 0.0, "reward_margin": 0.0, "reward_variance_min": 0.0, "reward_variance_mean": 0.0, "reward_reference_mean": 0.0}
    else:
        pert = table[list(names)].to_numpy()
        ref = table["reference"].to_numpy()
        group = np.column_stack([ref, pert])
        stats = {
            "rank_pass_rate": float(np.mean(ref > pert.max(axis=1))),
            "reward_margin": float(np.mean(ref - pert.mean(axis=1))),
            "reward_variance_min": float(group.var(axis=1).min()),
            "reward_variance_mean": float(group.var(axis=1).mean()),
            "reward_reference_mean": float(ref.mean()),
        }
        stats.update({f"reward_mean_{n}": float(table[n].mean()) for n in names})
    checks = [
        check("rank_pass_rate", stats["rank_pass_rate"], ">=", p.min_rank_pass_rate, detail=f"reference strictly above all {len(names)} perturbations"),
        check("reward_margin", stats["reward_margin"], ">=", p.min_reward_margin, detail="mean of reference minus mean perturbed reward"),
        check("reward_variance_min", stats["reward_variance_min"], ">", p.min_reward_variance, detail="smallest per-group reward variance (0 = no GRPO signal)"),
    ]
    return checks, stats


# --------------------------------------------------------------------------- label-shuffle canary


def _labels(sft: pd.DataFrame) -> list[tuple]:
    return list(sft[list(LABEL_FIELDS)].itertuples(index=False, name=None))


def evidence_in_context_rate(sft: pd.DataFrame, answers: pd.DataFrame, kb: pd.DataFrame) -> float:
    """Fraction of items whose answer's evidence doc is in the item's context and describes the answer's line/shift/date.

    ``answers`` is aligned with ``sft`` row by row (the real answers, or shuffled ones).
    """
    if sft.empty:
        return 0.0
    facts = kb.set_index("doc_id")[["line", "shift", "date"]]
    hits = 0
    for ctx, ans in zip(sft["context_doc_ids"], answers.to_dict("records")):
        doc = ans["evidence_doc_id"]
        if doc in parse_doc_ids(ctx) and doc in facts.index:
            hits += tuple(facts.loc[doc]) == (ans["line"], ans["shift"], ans["date"])
    return hits / len(sft)


def label_canary(sft: pd.DataFrame, kb: pd.DataFrame, p: AdmitParams) -> tuple[list[Check], dict[str, float]]:
    """Shuffle D_sft answers across items (seeded) and measure how much the labels change.

    Labels that barely change under a shuffle (constant or degenerate answers) carry no
    learnable signal: that fails admission. ``evidence_in_context_rate`` for real vs
    shuffled answers is recorded as a diagnostic only (see the comment in the body).
    """
    rng = np.random.default_rng([p.seed, _STREAMS["canary"]])
    perm = rng.permutation(len(sft))
    labels = _labels(sft)
    changed = float(np.mean([labels[j] != labels[i] for i, j in enumerate(perm)])) if len(sft) else 0.0
    shuffled = sft.iloc[perm].reset_index(drop=True)
    # Diagnostic only, never blocking: the context is what the application's retriever
    # returned, so a real batch can miss the evidence doc (a retrieval fault, not a label
    # fault) and a KB doc may lack line/shift/date; and the demo's corrupted batch 2026-03
    # must pass static admission so the runtime TBDL detector and the held-out gate are the
    # ones to catch it. Static checks passing is not proof that a batch is learnable.
    diag = {
        "label_shuffle_changed": changed,
        "evidence_in_context_rate_real": evidence_in_context_rate(sft, sft, kb),
        "evidence_in_context_rate_shuffled": evidence_in_context_rate(sft, shuffled, kb),
    }
    return [check("label_shuffle_changed", changed, ">=", p.min_label_shuffle_changed, detail="fraction of D_sft labels a seeded shuffle changes")], diag


# --------------------------------------------------------------------------- the gate


@dataclasses.dataclass(frozen=True)
class AdmissionResult:
    """Admitted frames (sft, grpo, eval, probe, replay, kb), the admission record, flat metrics."""

    frames: dict[str, pd.DataFrame]
    record: dict[str, Any]
    metrics: dict[str, Any]


def reason(c: Check) -> str:
    """A failed check as one line of the admission record's reasons."""
    kind = "" if c.blocking else "warning: "
    return f"{kind}{c.name} = {c.value:g}, required {c.op} {c.threshold:g}" + (f" ({c.detail})" if c.detail else "")


def evidence_check(items: pd.DataFrame, kb: pd.DataFrame, p: AdmitParams, vocab: Vocab) -> Check:
    """The share of items whose quote is verbatim in its cited doc and carries the value."""
    ok = evidence_verifiable(items, kb_bodies(kb), vocab)
    rate = float(ok.mean()) if len(ok) else 0.0
    return check("evidence_verifiable_rate", rate, ">=", p.min_evidence_verifiable_rate, detail=f"{int((~ok).sum())} admitted item(s) unverifiable")


def static_checks(pools: Mapping[str, pd.DataFrame], admitted: Mapping[str, pd.DataFrame], sizes: SplitSizes, p: AdmitParams, vocab: Vocab) -> list[Check]:
    """Overlap, sizes, balance and evidence verifiability of the admitted splits."""
    held = pd.concat([admitted["eval"], admitted["probe"]])
    items = pd.concat([admitted[s] for s in SPLITS])
    return [*overlap_checks(pools, admitted), *size_checks(admitted, sizes, p.min_sizes), *balance_checks(admitted["sft"], held, p),
            evidence_check(items, pools["kb"], p, vocab)]


def training_data_checks(sft: pd.DataFrame, held: pd.DataFrame, kb: pd.DataFrame, p: AdmitParams, vocab: Vocab) -> list[Check]:
    """The admission checks that read D_sft's content (balance, evidence, label canary), for
    re-checking training items changed after admission (``clap.judge.calibrate``'s data faults)."""
    return [*balance_checks(sft, held, p), evidence_check(sft, kb, p, vocab), *label_canary(sft, kb, p)[0]]


def admit_batch(pools: Mapping[str, pd.DataFrame], sizes: SplitSizes, p: AdmitParams, vocab: Vocab, reward_fn: RewardFn, batch: str) -> AdmissionResult:
    """Select and check one batch's admitted data.

    Args:
        pools: normalized frames ``sft, grpo, eval, replay, kb``.
        sizes: requested split sizes (params ``sizes``).
        p: params ``admit``.
        vocab: the normalize vocabulary (evidence verification, value tolerance).
        reward_fn: ``(completion_text, gold, context_text) -> reward in [0, 1]``; the stage
            passes ``clap.task.scoring.reward`` with the ``scoring`` params.
        batch: the batch name (recorded).

    Returns:
        AdmissionResult; ``record["verdict"]`` is True iff every blocking check passed.
    """
    admitted = select_splits(pools, sizes, p.seed)
    items = pd.concat([pools[s] for s in ("sft", "grpo", "eval", "replay")])
    domain = {k: sorted(items[k].unique()) for k in ("metric", "line", "shift")}
    table = reward_table(admitted["grpo"], pools["kb"], list(p.perturbations), domain, vocab, reward_fn)
    grpo_checks, grpo_stats = reward_checks(table, list(p.perturbations), p)
    canary_checks, canary = label_canary(admitted["sft"], pools["kb"], p)
    checks = [*static_checks(pools, admitted, sizes, p, vocab), *grpo_checks, *canary_checks]
    frames = {**admitted, "kb": pools["kb"].reset_index(drop=True)}
    counts = {**{f"pool_{s}": len(pools[s]) for s in ("sft", "grpo", "eval", "replay", "kb")}, **{f"n_{s}": len(admitted[s]) for s in SPLITS}}
    record = {
        "batch": batch,
        "verdict": all(c.passed for c in checks if c.blocking),
        "reasons": [reason(c) for c in checks if not c.passed],
        "checks": [dataclasses.asdict(c) for c in checks],
        "counts": counts,
        "grpo": grpo_stats,
        "canary": canary,
        "hashes": {name: logical_hash(df) for name, df in frames.items()},
        "selection": {"seed": p.seed, "sizes": dataclasses.asdict(sizes), "perturbations": list(p.perturbations)},
    }
    return AdmissionResult(frames, record, flat_metrics(record, checks))


def flat_metrics(record: Mapping[str, Any], checks: Sequence[Check]) -> dict[str, Any]:
    """The flat metrics file: ``admitted`` 0/1, reason counts, sizes, GRPO and canary numbers, every check."""
    return {
        "admitted": int(record["verdict"]),
        "n_reasons": len(record["reasons"]),
        "n_blocking_failed": sum(not c.passed for c in checks if c.blocking),
        **record["counts"],
        **record["grpo"],
        **record["canary"],
        **{c.name: c.value for c in checks},
        **{f"{c.name}_passed": int(c.passed) for c in checks},
    }

def admitted_set(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per admitted item (``role, item_id, input_hash``): the frame the zero-overlap schema checks."""
    parts = [frames[s][["item_id", "input_hash"]].assign(role=s) for s in SPLITS]
    return pd.concat(parts, ignore_index=True)[["role", "item_id", "input_hash"]]

