"""The clean checkout ``clap verify`` re-runs a commit in, and the dvc commands run there.

What to verify (:func:`resolve_target`: a commit, or a batch at HEAD); the ``git clone --shared``
of the commit with the workspace's default DVC remote (:func:`checkout`); dvc run with the clone's
own code (:func:`dvc`); which locked stages to re-run and which to pull (:func:`batch_stages`,
:func:`inputs_to_pull`); the committed outputs set aside before the re-run (:func:`snapshot`); and
the checks that the committed ``dvc.lock`` matches the commit's files, after a pull
(:func:`require_clean_status`) or without a remote (:func:`require_lock_matches_git`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io, params, vcs
from clap.errors import ClapError
from clap.release.compare import VerifyParams, files_under


def _run(cmd: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, what: str = "") -> str:
    done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-3000:]
        raise ClapError(
            f"{what or ' '.join(cmd)} failed (exit {done.returncode}):\n{tail}", rule="verify_command"
        )
    return done.stdout


def resolve_target(root: Path, target: str) -> tuple[str, list[str] | None]:
    """(commit sha, batches or None = every batch of the commit) for a commit-ish or a batch name."""
    found = vcs.git_run(root, "rev-parse", "--verify", "--quiet", f"{target}^{{commit}}", text=True)
    if found.returncode == 0:
        return found.stdout.strip(), None
    head = _run(["git", "rev-parse", "HEAD"], root, what="git rev-parse HEAD").strip()
    batches = params.load("params.yaml", read=lambda p: _show_at_head(root, p)).get("batches", [])
    if target in [str(b) for b in batches]:
        return head, [target]
    raise ClapError(
        f"{target!r} is neither a commit nor a batch of params.yaml at HEAD ({batches})", rule="verify_target"
    )


def _show_at_head(root: Path, path: Path) -> str:
    """A file's text at HEAD (``path`` relative to the repository root), for clap.params.load."""
    done = vcs.git_run(root, "show", f"HEAD:{path.as_posix()}", text=True)
    if done.returncode != 0:
        raise FileNotFoundError(f"{path} at HEAD: {done.stderr.strip()}")
    return done.stdout


def checkout(root: Path, commit: str, dest: Path) -> str | None:
    """A clean checkout of ``commit`` at ``dest`` with the workspace's default DVC remote (its
    name; None when the workspace has none)."""
    _run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(root), str(dest)], root, what="git clone"
    )
    _run(["git", "checkout", "--quiet", "--detach", commit], dest, what=f"git checkout {commit}")
    return configure_remote(root, dest)


def configure_remote(root: Path, dest: Path) -> str | None:
    """Copy the workspace's default remote (paths resolved) into the clone's ``.dvc/config.local``;
    its name, or None when the workspace has no default remote (verify then rebuilds from data/raw)."""
    from dvc.config import Config

    src = Config(dvc_dir=str(root / ".dvc"))
    name = src["core"].get("remote")
    if not name or name not in src["remote"]:
        return None
    with Config(dvc_dir=str(dest / ".dvc")).edit("local") as conf:
        conf["remote"][name] = dict(src["remote"][name])
        conf["core"]["remote"] = name
    return name


