"""clap.release.prcheck: committed metrics/records/dvc.lock vs the working tree, on hand-made files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from clap import cli, io
from clap.release import compare
from clap.release import prcheck as pc

ROOT_PARAMS = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/params.yaml"))["verify"]
B = "2026-01"
GATE = {
    "decision": "promote",
    "decision_code": 3,
    "rule": "all_checks_passed",
    "wall_s": 1.5,
    "b": 82,
    "c": 2,
}
EVAL = {"pass_rate": 0.92, "items": 100, "wall_s": 40.2, "tokens_per_s": 51.0, "p95_latency_ms": 120.0}
RECORD = {"adapter_sha256": "a" * 64, "torch_version": "2.13.0", "git_commit": "b" * 40, "seed": 1}


def _lock(params_value: float = 0.05, code: str = "c1", evidence: str = "e1") -> dict:
    return {
        "schema": "2.0",
        "stages": {
            f"gate@{B}": {
                "cmd": f"python stages/gate.py {B}",
                "deps": [
                    {"path": "clap/judge", "hash": "md5", "md5": f"{code}.dir"},
                    {"path": f"metrics/eval/{B}.json", "hash": "md5", "md5": "m1"},
                ],
                "params": {"params.yaml": {"gate": {"alpha": params_value}}},
                "outs": [
                    {"path": f"metrics/gate/{B}.json", "hash": "md5", "md5": "g1"},
                    {"path": f"reports/gate/{B}", "hash": "md5", "md5": f"{evidence}.dir"},
                ],
            },
            f"eval@{B}": {
                "cmd": f"python stages/eval.py {B}",
                "deps": [{"path": "clap/judge", "hash": "md5", "md5": f"{code}.dir"}],
                "outs": [
                    {"path": f"metrics/eval/{B}.json", "hash": "md5", "md5": "m1"},
                    {"path": f"data/eval/{B}", "hash": "md5", "md5": "d1.dir"},
                ],
            },
        },
    }


def _write(root: Path, files: dict[str, object]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(yaml.safe_dump(content) if rel == "dvc.lock" else io.dumps_json(content))


def _git(root: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    import os

    return subprocess.run(
        ["git", *args], cwd=root, env={**os.environ, **env}, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def vp() -> compare.VerifyParams:
    return compare.VerifyParams(**ROOT_PARAMS)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A committed repository: metrics, records, a gate report (cache: false, in git) and dvc.lock."""
    _write(
        tmp_path,
        {
            ".dvc/config": "",
            "params.yaml": yaml.safe_dump({"verify": ROOT_PARAMS}),
            "README.md": "hello\n",
            f"metrics/gate/{B}.json": GATE,
            f"metrics/eval/{B}.json": EVAL,
            f"records/train/{B}.json": RECORD,
            f"reports/gate/{B}/report.md": "took 1.5 s\n",
            f"reports/gate/{B}/evidence.json": {"decision": "promote", "git_commit": "b" * 40, "wall_s": 1.5},
            "dvc.lock": _lock(),
        },
    )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "committed run")
    return tmp_path


def _rerun(repo: Path, **changes) -> None:
    """The working tree as a re-run leaves it: timings, provenance and the md5s holding them change."""
    gate = {**GATE, "wall_s": 2.7, **changes.get("gate", {})}
    _write(
        repo,
        {
            f"metrics/gate/{B}.json": gate,
            f"metrics/eval/{B}.json": {**EVAL, "wall_s": 55.0, "tokens_per_s": 33.3, "p95_latency_ms": 300.0},
            f"records/train/{B}.json": {**RECORD, "git_commit": "c" * 40, **changes.get("record", {})},
            f"reports/gate/{B}/report.md": "took 2.7 s\n",
            f"reports/gate/{B}/evidence.json": {
                "decision": gate["decision"],
                "git_commit": "c" * 40,
                "wall_s": 2.7,
            },
            "dvc.lock": changes.get("lock", _lock(evidence="e2")),
        },
    )
    lock = yaml.safe_load((repo / "dvc.lock").read_text())  # the metrics' md5s change with their timings
    for stage in lock["stages"].values():
        for entry in stage.get("deps", []) + stage.get("outs", []):
            if entry["path"].startswith("metrics/"):
                entry["md5"] = entry["md5"] + "x"
            if entry["path"] == f"data/eval/{B}":
                entry["md5"] = "d2.dir"  # its timings.parquet changed; the committed object is not cached
    (repo / "dvc.lock").write_text(yaml.safe_dump(lock))


def test_unchanged_repo_passes(repo, vp):
    result = pc.pr_check(repo, vp)
    assert result.failures == [] and result.rows
    assert "PASS" in pc.render(result)


