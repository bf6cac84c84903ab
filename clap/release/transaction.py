"""How release control changes ``releases/``: one change at a time, all or nothing, committed.

:func:`locked` takes the clone's release lock (one release, rollback, canary action or key change at
a time); :func:`transaction` restores every file it names (bytes and index entries) and undoes a
commit made inside it when the block raises; :func:`commit_files` commits exactly the named paths.
The append-only files (history, ledger) are written whole from their text plus new JSON lines
(:func:`appended`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clap import io, vcs
from clap.errors import ClapError


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One release-state change at a time on this clone (the lock file lives in .git)."""
    git_dir = Path(root) / vcs.git(root, "rev-parse", "--git-dir").strip()
    with open(git_dir / "clap-release.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise ClapError(
                "another clap release/rollback is running in this repository", rule="locked"
            ) from e
        yield


@contextlib.contextmanager
def transaction(root: Path, paths: list[Path]) -> Iterator[None]:
    """Restore ``paths`` (bytes, and their index entries) and undo a commit made in the block
    (one whose registry tags failed) if the block raises: all or nothing."""
    saved = {p: ((Path(root) / p).read_bytes() if (Path(root) / p).exists() else None) for p in paths}
    head = vcs.head_commit(root)
    try:
        yield
    except BaseException:
        with contextlib.suppress(ClapError):  # a commit made inside the block is undone (its tags failed)
            if vcs.head_commit(root) != head:
                vcs.git(root, "reset", "-q", "--soft", head)
        for p, data in saved.items():
            if data is None:
                (Path(root) / p).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # a folder this transaction created goes too
                    (Path(root) / p).parent.rmdir()
            else:
                io.atomic_write_bytes(Path(root) / p, data)
        with contextlib.suppress(ClapError):
            vcs.git(root, "reset", "-q", "--", *map(str, paths))
        raise


def commit_files(root: Path, paths: list[Path], message: str) -> str:
    names = list(map(str, paths))
    vcs.git(root, "add", "--", *names)
    vcs.git(root, "commit", "-q", "-m", message, "--only", "--", *names)
    return vcs.head_commit(root)


def append_line(text: str, row: dict[str, Any]) -> str:
    return text + json.dumps(row, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def appended(text: str, rows: list[dict[str, Any]]) -> str:
    for row in rows:
        text = append_line(text, row)
    return text


def file_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
