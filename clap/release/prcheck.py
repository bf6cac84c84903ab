"""``clap pr-check [--base REV]``: after ``dvc repro`` in the working tree, do the committed decisions reproduce?

The PR workflow (``.github/workflows/pr.yml``) runs ``dvc repro`` on the pull request's checkout,
then this. Raw bytes cannot decide: every re-run stage rewrites its timings (and their hashes land
in ``dvc.lock``), so ``git diff --exit-code`` fails on any runner. This compares by meaning,
with ``clap verify``'s classification (params ``verify``: ``decision_keys``, ``timing_keys``,
``provenance_keys``, ``environment_keys``, ``timing_files``; :mod:`clap.release.compare`):

1. ``metrics/`` and ``records/``: every file in git at ``REV`` (default ``HEAD``) against the
   working tree, leaf by leaf (:func:`clap.release.compare.compare_file`). A new or missing file,
   a decision, a hash, a count or any other value that differs fails; timing, provenance and
   environment keys are reported as informational.
2. ``dvc.lock``, stage by stage, never its bytes:

   - the set of stages, each stage's ``cmd`` and ``params`` values: any difference fails
     (a params change that was not re-run and committed is a stale decision);
   - ``deps`` that no stage produces (code, raw data): hash differences fail (the committed
     lock was not produced by the committed code and data). Deps produced by a stage are that
     stage's outs and are compared there;
   - ``outs`` outside ``metrics/`` and ``records/`` (compared in 1.): equal hashes match;
     a timing file (``verify.timing_files``) is informational. When the hash differs the committed
     content is looked up (the git blob at ``REV`` for ``cache: false`` outs such as
     ``reports/``, else the DVC cache, which ``dvc pull`` filled) and compared file by file as
     ``clap verify`` does: a directory by its ``.dir`` listing, JSON leaf by leaf (a gate
     evidence file carries timings and the commit it ran at), parquet by its logical hash,
     weights by sha256 or the record's tolerance. When the committed object is not in the cache
     (no reachable DVC remote), the row is ``unverified``: reported, not failing, because its
     content hashes are also in ``records/`` (adapter, eval items, replay cases), compared in 1.

The run's own machine is not checked here: ``clap verify`` re-runs a commit from a clean checkout.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from clap import io, vcs
from clap.errors import ClapError
from clap.release import compare
from clap.release import verify as vf

COMPARED_FOLDERS = ("metrics", "records")
UNVERIFIED = "unverified"


@dataclasses.dataclass(frozen=True)
class PrCheckResult:
    """The committed revision, every compared row and the wall time."""

    base: str
    rows: list[compare.Row]
    wall_s: float

    @property
    def failures(self) -> list[compare.Row]:
        """The rows that fail, by ``clap verify``'s rule (:attr:`VerifyResult.failures`)."""
        return vf.VerifyResult(self.base, [], self.rows, self.wall_s).failures


# --- git ----------------------------------------------------------------------------------
def _git(root: Path, *args: str, what: str = "") -> bytes:
    done = vcs.git_run(root, *args)
    if done.returncode != 0:
        raise ClapError(
            f"{what or 'git ' + ' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()[-2000:]}",
            rule="pr_check_git",
        )
    return done.stdout


def resolve(root: Path, rev: str) -> str:
    """The commit sha of ``rev`` (loud when it is not a commit)."""
    return (
        _git(root, "rev-parse", "--verify", f"{rev}^{{commit}}", what=f"resolving {rev!r}").decode().strip()
    )


def export_committed(root: Path, rev: str, folders: Sequence[str], dest: Path) -> list[str]:
    """Write every file of ``folders`` in git at ``rev`` under ``dest``; their repository paths."""
    names = [
        n
        for n in _git(root, "ls-tree", "-r", "-z", "--name-only", rev, "--", *folders).decode().split("\0")
        if n
    ]
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_git(root, "show", f"{rev}:{name}"))
    return names


def committed_lock(root: Path, rev: str) -> dict[str, Any]:
    """The stages of ``dvc.lock`` at ``rev`` ({} when the revision has none)."""
    done = vcs.git_run(root, "show", f"{rev}:dvc.lock", text=True)
    if done.returncode != 0:
        return {}
    lock = yaml.safe_load(done.stdout) or {}
    return lock.get("stages") or {}


