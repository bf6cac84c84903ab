"""``clap pr-check`` on the tiny pipeline, as the PR workflow runs it after ``dvc repro``:

- the session's tiny run, committed, then its eval re-run from scratch (``--force --no-run-cache``, as
  a fresh CI runner without a DVC remote does) and what that makes stale: timings, latencies and
  their dvc.lock hashes differ, and the check passes;
- a gate policy change in params.yaml, re-run: the batch's gate decision changes and the check
  fails, its diff naming the decision key.

Works on a copy of the tiny repository, so the session's other e2e tests see it unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from conftest import E2E_BATCH as BATCH
from conftest import git, run_dvc

from clap import cli, io, params
from clap.release import compare
from clap.release import prcheck as pc

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)


@pytest.fixture(scope="module")
def repo(tiny_repo, tiny_run, tmp_path_factory) -> Path:
    """A copy of the tiny repository with the session's run committed."""
    assert tiny_run.returncode == 0, tiny_run.stdout[-3000:] + tiny_run.stderr[-3000:]
    copy = tmp_path_factory.mktemp("pr-check") / "repo"
    shutil.copytree(tiny_repo, copy, symlinks=True)
    # a fresh runner has no training checkpoints (a forced re-run of a finished run no longer resumes
    # from them, which trained one more step, 6 -> 7, seen 2026-12-02: tests/unit/train/test_sft.py)
    shutil.rmtree(copy / "checkpoints", ignore_errors=True)
    git(copy, "add", "-A")
    git(copy, "commit", "-qm", "tiny run", "--allow-empty")
    return copy


def _pr_check(repo: Path, monkeypatch, capsys) -> tuple[int, str, pc.PrCheckResult]:
    monkeypatch.chdir(repo)
    status = cli.main(["pr-check"])
    out = capsys.readouterr().out
    return (
        status,
        out,
        pc.pr_check(repo, params.section("verify", compare.VerifyParams, repo / "params.yaml")),
    )


def test_fresh_rerun_of_an_unchanged_repo_passes(repo, monkeypatch, capsys):
    before = io.read_json(repo / f"metrics/eval/{BATCH}.json")
    # eval re-run from scratch (forced, no run cache: a fresh CI runner without a DVC remote), then
    # whatever its new metrics make stale (gate, summary): timings and their dvc.lock hashes differ
    for args in (("repro", "--force", "--no-run-cache", "--single-item", f"eval@{BATCH}"), ("repro",)):
        done = run_dvc(repo, *args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert io.read_json(repo / f"metrics/eval/{BATCH}.json")["wall_s"] != before["wall_s"]
    assert git(repo, "status", "--porcelain", "--", "dvc.lock", "metrics/")  # raw bytes differ

    status, out, result = _pr_check(repo, monkeypatch, capsys)
    assert status == 0, out
    assert "PASS" in out and "timing" in out
    rows = {r.artifact: r for r in result.rows}
    assert rows[f"metrics/eval/{BATCH}.json:wall_s"].status == "expected"
    assert rows[f"metrics/gate/{BATCH}.json:decision"].status == "match"
    assert rows[f"records/train/{BATCH}.json:adapter_sha256"].status == "match"


def test_policy_change_that_flips_the_decision_fails(repo, monkeypatch, capsys):
    gate = io.read_json(repo / f"metrics/gate/{BATCH}.json")
    health = io.read_json(repo / f"metrics/train/{BATCH}.json")["health"]
    assert gate["rule"] != "admission", gate  # the tiny batch is admitted and trained
    # the health check comes first after admission: making its cap reject (or, when it already
    # decides, promote) moves the rule, and the decision with it unless both reject
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["gate"]["health"][health] = "promote" if gate["rule"] == "health" else "reject"
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    done = run_dvc(repo, "repro")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    now = io.read_json(repo / f"metrics/gate/{BATCH}.json")
    assert now["rule"] != gate["rule"]

    status, out, result = _pr_check(repo, monkeypatch, capsys)
    assert status == 1, out
    line = next(x for x in out.splitlines() if f"metrics/gate/{BATCH}.json:rule:" in x)
    assert BATCH in line and "gate" in line and f"{gate['rule']} -> {now['rule']}" in line
    failing = {r.artifact for r in result.failures}
    assert f"dvc.lock:gate@{BATCH}:params:params.yaml.gate.health.{health}" in failing
    assert not [r for r in result.failures if r.kind == "timing"]
