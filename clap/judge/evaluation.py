"""Held-out evaluation: base, candidate adapter and incumbent on the same items, same order.

Every model answers the admitted ``eval.parquet`` items through the one prompt builder with
the items' own context, greedily (``clap.model.generate``); each answer is parsed and scored
(``clap.task.scoring``) into one row per item x model. Unparseable answers are rows that score
wrong, never dropped, so the pairing the gate relies on always holds. Timings are kept
apart from the scored records: ``items.parquet`` is deterministic (the approval binds its
hash), ``timings.parquet`` is not.

With params ``eval.answer_metric: tatqa`` every answer is also scored by TAT-QA's exact match and
numeracy-focused F1 (:mod:`clap.judge.answer_metric`): the predicted value with the predicted unit
as its scale against the gold value and unit (the unit word ``none`` is TAT-QA's empty scale), per
item in columns ``em`` and ``f1`` and per model in the metrics, overall and per slice value.
They are reported beside clap's fields; the gate decides on clap's fields alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clap import io, params
from clap.chain.chain import ChainParams
from clap.chain.grounding import AnswerSpace, Constrainer, check_decoding, constrainer_for
from clap.errors import ClapError
from clap.judge import answer_metric as tatqa
from clap.judge.scored import ROLES, TIMING_COLUMNS, answer_metric_columns, scored_columns
from clap.model.base import ADAPTER_FILE, base_sha256
from clap.model.engine import EngineParams
from clap.model.generate import Generation, generate_batched
from clap.params import bad_param, check_keys
from clap.release.registry import verify_pointer
from clap.task.answer import EVERY_DOC, AnswerSchema, ContextSpec, gold_of
from clap.task.context import item_docs, kb_bodies
from clap.task.prompt import build_messages, format_answer
from clap.task.scoring import ScoringParams, context_text, parse_answer, score_item


@dataclasses.dataclass(frozen=True)
class EvalParams:
    """How answers are decoded: ``eval.batch_size`` prompts at a time (eval and replay), within the
    application chain's answer budget ``chain.max_new_tokens`` (one budget for eval, replay and
    serving). ``eval.answer_metric`` (none | tatqa): TAT-QA's EM and F1 beside clap's fields (eval
    only). Built from params.yaml by :func:`eval_params`."""

    batch_size: int
    max_new_tokens: int
    decoding: str
    free_diagnostic_items: int
    answer_metric: str
    engine: EngineParams

    def __post_init__(self) -> None:
        check_decoding(self.decoding, "chain.decoding")
        answer_metric_columns(self.answer_metric)  # raises on an unknown metric
        if self.free_diagnostic_items < 0:
            raise bad_param("eval.free_diagnostic_items", "eval.free_diagnostic_items must be >= 0")
        check_keys(
            {"eval.batch_size": self.batch_size >= 1, "chain.max_new_tokens": self.max_new_tokens >= 1},
            "eval.batch_size and chain.max_new_tokens must be >= 1",
        )


@dataclasses.dataclass(frozen=True)
class _EvalSection:
    """Params section ``eval``."""

    batch_size: int
    free_diagnostic_items: int
    answer_metric: str


def eval_params(path: Path | str = params.DEFAULT_PATH) -> EvalParams:
    """:class:`EvalParams` from params sections ``eval`` (batch size, the free-decoding diagnostic, the
    answer metric) and ``chain`` (answer budget, decoding mode)."""
    chain, section = params.section("chain", ChainParams, path), params.section("eval", _EvalSection, path)
    return EvalParams(
        section.batch_size,
        chain.max_new_tokens,
        chain.decoding,
        section.free_diagnostic_items,
        section.answer_metric,
        chain.engine,
    )


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate: its role, adapter folder (None = the base) and identity."""

    role: str
    adapter_dir: str | None
    adapter_sha256: str
    batch: str


def adapter_sha256(adapter_dir: Path | str) -> str:
    """sha256 of an adapter's weights file (what release pointers and approvals record)."""
    return io.sha256_file(Path(adapter_dir) / ADAPTER_FILE)