def stage_env(checkout_dir: Path) -> dict[str, str]:
    """Environment of dvc and the stages in the clone: its own code first, this interpreter's tools."""
    env = {k: v for k, v in os.environ.items() if k != io.CRASH_ENV}
    env["PYTHONPATH"] = str(checkout_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def dvc(checkout_dir: Path, *args: str) -> str:
    """Run a dvc command in the clone (loud on failure)."""
    dvc_bin = Path(sys.executable).with_name("dvc")
    return _run(
        [str(dvc_bin) if dvc_bin.exists() else "dvc", *args],
        checkout_dir,
        stage_env(checkout_dir),
        what=f"dvc {' '.join(args)}",
    )


def read_lock(checkout_dir: Path) -> dict[str, Any]:
    """The committed dvc.lock's stages (loud when missing or unparseable)."""
    return vcs.read_dvc_lock(
        checkout_dir, "the commit has no dvc.lock: nothing was run and committed to verify"
    )["stages"]


def batch_stages(lock: Mapping[str, Any], batch: str, vp: VerifyParams) -> list[str]:
    """The batch's stages to re-run, in pipeline order; each must be in the committed dvc.lock."""
    names = [f"{s}@{batch}" for s in vp.stages]
    missing = [n for n in names if n not in lock]
    if missing:
        raise ClapError(
            f"dvc.lock at this commit has no entry for {missing}: the commit did not run them",
            file="dvc.lock",
            rule="missing_stage",
        )
    return names


def outs(lock: Mapping[str, Any], stage: str) -> list[str]:
    """Output paths of a locked stage."""
    return [o["path"] for o in lock[stage].get("outs", [])]


def inputs_to_pull(lock: Mapping[str, Any], rerun: Sequence[str], checkout_dir: Path) -> list[str]:
    """Locked stages outside ``rerun`` whose outputs the re-run reads: declared deps (a dep that is
    the folder of other stages' outputs, admit's ``data/normalized``, needs each of them), plus the
    production incumbent's adapter (eval reads it through releases/production.json), plus the
    ``.dvc`` files of deps that are DVC-tracked data (a user's ``dvc add data/raw/<batch>``;
    the committed demo batches are in git and need no pull)."""
    owner = {path: name for name in lock for path in outs(lock, name)}
    deps = {d["path"] for s in rerun for d in lock[s].get("deps", [])}
    needed = {owner[d] for d in deps if d in owner}
    needed |= {name for d in deps for path, name in owner.items() if path.startswith(d.rstrip("/") + "/")}
    needed |= {f"{d}.dvc" for d in deps if d not in owner and (checkout_dir / f"{d}.dvc").is_file()}
    pointer = checkout_dir / "releases" / "production.json"
    if pointer.exists():
        batch = io.read_json(pointer).get("batch")
        if batch and f"train@{batch}" in lock:
            needed.add(f"train@{batch}")
    return sorted(needed - set(rerun))


def snapshot(checkout_dir: Path, paths: Sequence[str], dest: Path) -> None:
    """Copy the committed outputs aside before the re-run deletes them."""
    for rel in paths:
        for key, src in files_under(checkout_dir, rel).items():
            (dest / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / key)


def tracked_outputs(clone: Path, paths: Sequence[str]) -> set[str]:
    """The output paths (files or folders) that git tracks at the checked-out commit."""
    if not paths:
        return set()
    files = _run(["git", "ls-files", "-z", "--", *paths], clone, what="git ls-files").split("\0")
    return {p for p in paths if any(f == p or f.startswith(f"{p}/") for f in files if f)}


def dvc_status(clone: Path, stages: Sequence[str], *, with_deps: bool = False) -> dict[str, Any]:
    """``dvc status --json`` of the given stages in the clone (``with_deps``: and every stage upstream)."""
    raw = dvc(clone, "status", "--json", *(["--with-deps"] if with_deps else []), *stages).strip() or "{}"
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClapError(f"cannot parse `dvc status --json`: {raw[:500]}", rule="verify_command") from e


def not_pulled(clone: Path, lock: Mapping[str, Any], pulled: Sequence[str]) -> set[str]:
    """The locked outputs a pull of ``pulled`` (stages and ``.dvc`` files) leaves absent: the
    DVC-cached outputs (not in git) of every other stage."""
    every_out = sorted({p for s in lock for p in outs(lock, s)})
    fetched = {p for s in pulled if s in lock for p in outs(lock, s)}
    return set(every_out) - tracked_outputs(clone, every_out) - fetched


def require_clean_status(clone: Path, stages: Sequence[str], absent: set[str] | None = None) -> None:
    """``dvc status`` of the pulled stages must be clean: the lock matches the commit's files.

    ``absent`` (:func:`not_pulled`): DVC-cached outputs of stages that were not pulled, which may
    be missing as a dependency of a pulled stage that is not re-run (the production incumbent's
    ``train``, pulled for its adapter: its admitted data is not pulled and the re-run never reads
    it). Its outputs, everything re-run and everything in git must match."""
    status = unexpected_status(dvc_status(clone, stages), absent or set())
    if status:
        raise ClapError(
            "dvc.lock does not match the commit's files (after dvc pull; only the DVC-cached outputs of "
            f"stages not pulled may be missing): {json.dumps(status, sort_keys=True)[:2000]}",
            file="dvc.lock",
            rule="lock_mismatch",
        )


def unexpected_status(status: Mapping[str, Any], cached: set[str]) -> dict[str, Any]:
    """Of a ``dvc status --json``, what the missing DVC cache does not explain: anything but a
    DVC-cached output (``cached``: without a remote, the locked outputs git does not track; after
    a pull, those of the stages not pulled) that is missing (``not in cache``, ``deleted``), as an
    out or as another stage's dep. A dep that is the folder of such outputs (admit's ``data/normalized``,
    every batch's normalize output) is explained the same way: missing (``deleted``) when all of them
    are, ``modified`` when some are (the outputs it holds that are present are their own stages' outs,
    checked as such)."""

    def explained(path: str, change: str) -> bool:
        if path in cached:
            return change in ("not in cache", "deleted")
        holds = any(c.startswith(path.rstrip("/") + "/") for c in cached)
        return holds and change in ("not in cache", "deleted", "modified")

    problems: dict[str, Any] = {}
    for stage, entries in status.items():
        for entry in entries:
            if not isinstance(entry, dict):
                problems.setdefault(stage, []).append(entry)  # "changed command", "always changed", ...
                continue
            for part, changes in entry.items():
                if not isinstance(changes, dict):
                    problems.setdefault(stage, []).append({part: changes})
                    continue
                bad = {p: c for p, c in changes.items() if not explained(p, c)}
                if bad:
                    problems.setdefault(stage, []).append({part: bad})
    return problems


def require_lock_matches_git(clone: Path, stages: Sequence[str], cached: set[str]) -> None:
    """Without a remote: everything in git (code, params, raw data, committed metrics and
    records) must match the commit's dvc.lock, for the stages and every stage upstream (all
    of them re-run); only the DVC-cached outputs may be missing."""
    problems = unexpected_status(dvc_status(clone, stages, with_deps=True), cached)
    if problems:
        raise ClapError(
            "dvc.lock does not match the commit's files (no remote: only DVC-cached outputs may be "
            f"missing): {json.dumps(problems, sort_keys=True)[:2000]}",
            file="dvc.lock",
            rule="lock_mismatch",
        )
