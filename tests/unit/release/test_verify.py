"""clap.release.verify: key classification, file comparison, loud failures, target resolution, the table."""

from __future__ import annotations

import dataclasses
import json
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
from clap.release import checkout, compare
from clap.release import verify as vf

ROOT_PARAMS = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/params.yaml"))["verify"]


@pytest.fixture
def vp() -> compare.VerifyParams:
    return compare.VerifyParams(**ROOT_PARAMS)


def test_keys_are_classified_by_params(vp):
    kinds = {
        key: compare.classify_key(key, vp)
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
    assert dict(compare.flatten(obj)) == {
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
    assert {r.artifact: r.status for r in compare.compare_json("m.json", a, b, vp)} == {
        "m.json:decision": "match",
        "m.json:pass_rate": "match",
        "m.json:wall_s": "expected",
    }
    io.write_json(b, {"decision": "promote", "wall_s": 1.0})
    rows = {r.artifact: r for r in compare.compare_json("m.json", a, b, vp)}
    assert (
        rows["m.json:decision"].status == compare.FAILING
        and rows["m.json:pass_rate"].reproduced == "<missing>"
    )
    b.write_text("{corrupt")
    with pytest.raises(ClapError, match="not valid JSON"):
        compare.compare_json("m.json", a, b, vp)


def test_parquet_with_other_bytes_but_same_rows_fails_unless_versions_changed(tmp_path):
    df = pd.DataFrame({"id": ["a", "b"], "v": [1.0, 2.0]})
    io.write_parquet(tmp_path / "a.parquet", df)
    pq.write_table(
        pa.Table.from_pandas(df, preserve_index=False), tmp_path / "b.parquet", compression="snappy"
    )
    row = compare.compare_parquet("x.parquet", tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert row.status == "content"
    assert vf.VerifyResult("c", ["b"], [row], 0.0).failures == [row]
    env = compare.Row("m.json:pyarrow_version", "environment", "26.0.1", "27.0.0", "expected")
    assert vf.VerifyResult("c", ["b"], [row, env], 0.0).failures == []  # explained by the upgrade
    io.write_parquet(tmp_path / "b.parquet", df.assign(v=[1.0, 3.0]))
    assert (
        compare.compare_parquet("x.parquet", tmp_path / "a.parquet", tmp_path / "b.parquet").status
        == compare.FAILING
    )


def test_adapter_weights_compare_by_bytes_or_by_recorded_tolerance(tmp_path):
    save_file({"w": torch.ones(2, 2)}, tmp_path / "a.safetensors")
    save_file({"w": torch.ones(2, 2) + 1e-6}, tmp_path / "b.safetensors")
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert compare.compare_weights("w", a, b, None).status == compare.FAILING  # CPU: bytes must match
    assert compare.compare_weights("w", a, b, 1e-4).status == "tolerance"
    assert compare.compare_weights("w", a, b, 1e-8).status == compare.FAILING
    io.write_metrics_and_record(  # determinism goes to records/train/b1.json, the tolerance stays a metric
        tmp_path / "metrics/train/b1.json", None, {"determinism": "tolerance", "adapter_abs_tol": 1e-4}
    )
    assert io.read_json(tmp_path / "records/train/b1.json") == {"determinism": "tolerance"}
    assert (
        compare.adapter_tolerance(tmp_path, "b1") == 1e-4
        and compare.adapter_tolerance(tmp_path, "other") is None
    )


def test_missing_files_and_timing_files(tmp_path, vp):
    (tmp_path / "t.parquet").write_bytes(b"1")
    (tmp_path / "u.parquet").write_bytes(b"2")
    assert (
        compare.compare_file(
            "data/eval/b/timings.parquet", tmp_path / "t.parquet", tmp_path / "u.parquet", vp, None
        )[0].status
        == "expected"
    )
    gone = compare.compare_file("data/eval/b/items.parquet", tmp_path / "t.parquet", None, vp, None)[0]
    assert (gone.status, gone.reproduced) == (compare.FAILING, "missing")


def test_lock_problems_are_loud(tmp_path, vp):
    with pytest.raises(ClapError, match="no dvc.lock"):
        checkout.read_lock(tmp_path)
    (tmp_path / "dvc.lock").write_text("stages: [unclosed")
    with pytest.raises(ClapError, match="does not parse"):
        checkout.read_lock(tmp_path)
    (tmp_path / "dvc.lock").write_text(
        yaml.safe_dump({"schema": "2.0", "stages": {"assetize@b": {"outs": [{"path": "data/assets/b"}]}}})
    )
    with pytest.raises(ClapError, match="did not run them"):
        checkout.batch_stages(checkout.read_lock(tmp_path), "b", vp)


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
    assert checkout.inputs_to_pull(lock, ["admit@b", "train@b"], tmp_path) == ["base", "train@a"]
    # admit reads every earlier batch's training pool: a dep on the folder of the normalize outputs
    lock["normalize@a"] = {"outs": [{"path": "data/normalized/a"}]}
    lock["normalize@b"] = {"outs": [{"path": "data/normalized/b"}]}
    lock["admit@b"]["deps"] = [{"path": "data/normalized/b"}, {"path": "data/normalized"}]
    assert checkout.inputs_to_pull(lock, ["admit@b"], tmp_path) == ["normalize@a", "normalize@b", "train@a"]
    del lock["admit@b"]["deps"]
    # a user's batch is DVC-tracked data (data/raw/<b>.dvc): its .dvc file is pulled; a git-tracked one is not
    lock["assetize@b"] = {"deps": [{"path": "stages/assetize.py"}, {"path": "data/raw/b"}]}
    assert checkout.inputs_to_pull(lock, ["assetize@b"], tmp_path) == ["train@a"]
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "data/raw/b.dvc").write_text("outs:\n- path: b\n")
    assert checkout.inputs_to_pull(lock, ["assetize@b", "admit@b"], tmp_path) == ["data/raw/b.dvc", "train@a"]


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
    assert checkout.resolve_target(tmp_path, "HEAD") == (head, None)
    assert checkout.resolve_target(tmp_path, "2026-01") == (head, ["2026-01"])
    with pytest.raises(ClapError, match="neither a commit nor a batch"):
        checkout.resolve_target(tmp_path, "2027-99")


def test_table_condenses_matching_keys_and_shows_every_difference():
    rows = [
        compare.Row("m.json:decision", "decision", "hold", "hold", "match"),
        compare.Row("m.json:a", "value", "1", "1", "match"),
        compare.Row("m.json:b", "value", "1", "1", "match"),
        compare.Row("m.json:wall_s", "timing", "1", "2", "expected"),
        compare.Row("m.json:c", "value", "1", "2", compare.FAILING),
        compare.Row("x.parquet", "hash", "ab", "ab", "match"),
    ]
    text = vf.render_table(vf.VerifyResult("0123456789abcdef", ["b"], rows, 1.5))
    assert (
        "| m.json [2 keys] | value |  |  |  | match |" in text
        and "| m.json [1 keys] | timing |  |  |  | expected |" in text
    )
    assert (
        "| m.json:c | value |  | 1 | 2 | DIFFERS |" in text
        and "| m.json:decision | decision |  | hold | hold | match |" in text
    )
    assert text.rstrip().endswith(
        "verify 0123456789ab batches b: NOT REPRODUCED (1 differences); DIFFERS 1, expected 1, match 4; 1.5 s"
    )
    result = vf.VerifyResult("0123456789abcdef", ["b"], rows[:2], 1.5, vf.MODE_NO_REMOTE, ["b: note"])
    text = vf.render_table(result)
    assert "\n- b: note\n" in text and text.rstrip().endswith(
        "verify 0123456789ab batches b (rebuilt from data/raw, no remote): REPRODUCED; match 2; 1.5 s"
    )
    by = [
        compare.Row("m.json:a", "value", "1", "1", "match", "value"),
        compare.Row("d/x", "hash", "", "", "match", compare.BY_LOCK),
    ]
    text = vf.render_table(vf.VerifyResult("0123456789abcdef", ["b"], by, 1.5))
    assert (
        "| m.json [1 keys] | value | value |  |  | match |" in text
        and "| d/x | hash | dvc.lock md5 |" in text
    )
    assert "; match 2; compared by dvc.lock md5 1, value 1; 1.5 s" in text


# --- another hardware class ---------------------------------------------------------------
TRAIN = {"decision": "hold", "steps": 32, "train_loss_end": 0.030669134110212326, "health": "ok"}


def _batch_root(root, hardware: str, **train):
    """A committed or reproduced output tree: records/train/b.json names the hardware class."""
    io.write_metrics_and_record(
        root / "metrics/train/b.json",
        root / "records/train/b.json",
        {**TRAIN, **train, "hardware": hardware, "adapter_sha256": train.get("adapter_sha256", "a" * 64)},
    )
    return root


def test_hardware_class_is_read_from_the_training_record_and_old_commits_count_as_same(tmp_path):
    a = _batch_root(tmp_path / "a", "x86_64-avx512-intel")
    b = _batch_root(tmp_path / "b", "x86_64-avx2-amd")
    assert compare.batch_hardware(a, b, "b") == compare.Hardware("x86_64-avx512-intel", "x86_64-avx2-amd")
    assert compare.batch_hardware(a, b, "b").differs and not compare.batch_hardware(a, a, "b").differs
    assert not compare.Hardware("", "x86_64-avx2-amd").differs  # the commit recorded none: bytes, as before
    assert compare.recorded_hardware(tmp_path / "none", "b") == ""


def test_another_hardware_class_passes_floats_within_tolerance_labelled(tmp_path, vp):
    sixth = 0.030669134110212326 * (1 + 3e-6)  # differs in the 6th significant digit
    a = _batch_root(tmp_path / "a", "x86_64-avx512-intel")
    b = _batch_root(tmp_path / "b", "x86_64-avx2-amd", train_loss_end=sixth, adapter_sha256="b" * 64)
    paths = ["metrics/train/b.json", "records/train/b.json"]
    same = compare.compare_outputs(a, b, paths, "b", vp)  # as if one hardware class: bytes and values exact
    assert {r.artifact for r in vf.VerifyResult("c", ["b"], same, 0.0).failures} == {
        "metrics/train/b.json:train_loss_end",
        "records/train/b.json:adapter_sha256",
    }
    rows = {
        r.artifact: r
        for r in compare.compare_outputs(a, b, paths, "b", vp, compare.batch_hardware(a, b, "b"))
    }
    assert vf.VerifyResult("c", ["b"], list(rows.values()), 0.0).failures == []
    loss = rows["metrics/train/b.json:train_loss_end"]
    assert (loss.status, loss.by) == (compare.CROSS_HARDWARE, "value") and loss.reproduced.endswith(
        "(different hardware)"
    )
    assert (
        rows["records/train/b.json:adapter_sha256"].status == compare.CROSS_HARDWARE
    )  # a float-made artifact
    assert rows["records/train/b.json:hardware"].status == "expected"  # environment: reported
    assert rows["metrics/train/b.json:decision"].status == "match"


@pytest.mark.parametrize(
    "change",
    [
        {"decision": "promote"},  # a decision
        {"health": "diverged"},  # a string
        {"steps": 33},  # a count
        {"train_loss_end": 0.0307},  # a float beyond the tolerance (4th digit)
        {"sha256_sft": "c" * 64},  # a data hash: not made by float arithmetic
    ],
    ids=["decision", "string", "count", "float-beyond-tolerance", "data-hash"],
)
def test_another_hardware_class_still_fails_on_decisions_counts_and_data(tmp_path, vp, change):
    a = _batch_root(tmp_path / "a", "x86_64-avx512-intel", sha256_sft="d" * 64)
    b = _batch_root(tmp_path / "b", "x86_64-avx2-amd", **{"sha256_sft": "d" * 64, **change})
    rows = compare.compare_outputs(
        a, b, ["metrics/train/b.json", "records/train/b.json"], "b", vp, compare.batch_hardware(a, b, "b")
    )
    failures = vf.VerifyResult("c", ["b"], rows, 0.0).failures
    assert [r.artifact.split(":")[1] for r in failures] == list(change)


def test_another_hardware_class_compares_adapter_weights_and_csv_within_tolerance(tmp_path, vp):
    save_file({"w": torch.ones(2, 2)}, tmp_path / "a.safetensors")
    save_file({"w": torch.ones(2, 2) + 1e-6}, tmp_path / "b.safetensors")
    save_file({"w": torch.ones(2, 2) + 1e-2}, tmp_path / "c.safetensors")
    a, b, c = (tmp_path / f"{n}.safetensors" for n in "abc")
    row = compare.compare_weights("w", a, b, vp.hardware_adapter_abs_tol, cross_hardware=True)
    assert (row.status, row.by) == (
        compare.CROSS_HARDWARE,
        "weights",
    ) and "(different hardware)" in row.reproduced
    assert (
        compare.compare_weights("w", a, c, vp.hardware_adapter_abs_tol, cross_hardware=True).status
        == compare.FAILING
    )
    (tmp_path / "a.csv").write_text("step,kl,verdict\n1,0.0123456,ok\n")
    (tmp_path / "b.csv").write_text("step,kl,verdict\n1,0.0123457,ok\n")
    (tmp_path / "c.csv").write_text("step,kl,verdict\n2,0.0123456,ok\n")
    csv_a, csv_b, csv_c = (tmp_path / f"{n}.csv" for n in "abc")
    assert (
        compare.compare_file("p.csv", csv_a, csv_b, vp, None)[0].status == compare.FAILING
    )  # same hardware: bytes
    assert compare.compare_file("p.csv", csv_a, csv_b, vp, None, True)[0].status == compare.CROSS_HARDWARE
    assert (
        compare.compare_file("p.csv", csv_a, csv_c, vp, None, True)[0].status == compare.FAILING
    )  # a count differs


def test_keyed_absolute_tolerances_for_quantities_whose_scale_is_not_their_magnitude(tmp_path, vp):
    """The differences a rebuild on AMD AVX2 showed against the AMD AVX-512 commit: the detector's
    max log e-value near 0 (4.6e-4 relative) and an early GRPO KL (1.8e-4 relative) fail the
    relative tolerance but are far inside their keyed absolute ones; beyond those they still fail."""
    assert vp.hardware_abs_tol_keys  # set in params.yaml
    log_e = (0.08412832804760018, 0.08408995069623049)
    kl = (8.680171595187858e-05, 8.681725012138486e-05)
    for key, (a, b) in {"metrics/train/b.json:detector_max_log_e": log_e, "kl": kl}.items():
        assert not compare.within_hardware_tolerance(a, b, vp)  # no key: relative 1e-4 only
        assert compare.within_hardware_tolerance(a, b, vp, key)
    assert compare.within_hardware_tolerance(*log_e, vp, "detector.max_log_e")  # the leaf of a nested key
    assert not compare.within_hardware_tolerance(0.084, 0.090, vp, "detector_max_log_e")  # 6e-3: beyond 1e-3
    assert not compare.within_hardware_tolerance(8.4e-5, 2.4e-5, vp, "kl_peak")  # 6e-5: beyond 1e-6
    assert not compare.within_hardware_tolerance(
        *log_e, vp, "final_loss"
    )  # other keys keep the relative rule

    a = _batch_root(tmp_path / "a", "x86_64-avx512-amd", detector_max_log_e=log_e[0])
    b = _batch_root(tmp_path / "b", "x86_64-avx2-amd", detector_max_log_e=log_e[1])
    rows = compare.compare_outputs(a, b, ["metrics/train/b.json"], "b", vp, compare.batch_hardware(a, b, "b"))
    assert vf.VerifyResult("c", ["b"], rows, 0.0).failures == []
    (tmp_path / "a.csv").write_text(f"step,kl,reward\n2,{kl[0]!r},0.97\n")
    (tmp_path / "b.csv").write_text(f"step,kl,reward\n2,{kl[1]!r},0.97\n")
    (tmp_path / "c.csv").write_text(f"step,kl,reward\n2,{kl[0]!r},0.9701\n")  # reward: relative rule
    csv_a, csv_b, csv_c = (tmp_path / f"{n}.csv" for n in "abc")
    assert compare.compare_file("p.csv", csv_a, csv_b, vp, None, True)[0].status == compare.CROSS_HARDWARE
    assert compare.compare_file("p.csv", csv_a, csv_c, vp, None, True)[0].status == compare.FAILING


# --- no remote: rebuilt from data/raw -----------------------------------------------------
def _lock(**outs) -> dict:
    return {
        stage: {"outs": [{"path": p, "md5": m, "nfiles": n} for p, (m, n) in paths.items()]}
        for stage, paths in outs.items()
    }


def test_cached_outputs_compare_by_the_committed_lock_md5(tmp_path, vp):
    committed = _lock(
        **{
            "train@b": {"models/adapters/b": ("aa.dir", 5), "metrics/train/b.json": ("m1", None)},
            "eval@b": {"data/eval/b": ("ee.dir", 3)},
            "admit@b": {"data/admitted/b": ("dd.dir", 6)},
        }
    )
    reproduced = _lock(
        **{
            "train@b": {"models/adapters/b": ("a2.dir", 5), "metrics/train/b.json": ("m2", None)},
            "eval@b": {"data/eval/b": ("e2.dir", 3)},
            "admit@b": {"data/admitted/b": ("dd.dir", 6)},
        }
    )
    (tmp_path / "data/eval/b").mkdir(parents=True)
    (tmp_path / "data/eval/b/timings.parquet").write_bytes(b"t")
    stages, in_git = ["admit@b", "train@b", "eval@b"], {"metrics/train/b.json"}
    rows = {
        r.artifact: r for r in compare.compare_lock_outs(committed, reproduced, stages, in_git, tmp_path, vp)
    }
    assert set(rows) == {"data/admitted/b", "models/adapters/b", "data/eval/b"}  # in git: compared by file
    assert {r.by for r in rows.values()} == {compare.BY_LOCK}
    assert rows["data/admitted/b"].status == "match" and rows["models/adapters/b"].status == compare.FAILING
    assert (rows["data/eval/b"].kind, rows["data/eval/b"].status) == ("timing", "expected")  # holds timings
    cross = {
        r.artifact: r
        for r in compare.compare_lock_outs(committed, reproduced, stages, in_git, tmp_path, vp, True)
    }
    assert cross["models/adapters/b"].status == compare.CROSS_HARDWARE
    reproduced["eval@b"]["outs"][0]["nfiles"] = 2
    reproduced["admit@b"]["outs"][0]["md5"] = "d2.dir"  # data is not float-made: fails on any hardware
    cross = {
        r.artifact: r
        for r in compare.compare_lock_outs(committed, reproduced, stages, in_git, tmp_path, vp, True)
    }
    assert (
        cross["data/eval/b"].status == compare.FAILING and cross["data/admitted/b"].status == compare.FAILING
    )


def test_without_a_remote_only_missing_cached_outputs_are_explained():
    cached = {"data/assets/b", "models/base", "data/normalized/a", "data/normalized/b"}
    status = {
        "assetize@b": [{"changed outs": {"data/assets/b": "not in cache"}}],
        "train@b": [{"changed deps": {"models/base": "deleted"}}],
        # admit's dep on the folder of every batch's normalize output: missing because they are
        "admit@b": [{"changed deps": {"data/normalized": "deleted"}}],
        "admit@c": [{"changed deps": {"data/normalized": "modified"}}],  # some of them pulled
    }
    assert checkout.unexpected_status(status, cached) == {}
    # a folder none of whose missing contents is a cached output is not explained
    assert checkout.unexpected_status({"x@b": [{"changed deps": {"data/norm": "deleted"}}]}, cached) != {}
    # a cached output itself that is modified (not missing) is never explained
    assert checkout.unexpected_status({"x@b": [{"changed deps": {"models/base": "modified"}}]}, cached) != {}
    status["gate@b"] = [{"changed deps": {"metrics/train/b.json": "modified"}}, "changed command"]
    status["assetize@b"].append(
        {"changed deps": {"data/raw/b": "deleted", "params.yaml": {"assetize": "modified"}}}
    )
    assert checkout.unexpected_status(status, cached) == {
        "gate@b": [{"changed deps": {"metrics/train/b.json": "modified"}}, "changed command"],
        "assetize@b": [{"changed deps": {"data/raw/b": "deleted", "params.yaml": {"assetize": "modified"}}}],
    }


def test_a_workspace_without_a_default_remote_has_none(tmp_path):
    for d in ("ws/.dvc", "clone/.dvc"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "ws/.dvc/config").write_text("[core]\n    analytics = false\n")
    assert checkout.configure_remote(tmp_path / "ws", tmp_path / "clone") is None
    (tmp_path / "ws/.dvc/config").write_text(
        "[core]\n    remote = r\n['remote \"r\"']\n    url = /somewhere\n"
    )
    assert checkout.configure_remote(tmp_path / "ws", tmp_path / "clone") == "r"
    assert "remote = r" in (tmp_path / "clone/.dvc/config.local").read_text()


def test_an_s3_remote_reaches_the_checkout_with_its_endpoint_and_local_credentials(tmp_path):
    """README "Data remote": the S3 remote in .dvc/config, its credentials in the git-ignored
    .dvc/config.local; verify's checkout gets both (in its own config.local, never committed)."""
    for d in ("ws/.dvc", "clone/.dvc"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "ws/.dvc/config").write_text(
        "[core]\n    remote = storage\n['remote \"storage\"']\n    url = s3://bucket/clap\n"
        "    endpointurl = http://127.0.0.1:9000\n"
    )
    (tmp_path / "ws/.dvc/config.local").write_text(
        "['remote \"storage\"']\n    access_key_id = AKID\n    secret_access_key = SECRET\n"
    )
    assert checkout.configure_remote(tmp_path / "ws", tmp_path / "clone") == "storage"
    local = (tmp_path / "clone/.dvc/config.local").read_text()
    for line in (
        "remote = storage",
        "url = s3://bucket/clap",
        "endpointurl = http://127.0.0.1:9000",
        "access_key_id = AKID",
        "secret_access_key = SECRET",
    ):
        assert line in local, local
    assert not (tmp_path / "clone/.dvc/config").exists()  # nothing lands in the committed config


@pytest.mark.parametrize("remote", [None, "r"])
def test_no_remote_or_a_failing_pull_rebuilds_from_raw_data(tmp_path, vp, monkeypatch, remote):
    lock = {f"{s}@b": {"outs": []} for s in vp.stages} | {"base": {"outs": [{"path": "models/base"}]}}
    calls, rebuilt = [], []
    monkeypatch.setattr(vf, "checkout", lambda root, commit, dest: remote)
    monkeypatch.setattr(vf, "read_lock", lambda clone: lock)
    monkeypatch.setattr(vf, "inputs_to_pull", lambda lock, rerun, clone: ["base"])

    def fake_dvc(clone, *args):
        calls.append(args[0])
        raise ClapError("dvc pull failed (exit 1): ERROR: failed to pull data from the cloud")

    monkeypatch.setattr(vf, "dvc", fake_dvc)
    monkeypatch.setattr(vf, "_rebuild", lambda *a: rebuilt.append(a[-1]) or "rebuilt")
    assert vf._verify_in(tmp_path, "c0ffee", ["b"], tmp_path, vp, lambda line: None) == "rebuilt"
    if remote is None:
        assert calls == [] and rebuilt == [vf.MODE_NO_REMOTE]  # nothing pulled
    else:
        assert calls == ["pull"] and rebuilt == [
            "rebuilt from data/raw, remote 'r' unreachable or lacking objects"
        ]


def test_a_dvc_tracked_raw_batch_cannot_be_rebuilt_without_a_remote(tmp_path, vp):
    with pytest.raises(ClapError) as e:
        vf._rebuild(
            tmp_path, "c", ["b"], {}, [], ["data/raw/b.dvc"], {}, tmp_path, vp, print, vf.MODE_NO_REMOTE
        )
    assert e.value.rule == "no_remote" and "data/raw/b.dvc" in str(e.value)


def test_tracked_outputs_are_the_outputs_git_has(tmp_path):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip
    io.write_json(tmp_path / "metrics/train/b.json", {})
    io.write_json(tmp_path / "reports/gate/b/evidence.json", {})
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True)
    (tmp_path / "models/adapters/b").mkdir(parents=True)  # a DVC-cached output: never in git
    paths = ["metrics/train/b.json", "reports/gate/b", "models/adapters/b", "reports/gate"]
    assert checkout.tracked_outputs(tmp_path, paths) == {
        "metrics/train/b.json",
        "reports/gate/b",
        "reports/gate",
    }


# --- with a remote: the production incumbent ---------------------------------------------
INCUMBENT_STAGES = r"""
import hashlib, json, sys
from pathlib import Path

stage, b = sys.argv[1], sys.argv[2]
def write(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
if stage == "admit":
    write(f"data/admitted/{b}/sft.jsonl", Path(f"data/raw/{b}.txt").read_bytes().upper())
elif stage == "train":
    write(f"models/adapters/{b}/adapter.bin", hashlib.sha256(Path(f"data/admitted/{b}/sft.jsonl").read_bytes()).digest())
elif stage == "eval":  # reads the incumbent's adapter through releases/production.json, as the real eval does
    incumbent = json.loads(Path("releases/production.json").read_text())["batch"]
    against = hashlib.sha256(Path(f"models/adapters/{incumbent}/adapter.bin").read_bytes()).hexdigest() if incumbent else ""
    write(f"data/eval/{b}/items.jsonl", Path(f"models/adapters/{b}/adapter.bin").read_bytes().hex().encode())
    write(f"metrics/eval/{b}.json", json.dumps({"incumbent": incumbent, "incumbent_sha256": against, "wall_s": 1.0}).encode())
"""


def _incumbent_repo(base) -> tuple:
    """A git + DVC repository (stdlib-only stages admit -> train -> eval per batch, both batches
    pushed to a local-directory remote) whose releases/production.json names the first batch:
    the incumbent's adapter is a DVC-cached output of train@<first>, whose own input
    ``data/admitted/<first>`` is a DVC-cached output of admit@<first> (the real pipeline's shape)."""
    import sys

    from .release_fixtures import commit_all, git, repro, run

    repo, remote = base / "repo", base / "remote"
    repo.mkdir()
    remote.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for k, v in {"user.email": "t@clap.invalid", "user.name": "clap test", "commit.gpgsign": "false"}.items():
        git(repo, "config", k, v)
    run(repo, sys.executable, "-m", "dvc", "init", "-q")
    (repo / ".dvc" / "config").write_text(
        f"[core]\n    analytics = false\n    remote = local\n[cache]\n    type = copy\n"
        f"['remote \"local\"']\n    url = {remote}\n"
    )
    batches = ["2026-01", "2026-02"]

    def stage(name: str, deps: list[str], outs: list) -> dict:
        cmd = f"{sys.executable} stage.py {name} ${{item}}"
        return {"foreach": "${batches}", "do": {"cmd": cmd, "deps": ["stage.py", *deps], "outs": outs}}

    (repo / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "admit": stage("admit", ["data/raw/${item}.txt"], ["data/admitted/${item}"]),
                    "train": stage("train", ["data/admitted/${item}"], ["models/adapters/${item}"]),
                    "eval": stage(
                        "eval",
                        ["models/adapters/${item}", "releases/production.json"],
                        ["data/eval/${item}", {"metrics/eval/${item}.json": {"cache": False}}],
                    ),
                }
            },
            sort_keys=False,
        )
    )
    (repo / "params.yaml").write_text(yaml.safe_dump({"batches": batches}))
    (repo / "stage.py").write_text(INCUMBENT_STAGES)
    for b in batches:
        io.atomic_write_text(repo / "data" / "raw" / f"{b}.txt", f"questions of {b}\n")
    io.write_json(repo / "releases" / "production.json", {"batch": None})
    commit_all(repo, "init")
    repro(repo)
    io.write_json(repo / "releases" / "production.json", {"batch": batches[0]})  # released: eval re-runs
    commit_all(repo, "release")
    repro(repo)
    run(repo, sys.executable, "-m", "dvc", "push", "-q")
    return repo, batches


