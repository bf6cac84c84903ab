"""warm_start: what a batch's adapter starts from (params warm_start.mode), resolved from the release history.

usage: python stages/warm_start.py <b> releases/production.json models/adapters records/warm_start/<b>.json

in:  params.yaml `warm_start` (mode: fresh | incumbent), `release` (the approval checks of the pointer);
     releases/ (production pointer, history.jsonl, trusted keys)
out: records/warm_start/<b>.json: {batch, from_batch, adapter_sha256} (from_batch empty: fresh LoRA weights).
     `train` depends on this file, not on releases/ or the mode: a release re-runs this resolution, and a
     batch trains again only when its starting point changed (clap/train/warm_start.py: the rule).
"""

from __future__ import annotations

import sys
from pathlib import Path

from clap import io, params, stage
from clap.release.lineage import resolve
from clap.train.warm_start import WarmStartParams

USAGE = "usage: python stages/warm_start.py BATCH PRODUCTION_JSON ADAPTERS_DIR OUT_JSON"


def run(batch: Path, pointer: Path, adapters: Path, out: Path) -> dict:
    """Resolve and write the batch's starting point; returns the record."""
    wp = params.section("warm_start", WarmStartParams)
    ws = resolve(batch.name, wp.mode, pointer.resolve().parent.parent, adapters)
    io.write_json(out, ws.record())
    return {**ws.record(), "why": ws.why}


def describe(argv, r: dict) -> str:
    start = (
        f"batch {r['from_batch']}'s adapter {r['adapter_sha256'][:12]}"
        if r["from_batch"]
        else "fresh LoRA weights"
    )
    return f"warm_start {r['batch']}: {start} ({r['why']})"


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (4,), run, describe))
