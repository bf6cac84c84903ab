"""git and dvc.lock: the one home of the helpers every phase that reads the repository uses."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from clap.errors import ClapError
from clap.params import parse_yaml


def git_run(
    root: Path | str, *args: str, text: bool = False, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run git in ``root`` and return the finished process, whatever its exit code (output captured:
    bytes, or str with ``text``): for a caller to whom a non-zero code is an answer (``check-ignore``,
    ``cat-file -e``, ``merge-base --is-ancestor``) or that needs git's bytes. :func:`git` raises instead."""
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=text, timeout=timeout)


def git(root: Path | str, *args: str) -> str:
    """Run git in ``root``; a failure is a ClapError carrying git's message."""
    proc = git_run(root, *args, text=True)
    if proc.returncode != 0:
        raise ClapError(
            f"git {' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}",
            rule="git_failed",
        )
    return proc.stdout


def is_ignored(root: Path | str, path: Path | str) -> bool:
    """Whether git ignores ``path`` (relative to ``root``): ``git check-ignore -q``, whose exit code is
    the answer (1: not ignored; any other failure counts as not ignored too)."""
    return git_run(root, "check-ignore", "-q", str(path)).returncode == 0


def head_commit(root: Path | str) -> str:
    """The current commit (loud outside a git checkout)."""
    return git(root, "rev-parse", "HEAD").strip()


def commit_or_unknown(root: Path | str = ".") -> str:
    """``git rev-parse HEAD``, or "unknown" outside a git checkout (or before the first commit): for records."""
    try:
        out = git_run(root, "rev-parse", "HEAD", text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.stdout.strip() if out.returncode == 0 else "") or "unknown"


def require_committed(root: Path | str, paths: list[Path], why: str) -> None:
    """Refuse when any of ``paths`` is untracked or differs from HEAD."""
    status = git(root, "status", "--porcelain", "--untracked-files=all", "--", *map(str, paths))
    if status.strip():
        raise ClapError(f"{why}; commit these first:\n{status.rstrip()}", rule="uncommitted")


def read_dvc_lock(root: Path | str, missing: str = "dvc.lock is missing: nothing was run") -> dict[str, Any]:
    """The parsed ``dvc.lock`` of ``root``; missing (with the caller's ``missing`` message), unparseable or
    without stages is a ClapError."""
    path = Path(root) / "dvc.lock"
    if not path.exists():
        raise ClapError(missing, file="dvc.lock", rule="missing_lock")
    try:
        lock = parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ClapError(f"dvc.lock does not parse: {e}", file="dvc.lock", rule="corrupt_lock") from e
    if not isinstance(lock, dict) or not isinstance(lock.get("stages"), dict):
        raise ClapError("dvc.lock has no stages", file="dvc.lock", rule="corrupt_lock")
    return lock
