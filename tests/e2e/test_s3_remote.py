"""An S3 DVC remote: ``dvc push``, ``dvc pull`` and ``clap verify`` against a local S3 server.

moto's server mode (``ThreadedMotoServer``, in this process, on a free loopback port) stands in
for S3; dvc-s3 talks to it through the remote's ``endpointurl`` with dummy credentials from the
environment (nothing leaves the machine; the instance-metadata lookup is disabled). The session's
tiny run (``tiny_run``) is copied with its DVC cache, committed with an ``s3://`` default remote
and pushed; a fresh ``git clone`` (no cache, no outputs) pulls every DVC-cached output back
byte for byte, and ``clap verify`` from that clone takes its fast path (``committed outputs
pulled from DVC remote 's3'``), i.e. it pulls the committed outputs and the base model from S3.
"""

from __future__ import annotations

import dataclasses
import filecmp
import shutil
from pathlib import Path

import pytest
from conftest import E2E_BATCH as BATCH
from conftest import git, run_dvc

from clap import params
from clap.release import checkout, compare
from clap.release import verify as vf

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)

BUCKET = "clap-dvc"
REMOTE = "s3"
# verify's fast path re-runs the chain's head (assetize … train: train needs models/base, pulled
# from S3 with the batch's committed outputs); the rest of the chain is what
# test_reproducibility.py verifies with a local remote, and the remote path is the same code
HEAD_STAGES = ["assetize", "normalize", "admit", "train"]


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with one bucket; the environment dvc and boto read (its URL)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    nowhere = tmp_path_factory.mktemp("aws") / "none"  # no developer's ~/.aws is read
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(nowhere),
            "AWS_SHARED_CREDENTIALS_FILE": str(nowhere),
        }.items():
            mp.setenv(key, value)
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        yield url
    server.stop()


def _ignore_dvc_tmp(folder: str, names: list[str]) -> list[str]:
    return ["tmp"] if Path(folder).name == ".dvc" else []


@pytest.fixture(scope="module")
def pushed(tiny_repo, tiny_run, s3_server, tmp_path_factory) -> Path:
    """A copy of the tiny run (workspace and DVC cache) committed with the S3 default remote and pushed."""
    assert tiny_run.returncode == 0, tiny_run.stdout[-3000:] + tiny_run.stderr[-3000:]
    project = tmp_path_factory.mktemp("s3") / "project"
    shutil.copytree(tiny_repo, project, ignore=_ignore_dvc_tmp)  # the shared fixture stays untouched
    for args in (
        ("remote", "add", "-f", "-d", REMOTE, f"s3://{BUCKET}/clap"),
        ("remote", "modify", REMOTE, "endpointurl", s3_server),
        # earlier e2e tests re-run stages of the shared run (a killed-and-rerun train, a policy change and
        # back) and may leave a downstream stage such as `summary` stale: bring the copy up to date first
        ("repro",),
        ("status",),
        ("push",),
    ):
        done = run_dvc(project, *args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if args == ("status",):
            assert "up to date" in done.stdout, done.stdout  # the copy is a complete, locked run
    git(project, "add", "-A")
    git(project, "commit", "-qm", "tiny run, S3 remote")
    return project


def _cached_outputs(repo: Path) -> list[str]:
    """The locked outputs that git does not hold (DVC-cached: data/, models/)."""
    lock = checkout.read_lock(repo)
    every = sorted({p for stage in lock for p in checkout.outs(lock, stage)})
    return sorted(set(every) - checkout.tracked_outputs(repo, every))


def test_push_then_pull_into_a_fresh_clone_is_byte_identical(pushed, s3_server, tmp_path):
    import boto3

    keys = [
        o["Key"]
        for page in boto3.client("s3", endpoint_url=s3_server)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=BUCKET)
        for o in page.get("Contents", [])
    ]
    assert keys and all(k.startswith("clap/files/md5/") for k in keys), keys[:5]

    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(pushed), str(fresh))
    cached = _cached_outputs(fresh)
    assert f"models/adapters/{BATCH}" in cached and "models/base" in cached
    assert not any((fresh / p).exists() for p in cached) and not (fresh / ".dvc" / "cache").exists()
    done = run_dvc(fresh, "pull")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    compared = 0
    for rel in cached:
        ours, theirs = compare.files_under(pushed, rel), compare.files_under(fresh, rel)
        assert ours and sorted(ours) == sorted(theirs), rel
        for key in ours:
            assert filecmp.cmp(ours[key], theirs[key], shallow=False), key
            compared += 1
    assert compared >= len(cached)
    status = run_dvc(fresh, "status")
    assert status.returncode == 0 and "up to date" in status.stdout, status.stdout


def test_verify_pulls_from_the_s3_remote(pushed, s3_server, tmp_path):
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(pushed), str(fresh))  # the workspace: its default remote is S3
    vp = params.section("verify", compare.VerifyParams, fresh / "params.yaml")
    lines: list[str] = []
    result = vf.verify(fresh, BATCH, dataclasses.replace(vp, stages=HEAD_STAGES), log=lines.append)
    verdict = vf.render_table(result).splitlines()[-1]
    print(f"\n{verdict}")
    assert result.mode == vf.MODE_REMOTE.format(name=REMOTE), "\n".join(lines)
    assert result.failures == [] and "REPRODUCED" in verdict and "NOT REPRODUCED" not in verdict
    pulled = next(x for x in lines if x.startswith("dvc pull "))
    assert "base" in pulled.split() and f"train@{BATCH}" in pulled.split()  # the base model came from S3
    rows = {r.artifact: r for r in result.rows}
    for path in (
        f"models/adapters/{BATCH}/adapter_model.safetensors",  # trained again on the pulled base
        f"data/admitted/{BATCH}/sft.parquet",
    ):
        assert (rows[path].by, rows[path].status) == ("sha256", "match")