def test_with_a_remote_a_batch_verifies_against_another_batch_in_production(tmp_path, vp, monkeypatch):
    """The incumbent's train stage is pulled for its adapter (eval reads it), not re-run: its own
    DVC-cached input (the incumbent's admitted data) is not pulled and must not fail the status
    check; what was pulled and what git holds still must match dvc.lock."""
    from .release_fixtures import clean_git_env, git

    clean_git_env(monkeypatch)
    repo, (incumbent, batch) = _incumbent_repo(tmp_path)
    vp = dataclasses.replace(vp, stages=["admit", "train", "eval"])
    result = vf.verify(repo, batch, vp, log=lambda line: None)
    assert result.mode == vf.MODE_REMOTE.format(name="local") and result.batches == [batch]
    assert not result.failures, vf.render_table(result)
    assert {r.artifact: r.status for r in result.rows}[f"metrics/eval/{batch}.json:incumbent"] == "match"
    # what was pulled or is in git must still match dvc.lock: a hand-edited metrics file is caught
    rel = f"metrics/eval/{batch}.json"
    io.write_json(repo / rel, {**io.read_json(repo / rel), "incumbent_sha256": "0" * 64})
    git(repo, "commit", "-qam", "forged")
    with pytest.raises(ClapError) as e:
        vf.verify(repo, batch, vp, log=lambda line: None)
    assert e.value.rule == "lock_mismatch" and rel in str(e.value)


