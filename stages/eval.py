"""eval: base, candidate adapter and production incumbent on the same held-out items.

usage: python stages/eval.py data/admitted/<b> models/base models/adapters/<b> releases/production.json data/eval/<b> metrics/eval/<b>.json

in:  data/admitted/<b>/{eval,kb}.parquet; models/base; the candidate adapter (if trained);
     the incumbent adapter models/adapters/<pointer batch> (if releases/production.json names one,
     sha256-verified); params.yaml `eval`, `chain` (answer budget, decoding), `scoring`, `normalize`
     (the answer space of constrained decoding)
out: data/eval/<b>/items.parquet (scored item x model, deterministic), timings.parquet (latency),
     manifest.json (models, hashes, admitted dataset hashes); flat per-model metrics json (with the
     free-decoding format diagnostic <role>_free_parse_rate under constrained decoding, and with
     eval.answer_metric tatqa TAT-QA's <role>_em, <role>_f1, per slice value too), its
     provenance (items hash, versions, device, threads, incumbent batch, decoding, generation engine) in records/eval/<b>.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clap import determinism, io, params, progress, stage
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.judge.evaluation import eval_params, evaluate, flat_metrics, incumbent_spec, manifest, model_specs
from clap.model.base import default_device
from clap.model.engine import choose_engine, model_config
from clap.task.scoring import scoring_params
from schemas.eval import EvalTimings, eval_items
from schemas.normalized import validate_frame

USAGE = "usage: python stages/eval.py ADMITTED_DIR BASE_DIR ADAPTER_DIR PRODUCTION_JSON OUT_DIR METRICS_JSON"


def run(admitted: Path, base: Path, adapter: Path, pointer: Path, out_dir: Path, metrics_path: Path) -> dict:
    """Evaluate every model of one batch; write the eval folder and metrics; return the metrics."""
    progress.configure(params.section("progress", progress.ProgressParams))  # what is printed only
    started = time.perf_counter()
    ep, sp = eval_params(), scoring_params()
    dp = params.section("determinism", determinism.DeterminismParams)
    determinism.apply(dp)
    items, kb = io.read_parquet(admitted / "eval.parquet"), io.read_parquet(admitted / "kb.parquet")
    incumbent = incumbent_spec(pointer, adapter.parent, base)
    specs = model_specs(adapter, incumbent)
    space = answer_space(normalize_params(), sp.answer)
    scored, timings, diagnostics = evaluate(specs, base, items, kb, ep, sp, space)
    scored = validate_frame(
        eval_items(sp.answer, answer_metric=ep.answer_metric), scored, str(out_dir / "items.parquet")
    )
    timings = validate_frame(EvalTimings, timings, str(out_dir / "timings.parquet"))
    with io.atomic_dir(out_dir) as tmp:
        io.write_parquet(tmp / "items.parquet", scored)
        io.write_parquet(tmp / "timings.parquet", timings)
        io.write_json(tmp / "manifest.json", manifest(specs, incumbent, base, admitted, len(items)))
    metrics = {
        **flat_metrics(scored, timings, specs, sp.answer),
        **diagnostics,
        "decoding": ep.decoding,
        **choose_engine(ep.engine, default_device(), model_config(base)).record(),
        **determinism.frame_hashes(out_dir, {"items": scored}),
        **determinism.record(dp, default_device()),
        "torch_threads": torch_threads(),
        "wall_s": round(time.perf_counter() - started, 3),
        "device": default_device(),
    }
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), metrics)
    return metrics


def torch_threads() -> int:
    """Intra-op threads generation ran with (float sums, hence greedy tokens, can depend on it)."""
    import torch

    return torch.get_num_threads()


def describe(argv, metrics: dict) -> str:
    roles = [r for r in ("base", "candidate", "incumbent") if f"{r}_pass_rate" in metrics]
    summary = ", ".join(
        f"{r} pass {metrics[f'{r}_pass_rate']:.3f} overall {metrics[f'{r}_overall']:.3f}" for r in roles
    )
    over = metrics.get("gold_over_budget", 0)
    budget = (
        f"; {over} gold answers need more tokens than chain.max_new_tokens: no model can answer them right"
        if over
        else ""
    )
    return f"eval: {metrics['n_items']} items; {summary or 'no items'}{budget}"


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (6,), run, describe))