# --- the DVC cache ------------------------------------------------------------------------
def cache_dir(root: Path) -> Path:
    """The workspace's local DVC cache folder (``cache.dir`` of the DVC config, else ``.dvc/cache``)."""
    from dvc.config import Config

    configured = Config(dvc_dir=str(root / ".dvc"))["cache"].get("dir")
    path = Path(configured) if configured else root / ".dvc" / "cache"
    return path if path.is_absolute() else (root / ".dvc" / path).resolve()


def cache_object(cache: Path, md5: str) -> Path | None:
    """The cached object of a DVC 3 md5 (``.dir`` listings included), or None when not cached."""
    path = cache / "files" / "md5" / md5[:2] / md5[2:]
    return path if path.is_file() else None


# --- the comparison -----------------------------------------------------------------------
def _is_timing(rel: str, vp: compare.VerifyParams) -> bool:
    return any(fnmatch.fnmatchcase(rel, g) for g in vp.timing_files)


def _tolerance(committed_root: Path, rel: str) -> float | None:
    """A CUDA adapter's weight tolerance from the committed training metrics and record."""
    parts = Path(rel).parts
    if len(parts) >= 3 and parts[:2] == ("models", "adapters"):
        return compare.adapter_tolerance(committed_root, parts[2])
    return None


def compare_folders(
    committed_root: Path, names: Sequence[str], root: Path, folders: Sequence[str], vp: compare.VerifyParams
) -> list[compare.Row]:
    """Rows for every committed (``names`` under ``committed_root``) or present file of ``folders``."""
    committed = {n: committed_root / n for n in names}
    now: dict[str, Path] = {}
    for folder in folders:
        now.update(compare.files_under(root, folder))
    rows = []
    for rel in sorted(set(committed) | set(now)):
        rows += compare.compare_file(rel, committed.get(rel), now.get(rel), vp, None)
    return rows


def _hash(entry: Mapping[str, Any]) -> str | None:
    return entry.get("md5") or entry.get("etag") or entry.get("checksum")


def _by_path(entries: Sequence[Mapping[str, Any]] | None) -> dict[str, str | None]:
    return {e["path"]: _hash(e) for e in entries or []}


def _dir_listing(obj: Path | None) -> dict[str, str] | None:
    if obj is None:
        return None
    return {e["relpath"]: e["md5"] for e in json.loads(obj.read_text(encoding="utf-8"))}


def _row(artifact: str, kind: str, a: Any, b: Any, status: str) -> compare.Row:
    return compare.Row(artifact, kind, compare._show(a), compare._show(b), status)


def _compare_out(
    rel: str,
    old: str | None,
    new: str | None,
    root: Path,
    committed_root: Path,
    in_git: set[str],
    cache: Path,
    vp: compare.VerifyParams,
) -> list[compare.Row]:
    """Rows for one locked out whose hash differs (see the module docstring)."""
    tolerance = _tolerance(committed_root, rel)
    if old is None or new is None:
        return [_row(f"dvc.lock:{rel}", "hash", old or "<missing>", new or "<missing>", compare.FAILING)]
    if _is_timing(rel, vp):
        return [_row(f"dvc.lock:{rel}", "timing", old[:12], new[:12], "expected")]
    git_files = sorted(n for n in in_git if n == rel or n.startswith(rel.rstrip("/") + "/"))
    if git_files:  # a cache: false out, committed in git
        now = compare.files_under(root, rel)
        return [
            r
            for key in sorted(set(git_files) | set(now))
            for r in compare.compare_file(
                key, committed_root / key if key in git_files else None, now.get(key), vp, tolerance
            )
        ]
    if old.endswith(".dir"):
        before, after = _dir_listing(cache_object(cache, old)), _dir_listing(cache_object(cache, new))
        if after is None:  # the working tree is the reproduced side
            after = {k[len(rel) + 1 :]: "" for k in compare.files_under(root, rel)}
        if before is None:
            return [_row(f"dvc.lock:{rel}", "hash", old[:12], new[:12], UNVERIFIED)]
        rows = []
        for name in sorted(set(before) | set(after)):
            key = f"{rel}/{name}"
            if before.get(name) == after.get(name):
                continue
            obj = cache_object(cache, before[name]) if name in before else None
            if name in before and obj is None:
                rows.append(_row(key, "hash", before[name][:12], "", UNVERIFIED))
                continue
            present = root / key
            rows += compare.compare_file(key, obj, present if present.is_file() else None, vp, tolerance)
        return rows
    obj = cache_object(cache, old)
    if obj is None:
        return [_row(f"dvc.lock:{rel}", "hash", old[:12], new[:12], UNVERIFIED)]
    present = root / rel
    return compare.compare_file(rel, obj, present if present.is_file() else None, vp, tolerance)