def incumbent_spec(
    pointer_path: Path | str, adapters_root: Path | str, base_dir: Path | str | None = None
) -> ModelSpec | None:
    """The production adapter named by ``releases/production.json``, hash- and approval-verified; None if none.

    A missing pointer file or a pointer without a batch means nothing is in production. The
    pointer must be backed by a signed, single-use approval bound to the adapter's hashes (and
    to the base model in ``base_dir``, when given): :func:`clap.release.registry.verify_pointer`
    on the repository that holds ``<root>/releases/production.json``.

    Raises:
        ClapError: the pointer is corrupt, names an adapter that is missing, or whose bytes
            do not match ``adapter_sha256``, or it is not backed by a valid approval.
    """
    pointer_path = Path(pointer_path)
    if not pointer_path.exists():
        return None
    pointer = io.read_json(pointer_path)
    if not isinstance(pointer, dict):
        raise ClapError("production pointer must be a JSON object", file=pointer_path, rule="corrupt_pointer")
    if not pointer.get("batch"):
        return None
    expected = pointer.get("adapter_sha256")
    if not isinstance(expected, str) or not expected:
        raise ClapError(
            "production pointer names a batch but no adapter_sha256",
            file=pointer_path,
            column="adapter_sha256",
            rule="corrupt_pointer",
        )
    adapter_dir = Path(adapters_root) / str(pointer["batch"])
    actual = adapter_sha256(adapter_dir)
    if actual != expected:
        raise ClapError(
            f"incumbent adapter {adapter_dir} has sha256 {actual}, the pointer says {expected} (run `dvc checkout`)",
            file=pointer_path,
            column="adapter_sha256",
            rule="incumbent_hash_mismatch",
        )
    root = pointer_path.resolve().parent.parent  # <root>/releases/production.json
    base = base_sha256(base_dir) if base_dir is not None else None
    try:
        verify_pointer(root, adapters_dir=adapters_root, base_sha256=base)
    except ClapError as e:
        raise ClapError(
            f"refusing to compare against the incumbent: {e.args[0]}", file=e.file, rule=e.rule
        ) from e
    return ModelSpec("incumbent", str(adapter_dir), actual, str(pointer["batch"]))


def model_specs(adapter_dir: Path | str, incumbent: ModelSpec | None) -> list[ModelSpec]:
    """Base, candidate (when its adapter file exists) and the incumbent (see :func:`incumbent_spec`).

    The incumbent is left out when it is the candidate itself (same weights hash): its
    answers would be the candidate's, and the gate must not test a model against itself.
    """
    adapter_dir = Path(adapter_dir)
    specs = [ModelSpec("base", None, "", "")]
    if (adapter_dir / ADAPTER_FILE).exists():
        specs.append(ModelSpec("candidate", str(adapter_dir), adapter_sha256(adapter_dir), adapter_dir.name))
    if incumbent is not None and incumbent.adapter_sha256 not in {s.adapter_sha256 for s in specs}:
        specs.append(incumbent)
    return specs


def item_contexts(
    items: pd.DataFrame, kb: pd.DataFrame, spec: ContextSpec = EVERY_DOC
) -> list[list[tuple[str, str]]]:
    """The context documents each eval item shows (``spec``: params ``task.context``), in item order."""
    bodies = kb_bodies(kb)
    return [item_docs(row, bodies, spec) for row in items.to_dict("records")]


