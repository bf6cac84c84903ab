"""Reproducible decisions on the tiny pipeline (the session's one run, ``tiny_run``, committed and
pushed to a local DVC remote):

- ``clap verify`` re-runs the batch from a clean checkout with the run-cache off: the second,
  forced run gives identical hashes and decisions (the determinism test); without a remote it
  rebuilds the commit from data/raw and compares with what git holds (dvc.lock md5s included);
- a tampered commit (a metrics file that no longer matches dvc.lock) fails loudly;
- assetize, train, eval and gate are SIGKILLed mid-write (train mid-training): no partial file
  at a final path, and one ``dvc repro`` completes with the same result as the uninterrupted run;
- a concurrent ``dvc repro`` in the same workspace is refused by DVC's lock.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import E2E_BATCH as BATCH
from conftest import e2e_env, git, run_dvc

from clap import cli, io, params
from clap.errors import ClapError
from clap.release import checkout, compare
from clap.release import verify as vf

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)
# (stage, the path whose final rename kills it): gate after its report folder, before its metrics;
# train after checkpoint-6's weights are saved but before its state marker, so the re-run
# resumes from checkpoint-3 (the tiny config trains 6 steps, a checkpoint every 3). Killed
# downstream first, so each killed stage still finds its inputs.
KILLS = [
    ("gate", f"metrics/gate/{BATCH}.json"),
    ("eval", f"data/eval/{BATCH}"),
    ("train", f"checkpoints/{BATCH}/checkpoint-6/clap_diagnosis.json"),
    ("assetize", f"data/assets/{BATCH}"),
]


@pytest.fixture(scope="module")
def committed(tiny_repo, tiny_run, tmp_path_factory) -> str:
    """The tiny run committed to git and pushed to a local DVC remote; the commit's sha."""
    assert tiny_run.returncode == 0, tiny_run.stdout[-3000:] + tiny_run.stderr[-3000:]
    remote = tmp_path_factory.mktemp("dvc-remote")
    for args in (("remote", "add", "-f", "-d", "local", str(remote)), ("push",)):
        done = run_dvc(tiny_repo, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    git(tiny_repo, "add", "-A")
    git(tiny_repo, "commit", "-qm", "tiny run")
    return git(tiny_repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def vp(tiny_repo) -> compare.VerifyParams:
    return params.section("verify", compare.VerifyParams, tiny_repo / "params.yaml")


def test_verify_reproduces_decisions_and_hashes(tiny_repo, committed, monkeypatch, capsys):
    seen, real = [], vf.verify
    monkeypatch.setattr(vf, "verify", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    monkeypatch.chdir(tiny_repo)
    assert cli.main(["verify", BATCH]) == 0  # a batch name: that batch at HEAD (the committed run)
    table = capsys.readouterr().out
    assert "REPRODUCED" in table and "NOT REPRODUCED" not in table
    result = seen[0]
    rows = {r.artifact: r for r in result.rows}
    assert result.commit == committed
    assert result.failures == [] and result.batches == [BATCH]
    for key in (f"metrics/gate/{BATCH}.json:decision", f"metrics/gate/{BATCH}.json:offline_decision"):
        assert rows[key].kind == "decision" and rows[key].status == "match"
    for path in (
        f"models/adapters/{BATCH}/adapter_model.safetensors",
        f"data/eval/{BATCH}/items.parquet",
        f"data/assets/{BATCH}/sft.parquet",
        f"data/admitted/{BATCH}/sft.parquet",
    ):
        assert rows[path].kind == "hash" and rows[path].status == "match"  # byte-identical on CPU
    assert rows[f"metrics/eval/{BATCH}.json:wall_s"].status == "expected"  # timings differ, and do not fail
    assert rows[f"reports/gate/{BATCH}/evidence.json:git_commit"].kind == "provenance"
    assert rows[f"records/train/{BATCH}.json:determinism"].committed == "bytes"  # provenance: a record file
    for key in (f"records/train/{BATCH}.json:adapter_sha256", f"records/replay/{BATCH}.json:cases_sha256"):
        assert rows[key].kind == "hash" and rows[key].status == "match"  # record files are compared too
    assert rows[f"records/eval/{BATCH}.json:torch_version"].kind == "environment"


def test_verify_without_a_remote_rebuilds_from_raw_data(
    tiny_repo, committed, vp, tmp_path, monkeypatch, capsys
):
    """A fresh clone whose workspace has no DVC remote: the commit is rebuilt from data/raw (in git),
    outputs in git are compared by value, DVC-cached ones by the committed dvc.lock's md5."""
    clone = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(tiny_repo), str(clone))
    assert run_dvc(clone, "remote", "remove", "local").returncode == 0  # the workspace: no remote at all
    seen, real = [], vf.verify
    monkeypatch.setattr(vf, "verify", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    monkeypatch.chdir(clone)
    assert cli.main(["verify", "HEAD"]) == 0
    table = capsys.readouterr().out
    verdict = table.rstrip().splitlines()[-1]
    with capsys.disabled():
        print(f"\n{verdict}")  # the measured wall time (docs/reproducibility.md)
    assert f"batches {BATCH} (rebuilt from data/raw, no remote): REPRODUCED" in verdict
    result = seen[0]
    rows = {r.artifact: r for r in result.rows}
    assert result.commit == committed and result.mode == vf.MODE_NO_REMOTE and result.failures == []
    for key in (f"metrics/gate/{BATCH}.json:decision", f"metrics/gate/{BATCH}.json:offline_decision"):
        assert (rows[key].kind, rows[key].by, rows[key].status) == ("decision", "value", "match")
    for path in (f"models/adapters/{BATCH}", f"data/assets/{BATCH}", f"data/admitted/{BATCH}", "models/base"):
        assert (rows[path].by, rows[path].status) == (
            compare.BY_LOCK,
            "match",
        )  # same md5 as the committed lock
    assert (rows[f"data/eval/{BATCH}"].kind, rows[f"data/eval/{BATCH}"].status) == ("timing", "expected")
    assert (
        rows[f"records/eval/{BATCH}.json:sha256_items"].status == "match"
    )  # eval items, by their recorded hash
    hardware = rows[f"records/train/{BATCH}.json:hardware"]
    assert hardware.kind == "environment" and hardware.status == "match" and hardware.committed
    assert any("same hardware class" in n for n in result.notes)
    # a metrics file that no longer matches dvc.lock: caught before anything re-runs, remote or not
    rel = f"metrics/gate/{BATCH}.json"
    forged = {**io.read_json(clone / rel), "decision": "promote", "decision_code": 3}
    with pytest.raises(ClapError) as e:
        vf.verify(clone, _tampered_commit(clone, rel, io.dumps_json(forged)), vp)
    assert e.value.rule == "lock_mismatch" and rel in str(e.value) and "no remote" in str(e.value)


def _tampered_commit(repo: Path, rel: str, text: str) -> str:
    """A commit on top of HEAD where ``rel`` holds ``text`` (dvc.lock unchanged); the workspace is not touched."""
    env = {**e2e_env(), "GIT_INDEX_FILE": str(repo / ".git" / "tamper-index")}

    def run(*a, **kw):
        return subprocess.run(
            ["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True, **kw
        ).stdout.strip()

    run("read-tree", "HEAD")
    blob = run("hash-object", "-w", "--stdin", input=text)
    run("update-index", "--cacheinfo", f"100644,{blob},{rel}")
    return run("commit-tree", run("write-tree"), "-p", "HEAD", "-m", "tampered")


def test_verify_fails_loudly_when_the_lock_does_not_match(tiny_repo, committed, vp):
    rel = f"metrics/gate/{BATCH}.json"
    decision = io.read_json(tiny_repo / rel)
    forged = {**decision, "decision": "promote", "decision_code": 3}
    with pytest.raises(ClapError) as e:
        vf.verify(tiny_repo, _tampered_commit(tiny_repo, rel, io.dumps_json(forged)), vp)
    assert e.value.rule == "lock_mismatch" and rel in str(e.value)
    with pytest.raises(ClapError) as e:  # a decision file that does not parse
        vf.verify(tiny_repo, _tampered_commit(tiny_repo, rel, "{not json"), vp)
    assert e.value.rule == "lock_mismatch"


def _temporaries(repo: Path) -> list[Path]:
    return [
        p
        for top in ("data", "models", "metrics", "reports", "plots", "checkpoints")
        for p in (repo / top).rglob(".*.tmp")
    ]


def _assert_no_partial_outputs(
    repo: Path, committed_dir: Path, stage_outs: list[str], vp: compare.VerifyParams
) -> None:
    """Every file at a final path is absent or complete (equal to the uninterrupted run's, timings aside)."""
    for rel in stage_outs:
        before = compare.files_under(committed_dir, rel)
        for key, path in compare.files_under(repo, rel).items():
            rows = compare.compare_file(key, before.get(key), path, vp, None)
            assert not [r for r in rows if r.status == compare.FAILING], rows


def _dvc_bin() -> str:
    return str(Path(sys.executable).parent / "dvc")


def _runs_a_stage(proc: subprocess.Popen) -> bool:
    try:
        return any(
            "stages/" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True)
        )
    except psutil.Error:  # a child ended while being inspected
        return False


def _wait_for_stage_process(proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the dvc process runs a stage command (it holds the repository lock by then)."""
    deadline = time.monotonic() + timeout
    while not _runs_a_stage(proc):
        assert proc.poll() is None and time.monotonic() < deadline, "dvc repro ended before running a stage"
        time.sleep(0.05)


def test_killed_stages_leave_no_partial_file_and_rerun_reproduces(tiny_repo, committed, vp, tmp_path):
    lock = checkout.read_lock(tiny_repo)
    stages = checkout.batch_stages(lock, BATCH, vp)
    paths = [p for s in stages for p in checkout.outs(lock, s)]
    checkout.snapshot(tiny_repo, paths, tmp_path / "committed")
    shutil.rmtree(tiny_repo / "checkpoints" / BATCH)  # train from scratch, so it is killed mid-training
    for stage, rel in KILLS:
        killed = run_dvc(
            tiny_repo,
            "repro",
            "--force",
            "--single-item",
            f"{stage}@{BATCH}",
            env={**e2e_env(), io.CRASH_ENV: f"*/{rel}"},
        )
        assert killed.returncode != 0
        target = tiny_repo / rel
        assert list(target.parent.glob(f".{target.name}.*.tmp")), (
            f"{stage} was not killed mid-write:\n{killed.stderr[-2000:]}"
        )
        _assert_no_partial_outputs(
            tiny_repo, tmp_path / "committed", checkout.outs(lock, f"{stage}@{BATCH}"), vp
        )

    # forced, without the run-cache: the killed stages really run again (train resumes from its
    # checkpoint); a plain `dvc repro` restores their missing outputs from the local cache instead
    again = [f"{stage}@{BATCH}" for stage, _ in reversed(KILLS)]
    rerun = subprocess.Popen(
        [_dvc_bin(), "repro", "--force", "--no-run-cache", "--single-item", *again],
        cwd=tiny_repo,
        env=e2e_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_stage_process(rerun)
        concurrent = run_dvc(tiny_repo, "repro")  # same workspace, while the first holds the lock
        out, _ = rerun.communicate(timeout=900)
    finally:
        if rerun.poll() is None:
            rerun.kill()
    assert concurrent.returncode != 0 and "lock" in (concurrent.stdout + concurrent.stderr).lower()
    assert rerun.returncode == 0, out[-4000:]

    rows = compare.compare_outputs(tmp_path / "committed", tiny_repo, paths, BATCH, vp)
    assert vf.VerifyResult("", [BATCH], rows, 0.0).failures == []
    by_key = {r.artifact: r for r in rows}
    assert (
        by_key[f"models/adapters/{BATCH}/adapter_model.safetensors"].status == "match"
    )  # resumed training: same bytes
    assert io.read_json(tiny_repo / f"records/train/{BATCH}.json")["resumed_from"] == "checkpoint-3"
    assert _temporaries(tiny_repo) == []  # the re-run swept what the kills left
