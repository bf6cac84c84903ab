"""normalize: canonical, verifiable, deduplicated, leak-free assets for one batch.

usage: python stages/normalize.py data/assets/<b> data/normalized/<b> metrics/normalize/<b>.json

in:  data/assets/<b>/{records,kb,sft,grpo,eval,replay}.parquet; params.yaml `normalize`
out: data/normalized/<b>/{records,kb,sft,grpo,eval,replay,rejects}.parquet (every dropped or
     repaired row is in rejects.parquet with its rule); flat counts per rule in the metrics json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clap import io, stage
from clap.data.normalize import build_vocab, load_assets, normalize_batch, normalize_params
from clap.determinism import frame_hashes
from schemas.normalized import normalized_schemas, validate_frame

USAGE = "usage: python stages/normalize.py ASSETS_DIR OUT_DIR METRICS_JSON"


def run(assets_dir: Path, out_dir: Path, metrics_path: Path) -> dict:
    """Normalize one batch and write its folder and metrics; returns the metrics."""
    started = time.perf_counter()
    p = normalize_params()
    result = normalize_batch(load_assets(assets_dir, p.answer), p)
    schemas = normalized_schemas(build_vocab(p))
    frames = {**result.frames, "rejects": result.rejects}
    checked = {
        name: validate_frame(schemas[name], df, str(out_dir / f"{name}.parquet"))
        for name, df in frames.items()
    }
    with io.atomic_dir(out_dir) as tmp:
        for name, df in checked.items():
            io.write_parquet(tmp / f"{name}.parquet", df)
    metrics = {
        **result.metrics,
        **frame_hashes(out_dir, checked),
        "seconds": round(time.perf_counter() - started, 3),
    }
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), metrics)
    return metrics


def describe(argv, metrics: dict) -> str:
    kept = {k[: -len("_rows_out")]: v for k, v in metrics.items() if k.endswith("_rows_out")}
    return (
        f"normalize: kept {kept}; rejected {metrics['total_rejected']}, repaired {metrics['total_repaired']}, "
        f"deduplicated {metrics['total_deduplicated']}"
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (3,), run, describe))