def _as_text(value: Any) -> str | None:
    """A parsed field as text for the record (non-strings as JSON, absent as None)."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def score_generations(
    role: str, items: pd.DataFrame, gens: Sequence[Generation], contexts: Sequence[str], p: ScoringParams
) -> pd.DataFrame:
    """One scored row per item for one model (no timings: those go to :func:`timing_rows`)."""
    rows = []
    schema = p.answer
    for pos, (item, gen, ctx) in enumerate(zip(items.to_dict("records"), gens, contexts)):
        parsed = parse_answer(gen.text, schema)
        scored = score_item(parsed, {k: item[k] for k in schema.names}, ctx, p)
        row = {
            "model": role,
            "position": pos,
            "item_id": item["item_id"],
            **{s: item[s] for s in schema.slices},
        }
        row.update(
            gold_value=str(item[schema.value]) if schema.value_is_text else float(item[schema.value]),
            output=gen.text,
            parse_ok=parsed.ok,
            parse_error=parsed.error or "",
        )
        row.update({f"pred_{k}": _as_text(parsed.fields.get(k)) for k in schema.names if k != schema.value})
        row.update(
            {k: v for k, v in scored.items() if k != "parse_ok"},
            new_tokens=gen.new_tokens,
            prompt_tokens=gen.prompt_tokens,
        )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=scored_columns(schema))
    if schema.value_is_text:  # the predicted text, None where there is none
        frame["pred_value"] = frame["pred_value"].astype(object).where(frame["pred_value"].notna(), None)
    else:
        frame["pred_value"] = pd.to_numeric(frame["pred_value"], errors="coerce").astype("float64")
    return frame


def tatqa_scale(unit: Any) -> Any:
    """A unit word as TAT-QA's scale: ``none`` (any case) and None are its empty scale ``""``; any other
    value as it is (:func:`clap.judge.answer_metric.score` reads thousand, million, billion, percent)."""
    if unit is None or (isinstance(unit, str) and unit.strip().casefold() == "none"):
        return ""
    return unit


def with_answer_metric(scored: pd.DataFrame, items: pd.DataFrame, schema: AnswerSchema) -> pd.DataFrame:
    """One model's scored rows with TAT-QA's ``em`` and ``f1`` per item (:func:`clap.judge.answer_metric.score`).

    The prediction is the parsed value of the row's ``output`` (as the model wrote it: a number or a
    string) with the predicted unit as its scale; the gold the item's value and unit. Without a
    declared unit both scales are empty. A prediction that did not parse, or names no known scale,
    scores (0, 0).

    Raises:
        ClapError: a gold unit that is not a TAT-QA scale (rule ``bad_gold``, naming the item).
    """
    unit = next((f.name for f in schema.fields if f.role == "unit"), None)
    golds = items.to_dict("records")
    ems, f1s = [], []
    for output, pos in zip(scored["output"], scored["position"]):
        gold = golds[int(pos)]
        parsed = parse_answer(output, schema)
        pred = parsed.fields.get(schema.value) if parsed.ok else None
        pred_scale = tatqa_scale(parsed.fields.get(unit)) if unit else ""
        gold_value = gold_of(gold, schema)[schema.value]
        try:
            em, f1 = tatqa.score(pred, gold_value, pred_scale, tatqa_scale(gold[unit]) if unit else "")
        except ClapError as e:
            raise ClapError(f"item {gold['item_id']}: {e.args[0]}", column=unit, rule=e.rule) from e
        ems.append(em)
        f1s.append(f1)
    return scored.assign(
        em=pd.Series(ems, index=scored.index, dtype="float64"),
        f1=pd.Series(f1s, index=scored.index, dtype="float64"),
    )


def timing_rows(role: str, items: pd.DataFrame, gens: Sequence[Generation]) -> pd.DataFrame:
    """Per item x model latency (apportioned) and batch wall time, in milliseconds."""
    rows = [
        (role, i, g.latency_ms, g.batch_wall_ms, g.batch_size, g.batch_index)
        for i, g in zip(items["item_id"], gens)
    ]
    return pd.DataFrame(rows, columns=TIMING_COLUMNS)


def generate_for(
    spec: ModelSpec,
    base_dir: Path | str,
    chats: Sequence[list[dict[str, str]]],
    docs: Sequence[Sequence[tuple[str, str]]],
    p: EvalParams,
    space: AnswerSpace,
    constrainers: dict[str, Constrainer],
    memo_log: dict[str, str],
) -> tuple[list[Generation], float | None]:
    """Load one model (base + optional adapter) and answer every chat.

    Returns the answers (decoded as ``p.decoding`` says) and, under constrained decoding with
    ``p.free_diagnostic_items`` > 0, the share of the first that many chats whose *free*
    (unconstrained) answer parses: the format-compliance diagnostic (None otherwise).
    ``constrainers`` caches the compiled grammars across the models of one evaluation. The base
    model's answers are read from :mod:`clap.model.memo` when an earlier run generated exactly these
    (``memo_log`` gets ``<role>_answers_memo``: ``reused <key>`` or ``generated <key>``).
    """
    from clap.model.base import default_device, load_tokenizer
    from clap.model.engine import engine_label, load_generator, model_config
    from clap.model.memo import base_memo

    k = min(p.free_diagnostic_items, len(chats)) if p.decoding == "constrained" else 0
    device = default_device()
    label = engine_label(p.engine, device, model_config(base_dir))
    memo = base_memo(base_dir, label, device) if spec.adapter_dir is None else None
    if memo is not None:
        key = memo.key(
            chats,
            [space.schema(d) for d in docs] if p.decoding == "constrained" else None,
            batch_size=p.batch_size,
            max_new_tokens=p.max_new_tokens,
            decoding=p.decoding,
            free_diagnostic_items=k,
        )
        if (hit := memo.load(key, spec.role)) is not None:
            memo_log.update(memo.log)
            return hit[0], hit[1]["free_rate"]
    model = load_generator(base_dir, spec.adapter_dir, p.engine)
    tok = load_tokenizer(base_dir, padding_side="left")
    free_rate = None
    if "grammars" not in constrainers:
        constrainers["grammars"] = constrainer_for(p.decoding, space, model, tok)
    constraint = constrainers["grammars"](docs) if constrainers["grammars"] is not None else None
    gens = generate_batched(
        model,
        tok,
        chats,
        batch_size=p.batch_size,
        max_new_tokens=p.max_new_tokens,
        desc=f"eval {spec.role}",
        constraint=constraint,
    )
    if k:
        free = generate_batched(
            model,
            tok,
            chats[:k],
            batch_size=p.batch_size,
            max_new_tokens=p.max_new_tokens,
            desc=f"eval {spec.role} free",
        )
        free_rate = sum(parse_answer(g.text, space.answer).ok for g in free) / k
    del model  # free the weights before the next model loads
    if memo is not None:
        memo.save(key, gens, {"free_rate": free_rate}, spec.role)
        memo_log.update(memo.log)
    return gens, free_rate


def gold_over_budget(items: pd.DataFrame, base_dir: Path | str, schema: AnswerSchema, budget: int) -> int:
    """Items whose gold answer (its JSON and the end-of-turn token) takes more tokens than the answer
    budget ``chain.max_new_tokens``: no model can answer them right within it. Counted in eval's metrics
    so a budget too small for the data is never silent."""
    from clap.model.base import load_tokenizer

    tok = load_tokenizer(base_dir, padding_side="left")
    texts = [format_answer(gold_of(row, schema), schema) for row in items.to_dict("records")]
    return sum(len(ids) + 1 > budget for ids in tok(texts, add_special_tokens=False)["input_ids"])


def evaluate(
    specs: Sequence[ModelSpec],
    base_dir: Path | str,
    items: pd.DataFrame,
    kb: pd.DataFrame,
    p: EvalParams,
    sp: ScoringParams,
    space: AnswerSpace,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """Score every model in ``specs`` on ``items``: (scored rows, timing rows, diagnostics).

    The diagnostics are ``<role>_free_parse_rate`` (see :func:`generate_for`) per model, when measured,
    ``base_answers_memo``: whether the base's answers were reused or generated, and their key, and
    ``gold_over_budget`` (:func:`gold_over_budget`).
    """
    columns = scored_columns(sp.answer) + answer_metric_columns(p.answer_metric)
    if items.empty:
        return pd.DataFrame(columns=columns), pd.DataFrame(columns=TIMING_COLUMNS), {}
    docs = item_contexts(items, kb, sp.answer.context)
    chats = [build_messages(q, d, sp.answer) for q, d in zip(items["question"], docs)]
    contexts = [context_text(d) for d in docs]
    scored, timed, constrainers = [], [], {}
    diagnostics: dict[str, Any] = {
        "gold_over_budget": gold_over_budget(items, base_dir, sp.answer, p.max_new_tokens)
    }
    for spec in specs:
        gens, free_rate = generate_for(spec, base_dir, chats, docs, p, space, constrainers, diagnostics)
        rows = score_generations(spec.role, items, gens, contexts, sp)
        scored.append(with_answer_metric(rows, items, sp.answer) if p.answer_metric == "tatqa" else rows)
        timed.append(timing_rows(spec.role, items, gens))
        if free_rate is not None:
            diagnostics[f"{spec.role}_free_parse_rate"] = round(free_rate, 6)
    return pd.concat(scored, ignore_index=True), pd.concat(timed, ignore_index=True), diagnostics


def manifest(
    specs: Sequence[ModelSpec],
    incumbent: ModelSpec | None,
    base_dir: Path | str,
    admitted_dir: Path | str,
    n_items: int,
) -> dict[str, Any]:
    """What was evaluated: models with hashes, the production adapter, the base hash and every admitted file's hash."""
    admitted_dir = Path(admitted_dir)
    files = sorted(p for p in admitted_dir.iterdir() if p.is_file())
    return {
        "n_items": n_items,
        "base_sha256": base_sha256(base_dir),
        "models": [dataclasses.asdict(s) for s in specs],
        "production": dataclasses.asdict(incumbent) if incumbent is not None else {},
        "datasets": {p.name: io.sha256_file(p) for p in files},
    }