def _flat(obj: Any) -> dict[str, Any]:
    return dict(compare.flatten(obj)) if obj else {}


def _produced(path: str, produced: set[str]) -> bool:
    """A dep that is, holds or lies inside a stage's out (e.g. summary's ``metrics/eval``), or lies
    in a folder compared file by file: its producing stages' outs are compared instead."""
    if path.split("/", 1)[0] in COMPARED_FOLDERS:
        return True
    return any(
        path == o or o.startswith(path.rstrip("/") + "/") or path.startswith(o + "/") for o in produced
    )


def compare_locks(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    root: Path,
    committed_root: Path,
    in_git: set[str],
    vp: compare.VerifyParams,
    cache: Path | None = None,
) -> list[compare.Row]:
    """Rows for two ``dvc.lock`` stage maps (see the module docstring for what is compared)."""
    cache = cache if cache is not None else cache_dir(root)
    produced = {o["path"] for lock in (old, new) for s in lock.values() for o in s.get("outs", [])}
    rows: list[compare.Row] = []
    for stage in sorted(set(old) | set(new)):
        if stage not in old or stage not in new:
            rows.append(
                _row(
                    f"dvc.lock:{stage}",
                    "value",
                    "present" if stage in old else "<missing>",
                    "present" if stage in new else "<missing>",
                    compare.FAILING,
                )
            )
            continue
        a, b = old[stage], new[stage]
        for part, kind, va, vb in (
            ("cmd", "value", {"cmd": a.get("cmd")}, {"cmd": b.get("cmd")}),
            ("params", "value", _flat(a.get("params")), _flat(b.get("params"))),
            ("deps", "hash", _by_path(a.get("deps")), _by_path(b.get("deps"))),
        ):
            for key in sorted(set(va) | set(vb)):
                if part == "deps" and _produced(key, produced):
                    continue  # the producing stages' outs are compared
                x, y = va.get(key, "<missing>"), vb.get(key, "<missing>")
                if x != y:
                    rows.append(_row(f"dvc.lock:{stage}:{part}:{key}", kind, x, y, compare.FAILING))
        outs_a, outs_b = _by_path(a.get("outs")), _by_path(b.get("outs"))
        for rel in sorted(set(outs_a) | set(outs_b)):
            if rel.split("/", 1)[0] in COMPARED_FOLDERS and rel in outs_a and rel in outs_b:
                continue  # compared file by file from git
            x, y = outs_a.get(rel), outs_b.get(rel)
            if x == y:
                rows.append(_row(f"dvc.lock:{rel}", "hash", (x or "")[:12], (y or "")[:12], "match"))
            else:
                rows += _compare_out(rel, x, y, root, committed_root, in_git, cache, vp)
    return rows


def pr_check(root: Path | str, vp: compare.VerifyParams, base: str = "HEAD") -> PrCheckResult:
    """Compare ``metrics/``, ``records/`` and ``dvc.lock`` at ``base`` with the working tree.

    Args:
        root: the repository, after ``dvc repro``.
        vp: the ``verify`` params (the key and file classification).
        base: the committed revision (default ``HEAD``).

    Returns:
        Every compared row; ``result.failures`` empty means the committed decisions reproduce.

    Raises:
        ClapError: ``base`` is not a commit, the working tree's dvc.lock is missing or does not
            parse, a metrics or records file does not parse.
    """
    started = time.perf_counter()
    root = Path(root).resolve()
    sha = resolve(root, base)
    new_lock = vcs.read_dvc_lock(root, "dvc.lock is missing: run `dvc repro` first")["stages"]
    with tempfile.TemporaryDirectory(prefix="clap-pr-check-") as tmp:
        committed_root = Path(tmp)
        names = export_committed(root, sha, COMPARED_FOLDERS, committed_root)
        rows = compare_folders(committed_root, names, root, COMPARED_FOLDERS, vp)
        old_lock = committed_lock(root, sha)
        outs = {o["path"] for s in old_lock.values() for o in s.get("outs", [])}
        outside = sorted({p for p in outs if p.split("/", 1)[0] not in COMPARED_FOLDERS})
        in_git = set(export_committed(root, sha, outside, committed_root)) if outside else set()
        rows += compare_locks(old_lock, new_lock, root, committed_root, in_git, vp)
    return PrCheckResult(sha, rows, round(time.perf_counter() - started, 1))


