"""summary: the cross-batch table over every batch in params `batches` (averages never hide a regressed batch).

usage: python stages/summary.py metrics reports/summary.md metrics/summary.json plots/summary.csv

in:  metrics/{eval,gate,train,replay}/<b>.json for each batch; params.yaml `batches`, `summary`;
     metrics/grpo/<b>.json for each batch when metrics/grpo exists (the GRPO probe stage ran)
out: reports/summary.md (table, mean, regressed batches, decision counts; GRPO static vs runtime per batch),
     metrics/summary.json (flat),
     plots/summary.csv (a row per batch x delta: offline pass rate vs the gate's baseline, chain value B - A,
     with the batch's decision; dvc.yaml's top-level `plots` draws it)
"""

from __future__ import annotations

import sys
from pathlib import Path

from clap import io, params, stage
from clap.errors import ClapError
from clap.judge import grpo_gate as grpo
from clap.judge.summary import SummaryParams, batch_row, plot_frame, render_markdown, summarize

USAGE = "usage: python stages/summary.py METRICS_DIR REPORT_MD SUMMARY_JSON PLOT_CSV"


def run(metrics_dir: Path, report_md: Path, summary_json: Path, plot_csv: Path) -> dict:
    """Build the summary of every configured batch; write the three outputs; return the flat summary."""
    p = params.section("summary", SummaryParams)
    batches = params.raw_section("batches")
    if not isinstance(batches, list) or not batches:
        raise ClapError(
            "params `batches` must be a non-empty list",
            file="params.yaml",
            column="batches",
            rule="bad_params",
        )
    rows = [batch_row(metrics_dir, str(b), p) for b in batches]
    flat = summarize(rows, p)
    markdown = render_markdown(rows, flat, p)
    if (metrics_dir / "grpo").is_dir():  # static admission vs the runtime probe, per batch
        probes = [grpo.static_runtime_row(metrics_dir, str(b)) for b in batches]
        flat.update(grpo.summary_fields(probes))
        markdown += grpo.render_static_runtime(probes)
    io.atomic_write_text(report_md, markdown)
    io.write_metrics_and_record(summary_json, io.record_path(summary_json), flat)
    io.atomic_write_text(plot_csv, plot_frame(rows).to_csv(index=False, lineterminator="\n"))
    return flat


def describe(argv, flat: dict) -> str:
    return f"summary: {flat['n_batches']} batches, regressed: {flat['regressed_batches'] or 'none'}"


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (4,), run, describe))
