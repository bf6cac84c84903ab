"""Fault-injection calibration (TBDL's calibration positives): run the loop on known faults.

Each variant copies an admitted batch into a work folder (the batch itself is never
touched), injects one fault, then runs the loop as the stages do, in-process: train
(:func:`clap.train.sft.train_batch`, with the runtime diagnosis and the TBDL detector), eval
on the batch's held-out items (:func:`clap.judge.evaluation.evaluate`) and the gate
(:func:`clap.judge.gating.run_gate`) under the real policy from params (bar the per-request
latency bound: that is measured by replay, which calibration does not run). Faults:

- ``relabel``: every training answer (fields, evidence and cited doc together) moves to
  another item (a seeded derangement): a join on the wrong key;
- ``dirty_values`` / ``dirty_evidence``: a fraction of training items get another item's
  value / evidence quote (a seeded derangement within that fraction);
- ``loss_on_prompt``: the omitted loss-masking trap (``train.loss_on_prompt: true``);
- ``lr_zero``: learning rate 0 (the adapter stays the base);
- ``nan``: a LoRA weight is poisoned with NaN before a step (``train.inject_nan_at_step``).

Clean runs (no fault) over several seeds give the false-reject rate. The required outcome:
no fault run gets a decision in ``calibrate.fail_on`` (promote, canary).

Faults are injected into a copy of the admitted batch, and admission's content checks
(:func:`clap.data.admission.training_data_checks`: balance, evidence verifiability, label canary)
re-run on the changed training items, as they would on a batch that arrived with the fault.
Every run is then trained, evaluated and gated even when that re-check refuses it (the real
loop would skip training), so the table shows what each layer catches on its own: the
admission verdict, the gate without it ("gate alone") and the loop's decision (the gate
with the admission verdict). The baseline is the base model (no incumbent).
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clap import io
from clap.chain.grounding import answer_space
from clap.data.admission import AdmitParams, reason, training_data_checks
from clap.data.normalize import NormalizeParams, build_vocab, normalize_params
from clap.errors import ClapError
from clap.judge import certification
from clap.judge.evaluation import EvalParams, ModelSpec, adapter_sha256, eval_params, evaluate
from clap.judge.gating import DECISION_CODE, GateParams, GateResult, decide, run_gate
from clap.model.base import ADAPTER_FILE
from clap.params import check_keys
from clap.task.answer import AnswerSchema
from clap.task.scoring import ScoringParams, scoring_params
from clap.train.budget import BudgetParams, budget_params
from clap.train.detector import DetectorParams
from clap.train.diagnosis import curves_csv
from clap.train.sft import TrainParams, admitted, train_batch

CLEAN = "clean"
DATA_FAULTS = ("relabel", "dirty_values", "dirty_evidence")
FAULTS = (*DATA_FAULTS, "loss_on_prompt", "lr_zero", "nan")
BATCH_FILES = ("sft.parquet", "probe.parquet", "eval.parquet", "kb.parquet", "admission.json")


def relabel_columns(answer: AnswerSchema) -> tuple[str, ...]:
    """The columns a relabel fault moves: the whole answer, with its cited doc."""
    return (*answer.names, "evidence_doc_id")


@dataclasses.dataclass(frozen=True)
class CalibrateParams:
    """params.yaml ``calibrate`` (see the comments there)."""

    faults: Sequence[str]
    fault_seeds: Sequence[int]
    clean_seeds: Sequence[int]
    dirty_fraction: float
    nan_at_step: int
    fail_on: Sequence[str]
    batches: Sequence[
        str
    ] = ()  # `clap certify`: the profile's clean batches (positive controls); faults on the first
    record: str = ""  # `clap certify`: the committed certification record (clap/judge/certification.py)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(FAULTS))
        bad_fail = sorted(set(self.fail_on) - set(DECISION_CODE))
        check_keys(
            {
                "calibrate.faults": not unknown,
                "calibrate.fail_on": not bad_fail,
                "calibrate.dirty_fraction": 0.0 < self.dirty_fraction <= 1.0,
                "calibrate.nan_at_step": self.nan_at_step >= 1,
            },
            f"calibrate: faults must be among {FAULTS} (unknown {unknown}), fail_on among {tuple(DECISION_CODE)} "
            f"(unknown {bad_fail}), 0 < dirty_fraction <= 1, nan_at_step >= 1",
        )
        check_keys(
            {
                "calibrate.clean_seeds": bool(self.clean_seeds),
                "calibrate.fault_seeds": bool(self.fault_seeds) or not self.faults,
            },
            "calibrate: clean_seeds (and fault_seeds when faults are listed) must not be empty",
        )


@dataclasses.dataclass(frozen=True)
class LoopParams:
    """The params sections the loop reads, as the stages read them."""

    train: TrainParams
    detector: DetectorParams
    eval: EvalParams
    scoring: ScoringParams
    gate: GateParams
    admit: AdmitParams
    normalize: NormalizeParams
    budget: BudgetParams  # each run's training is held to the batch's budget, as the train stage's


@dataclasses.dataclass(frozen=True)
class Variant:
    """One calibration run: a fault (or ``clean``) and the seed of its training and fault draw."""

    fault: str
    seed: int
    batch: str = ""

    @property
    def name(self) -> str:
        """``<batch>.<fault>-<seed>``: the run's name in the table, metrics keys and file names."""
        return f"{self.batch}.{self.fault}-{self.seed}" if self.batch else f"{self.fault}-{self.seed}"


