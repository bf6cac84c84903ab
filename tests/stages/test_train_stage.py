"""The train stage on the tiny model: one plain run (in-process through clap.stage.main) and one
2-process torchrun (a real subprocess: the ranks must stop together)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_stage, write_tiny_admitted

from clap import io
from clap.release.lineage import resolve

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / "stages" / "train.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
CURVE_HEADER = [
    "step",
    "loss",
    "grad_norm",
    "learning_rate",
    "tokens_per_s",
    "probe_loss",
    "train_ref_loss",
    "probe_ref_loss",
    "gap_increment",
    "log_e",
    "log_threshold",
]


def _params(tmp: Path, cost: dict | None = None, **train) -> None:
    """A params.yaml in ``tmp`` with the real train/detector/determinism/task/release sections, shrunk for the
    tiny model (``cost`` overrides keys of release.cost)."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["release"]["cost"].update(cost or {})
    p["train"].update(
        max_steps=4,
        torch_threads=1,
        max_length=512,
        lr=1e-2,
        save_steps=2,
        checkpoint_root=str(tmp / "checkpoints"),
        **train,
    )
    p["detector"].update(probe_draw=1)
    p["progress"].update(log_every_s=0)  # a progress line at every step
    (tmp / "params.yaml").write_text(
        yaml.safe_dump(
            {k: p[k] for k in ("train", "detector", "determinism", "task", "release", "progress")},
            sort_keys=False,
        )  # the stage reads these sections only (task: the declared answer, the completions' shape; release.cost: the budget)
    )


def _argv(tmp: Path, base: Path, data: Path) -> list[str]:
    start = (
        tmp / "records/warm_start/b.json"
    )  # nothing released: fresh weights (what stage warm_start writes)
    io.write_json(start, resolve("b", "fresh", tmp, tmp / "models/adapters").record())
    return [
        str(data),
        str(base),
        str(start),
        str(tmp / "models/adapters/b"),
        str(tmp / "metrics/train/b.json"),
        str(tmp / "plots/train/b.csv"),
    ]


def _env() -> dict:
    return {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


def test_stage_writes_adapter_record_and_curves(tiny_base, tmp_path):
    _params(tmp_path)
    data = write_tiny_admitted(tmp_path / "data", n_sft=12, n_probe=6, seed=0, n_combos=4)
    done = run_stage("train", *_argv(tmp_path, tiny_base, data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rec = io.read_flat(tmp_path / "metrics/train/b.json")
    assert rec["trained"] == 1 and rec["health"] == "ok" and rec["steps"] == 4
    record = io.read_json(tmp_path / "records/train/b.json")  # provenance is not a metric
    assert record["adapter_sha256"] == io.sha256_file(
        tmp_path / "models/adapters/b/adapter_model.safetensors"
    )
    assert {"seed", "torch_version", "device", "base_sha256"} <= set(record)
    assert not {"seed", "torch_version", "device", "base_sha256"} & set(
        io.read_json(tmp_path / "metrics/train/b.json")
    )
    with open(tmp_path / "plots/train/b.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == CURVE_HEADER and len(rows) == 5
    assert "health ok" in done.stdout
    assert rec["cost_over_budget"] == 0 and rec["cost_estimate_s"] > 0 and "estimated" in done.stdout
    # progress: stdout is the stage's one summary line (no raw trainer dicts); stderr, not a terminal here,
    # has one plain line per step (params progress.log_every_s: 0)
    assert done.stdout.strip().splitlines() == [done.stdout.strip()] and "{'loss'" not in done.stdout
    steps = [ln for ln in done.stderr.splitlines() if ln.startswith("train b: ")]
    assert [ln.split(",")[0] for ln in steps] == [f"train b: {k}/4 steps ({25 * k}%)" for k in (1, 2, 3, 4)]
    assert all(" steps/s, elapsed " in ln and ", loss " in ln for ln in steps), steps


def test_stage_refuses_a_run_estimated_over_budget(tiny_base, tmp_path):
    _params(tmp_path, cost={"over_budget": "refuse", "budget_cpu_hours": 1e-7})
    data = write_tiny_admitted(tmp_path / "data", n_sft=12, n_probe=6, seed=0, n_combos=4)
    done = run_stage("train", *_argv(tmp_path, tiny_base, data), cwd=tmp_path)
    last = done.stderr.splitlines()[-1]  # after the model's loading progress
    assert done.returncode == 2 and last.startswith("error:") and "Traceback" not in done.stderr
    assert "over_budget" in last and "training refused before it starts: estimated" in done.stderr
    assert not (tmp_path / "metrics/train/b.json").exists() and not (tmp_path / "models/adapters/b").exists()


def test_stage_reports_bad_input_without_traceback(tiny_base, tmp_path):
    _params(tmp_path)
    done = run_stage("train", *_argv(tmp_path, tiny_base, tmp_path / "missing"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "Traceback" not in done.stderr


@pytest.mark.heavy  # two training processes (~1 min): make test-heavy
@pytest.mark.skipif(shutil.which(str(TORCHRUN)) is None, reason="torchrun not installed")
def test_torchrun_two_processes_stop_together(tiny_base, tmp_path):
    """2-process gloo DDP: the injected NaN and the detector's probe values must stop both ranks at the
    same step (a rank-local decision would hang the other rank in the next collective)."""
    _params(tmp_path, inject_nan_at_step=3, batch_size=1)
    data = write_tiny_admitted(tmp_path / "data", n_sft=16, n_probe=6, seed=0, n_combos=4)
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(STAGE),
        *_argv(tmp_path, tiny_base, data),
    ]
    done = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    rec = io.read_flat(tmp_path / "metrics/train/b.json")
    assert rec["world_size"] == 2 and rec["health"] == "nan" and rec["steps"] == rec["stop_step"] == 3
    assert rec["detector_checks"] == 2  # steps 1 and 2 were checked on both ranks
    assert (tmp_path / "models/adapters/b/adapter_model.safetensors").exists()
    assert done.stdout.count("health nan") == 1  # only rank 0 reports and writes
    # a forced re-run: every rank reads the finished marker before rank 0 clears the folder (no hang),
    # and both train from scratch to the same stop
    again = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = io.read_flat(tmp_path / "metrics/train/b.json")
    assert rerun["resumed_from"] == "" and rerun["steps"] == rerun["stop_step"] == 3
    assert rerun["adapter_sha256"] == rec["adapter_sha256"]
