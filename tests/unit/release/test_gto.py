"""clap release / rollback write GTO's registry tags; the real `gto` CLI reads them back."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clap.errors import ClapError
from clap.release import control as R
from clap.release import gto as gto_tags
from clap.release.records import load_params
from clap.release.rollback import rollback

from .release_fixtures import (
    BATCHES,
    approve,
    clean_git_env,
    copy_template,
    git,
    repro,
    signing_key,
    snapshot,
    template_base,
)

X, Y = BATCHES
A = gto_tags.GTO_ARTIFACT


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    clean_git_env(monkeypatch)
    return copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)


def at(monkeypatch, seconds: int) -> None:
    """Tag and commit dates `seconds` from now: GTO orders assignments by tagger date (1 s resolution)."""
    monkeypatch.setenv("GIT_COMMITTER_DATE", f"{int(time.time()) + seconds} +0000")


def gto(repo: Path, *args: str) -> str:
    script = Path(sys.executable).parent / "gto"
    cmd = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from gto.cli import app; sys.exit(app())"]
    )
    proc = subprocess.run([*cmd, *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def prod_version(repo: Path, *options: str) -> str:
    """The version `gto show` reports in stage prod of the artifact."""
    shown = json.loads(gto(repo, "show", A, "--json", *options))
    return next(v["version"] for v in shown if any(s["stage"] == gto_tags.GTO_STAGE for s in v["stages"]))


def tags_at(repo: Path, commit: str) -> set[str]:
    return set(git(repo, "tag", "--points-at", commit).split())


def release(repo, monkeypatch, batch, seconds):
    token = approve(repo, batch)
    at(monkeypatch, seconds)
    return R.release(repo, batch, token, load_params(repo), signing_key=signing_key(repo))


@pytest.mark.skipif(
    importlib.util.find_spec("gto") is None, reason="gto is not installed (pip install -e .[test])"
)
def test_gto_show_lists_releases_and_the_rolled_back_version_in_prod(repo, monkeypatch):
    e1 = release(repo, monkeypatch, X, 10)
    assert e1["tags"] == [f"{A}@v1.0.0", f"{A}#prod#1"] and tags_at(repo, e1["release_commit"]) == set(
        e1["tags"]
    )
    message = git(repo, "tag", "-l", "--format=%(contents)", f"{A}@v1.0.0")
    assert f"batch: {X}" in message and f"approval: {e1['pointer']['approval_id']}" in message
    assert prod_version(repo) == "v1.0.0"
    repro(repo)
    e2 = release(repo, monkeypatch, Y, 20)
    assert e2["tags"] == [f"{A}@v2.0.0", f"{A}#prod#2"]
    assert prod_version(repo) == "v2.0.0"
    assert {v["version"] for v in json.loads(gto(repo, "show", A, "--json"))} == {"v1.0.0", "v2.0.0"}
    at(monkeypatch, 30)
    back = rollback(repo)
    # prod leaves v2 (unassign on its commit) and is assigned again to v1 (on v1's commit)
    assert back["tags"] == [f"{A}#prod!#3", f"{A}#prod#4"]
    assert f"{A}#prod#4" in tags_at(repo, e1["release_commit"])
    assert f"{A}#prod!#3" in tags_at(repo, e2["release_commit"])
    assert prod_version(repo) == "v1.0.0" and prod_version(repo, "--sort", "semver") == "v1.0.0"
    history = json.loads(gto(repo, "history", A, "--json"))
    assert len(history) >= 6  # two registrations, three assignments, one unassignment


def test_an_existing_tag_name_refuses_the_release_and_is_never_moved(repo):
    token = approve(repo, X)
    git(repo, "tag", f"{A}@v1.0.0", "HEAD")  # someone else's tag with the name of the next version
    before = snapshot(repo)
    with pytest.raises(ClapError) as err:
        R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    assert err.value.rule == "tag_exists" and snapshot(repo) == before


def test_a_tag_that_fails_after_the_commit_undoes_the_release(repo, monkeypatch):
    token = approve(repo, X)
    git(repo, "tag", f"{A}#prod#1", "HEAD")  # git refuses this name after the commit is made
    monkeypatch.setattr(gto_tags, "refuse_taken", lambda root, names: None)  # skip the early check
    monkeypatch.setattr(gto_tags, "next_counter", lambda root: 1)  # and collide after v1.0.0 is tagged
    before = snapshot(repo)
    with pytest.raises(ClapError) as err:
        R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    assert (
        err.value.rule == "git_failed" and snapshot(repo) == before
    )  # no commit, no v1.0.0 tag, files restored
    assert git(repo, "tag", "--list", f"{A}@*") == ""