@dataclasses.dataclass
class CalibrationResult:
    """Per-run rows (table order), each run's training curves, and the flat summary."""

    rows: list[dict[str, Any]]
    curves: dict[str, list[dict[str, Any]]]
    summary: dict[str, Any]


def load_params(path: Path | str) -> tuple[CalibrateParams, LoopParams]:
    """The ``calibrate`` section and the loop's sections of a params file."""
    from clap import params

    sections = {
        "train": TrainParams,
        "detector": DetectorParams,
        "gate": GateParams,
        "admit": AdmitParams,
    }
    loop = LoopParams(
        **{name: params.section(name, cls, path) for name, cls in sections.items()},
        eval=eval_params(path),
        scoring=scoring_params(path),
        normalize=normalize_params(path),
        budget=budget_params(path),
    )
    return params.section("calibrate", CalibrateParams, path), loop


def plan(cp: CalibrateParams, batch: str = "", *, faults: bool = True) -> list[Variant]:
    """Every run of one batch: each fault under each fault seed (unless ``faults`` is false), then a
    clean run per clean seed."""
    return [Variant(f, s, batch) for f in cp.faults for s in cp.fault_seeds if faults] + [
        Variant(CLEAN, s, batch) for s in cp.clean_seeds
    ]


# --- fault injection --------------------------------------------------------------------------
def derange_rows(
    frame: pd.DataFrame, columns: Sequence[str], fraction: float, rng: np.random.Generator
) -> pd.DataFrame:
    """A copy in which a seeded ``fraction`` of rows take ``columns`` from another row of that set.

    The chosen rows are put in random order and each takes the values of the next one (a
    cyclic shift: no chosen row keeps its own position's values).
    """
    out = frame.copy()
    n = int(round(fraction * len(frame)))
    if n < 2:
        return out
    chosen = rng.permutation(len(frame))[:n]
    for col in columns:  # column by column: each keeps its dtype
        values = frame[col].to_numpy(copy=True)
        values[chosen] = frame[col].to_numpy()[np.roll(chosen, -1)]
        out[col] = values
    return out


def rows_changed(before: pd.DataFrame, after: pd.DataFrame, columns: Sequence[str]) -> int:
    """Rows whose ``columns`` differ (a derangement between equal answers changes nothing)."""
    cols = list(columns)
    return int((before[cols].reset_index(drop=True) != after[cols].reset_index(drop=True)).any(axis=1).sum())


def corrupt_sft(
    sft: pd.DataFrame, fault: str, fraction: float, seed: int, answer: AnswerSchema
) -> pd.DataFrame:
    """The training items with a data fault injected (``sft`` unchanged for other faults)."""
    rng = np.random.default_rng(seed)
    if fault == "relabel":
        return derange_rows(sft, relabel_columns(answer), 1.0, rng)
    if fault == "dirty_values":
        return derange_rows(sft, ["value"], fraction, rng)
    if fault == "dirty_evidence":
        return derange_rows(sft, ["evidence"], fraction, rng)
    return sft