# --- the report ---------------------------------------------------------------------------
def _where(artifact: str) -> tuple[str, str, str]:
    """(batch, stage, key) of a row: ``metrics/<stage>/<batch>.json:key``, ``dvc.lock:<stage>@<batch>:...``."""
    path, _, key = artifact.partition(":")
    if path == "dvc.lock":
        head, _, rest = key.partition(":")
        if "@" in head or rest:
            stage, _, batch = head.partition("@")
            return batch or "-", stage, f"dvc.lock {rest}" if rest else "dvc.lock (stage)"
        path, key = head, ""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[0] in ("metrics", "records", "reports", "plots"):
        return Path(parts[2]).stem, parts[1], f"{path}:{key}" if key else path
    if len(parts) >= 3 and parts[0] in ("data", "models", "checkpoints"):
        return (
            parts[2] if len(parts) > 3 else Path(parts[2]).stem,
            parts[1],
            path + (f":{key}" if key else ""),
        )
    if len(parts) == 2 and parts[0] in COMPARED_FOLDERS:
        return "-", Path(parts[1]).stem, f"{path}:{key}" if key else path
    return "-", "-", artifact


def decision_diff(rows: Sequence[compare.Row]) -> list[str]:
    """One line per failing row, decisions first: ``batch  stage  kind  key: committed -> now``."""
    order = {"decision": 0, "value": 1, "hash": 2}
    lines = []
    for r in sorted(rows, key=lambda r: (order.get(r.kind, 3), _where(r.artifact))):
        batch, stage, key = _where(r.artifact)
        lines.append(f"  {batch:<10} {stage:<10} {r.kind:<9} {key}: {r.committed} -> {r.reproduced}")
    return lines


def _informational(rows: Sequence[compare.Row]) -> Iterator[str]:
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.status in ("expected", "content", "tolerance", UNVERIFIED):
            label = UNVERIFIED if r.status == UNVERIFIED else r.kind if r.status == "expected" else r.status
            groups.setdefault((label, r.status), []).append(r.artifact)
    for (label, _), artifacts in sorted(groups.items()):
        files = sorted({a.split(":", 1)[0] if not a.startswith("dvc.lock:") else a for a in artifacts})
        shown = ", ".join(files[:6]) + (f", ... ({len(files) - 6} more)" if len(files) > 6 else "")
        yield f"  {label}: {len(artifacts)} differ in {len(files)} files ({shown})"


def render(result: PrCheckResult) -> str:
    """The printed report: the decision diff (when failing), informational differences and a verdict."""
    failures = result.failures
    lines = [f"pr-check: committed {result.base[:12]} vs the working tree (metrics/, records/, dvc.lock)"]
    if failures:
        lines += [
            "",
            "decision diff (fails): batch, stage, kind, key: committed -> now",
            *decision_diff(failures),
        ]
    info = list(_informational(result.rows))
    if info:
        lines += ["", "differ as expected (informational, never failing):", *info]
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    verdict = (
        "PASS: the committed decisions reproduce" if not failures else f"FAIL: {len(failures)} differences"
    )
    lines += [
        "",
        f"{verdict}; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; {result.wall_s} s",
    ]
    return "\n".join(lines)


def write_markdown(result: PrCheckResult, path: Path | str) -> None:
    """The verdict, the decision diff and the informational differences, for the PR comment."""
    failures = result.failures
    lines = (
        [
            "**Committed decisions do NOT reproduce** (`clap pr-check`):",
            "",
            "```",
            *decision_diff(failures)[:200],
            "```",
        ]
        if failures
        else ["Committed `dvc.lock`, `metrics/` and `records/` reproduce (`clap pr-check`)."]
    )
    info = list(_informational(result.rows))
    if info:
        lines += ["", "Differ as expected (never failing):", "", "```", *info, "```"]
    io.atomic_write_text(path, "\n".join(lines) + "\n")
