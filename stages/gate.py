"""gate: the post-training release decision for one batch, with its evidence bundle.

usage: python stages/gate.py data/eval/<b> metrics/train/<b>.json plots/train/<b>.csv metrics/admit/<b>.json metrics/replay/<b>.json reports/gate/<b> metrics/gate/<b>.json [metrics/grpo/<b>.json]

in:  data/eval/<b>/items.parquet + manifest.json; the training curves (plots/train/<b>.csv); the flat training, admission and
     application-chain replay records (each metrics file with its record file records/<stage>/<b>.json); params.yaml `gate` (the whole release policy, `gate.chain`
     for the replay; latency is gated on the replay's per-request B_request_p95_ms) and, for the evidence,
     `sizes admit train scoring eval`; the certification record named by `calibrate.record`, checked against
     records/base.json (and models/base), data/raw and data/admitted of its control batches and the deciding
     stages' code in dvc.yaml (whether the scenario is certified: evidence["certification"] with every change,
     metrics certified 0/1 and its reason)
out: metrics/gate/<b>.json + records/gate/<b>.json (flat, split by clap.io.split_record; decision as text and code: promote 3, canary 2, hold 1, reject 0; the
     decision without the chain checks as offline_decision; the incumbent's verdict on these items as incumbent_decision
     keep|rollback|n/a with incumbent_rule and incumbent_* numbers; the batch's decision for production as
     production_decision: rollback when the incumbent fails and the candidate is not releasable, else the candidate's
     decision), reports/gate/<b>/evidence.json (hashes, params,
     commit, regressed samples, the replay record, the detector's reading), reports/gate/<b>/report.md and
     reports/gate/<b>/detector.svg (training vs probe loss, log E vs log(1/alpha), the alarm marked; none
     for an untrained batch: the report says so)
with the GRPO probe record: the batch's GRPO-candidate decision (grpo_* fields, evidence["grpo"] with the KL
evidence, a report section); it caps the SFT decision only when params `grpo.hold_sft_on_hold` is true.
"""

from __future__ import annotations

import sys
from pathlib import Path

from clap import determinism, io, params, stage
from clap.judge import certification, detector_plot
from clap.judge import grpo_gate as grpo
from clap.judge.gate_report import evidence_bundle, render_report
from clap.judge.gating import GateParams, chain_checks, flat_metrics, run_gate
from clap.judge.scored import read_scored
from clap.task.answer import load_answer_schema
from clap.train.grpo_policy import GrpoParams

USAGE = "usage: python stages/gate.py EVAL_DIR TRAIN_JSON CURVES_CSV ADMIT_JSON REPLAY_JSON REPORT_DIR METRICS_JSON [GRPO_JSON]"
EVIDENCE_SECTIONS = ("sizes", "admit", "train", "task", "scoring", "eval", "gate")


def read_record(path: Path) -> dict:
    """A stage's whole flat record: its metrics file merged with its record file (records/<stage>/<b>.json,
    :func:`clap.io.record_path`: the hashes, versions, seeds and devices); a list or scalar is a corrupt record."""
    return io.read_flat(path)


def run(
    eval_dir: Path,
    train_json: Path,
    curves_csv: Path,
    admit_json: Path,
    replay_json: Path,
    report_dir: Path,
    metrics_path: Path,
    grpo_json: Path | None = None,
) -> dict:
    """Decide one batch (and its GRPO candidate, given the probe record); write the report folder and metrics."""
    p = params.section("gate", GateParams)
    scored, _, meta = read_scored(
        eval_dir
    )  # eval's timings are diagnostics: latency is gated per request (replay)
    train, admit, replay = read_record(train_json), read_record(admit_json), read_record(replay_json)
    probe = read_record(grpo_json) if grpo_json else None
    extra = grpo.sft_checks(probe, params.section("grpo", GrpoParams)) if probe else []
    slices = load_answer_schema().slices
    result = run_gate(
        scored, meta, train, admit, p, [*extra, *chain_checks(replay, p.chain)], replay=replay, slices=slices
    )
    used = {name: params.raw_section(name) for name in (*EVIDENCE_SECTIONS, *(("grpo",) if probe else ()))}
    evidence = evidence_bundle(
        result, eval_dir.name, meta, io.sha256_file(eval_dir / "items.parquet"), used, p
    )
    evidence["replay"] = (
        replay  # its cases_sha256 binds the scored cases (the record's own bytes hold timings)
    )
    curves = detector_plot.read_curves(curves_csv)
    evidence["detector"] = detector_plot.evidence_section(curves, train, detector_plot.curves_sha256(curves))
    # whether this decision is made in a certified scenario (clap/judge/certification.py); it labels the
    # decision and `clap release` refuses an uncertified one, it does not change it
    cert = certification.status(params.DEFAULT_PATH, params.raw_section("calibrate")["record"])
    evidence["certification"] = cert
    head, _, rest = render_report(evidence).partition("\n")
    report = f"{head}\n\n{certification.status_line(cert)}\n{rest}"
    metrics = {
        **flat_metrics(result),
        "certified": int(cert["certified"]),
        "certification": cert["reason"],
        **determinism.gate_record(train, params.section("determinism", determinism.DeterminismParams)),
    }
    if probe:
        evidence["grpo"] = grpo.evidence_section(probe, io.sha256_file(grpo_json))
        report += grpo.report_section(probe)
        metrics.update(grpo.gate_fields(probe))
    with io.atomic_dir(report_dir) as tmp:
        io.write_json(tmp / "evidence.json", evidence)
        io.atomic_write_text(tmp / "report.md", report)
        if curves:  # an untrained batch has none: the report says so
            svg = detector_plot.detector_svg(
                curves,
                alarm_step=evidence["detector"]["alarm_step"],
                planned_steps=evidence["detector"]["planned_steps"],
                title=f"Batch {eval_dir.name}: what the TBDL detector saw",
            )
            io.atomic_write_text(tmp / detector_plot.SVG_NAME, svg)
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), metrics)
    return metrics


def describe(argv, metrics: dict) -> str:
    production = (
        f"; production: {metrics['production_decision']} (incumbent {metrics['incumbent_decision']}, rule {metrics['incumbent_rule']})"
        if metrics["incumbent_decision"] != "n/a"
        else ""
    )
    return (
        f"gate {Path(argv[0]).name}: {metrics['decision']} (rule: {metrics['rule']}, baseline: {metrics['baseline']}; "
        f"offline checks alone: {metrics['offline_decision']}){production}"
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (7, 8), run, describe))