def test_timing_provenance_only_changes_pass_and_are_reported(repo, vp):
    _rerun(repo)
    result = pc.pr_check(repo, vp)
    assert result.failures == [], pc.render(result)
    rows = {r.artifact: r for r in result.rows}
    assert rows[f"metrics/gate/{B}.json:wall_s"].status == "expected"
    assert rows[f"metrics/eval/{B}.json:p95_latency_ms"].kind == "timing"
    assert rows[f"records/train/{B}.json:git_commit"].kind == "provenance"
    assert rows[f"reports/gate/{B}/report.md"].kind == "timing"  # a timing file, from the git blob
    assert rows[f"reports/gate/{B}/evidence.json:decision"].status == "match"
    assert rows[f"dvc.lock:data/eval/{B}"].status == pc.UNVERIFIED  # no DVC cache here: reported only
    text = pc.render(result)
    assert "PASS" in text and "timing" in text and "unverified" in text


def test_decision_change_fails_with_a_readable_diff(repo, vp, monkeypatch, capsys):
    _rerun(repo, gate={"decision": "reject", "decision_code": 0, "rule": "tbdl_detector_alarm"})
    result = pc.pr_check(repo, vp)
    failing = {r.artifact for r in result.failures}
    assert {f"metrics/gate/{B}.json:decision", f"reports/gate/{B}/evidence.json:decision"} <= failing
    monkeypatch.chdir(repo)
    assert cli.main(["pr-check", "--markdown", str(repo / "comment.md")]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if f"metrics/gate/{B}.json:decision:" in x)
    assert B in line and "gate" in line and "promote -> reject" in line
    assert "FAIL" in out and "do NOT reproduce" in (repo / "comment.md").read_text()


def test_hash_and_count_changes_fail(repo, vp):
    _rerun(repo, gate={"b": 81}, record={"adapter_sha256": "f" * 64})
    failing = {r.artifact: r for r in pc.pr_check(repo, vp).failures}
    assert failing[f"metrics/gate/{B}.json:b"].kind == "value"
    assert failing[f"records/train/{B}.json:adapter_sha256"].kind == "hash"


@pytest.mark.parametrize("change", ["new", "missing"])
def test_new_or_missing_metrics_file_fails(repo, vp, change):
    if change == "new":
        _write(repo, {"metrics/gate/2026-02.json": GATE})
        want = ("metrics/gate/2026-02.json", "missing", "present")
    else:
        (repo / f"metrics/eval/{B}.json").unlink()
        want = (f"metrics/eval/{B}.json", "present", "missing")
    failures = pc.pr_check(repo, vp).failures
    assert [(r.artifact, r.committed, r.reproduced) for r in failures] == [want]


def test_lock_params_code_and_stage_changes_fail(repo, vp):
    lock = _lock(params_value=0.01, code="c2")
    del lock["stages"][f"eval@{B}"]
    _rerun(repo, lock=lock)
    failing = {r.artifact for r in pc.pr_check(repo, vp).failures}
    assert f"dvc.lock:gate@{B}:params:params.yaml.gate.alpha" in failing
    assert f"dvc.lock:gate@{B}:deps:clap/judge" in failing
    assert f"dvc.lock:eval@{B}" in failing


def test_cached_directory_out_is_compared_by_content(repo, vp, tmp_path):
    """A DVC-cached out whose .dir md5 changed: the committed listing and objects come from the cache."""
    cache = tmp_path / "cache"

    def put(md5: str, data: bytes) -> None:
        obj = cache / "files" / "md5" / md5[:2] / md5[2:]
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(data)

    rel = f"data/eval/{B}"
    put(
        "d1.dir",
        json.dumps(
            [{"md5": "t1", "relpath": "timings.parquet"}, {"md5": "s1", "relpath": "summary.json"}]
        ).encode(),
    )
    put("t1", b"old timings")
    put("s1", io.dumps_json({"passed": 92, "wall_s": 1.0}).encode())
    old, new = _lock()["stages"], _lock()["stages"]
    new[f"eval@{B}"]["outs"][1]["md5"] = "d2.dir"
    _write(
        repo, {f"{rel}/timings.parquet": "new timings", f"{rel}/summary.json": {"passed": 92, "wall_s": 9.0}}
    )
    rows = pc.compare_locks(old, new, repo, repo, set(), vp, cache=cache)
    by = {r.artifact: r for r in rows}
    assert (
        by[f"{rel}/timings.parquet"].kind == "timing"
        and by[f"{rel}/summary.json:wall_s"].status == "expected"
    )
    assert by[f"{rel}/summary.json:passed"].status == "match"
    _write(repo, {f"{rel}/summary.json": {"passed": 91, "wall_s": 9.0}})
    rows = pc.compare_locks(old, new, repo, repo, set(), vp, cache=cache)
    assert [r.artifact for r in rows if r.status == compare.FAILING] == [f"{rel}/summary.json:passed"]


def test_docs_only_change_passes(repo, vp):
    (repo / "README.md").write_text("changed\n")
    _git(repo, "commit", "-qam", "docs")
    assert pc.pr_check(repo, vp, base="HEAD~1").failures == []