def test_after_a_pull_only_the_outputs_of_stages_not_pulled_may_be_missing(tmp_path, monkeypatch):
    lock = {
        "admit@a": {"outs": [{"path": "data/admitted/a"}, {"path": "metrics/admit/a.json"}]},
        "train@a": {"outs": [{"path": "models/adapters/a"}]},
        "admit@b": {"outs": [{"path": "data/admitted/b"}]},
        "train@b": {"outs": [{"path": "models/adapters/b"}]},
    }
    monkeypatch.setattr(checkout, "tracked_outputs", lambda clone, paths: {"metrics/admit/a.json"})
    absent = checkout.not_pulled(tmp_path, lock, ["train@a", "data/raw/b.dvc", "admit@b", "train@b"])
    assert absent == {"data/admitted/a"}  # not models/adapters/a (pulled), not metrics/admit/a.json (git)
    status = {"train@a": [{"changed deps": {"data/admitted/a": "deleted"}}]}
    monkeypatch.setattr(checkout, "dvc_status", lambda clone, stages: status)
    checkout.require_clean_status(tmp_path, ["train@a"], absent)  # the incumbent's own input: never read
    with pytest.raises(ClapError, match="lock_mismatch"):
        checkout.require_clean_status(tmp_path, ["train@a"])  # nothing declared absent: strict
    for bad in (
        {"train@a": [{"changed outs": {"models/adapters/a": "not in cache"}}]},  # pulled: must be there
        {"train@a": [{"changed deps": {"data/admitted/a": "modified"}}]},  # present and different
        {"train@a": [{"changed deps": {"stage.py": "modified"}}]},  # git
        {"train@a": ["changed command"]},
    ):
        status = bad
        with pytest.raises(ClapError) as e:
            checkout.require_clean_status(tmp_path, ["train@a"], absent)
        assert e.value.rule == "lock_mismatch" and json.dumps(bad["train@a"][0])[:20] in str(e.value)