def fault_train_params(
    tp: TrainParams, variant: Variant, cp: CalibrateParams, checkpoint_root: Path
) -> TrainParams:
    """The ``train`` params of one run: its seed, its checkpoint folder, and a training fault."""
    changes: dict[str, Any] = {"seed": variant.seed, "checkpoint_root": str(checkpoint_root)}
    if variant.fault == "loss_on_prompt":
        changes["loss_on_prompt"] = True
    elif variant.fault == "lr_zero":
        changes["lr"] = 0.0
    elif variant.fault == "nan":
        changes["inject_nan_at_step"] = cp.nan_at_step
    return dataclasses.replace(tp, **changes)


def prepare_batch(
    admitted_dir: Path, run_dir: Path, variant: Variant, cp: CalibrateParams, answer: AnswerSchema
) -> tuple[Path, int]:
    """Copy the admitted batch into ``run_dir/data`` with the variant's data fault; (folder, rows changed)."""
    data = run_dir / "data"
    data.mkdir(parents=True)
    for name in BATCH_FILES:
        shutil.copy2(admitted_dir / name, data / name)
    if variant.fault not in DATA_FAULTS:
        return data, 0
    sft = io.read_parquet(admitted_dir / "sft.parquet")
    dirty = corrupt_sft(sft, variant.fault, cp.dirty_fraction, variant.seed, answer)
    io.write_parquet(data / "sft.parquet", dirty)
    return data, rows_changed(sft, dirty, relabel_columns(answer))


def readmit(data: Path, lp: LoopParams) -> dict[str, Any]:
    """Admission's content checks on the run's training items (after its fault):
    ``admitted``, the failed checks' reasons and the evidence-verifiable rate."""
    sft, kb = io.read_parquet(data / "sft.parquet"), io.read_parquet(data / "kb.parquet")
    held = pd.concat([io.read_parquet(data / "eval.parquet"), io.read_parquet(data / "probe.parquet")])
    checks = training_data_checks(sft, held, kb, lp.admit, build_vocab(lp.normalize), lp.scoring.answer)
    failed = [c for c in checks if c.blocking and not c.passed]
    evidence = next(c.value for c in checks if c.name == "evidence_verifiable_rate")
    return {
        "admitted": not failed,
        "admission_reasons": "; ".join(reason(c) for c in failed),
        "evidence_verifiable_rate": evidence,
    }


# --- one run --------------------------------------------------------------------------------
def candidate_spec(adapter_dir: Path) -> ModelSpec | None:
    """The candidate adapter, or None when training wrote no weights (batch skipped)."""
    if not (adapter_dir / ADAPTER_FILE).exists():
        return None
    return ModelSpec("candidate", str(adapter_dir), adapter_sha256(adapter_dir), adapter_dir.name)


def gate_run(
    base_eval: tuple[pd.DataFrame, pd.DataFrame],
    cand: ModelSpec | None,
    base_dir: Path,
    items: pd.DataFrame,
    kb: pd.DataFrame,
    record: dict[str, Any],
    admitted: bool,
    lp: LoopParams,
) -> GateResult:
    """Eval the candidate on the held-out items and decide with the real gate (baseline: base)."""
    specs = [ModelSpec("base", None, "", "")] + ([cand] if cand else [])
    scored = base_eval[0]  # eval's timings are diagnostics: the gate bounds per-request latency (replay)
    if cand is not None:
        c_scored, _, _ = evaluate(
            [cand], base_dir, items, kb, lp.eval, lp.scoring, answer_space(lp.normalize, lp.scoring.answer)
        )
        scored = pd.concat([scored, c_scored], ignore_index=True)
    meta = {"models": [dataclasses.asdict(s) for s in specs], "production": {}}
    # no replay here: the per-request latency bound (measured by replay) is not part of calibration
    return run_gate(
        scored,
        meta,
        record,
        {"admitted": int(admitted)},
        lp.gate,
        replay=None,
        slices=lp.scoring.answer.slices,
    )


