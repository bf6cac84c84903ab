"""clap.release.verify: key classification, file comparison, loud failures, target resolution, the table."""

from __future__ import annotations

import subprocess

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import save_file

from clap import io
from clap.errors import ClapError
from clap.release import verify as vf

ROOT_PARAMS = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/params.yaml"))["verify"]


@pytest.fixture
def vp() -> vf.VerifyParams:
    return vf.VerifyParams(**ROOT_PARAMS)


def test_keys_are_classified_by_params(vp):
    kinds = {
        key: vf.classify_key(key, vp)
        for key in (
            "decision",
            "offline_decision",
            "wall_s",
            "candidate_p95_latency_ms",
            "reasons.p95_latency_ms.detail",
            "git_commit",
            "torch_version",
            "adapter_sha256",
            "datasets_sha256.sft.parquet",
            "candidate_pass_rate",
            "reasons.quality.detail",
            "check_chain_latency_cost",
        )
    }
    assert kinds == {
        "decision": "decision",
        "offline_decision": "decision",
        "wall_s": "timing",
        "candidate_p95_latency_ms": "timing",
        "reasons.p95_latency_ms.detail": "timing",
        "git_commit": "provenance",
        "torch_version": "environment",
        "adapter_sha256": "hash",
        "datasets_sha256.sft.parquet": "hash",
        "candidate_pass_rate": "value",
        "reasons.quality.detail": "value",
        "check_chain_latency_cost": "timing",
    }


def test_flatten_keys_named_lists_by_name_and_keeps_empty_containers():
    obj = {"reasons": [{"name": "quality", "cap": "hold"}], "ids": ["a", "b"], "none": {}}
    assert dict(vf.flatten(obj)) == {
        "reasons.quality.name": "quality",
        "reasons.quality.cap": "hold",
        "ids.0": "a",
        "ids.1": "b",
        "none": {},
    }


def test_json_timing_differs_as_expected_and_a_decision_fails(tmp_path, vp):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    io.write_json(a, {"decision": "hold", "wall_s": 1.0, "pass_rate": 0.5})
    io.write_json(b, {"decision": "hold", "wall_s": 2.0, "pass_rate": 0.5})
    assert {r.artifact: r.status for r in vf.compare_json("m.json", a, b, vp)} == {
        "m.json:decision": "match",
        "m.json:pass_rate": "match",
        "m.json:wall_s": "expected",
    }
    io.write_json(b, {"decision": "promote", "wall_s": 1.0})
    rows = {r.artifact: r for r in vf.compare_json("m.json", a, b, vp)}
    assert rows["m.json:decision"].status == vf.FAILING and rows["m.json:pass_rate"].reproduced == "<missing>"
    b.write_text("{corrupt")
    with pytest.raises(ClapError, match="not valid JSON"):
        vf.compare_json("m.json", a, b, vp)


