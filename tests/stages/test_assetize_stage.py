"""stages/assetize.py on a small generated batch (in-process), and the script's own exit-code wiring.

The success run goes through clap.stage.main in this process (``run_stage``; tests/e2e runs the
script itself under dvc repro). The error and usage cases stay real subprocesses: they prove
that ``python stages/<x>.py`` exits 2 with a one-line ``error: ...`` or the usage, no traceback.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from conftest import run_stage, stage_params_dir

from clap.demo import generate as demo
from clap.task.answer import load_answer_schema
from schemas.assets import asset_schemas

SCHEMAS = asset_schemas(load_answer_schema(Path(__file__).resolve().parents[2] / "params.yaml"))

ROOT = Path(__file__).resolve().parents[2]


def stage_subprocess(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "stages/assetize.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stage_writes_valid_assets_and_conserving_metrics(tmp_path):
    p = dataclasses.replace(demo.load_params(ROOT / "params.yaml"), scale=0.15)
    raw = demo.write_batch(tmp_path / "raw", "2026-04", demo.generate_batch("2026-04", p))
    manifest = json.loads((raw / "MANIFEST.json").read_text())
    out, metrics_path = tmp_path / "assets" / "2026-04", tmp_path / "metrics" / "2026-04.json"
    done = run_stage("assetize", raw, out, metrics_path, cwd=stage_params_dir(tmp_path / "repo"))
    assert done.returncode == 0, done.stderr
    m = json.loads(metrics_path.read_text())
    assert done.stdout.startswith(f"assetize {raw}: {m['rows_in']} rows -> ")  # describe()
    assert all(isinstance(v, (int, float, str, bool)) for v in m.values())  # flat for DVC
    assert m["conservation_ok"] is True and m["rows_in"] == sum(manifest["rows"].values())
    record = json.loads((tmp_path / "records" / "2026-04.json").read_text())  # provenance, not metrics
    key = "cmms.maintenance_tickets.csv.encoding"
    assert record[key] == "cp1252" and key not in m
    assert {k for k in record if k.startswith("sha256_")} and not any("sha256" in k for k in m)
    noise = manifest["noise"]
    assert (
        min(
            noise[k]
            for k in ("duplicate_within_system", "malformed_missing_field", "malformed_broken_quoting")
        )
        > 0
    )
    assert m["rejected.duplicate_id"] == noise["duplicate_within_system"]
    assert m["rejected.missing_field"] == noise["malformed_missing_field"]
    assert m["rejected.bad_json"] + m["rejected.broken_quoting"] == noise["malformed_broken_quoting"]
    assert sorted(f.name for f in out.iterdir()) == sorted(f"{a}.parquet" for a in SCHEMAS)
    for name, model in SCHEMAS.items():
        df = pd.read_parquet(out / f"{name}.parquet")
        model.validate(df, lazy=True)
        assert len(df) == m[f"assets.{name}"]


def test_stage_error_is_one_line_and_keeps_previous_outputs(tmp_path):
    raw = tmp_path / "raw" / "2026-01"
    raw.mkdir(parents=True)
    (raw / "notes.txt").write_text("not an export")
    out, metrics_path = tmp_path / "assets" / "2026-01", tmp_path / "metrics.json"
    out.mkdir(parents=True)
    (out / "records.parquet").write_bytes(b"previous run")
    done = stage_subprocess(raw, out, metrics_path)
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: ") and "unknown_file" in done.stderr and "Traceback" not in done.stderr
    )
    assert (out / "records.parquet").read_bytes() == b"previous run" and not metrics_path.exists()


def test_wrong_argument_count_exits_2_with_the_usage():
    done = stage_subprocess()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python stages/assetize.py") and "Traceback" not in done.stderr
