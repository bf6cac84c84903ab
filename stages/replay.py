"""replay: CLAP's ABCD application-chain replay of one batch (the gate, run next, decides on it).

usage: python stages/replay.py data/admitted/<b> models/base models/adapters/<b> data/replay/<b> reports/replay/<b> metrics/replay/<b>.json plots/replay/<b>.csv

in:  data/admitted/<b>/{replay,kb}.parquet; models/base; the batch's adapter (if trained);
     params.yaml `chain`, `eval` (batch size), `scoring`, `replay` (the per-request latency sample),
     `normalize` (the answer space of constrained decoding)
out: data/replay/<b>/cases.parquet (scored case x condition, deterministic), timings.parquet (batched,
     apportioned), request_timings.parquet (A and B, one request at a time);
     reports/replay/<b>/report.md (ABCD table, RAG necessity, adapter contribution, latency);
     flat metrics json (A_..D_ numbers, RAG necessity, adapter contribution, per-request latency of A and B
     and the adapter's per-request latency cost);
     records/replay/<b>.json (base, adapter and cases sha256, device);
     plot data csv (condition, metric, value, series)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clap import io, params, progress, stage
from clap.chain.chain import ChainParams
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.judge.evaluation import eval_params, gold_over_budget
from clap.judge.replay import (
    ReplayParams,
    plot_rows,
    render_report,
    replay_metrics,
    run_conditions,
    score_conditions,
)
from clap.model.base import ADAPTER_FILE, base_sha256, default_device
from clap.model.engine import choose_engine, model_config
from clap.task.scoring import scoring_params
from schemas.normalized import validate_frame
from schemas.replay import ReplayPlot, ReplayRequests, ReplayTimings, replay_cases

USAGE = "usage: python stages/replay.py ADMITTED_DIR BASE_DIR ADAPTER_DIR DATA_OUT_DIR REPORT_DIR METRICS_JSON PLOT_CSV"


def run(
    admitted: Path,
    base: Path,
    adapter: Path,
    data_dir: Path,
    report_dir: Path,
    metrics_path: Path,
    plot_csv: Path,
) -> dict:
    """Replay one batch; write cases, report, metrics and plot data; return the metrics."""
    progress.configure(params.section("progress", progress.ProgressParams))  # what is printed only
    started = time.perf_counter()
    cp, rp, sp, lp = (
        params.section("chain", ChainParams),
        eval_params(),
        scoring_params(),
        params.section("replay", ReplayParams).latency,
    )
    items, kb = io.read_parquet(admitted / "replay.parquet"), io.read_parquet(admitted / "kb.parquet")
    has_adapter = (adapter / ADAPTER_FILE).exists()
    space = answer_space(normalize_params(), sp.answer)
    memo_log: dict[str, str] = {}
    answers, requests = run_conditions(
        items, kb, base, adapter if has_adapter else None, cp, rp, lp, space, memo_log
    )
    cases, timings = score_conditions(items, answers, sp)
    cases = validate_frame(replay_cases(sp.answer), cases, str(data_dir / "cases.parquet"))
    timings = validate_frame(ReplayTimings, timings, str(data_dir / "timings.parquet"))
    requests = validate_frame(ReplayRequests, requests, str(data_dir / "request_timings.parquet"))
    numbers = {
        **replay_metrics(cases, timings, requests, len(items), has_adapter),
        "gold_over_budget": gold_over_budget(items, base, sp.answer, cp.max_new_tokens) if len(items) else 0,
    }
    plot = validate_frame(ReplayPlot, plot_rows(numbers), str(plot_csv))
    with io.atomic_dir(data_dir) as tmp:
        io.write_parquet(tmp / "cases.parquet", cases)
        io.write_parquet(tmp / "timings.parquet", timings)
        io.write_parquet(tmp / "request_timings.parquet", requests)
    with io.atomic_dir(report_dir) as tmp:
        io.atomic_write_text(tmp / "report.md", render_report(admitted.name, numbers))
    io.atomic_write_text(plot_csv, plot.to_csv(index=False, lineterminator="\n"))
    identity = {
        "base_sha256": base_sha256(base),
        "adapter_sha256": io.sha256_file(adapter / ADAPTER_FILE) if has_adapter else "",
        "cases_sha256": io.sha256_file(data_dir / "cases.parquet"),
    }  # deterministic (timings are kept apart): the gate's evidence binds it
    metrics = {
        **numbers,
        **identity,
        "wall_s": round(time.perf_counter() - started, 3),
        "device": default_device(),
        "decoding": cp.decoding,
        **choose_engine(cp.engine, default_device(), model_config(base)).record(),
        **memo_log,
    }
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), metrics)
    return metrics


def describe(argv, m: dict) -> str:
    abcd = ", ".join(
        f"{c} value {m[f'{c}_value_accuracy']:.3f} core {m[f'{c}_core_accuracy']:.3f}"
        for c in "ABCD"
        if m.get(f"{c}_run")
    )
    timed = ", ".join(
        f"{c} request p95 {m[f'{c}_request_p95_ms']:.0f} ms" for c in "AB" if f"{c}_request_p95_ms" in m
    )
    over = m.get("gold_over_budget", 0)
    return (
        f"replay {Path(argv[0]).name}: {m['n_cases']} cases; {abcd or 'nothing run'}"
        + (f"; {timed}" if timed else "")
        + (f"; {over} gold answers need more tokens than chain.max_new_tokens" if over else "")
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (7,), run, describe))