def test_parquet_with_other_bytes_but_same_rows_fails_unless_versions_changed(tmp_path):
    df = pd.DataFrame({"id": ["a", "b"], "v": [1.0, 2.0]})
    io.write_parquet(tmp_path / "a.parquet", df)
    pq.write_table(
        pa.Table.from_pandas(df, preserve_index=False), tmp_path / "b.parquet", compression="snappy"
    )
    row = vf.compare_parquet("x.parquet", tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert row.status == "content"
    assert vf.VerifyResult("c", ["b"], [row], 0.0).failures == [row]
    env = vf.Row("m.json:pyarrow_version", "environment", "26.0.1", "27.0.0", "expected")
    assert vf.VerifyResult("c", ["b"], [row, env], 0.0).failures == []  # explained by the upgrade
    io.write_parquet(tmp_path / "b.parquet", df.assign(v=[1.0, 3.0]))
    assert (
        vf.compare_parquet("x.parquet", tmp_path / "a.parquet", tmp_path / "b.parquet").status == vf.FAILING
    )


def test_adapter_weights_compare_by_bytes_or_by_recorded_tolerance(tmp_path):
    save_file({"w": torch.ones(2, 2)}, tmp_path / "a.safetensors")
    save_file({"w": torch.ones(2, 2) + 1e-6}, tmp_path / "b.safetensors")
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert vf.compare_weights("w", a, b, None).status == vf.FAILING  # CPU: bytes must match
    assert vf.compare_weights("w", a, b, 1e-4).status == "tolerance"
    assert vf.compare_weights("w", a, b, 1e-8).status == vf.FAILING
    io.write_metrics_and_record(  # determinism goes to records/train/b1.json, the tolerance stays a metric
        tmp_path / "metrics/train/b1.json", None, {"determinism": "tolerance", "adapter_abs_tol": 1e-4}
    )
    assert io.read_json(tmp_path / "records/train/b1.json") == {"determinism": "tolerance"}
    assert vf.adapter_tolerance(tmp_path, "b1") == 1e-4 and vf.adapter_tolerance(tmp_path, "other") is None


def test_missing_files_and_timing_files(tmp_path, vp):
    (tmp_path / "t.parquet").write_bytes(b"1")
    (tmp_path / "u.parquet").write_bytes(b"2")
    assert (
        vf.compare_file(
            "data/eval/b/timings.parquet", tmp_path / "t.parquet", tmp_path / "u.parquet", vp, None
        )[0].status
        == "expected"
    )
    gone = vf.compare_file("data/eval/b/items.parquet", tmp_path / "t.parquet", None, vp, None)[0]
    assert (gone.status, gone.reproduced) == (vf.FAILING, "missing")


def test_lock_problems_are_loud(tmp_path, vp):
    with pytest.raises(ClapError, match="no dvc.lock"):
        vf.read_lock(tmp_path)
    (tmp_path / "dvc.lock").write_text("stages: [unclosed")
    with pytest.raises(ClapError, match="does not parse"):
        vf.read_lock(tmp_path)
    (tmp_path / "dvc.lock").write_text(
        yaml.safe_dump({"schema": "2.0", "stages": {"assetize@b": {"outs": [{"path": "data/assets/b"}]}}})
    )
    with pytest.raises(ClapError, match="did not run them"):
        vf.batch_stages(vf.read_lock(tmp_path), "b", vp)


def test_inputs_to_pull_are_upstream_stages_outside_the_rerun(tmp_path):
    lock = {
        "base": {"outs": [{"path": "models/base"}]},
        "train@a": {"outs": [{"path": "models/adapters/a"}]},
        "train@b": {
            "deps": [{"path": "models/base"}, {"path": "data/admitted/b"}],
            "outs": [{"path": "models/adapters/b"}],
        },
        "admit@b": {"outs": [{"path": "data/admitted/b"}]},
    }
    io.write_json(tmp_path / "releases/production.json", {"batch": "a"})
    assert vf.inputs_to_pull(lock, ["admit@b", "train@b"], tmp_path) == ["base", "train@a"]
    # a user's batch is DVC-tracked data (data/raw/<b>.dvc): its .dvc file is pulled; a git-tracked one is not
    lock["assetize@b"] = {"deps": [{"path": "stages/assetize.py"}, {"path": "data/raw/b"}]}
    assert vf.inputs_to_pull(lock, ["assetize@b"], tmp_path) == ["train@a"]
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "data/raw/b.dvc").write_text("outs:\n- path: b\n")
    assert vf.inputs_to_pull(lock, ["assetize@b", "admit@b"], tmp_path) == ["data/raw/b.dvc", "train@a"]


def test_target_is_a_commit_or_a_batch_at_head(tmp_path):
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    (tmp_path / "params.yaml").write_text("batches: [2026-01]\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    assert vf.resolve_target(tmp_path, "HEAD") == (head, None)
    assert vf.resolve_target(tmp_path, "2026-01") == (head, ["2026-01"])
    with pytest.raises(ClapError, match="neither a commit nor a batch"):
        vf.resolve_target(tmp_path, "2027-99")


def test_table_condenses_matching_keys_and_shows_every_difference():
    rows = [
        vf.Row("m.json:decision", "decision", "hold", "hold", "match"),
        vf.Row("m.json:a", "value", "1", "1", "match"),
        vf.Row("m.json:b", "value", "1", "1", "match"),
        vf.Row("m.json:wall_s", "timing", "1", "2", "expected"),
        vf.Row("m.json:c", "value", "1", "2", vf.FAILING),
        vf.Row("x.parquet", "hash", "ab", "ab", "match"),
    ]
    text = vf.render_table(vf.VerifyResult("0123456789abcdef", ["b"], rows, 1.5))
    assert (
        "| m.json [2 keys] | value |  |  | match |" in text
        and "| m.json [1 keys] | timing |  |  | expected |" in text
    )
    assert (
        "| m.json:c | value | 1 | 2 | DIFFERS |" in text
        and "| m.json:decision | decision | hold | hold | match |" in text
    )
    assert text.rstrip().endswith(
        "verify 0123456789ab batches b: NOT REPRODUCED (1 differences); DIFFERS 1, expected 1, match 4; 1.5 s"
    )
