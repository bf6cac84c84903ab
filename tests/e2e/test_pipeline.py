"""End to end: `dvc repro` of the real dvc.yaml on a tiny config (one batch, tiny model, few items).

This is the test that the stages fit together as DVC runs them: argv paths, deps/outs,
params sections, metrics files. It runs in a copy of the working tree so the repository's
own dvc.lock, cache and outputs are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BATCH = "2026-01"
pytestmark = pytest.mark.slow


def _project_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    keep = []
    for f in filter(None, out):
        if f.startswith("data/raw/") and not f.startswith(f"data/raw/{BATCH}/"):
            continue  # one batch is enough
        if f.startswith(("metrics/", "reports/", "plots/")) or f == "dvc.lock":
            continue  # the copy produces its own
        if (ROOT / f).is_file():
            keep.append(f)
    return keep


def tiny_params(params: dict, tiny_base: Path) -> dict:
    """The repository's params with sizes and budgets shrunk for a seconds-long run."""
    p = json.loads(json.dumps(params))
    p["batches"] = [BATCH]
    p["sizes"] = {"sft": 16, "grpo": 4, "eval": 8, "probe": 8, "replay": 6}
    p["admit"]["min_sizes"] = {"sft": 8, "grpo": 2, "eval": 4, "probe": 4, "replay": 2}
    p["base"]["model"] = str(tiny_base)
    p["train"].update(max_steps=6, save_steps=3)
    p["detector"].update(pilot_items=4, every_steps=2, probe_draw=2)
    p["eval"].update(batch_size=8, max_new_tokens=24)
    p["grpo"].update(enabled=[BATCH], max_steps=2, num_generations=2, prompts_per_step=1, max_completion_length=8)
    for section, key, value in (("replay", "max_new_tokens", 24), ("chain", "max_new_tokens", 24)):
        if section in p and key in p[section]:
            p[section][key] = value
    return p


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory, tiny_base):
    repo = tmp_path_factory.mktemp("e2e") / "repo"
    for f in _project_files():
        dest = repo / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    (repo / "params.yaml").write_text(yaml.safe_dump(tiny_params(params, tiny_base), sort_keys=False))
    env = _env(repo)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    return repo


def _env(repo: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "dvc"), *args], cwd=repo, env=_env(repo),
                          capture_output=True, text=True, timeout=900)


def test_dvc_repro_runs_every_stage_then_is_a_noop(tiny_repo):
    run = _dvc(tiny_repo, "repro")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    assetize = json.loads((tiny_repo / f"metrics/assetize/{BATCH}.json").read_text())
    assert assetize["rows_in"] == assetize["rows_assets"] + assetize["rows_rejected"]
    admit = json.loads((tiny_repo / f"metrics/admit/{BATCH}.json").read_text())
    assert admit["admitted"] == 1 and admit["pool_overlap"] == 0 and admit["admitted_overlap"] == 0
    gate = json.loads((tiny_repo / f"metrics/gate/{BATCH}.json").read_text())
    assert gate["decision"] in {"promote", "canary", "hold", "reject"}
    assert (tiny_repo / f"reports/gate/{BATCH}/report.md").read_text().strip()
    probe = json.loads((tiny_repo / f"metrics/grpo/{BATCH}.json").read_text())
    assert probe["run"] == 1 and probe["steps"] >= 1 and probe["static_verdict"] in {"pass", "fail"}
    assert gate["grpo_decision"] == "hold" and "GRPO probe: static admission vs runtime" in (tiny_repo / "reports/summary.md").read_text()

    start = time.perf_counter()
    again = _dvc(tiny_repo, "repro")
    assert again.returncode == 0
    assert "Data and pipelines are up to date" in again.stdout
    assert "Running stage" not in again.stdout
    status = _dvc(tiny_repo, "status")
    assert "up to date" in status.stdout, status.stdout
    print(f"no-op dvc repro: {time.perf_counter() - start:.2f} s")
