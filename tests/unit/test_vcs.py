"""clap.vcs: the one git wrapper (a raising call, a call whose exit code is the answer, the ignore probe)."""

from __future__ import annotations

import subprocess

import pytest

from clap import vcs
from clap.errors import ClapError


@pytest.fixture
def repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("keys/\n")
    return tmp_path


def test_git_run_returns_the_exit_code_and_bytes_instead_of_raising(repo):
    missing = vcs.git_run(repo, "cat-file", "-e", "HEAD")  # no commit yet: an answer, not a failure
    assert missing.returncode != 0 and isinstance(missing.stdout, bytes)
    shown = vcs.git_run(repo, "check-ignore", "-v", "keys/a.key", text=True)
    assert shown.returncode == 0 and ".gitignore" in shown.stdout


def test_git_raises_naming_the_command(repo):
    with pytest.raises(ClapError, match="git rev-parse HEAD failed") as e:
        vcs.git(repo, "rev-parse", "HEAD")
    assert e.value.rule == "git_failed"
    assert vcs.commit_or_unknown(repo) == "unknown"  # before the first commit


def test_is_ignored_answers_from_the_exit_code(repo):
    assert vcs.is_ignored(repo, "keys/alice.key")
    assert not vcs.is_ignored(repo, "alice.key")