def table_row(
    variant: Variant,
    changed: int,
    admission: dict[str, Any],
    record: dict[str, Any],
    gate: GateResult,
    cp: CalibrateParams,
) -> dict[str, Any]:
    """One table row: the fault, admission, training health and detector, held-out numbers, the decisions."""
    n = gate.numbers
    keys = (
        "health",
        "steps",
        "planned_steps",
        "detector_alarm_step",
        "alarm_fraction",
        "detector_max_log_e",
        "detector_log_threshold",
        "train_loss_start",
        "train_loss_end",
        "probe_loss_start",
        "probe_loss_end",
        "masked_tokens_fraction",
    )
    quality = next((c for c in gate.checks if c.name == "quality"), None)
    row = {
        "run": variant.name,
        "batch": variant.batch,
        "fault": variant.fault,
        "seed": variant.seed,
        "rows_changed": changed,
        **admission,
        **{k: record.get(k, "") for k in keys},
    }
    row.update(
        {
            k: n.get(k, "")
            for k in (
                "baseline_pass_rate",
                "candidate_pass_rate",
                "b",
                "c",
                "delta",
                "pvalue",
                "hallucination_rate",
                "wrong_fact_rate",
                "n_items",
                "rule_power_at_delta_star",
            )
        }
    )
    # the positive control's test: the gate's own quality rule against the base passed
    row.update(
        learned=quality is not None and quality.cap == "promote",
        quality_detail=quality.detail if quality is not None else "no quality test (no candidate evaluated)",
    )
    alone = decide([c for c in gate.checks if c.name != "admission"])
    row.update(
        gate_alone=alone[0],
        gate_alone_rule=alone[1],
        decision=gate.decision,
        rule=gate.rule,
        released=gate.decision in cp.fail_on,
    )
    # a fault that would ship, or a clean run that did not learn: the certification fails
    row["failed"] = row["released"] if variant.fault != CLEAN else not row["learned"]
    return row


