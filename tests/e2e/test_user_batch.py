"""End to end: a user's batch added the way README documents it (DVC-tracked, pushed), in a scratch repo.

The scratch repository is built from the working tree like the other e2e tests' (``make_e2e_repo``
in tests/conftest.py: the project's files, the tiny params, the one demo batch 2026-01 in git). A
copy of that batch's exports under a new name is the user's batch. README's walkthrough, command
for command: put the folder under data/raw/, `dvc add data/raw/<batch>`, `git add` its .dvc file
and data/raw/.gitignore, add it to ``batches`` in params.yaml, `dvc repro` (here only its first
three stages: no model is trained), `dvc push` to the default remote of .dvc/config, then
`clap verify` of the batch from a clean checkout, which must pull the raw data from the remote.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import time

import pytest
import yaml
from conftest import E2E_BATCH, e2e_env, git, make_e2e_repo, repo_params, run_dvc, tiny_params

from clap import params
from clap.release import compare
from clap.release import verify as vf

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)
USER = "2027-01"  # the user's batch: not a demo batch, so data/raw/.gitignore ignores it
STAGES = ("assetize", "normalize", "admit")


def _ok(done) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _ignored(repo, rel: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", rel], cwd=repo, env=e2e_env()).returncode == 0


def test_a_users_batch_is_dvc_added_run_pushed_and_verified(tmp_path):
    start = time.perf_counter()
    # the base model is never built or read here (no stage after admit runs)
    repo = make_e2e_repo(tmp_path / "repo", tiny_params(repo_params(), tmp_path / "unused-base"))
    shutil.copytree(repo / "data/raw" / E2E_BATCH, repo / "data/raw" / USER)  # the user's exports arrive

    # a habit (docs/reproducibility.md commits with `git add -A`): it must not take the raw files
    git(repo, "add", "-A")
    assert git(repo, "ls-files", f"data/raw/{USER}") == ""
    _ok(run_dvc(repo, "add", f"data/raw/{USER}"))
    assert (repo / f"data/raw/{USER}.dvc").is_file()
    assert _ignored(repo, f"data/raw/{USER}/question_log.jsonl")
    assert not _ignored(repo, f"data/raw/{USER}.dvc")
    git(repo, "add", f"data/raw/{USER}.dvc", "data/raw/.gitignore")
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["batches"].append(USER)
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))

    ran = _ok(run_dvc(repo, "repro", *(f"{s}@{USER}" for s in STAGES)))
    # admit reads every earlier batch's training pool (data/normalized: clap/data/admission.py), so the
    # earlier batch's assetize and normalize run before it (DVC orders the two batches' chains either way)
    ran_stages = re.findall(r"Running stage '([^']+)'", ran)
    before = {f"{s}@{b}" for s in STAGES[:2] for b in (USER, E2E_BATCH)}
    assert set(ran_stages[:-1]) == before and len(ran_stages) == 5 and ran_stages[-1] == f"admit@{USER}"
    for stage in STAGES:
        assert (repo / f"records/{stage}/{USER}.json").is_file()
    assetize = json.loads((repo / f"metrics/assetize/{USER}.json").read_text())
    assert assetize["rows_in"] == assetize["rows_assets"] + assetize["rows_rejected"] > 0
    assert json.loads((repo / f"metrics/admit/{USER}.json").read_text())["admitted"] == 1
    assert (repo / f"data/admitted/{USER}/sft.parquet").is_file()

    _ok(run_dvc(repo, "push"))  # the default remote of .dvc/config: ../clap-dvc-remote beside the repo
    assert any((tmp_path / "clap-dvc-remote").rglob("*"))
    assert json.loads(_ok(run_dvc(repo, "status", "--cloud", "--json")) or "{}") == {}
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"batch {USER}")
    assert git(repo, "status", "--porcelain") == ""
    tracked = git(repo, "ls-files", "data/raw").split()
    assert f"data/raw/{USER}.dvc" in tracked and not [f for f in tracked if f.startswith(f"data/raw/{USER}/")]

    # a clean checkout has the .dvc file only: verify pulls the raw batch from the remote and re-runs it
    vp = dataclasses.replace(
        params.section("verify", compare.VerifyParams, repo / "params.yaml"), stages=STAGES
    )
    result = vf.verify(repo, USER, vp, log=lambda line: None)
    assert result.batches == [USER] and result.failures == [], result.failures
    assert {r.artifact for r in result.rows} >= {f"data/admitted/{USER}/sft.parquet"}
    print(f"user batch: dvc add, repro of 3 stages, push, verify: {time.perf_counter() - start:.1f} s")
