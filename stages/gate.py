"""gate: the post-training release decision for one batch, with its evidence bundle.

usage: python stages/gate.py data/eval/<b> metrics/train/<b>.json metrics/admit/<b>.json reports/gate/<b> metrics/gate/<b>.json

in:  data/eval/<b>/{items,timings}.parquet + manifest.json; the flat training and admission
     records; params.yaml `gate` (the policy) and, for the evidence, `sizes admit train scoring eval`
out: metrics/gate/<b>.json (flat; decision as text and code: promote 3, canary 2, hold 1, reject 0),
     reports/gate/<b>/evidence.json (hashes, params, commit, regressed samples), reports/gate/<b>/report.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from clap import determinism, io, params
from clap.errors import ClapError
from clap.evaluation import read_scored
from clap.gating import GateParams, evidence_bundle, flat_metrics, render_report, run_gate

USAGE = "usage: python stages/gate.py EVAL_DIR TRAIN_JSON ADMIT_JSON REPORT_DIR METRICS_JSON"
EVIDENCE_SECTIONS = ("sizes", "admit", "train", "scoring", "eval", "gate")


def run(eval_dir: Path, train_json: Path, admit_json: Path, report_dir: Path, metrics_path: Path) -> dict:
    """Decide one batch; write the report folder and the flat metrics; return the metrics."""
    p = params.section("gate", GateParams)
    scored, timings, meta = read_scored(eval_dir)
    train, admit = io.read_json(train_json), io.read_json(admit_json)
    for path, record in ((train_json, train), (admit_json, admit)):
        if not isinstance(record, dict):
            raise ClapError("record must be a flat JSON object", file=path, rule="corrupt_record")
    result = run_gate(scored, timings, meta, train, admit, p)
    used = {name: params.raw_section(name) for name in EVIDENCE_SECTIONS}
    evidence = evidence_bundle(result, eval_dir.name, meta, io.sha256_file(eval_dir / "items.parquet"), used, p)
    with io.atomic_dir(report_dir) as tmp:
        io.write_json(tmp / "evidence.json", evidence)
        io.atomic_write_text(tmp / "report.md", render_report(evidence))
    metrics = {**flat_metrics(result), **determinism.gate_record(train, params.section("determinism", determinism.DeterminismParams))}
    io.write_json(metrics_path, metrics)
    return metrics


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        metrics = run(*(Path(a) for a in argv))
    except ClapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"gate {Path(argv[0]).name}: {metrics['decision']} (rule: {metrics['rule']}, baseline: {metrics['baseline']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
