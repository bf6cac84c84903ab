"""`dvc plots show` / `dvc plots diff` draw what the TBDL detector saw (fast: no stage runs).

A scratch DVC repository holds dvc.yaml, params.yaml and the committed plots/ of the working tree; the
top-level detector plots must render with points for both of their series from every batch's
plots/train/<b>.csv, and overlay two revisions under `dvc plots diff`.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLOTS = {"train_loss_vs_probe": ("loss", "probe_loss"), "detector_log_e": ("log_e", "log_threshold")}


def dvc(cwd: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path) -> Path:
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "plots", tmp_path / "plots")
    git(tmp_path, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "plots")
    return tmp_path


def values_by_series(shown: dict, plot_id: str) -> Counter:
    (rendered,) = shown["data"][plot_id]
    assert rendered["type"] == "vega"
    return Counter(
        (v["rev"], v["filename::field"])
        for v in rendered["content"]["data"]["values"]
        if v["dvc_inferred_y_value"]
    )


def checked_rows(path: Path, column: str) -> int:
    with path.open(newline="") as f:
        return sum(1 for r in csv.DictReader(f) if r[column])


def test_detector_plots_render_every_batch_with_both_series(repo):
    shown = dvc(repo, "plots", "show", "--json", *PLOTS)
    assert not [e for e in shown.get("errors", []) if "plots/train" in e.get("source", "")]
    batches = yaml.safe_load((repo / "params.yaml").read_text())["batches"]
    for plot_id, columns in PLOTS.items():
        counts = values_by_series(shown, plot_id)
        for b in batches:
            for col in columns:
                n = checked_rows(repo / "plots/train" / f"{b}.csv", col)
                assert n > 0 and counts[("workspace", f"{b}.csv::{col}")] == n, (plot_id, b, col)


def test_detector_plots_overlay_revisions(repo):
    batch = yaml.safe_load((repo / "params.yaml").read_text())["batches"][0]
    path = repo / "plots/train" / f"{batch}.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # the workspace's run logged one step fewer
    diff = dvc(repo, "plots", "diff", "HEAD", "--json", "--targets", "detector_log_e")
    counts = values_by_series(diff, "detector_log_e")
    n = checked_rows(path, "log_e")
    assert (
        counts[("HEAD", f"{batch}.csv::log_e")] == n + 1 and counts[("workspace", f"{batch}.csv::log_e")] == n
    )