def run_variant(
    admitted_dir: Path,
    base_dir: Path,
    run_dir: Path,
    variant: Variant,
    base_eval: tuple[pd.DataFrame, pd.DataFrame],
    cp: CalibrateParams,
    lp: LoopParams,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train, eval and gate one variant in ``run_dir``; (table row, training curves)."""
    data, changed = prepare_batch(admitted_dir, run_dir, variant, cp, lp.scoring.answer)
    admission = readmit(data, lp)
    tp = fault_train_params(lp.train, variant, cp, run_dir / "checkpoints")
    result = train_batch(
        data, base_dir, run_dir / "adapter", tp, lp.detector, answer=lp.scoring.answer, bp=lp.budget
    )
    items, kb = io.read_parquet(data / "eval.parquet"), io.read_parquet(data / "kb.parquet")
    gate = gate_run(
        base_eval,
        candidate_spec(run_dir / "adapter"),
        base_dir,
        items,
        kb,
        result.record,
        admission["admitted"],
        lp,
    )
    shutil.rmtree(
        run_dir
    )  # adapter and checkpoints: ~0.1-0.2 GB a run on the real base; the row and curves are kept
    gc.collect()  # each run loads a model; free it before the next
    return table_row(variant, changed, admission, result.record, gate, cp), result.curves


def calibrate(
    admitted_dirs: Path | str | Sequence[Path | str],
    base_dir: Path | str,
    work_dir: Path | str,
    cp: CalibrateParams,
    lp: LoopParams,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> CalibrationResult:
    """Run the controls on one or more admitted batches (each copied into ``work_dir``).

    The first batch gets every variant of :func:`plan` (faults, then clean seeds); every other batch
    its clean seeds. Clean runs are the positive controls, fault runs the negative ones
    (:mod:`clap.judge.certification`).

    Args:
        admitted_dirs: ``data/admitted/<batch>`` folders (each must be admitted); read only.
        base_dir: the exported base model folder.
        work_dir: an empty scratch folder (copies, adapters, checkpoints); the caller deletes it.
        cp: ``calibrate`` params.  lp: the loop's params (train, detector, eval, scoring, gate).
        on_row: called with each finished row (progress output).

    Returns:
        The table rows, each run's curves and the flat summary (see :func:`summarize`).

    Raises:
        ClapError: a batch is not admitted (a skipped batch calibrates nothing).
    """
    dirs = (
        [Path(admitted_dirs)] if isinstance(admitted_dirs, (str, Path)) else [Path(d) for d in admitted_dirs]
    )
    base_dir, work_dir = Path(base_dir), Path(work_dir)
    for d in dirs:
        if not admitted(io.read_json(d / "admission.json"), d):
            raise ClapError(
                "calibration needs an admitted batch", file=d / "admission.json", rule="not_admitted"
            )
    rows, curves = [], {}
    for k, admitted_dir in enumerate(dirs):
        items, kb = (
            io.read_parquet(admitted_dir / "eval.parquet"),
            io.read_parquet(admitted_dir / "kb.parquet"),
        )
        base_eval = evaluate(
            [ModelSpec("base", None, "", "")],
            base_dir,
            items,
            kb,
            lp.eval,
            lp.scoring,
            answer_space(lp.normalize, lp.scoring.answer),
        )  # the same for every run of this batch
        batch = admitted_dir.name if len(dirs) > 1 else ""
        for variant in plan(cp, batch, faults=k == 0):
            row, curves[variant.name] = run_variant(
                admitted_dir, base_dir, work_dir / variant.name, variant, base_eval, cp, lp
            )
            rows.append(row)
            if on_row:
                on_row(row)
    return CalibrationResult(rows, curves, summarize(rows, cp))


# --- outputs --------------------------------------------------------------------------------
def summarize(rows: Sequence[dict[str, Any]], cp: CalibrateParams) -> dict[str, Any]:
    """Aggregates: fault runs released (must be 0), what admission and the gate alone caught,
    the clean runs' false-reject, hold and release rates."""
    faults = [r for r in rows if r["fault"] != CLEAN]
    clean = [r for r in rows if r["fault"] == CLEAN]
    return {
        "runs": len(rows),
        "fault_runs": len(faults),
        "clean_runs": len(clean),
        "faults_released": sum(r["released"] for r in faults),
        "no_fault_released": not any(r["released"] for r in faults),
        "fault_detector_alarms": sum(r["health"] == "alarm" for r in faults),
        "fault_admission_refusals": sum(not r["admitted"] for r in faults),
        "faults_released_by_gate_alone": sum(r["gate_alone"] in cp.fail_on for r in faults),
        "clean_false_reject_rate": sum(r["decision"] == "reject" for r in clean) / len(clean)
        if clean
        else -1.0,
        "clean_hold_rate": sum(r["decision"] == "hold" for r in clean) / len(clean) if clean else -1.0,
        "clean_release_rate": sum(r["released"] for r in clean) / len(clean) if clean else -1.0,
        "clean_admission_refusals": sum(not r["admitted"] for r in clean),
        "clean_detector_alarms": sum(r["health"] == "alarm" for r in clean),
        "clean_learned": sum(r["learned"] for r in clean),
        "fail_on": ",".join(cp.fail_on),
        "verdict": certification.verdict(rows, CLEAN)[0],
    }


FLAT_FIELDS = (
    "admitted",
    "health",
    "detector_alarm_step",
    "alarm_fraction",
    "gate_alone",
    "decision",
    "delta",
)


def flat_metrics(result: CalibrationResult) -> dict[str, Any]:
    """The flat metrics file: the summary plus, per run, ``<run>_<field>`` and the decision code."""
    out = dict(result.summary)
    for r in result.rows:
        out.update({f"{r['run']}_{k}": _flat(r[k]) for k in FLAT_FIELDS})
        out[f"{r['run']}_decision_code"] = DECISION_CODE[r["decision"]]
    return out


def _flat(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def _num(v: Any, spec: str = ".3f") -> str:
    return (
        format(v, spec)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else (str(v) if v != "" else "–")
    )


def _alarm(r: dict[str, Any]) -> str:
    step = r["detector_alarm_step"]
    return "–" if step in (-1, "") else f"{step} ({_num(r['alarm_fraction'], '.0%')})"


def _control(r: dict[str, Any]) -> str:
    if r["fault"] == CLEAN:
        return "FAIL: did not learn" if r["failed"] else "learned"
    return "FAIL: released" if r["failed"] else f"caught ({certification.caught_by(r)})"


def markdown_row(r: dict[str, Any]) -> str:
    """One row of the markdown table."""
    admission = "admitted" if r["admitted"] else f"**refused** ({r['admission_reasons']})"
    cells = [
        r["run"],
        str(r["rows_changed"]),
        admission,
        r["health"],
        f"{r['steps']}/{r['planned_steps']}",
        _alarm(r),
        f"{_num(r['detector_max_log_e'], '.2f')} / {_num(r['detector_log_threshold'], '.2f')}",
        f"{_num(r['train_loss_start'])} → {_num(r['train_loss_end'])}",
        f"{_num(r['probe_loss_start'])} → {_num(r['probe_loss_end'])}",
        f"{_num(r['baseline_pass_rate'])} → {_num(r['candidate_pass_rate'])}",
        _num(r["delta"], "+.3f"),
        _num(r["pvalue"], ".3g"),
        f"{_num(r['hallucination_rate'])} / {_num(r['wrong_fact_rate'])}",
        _num(r["masked_tokens_fraction"]),
        f"{r['gate_alone']} ({r['gate_alone_rule']})",
        f"**{r['decision']}** ({r['rule']})",
        _control(r),
    ]
    return "| " + " | ".join(cells) + " |"


def progress_line(r: dict[str, Any]) -> str:
    """One finished run, for progress output."""
    admission = "admitted" if r["admitted"] else "REFUSED by the admission re-check"
    return f"{r['run']}: {admission}, health {r['health']}, gate alone {r['gate_alone']}, decision {r['decision']} ({r['rule']})"


def _power_line(rows: Sequence[dict[str, Any]]) -> str:
    at = sorted(
        {
            (r["n_items"], r["rule_power_at_delta_star"])
            for r in rows
            if r["fault"] == CLEAN and r["n_items"] != ""
        }
    )
    return "; ".join(
        f"At N = {n} held-out items the quality rule promotes a true gain of exactly delta* with probability {_num(pw, '.2f')} "
        "(planned discordance)"
        for n, pw in at
    ) + ("." if at else "")


def render_markdown(result: CalibrationResult, title: str) -> str:
    """The calibration table and its summary, ready for a PR or the README."""
    s = result.summary
    verdict = (
        "no fault was released"
        if s["no_fault_released"]
        else f"**{s['faults_released']} fault run(s) RELEASED**"
    )
    v, failed = certification.verdict(result.rows, CLEAN)
    lines = [
        f"# Certification controls: {title}",
        "",
        f"Verdict: **{v}**"
        + (":" if failed else " (every positive control learned, every negative one was caught)."),
        *[f"- {f}" for f in failed],
        "",
        "| run | rows changed | admission re-check | health | steps | detector alarm step (fraction) | max log E / threshold | train loss | probe loss | "
        "pass rate base → cand | Δ | p | cand. hallucination / wrong fact | masked label share | gate alone (rule) | loop decision (rule) | control |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[markdown_row(r) for r in result.rows],
        "",
        f"Fault runs: {s['fault_runs']}, {verdict} (fail on: {s['fail_on']}); refused by the admission re-check: {s['fault_admission_refusals']}, "
        f"detector alarms: {s['fault_detector_alarms']}, released by the gate alone (without the admission verdict): {s['faults_released_by_gate_alone']}. "
        f"Clean runs: {s['clean_runs']}, false-reject rate {_num(s['clean_false_reject_rate'], '.2f')}, hold rate {_num(s['clean_hold_rate'], '.2f')}, "
        f"release rate {_num(s['clean_release_rate'], '.2f')}, admission refusals {s['clean_admission_refusals']}, detector alarms {s['clean_detector_alarms']}, "
        f"learned (the gate's quality rule passed against the base) {s['clean_learned']}. {_power_line(result.rows)}",
        "",
        "Admission re-check: admission's content checks re-run on the training items after the fault. Gate alone: the decision without "
        "the admission verdict. Loop decision: with it (what the pipeline would do).",
        "",
    ]
    return "\n".join(lines)


def write_outputs(
    result: CalibrationResult, report_dir: Path | str, metrics_path: Path | str, title: str
) -> None:
    """``report_dir``: calibration.md, runs.json, curves/<run>.csv (re-readable with
    :func:`clap.train.detector.replay`); ``metrics_path``: the flat metrics."""
    with io.atomic_dir(report_dir) as tmp:
        io.atomic_write_text(tmp / "calibration.md", render_markdown(result, title))
        io.write_json(tmp / "runs.json", {"summary": result.summary, "runs": result.rows})
        for name, rows in result.curves.items():
            io.atomic_write_text(tmp / "curves" / f"{name}.csv", curves_csv(rows))
    io.write_metrics_and_record(metrics_path, None, flat_metrics(result))
