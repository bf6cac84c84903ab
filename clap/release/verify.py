"""``clap verify <commit-or-batch>``: reproduce a committed batch from a clean checkout and compare.

The commit is cloned into a temporary folder (``git clone --shared``: the user's workspace,
cache and outputs are never read). Two modes, named in the result:

- **with a remote** (the fast path): the default DVC remote of the workspace is configured
  in the clone and ``dvc pull`` fetches the batch's committed outputs and the cached inputs
  it needs (the base model, the production incumbent, a DVC-tracked raw batch). ``dvc status``
  of the pulled stages must then be clean: a ``dvc.lock`` that does not match the commit's
  files is a failure, never "no change". Only what was not pulled may be missing: the
  DVC-cached inputs of a stage pulled for its outputs and not re-run (the incumbent's
  ``train`` reads its admitted data, which the re-run never needs). The committed outputs are set aside, the batch's stages re-run with
  ``dvc repro --force --no-run-cache --single-item``, and every output file is compared with
  its committed copy.
- **rebuilt from data/raw** (no default remote, or its pull fails: unreachable, objects
  missing): the batch's stages and every stage upstream of them (``base``, the production
  incumbent's chain) run from the raw data in git (``dvc repro --force --no-run-cache``).
  The commit's DVC-cached outputs (parquet, models) exist nowhere else, so before the re-run
  ``dvc status`` may list only those as missing; everything in git must match ``dvc.lock``.
  Outputs in git (metrics, records, reports, plots) are compared file by file as above; a
  DVC-cached output by the md5 the committed ``dvc.lock`` records against the md5 of the
  re-run (a folder holding timing files cannot match: its file count is compared, its data
  files' hashes are in the records). A DVC-tracked raw batch needs the remote (loud failure).

The clean checkout and the dvc commands in it are :mod:`clap.release.checkout`; how each output is
compared with its committed copy (the rows, their kinds, the cross-hardware tolerances) is
:mod:`clap.release.compare`. This module runs the command and renders its table.

Nothing here reads ``dvc metrics diff``: it exits 0 even when a metrics file fails to load.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import params
from clap.errors import ClapError
from clap.release.checkout import (
    batch_stages,
    checkout,
    dvc,
    inputs_to_pull,
    not_pulled,
    outs,
    read_lock,
    require_clean_status,
    require_lock_matches_git,
    resolve_target,
    snapshot,
    tracked_outputs,
)
from clap.release.compare import (
    BY_LOCK,
    FAILING,
    Row,
    VerifyParams,
    batch_hardware,
    compare_lock_outs,
    compare_outputs,
    hardware_note,
)

MODE_REMOTE = "committed outputs pulled from DVC remote {name!r}"
MODE_NO_REMOTE = "rebuilt from data/raw, no remote"
MODE_UNREACHABLE = "rebuilt from data/raw, remote {name!r} unreachable or lacking objects"


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """The outcome: the commit, its batches, every compared row, the wall time, how the
    committed outputs were obtained (``mode``) and what the reader must know (``notes``)."""

    commit: str
    batches: list[str]
    rows: list[Row]
    wall_s: float
    mode: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def failures(self) -> list[Row]:
        """Rows that make verify fail: a differing decision, hash or value; bytes-only parquet
        differences too unless the recorded package versions changed (then they are explained)."""
        env_changed = any(r.kind == "environment" and r.status != "match" for r in self.rows)
        return [r for r in self.rows if r.status == FAILING or (r.status == "content" and not env_changed)]


def verify(root: Path | str, target: str, vp: VerifyParams, *, keep: bool = False, log=print) -> VerifyResult:
    """Reproduce a commit's batches (or one batch at HEAD) from a clean checkout and compare.

    Args:
        root: the workspace (its git repository and DVC remote configuration are used, not its files).
        target: a commit-ish (every batch of that commit) or a batch name (that batch at HEAD).
        vp: the ``verify`` params.
        keep: keep the temporary checkout (its path is logged).
        log: progress lines.

    Returns:
        The comparison; ``result.failures`` empty means reproduced; ``result.mode`` says whether
        the committed outputs came from the remote or the commit was rebuilt from data/raw.

    Raises:
        ClapError: no dvc.lock, a re-run that fails, a dvc.lock that does not match the commit's
            files, a DVC-tracked raw batch without a reachable remote, a committed or
            reproduced file that does not parse.
    """
    started = time.perf_counter()
    root = Path(root).resolve()
    commit, batches = resolve_target(root, target)
    work = Path(tempfile.mkdtemp(prefix="clap-verify-"))
    try:
        result = _verify_in(root, commit, batches, work, vp, log)
    finally:
        if keep:
            log(f"kept the checkout: {work / 'checkout'}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return dataclasses.replace(result, wall_s=round(time.perf_counter() - started, 1))


def _verify_in(
    root: Path, commit: str, batches: list[str] | None, work: Path, vp: VerifyParams, log
) -> VerifyResult:
    clone = work / "checkout"
    log(f"checkout {commit[:12]} -> {clone}")
    remote = checkout(root, commit, clone)
    lock = read_lock(clone)
    if batches is None:
        batches = [str(b) for b in params.load(clone / "params.yaml").get("batches", [])]
    rerun = [s for b in batches for s in batch_stages(lock, b, vp)]
    needed = inputs_to_pull(lock, rerun, clone)
    paths = {b: [p for s in batch_stages(lock, b, vp) for p in outs(lock, s)] for b in batches}
    if remote is None:
        log("no default DVC remote: rebuilding the commit from data/raw")
        return _rebuild(clone, commit, batches, lock, rerun, needed, paths, work, vp, log, MODE_NO_REMOTE)
    log(f"dvc pull {' '.join(needed + rerun)}")
    try:
        dvc(clone, "pull", *needed, *rerun)
    except ClapError as e:
        log(f"dvc pull from remote {remote!r} failed; rebuilding the commit from data/raw:\n{e}")
        mode = MODE_UNREACHABLE.format(name=remote)
        return _rebuild(clone, commit, batches, lock, rerun, needed, paths, work, vp, log, mode)
    require_clean_status(clone, needed + rerun, not_pulled(clone, lock, needed + rerun))
    snapshot(clone, [p for ps in paths.values() for p in ps], work / "committed")
    log(f"dvc repro --force --no-run-cache --single-item {' '.join(rerun)}")
    dvc(clone, "repro", "--force", "--no-run-cache", "--single-item", *rerun)
    rows, notes = [], []
    for b in batches:
        hw = batch_hardware(work / "committed", clone, b)
        notes.append(hardware_note(b, hw, vp, with_weights=True))
        rows += compare_outputs(work / "committed", clone, paths[b], b, vp, hw)
    return VerifyResult(commit, batches, rows, 0.0, MODE_REMOTE.format(name=remote), notes)


def _rebuild(
    clone: Path,
    commit: str,
    batches: list[str],
    lock: Mapping[str, Any],
    rerun: list[str],
    needed: list[str],
    paths: Mapping[str, list[str]],
    work: Path,
    vp: VerifyParams,
    log,
    mode: str,
) -> VerifyResult:
    """No remote: re-run the batches and everything upstream from the raw data in git, compare
    the outputs in git file by file and the DVC-cached ones by their dvc.lock md5."""
    tracked_raw = [p for p in needed if p.endswith(".dvc")]
    if tracked_raw:
        raise ClapError(
            f"{', '.join(tracked_raw)}: the raw batch is DVC-tracked, its bytes are only in a DVC remote "
            f"({mode}); `clap verify` can rebuild without a remote only from raw data committed to git",
            file=tracked_raw[0],
            rule="no_remote",
        )
    stages = [p for p in needed if not p.endswith(".dvc")] + rerun
    every_out = sorted({p for s in lock for p in outs(lock, s)})
    in_git = tracked_outputs(clone, every_out)
    require_lock_matches_git(clone, stages, set(every_out) - in_git)
    compared = {b: [p for p in ps if p in in_git] for b, ps in paths.items()}
    snapshot(clone, [p for ps in compared.values() for p in ps], work / "committed")
    log(f"dvc repro --force --no-run-cache {' '.join(stages)}")
    dvc(clone, "repro", "--force", "--no-run-cache", *stages)
    reproduced_lock = read_lock(clone)
    rows: list[Row] = []
    notes = [
        "outputs in git (metrics, records, reports, plots) compared by value (JSON) or sha256; DVC-cached "
        f"outputs (data, models) are not in git: compared by the {BY_LOCK} of the committed dvc.lock"
    ]
    upstream = [s for s in stages if s not in rerun]
    if upstream:
        rows += compare_lock_outs(lock, reproduced_lock, upstream, in_git, clone, vp)
        notes.append(f"rebuilt upstream of the batches: {', '.join(upstream)}")
    for b in batches:
        hw = batch_hardware(work / "committed", clone, b)
        notes.append(hardware_note(b, hw, vp, with_weights=False))
        rows += compare_outputs(work / "committed", clone, compared[b], b, vp, hw)
        batch_rerun = [s for s in rerun if s.endswith(f"@{b}")]
        rows += compare_lock_outs(lock, reproduced_lock, batch_rerun, in_git, clone, vp, hw.differs)
    return VerifyResult(commit, batches, rows, 0.0, mode, notes)


def condensed(rows: Sequence[Row]) -> list[Row]:
    """Every decision, file and differing row; JSON keys that match (or differ as expected) are
    counted per file and kind instead of listed one by one."""
    out: list[Row] = []
    groups: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if ":" in r.artifact and r.kind != "decision" and r.status in ("match", "expected"):
            key = (r.artifact.split(":", 1)[0], r.kind, r.status)
            if key not in groups:
                out.append(Row(key[0], r.kind, "", "", r.status, r.by))
            groups[key] = groups.get(key, 0) + 1
        else:
            out.append(r)
    return [
        dataclasses.replace(r, artifact=f"{r.artifact} [{groups[(r.artifact, r.kind, r.status)]} keys]")
        if (r.artifact, r.kind, r.status) in groups
        else r
        for r in out
    ]


def _tally(values: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def render_table(result: VerifyResult) -> str:
    """The printed table (markdown), the notes and a one-line verdict naming the mode."""
    rows = condensed(result.rows)
    lines = [
        "| artifact | kind | by | committed | reproduced | status |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.artifact} | {r.kind} | {r.by} | {r.committed} | {r.reproduced} | {r.status} |" for r in rows
    ]
    verdict = "REPRODUCED" if not result.failures else f"NOT REPRODUCED ({len(result.failures)} differences)"
    mode = f" ({result.mode})" if result.mode else ""
    by = _tally([r.by for r in result.rows if r.by])
    lines += ["", *(f"- {n}" for n in result.notes)] if result.notes else [""]
    lines += [
        f"verify {result.commit[:12]} batches {', '.join(result.batches)}{mode}: {verdict}; "
        + _tally([r.status for r in result.rows])
        + (f"; compared by {by}" if by else "")
        + f"; {result.wall_s} s",
    ]
    return "\n".join(lines)