def _rates(rows: pd.DataFrame, schema: AnswerSchema) -> dict[str, float]:
    core = rows[[f"{k}_correct" for k in schema.keys]].all(axis=1)
    return {
        "overall": float(rows["overall"].mean()),
        "pass_rate": float(rows["pass"].mean()),
        "value_accuracy": float(rows["value_correct"].mean()),
        "evidence_accuracy": float(rows["evidence_correct"].mean()),
        "core_accuracy": float(core.mean()),
        "hallucination_rate": float(rows["hallucination"].mean()),
        "wrong_fact_rate": float(rows["wrong_fact"].mean()),
        "parse_rate": float(rows["parse_ok"].mean()),
        "mean_new_tokens": float(rows["new_tokens"].mean()),
    }


def _speed(times: pd.DataFrame) -> dict[str, float]:
    wall_s = float(times.drop_duplicates("batch_index")["batch_wall_ms"].sum()) / 1000.0
    return {
        "p50_latency_ms": float(np.percentile(times["latency_ms"], 50)),
        "p95_latency_ms": float(np.percentile(times["latency_ms"], 95)),
        "items_per_s": float(len(times) / wall_s) if wall_s > 0 else 0.0,
    }


def flat_metrics(
    scored: pd.DataFrame, timings: pd.DataFrame, specs: Sequence[ModelSpec], schema: AnswerSchema
) -> dict[str, Any]:
    """Flat per-model metrics ``<role>_<metric>`` plus what was evaluated.

    A scored frame with TAT-QA's ``em`` and ``f1`` columns (params ``eval.answer_metric: tatqa``) adds
    :func:`answer_metric_metrics`."""
    roles = {s.role: s for s in specs}
    out: dict[str, Any] = {f"has_{r}": int(r in roles) for r in ROLES[1:]}
    out["n_items"] = int(scored["item_id"].nunique()) if len(scored) else 0
    out["incumbent_batch"] = roles["incumbent"].batch if "incumbent" in roles else ""
    for role in roles if len(scored) else ():
        rows, times = scored[scored["model"] == role], timings[timings["model"] == role]
        out.update({f"{role}_{k}": round(v, 6) for k, v in {**_rates(rows, schema), **_speed(times)}.items()})
    if len(scored) and {"em", "f1"} <= set(scored.columns):
        out.update(answer_metric_metrics(scored, [r for r in roles if r in set(scored["model"])], schema))
    return out


def answer_metric_metrics(scored: pd.DataFrame, roles: Sequence[str], schema: AnswerSchema) -> dict[str, Any]:
    """TAT-QA's mean EM and F1 per model (:func:`clap.judge.answer_metric.aggregate`), named like the
    other per-model metrics: ``<role>_em``, ``<role>_f1``, and per value of each slice column (the
    answer's slices: its vocabulary key fields, then ``task.slice_columns``)
    ``<role>_em.<column>=<value>`` and ``<role>_f1.<column>=<value>``, with the number of items
    ``n_items.<column>=<value>`` (the same for every model)."""
    slices = list(schema.slices)
    out: dict[str, Any] = {}
    for role in roles:
        rows = scored[scored["model"] == role]
        agg = tatqa.aggregate(rows[["em", "f1", *slices]].to_dict("records"), slices)
        for key, value in agg.items():
            if key == "n":
                continue
            if key.startswith("n."):
                out[f"n_items.{key[2:]}"] = int(value)
            else:
                out[f"{role}_{key}"] = round(float(value), 6)
    return out
