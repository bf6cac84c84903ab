"""assetize: parse one raw batch into typed assets; every raw row lands in an asset or in rejects.

usage: python stages/assetize.py data/raw/<b> data/assets/<b> metrics/assetize/<b>.json

in:  data/raw/<b>/: the files params `assetize.sources` declares (the demo: five exports)
out: data/assets/<b>/{records,kb,sft,eval,replay,grpo,rejects}.parquet (written all at once),
     metrics/assetize/<b>.json (flat: conservation per source and batch, rejects per rule) and
     records/assetize/<b>.json (file and logical hashes, encodings; clap.io.split_record)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandera.pandas as pa

from clap import io, params, stage
from clap.data.assetize import AssetizeParams, assetize_batch, batch_metrics
from clap.determinism import frame_hashes
from clap.errors import ClapError
from clap.task.answer import load_answer_schema
from schemas.assets import asset_schemas

USAGE = "usage: python stages/assetize.py RAW_DIR OUT_DIR METRICS_JSON"


def run(raw_dir: Path, out_dir: Path, metrics_path: Path) -> dict:
    started = time.perf_counter()
    p = params.section("assetize", AssetizeParams)
    answer = load_answer_schema()
    result = assetize_batch(raw_dir, p, answer)
    schemas = asset_schemas(answer)
    frames = {name: _validate(schemas[name], name, df) for name, df in result.assets.items()}
    metrics = batch_metrics(result)
    if not metrics["conservation_ok"]:
        raise ClapError(
            "rows were lost between raw files and assets (conservation failed)",
            file=raw_dir,
            rule="conservation",
        )
    with io.atomic_dir(out_dir) as tmp:
        for name, df in frames.items():
            io.write_parquet(tmp / f"{name}.parquet", df)
    metrics.update(frame_hashes(out_dir, frames))
    metrics["seconds"] = round(time.perf_counter() - started, 3)
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), metrics)
    return metrics


def _validate(schema, name: str, df):
    try:
        return schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        cases = e.failure_cases[["column", "check"]].drop_duplicates().head(5).to_dict("records")
        raise ClapError(
            f"asset {name} fails its schema: {cases}", file=f"{name}.parquet", rule="schema"
        ) from e


def describe(argv, m: dict) -> str:
    return (
        f"assetize {argv[0]}: {m['rows_in']} rows -> {m['rows_assets']} assets + {m['rows_rejected']} rejects"
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (3,), run, describe))
