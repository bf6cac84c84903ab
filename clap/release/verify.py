"""``clap verify <commit-or-batch>``: reproduce a committed batch from a clean checkout and compare.

The commit is cloned into a temporary folder (``git clone --shared``: the user's workspace,
cache and outputs are never read), the default DVC remote of the workspace is configured in
the clone, and ``dvc pull`` fetches the batch's committed outputs and the cached inputs it
needs (the base model, the production incumbent, a DVC-tracked raw batch). ``dvc status``
must then be clean: a ``dvc.lock`` that does not match the commit's files is a failure,
never "no change". The committed outputs are set aside, the batch's stages re-run with
``dvc repro --force --no-run-cache --single-item``, and every output file is compared with
its committed copy:

- JSON (metrics, records, evidence, manifests): leaf by leaf; each key is a decision, a hash, a value,
  a timing (expected to differ), provenance (where it ran) or environment (package versions);
- parquet: file sha256, then the logical hash (rows equal, bytes not: a pyarrow/pandas change);
- adapter weights: sha256; a CUDA record (``determinism: tolerance``) is compared within its tolerance;
- files holding timings (params ``verify.timing_files``): expected to differ;
- anything else: sha256.

Nothing here reads ``dvc metrics diff``: it exits 0 even when a metrics file fails to load.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from clap import io, vcs
from clap.errors import ClapError

FAILING = "DIFFERS"
LEAF_COMPARE_MAX_BYTES = (
    1 << 18
)  # JSON files above this (tokenizer.json) are compared key by key only when their bytes differ


@dataclasses.dataclass(frozen=True)
class VerifyParams:
    """Params section ``verify`` (see the comments there)."""

    stages: Sequence[str]
    decision_keys: Sequence[str]
    timing_keys: Sequence[str]
    provenance_keys: Sequence[str]
    environment_keys: Sequence[str]
    timing_files: Sequence[str]


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared item: a file, or one key of a JSON file (``path:key``)."""

    artifact: str
    kind: str  # decision | hash | value | timing | provenance | environment
    committed: str
    reproduced: str
    status: str  # match | expected | tolerance | content | DIFFERS


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """The outcome: the commit, its batches, every compared row and the wall time."""

    commit: str
    batches: list[str]
    rows: list[Row]
    wall_s: float

    @property
    def failures(self) -> list[Row]:
        """Rows that make verify fail: a differing decision, hash or value; bytes-only parquet
        differences too unless the recorded package versions changed (then they are explained)."""
        env_changed = any(r.kind == "environment" and r.status != "match" for r in self.rows)
        return [r for r in self.rows if r.status == FAILING or (r.status == "content" and not env_changed)]


# --- the checkout -------------------------------------------------------------------------
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
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{target}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if found.returncode == 0:
        return found.stdout.strip(), None
    head = _run(["git", "rev-parse", "HEAD"], root, what="git rev-parse HEAD").strip()
    batches = yaml.safe_load(
        _run(["git", "show", "HEAD:params.yaml"], root, what="reading params.yaml at HEAD")
    ).get("batches", [])
    if target in [str(b) for b in batches]:
        return head, [target]
    raise ClapError(
        f"{target!r} is neither a commit nor a batch of params.yaml at HEAD ({batches})", rule="verify_target"
    )


def checkout(root: Path, commit: str, dest: Path) -> None:
    """A clean checkout of ``commit`` at ``dest`` with the workspace's default DVC remote."""
    _run(
        ["git", "clone", "--quiet", "--shared", "--no-checkout", str(root), str(dest)], root, what="git clone"
    )
    _run(["git", "checkout", "--quiet", "--detach", commit], dest, what=f"git checkout {commit}")
    configure_remote(root, dest)


def configure_remote(root: Path, dest: Path) -> str:
    """Copy the workspace's default remote (paths resolved) into the clone's ``.dvc/config.local``."""
    from dvc.config import Config

    src = Config(dvc_dir=str(root / ".dvc"))
    name = src["core"].get("remote")
    if not name or name not in src["remote"]:
        raise ClapError(
            "no default DVC remote configured (dvc remote add -d NAME URL)",
            file=root / ".dvc/config",
            rule="no_remote",
        )
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


# --- what to run, pull and compare --------------------------------------------------------
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
    """Locked stages outside ``rerun`` whose outputs the re-run reads: declared deps, plus the
    production incumbent's adapter (eval reads it through releases/production.json), plus the
    ``.dvc`` files of deps that are DVC-tracked data (a user's ``dvc add data/raw/<batch>``;
    the committed demo batches are in git and need no pull)."""
    owner = {path: name for name in lock for path in outs(lock, name)}
    deps = {d["path"] for s in rerun for d in lock[s].get("deps", [])}
    needed = {owner[d] for d in deps if d in owner}
    needed |= {f"{d}.dvc" for d in deps if d not in owner and (checkout_dir / f"{d}.dvc").is_file()}
    pointer = checkout_dir / "releases" / "production.json"
    if pointer.exists():
        batch = io.read_json(pointer).get("batch")
        if batch and f"train@{batch}" in lock:
            needed.add(f"train@{batch}")
    return sorted(needed - set(rerun))


def files_under(root: Path, rel: str) -> dict[str, Path]:
    """Every file at or under ``root/rel``, keyed by repository path."""
    path = root / rel
    if path.is_file():
        return {rel: path}
    if not path.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}


def snapshot(checkout_dir: Path, paths: Sequence[str], dest: Path) -> None:
    """Copy the committed outputs aside before the re-run deletes them."""
    for rel in paths:
        for key, src in files_under(checkout_dir, rel).items():
            (dest / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / key)


# --- comparison ---------------------------------------------------------------------------
def flatten(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf) pairs; a list of dicts that all carry a ``name`` is keyed by name."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        named = obj and all(isinstance(x, dict) and isinstance(x.get("name"), str) for x in obj)
        items = ((x["name"] if named else str(i), x) for i, x in enumerate(obj))
    else:
        yield prefix, obj
        return
    empty = True
    for key, value in items:
        empty = False
        yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    if empty:
        yield prefix, obj


def _matches(key: str, patterns: Sequence[str]) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(leaf, p) for p in patterns)


def classify_key(key: str, vp: VerifyParams) -> str:
    """The kind of one flattened JSON key (first match wins, in this order)."""
    for kind, patterns in (
        ("provenance", vp.provenance_keys),
        ("environment", vp.environment_keys),
        ("timing", vp.timing_keys),
        ("decision", vp.decision_keys),
    ):
        if _matches(key, patterns):
            return kind
    return (
        "hash" if "sha256" in key or "md5" in key else "value"
    )  # also names under a hash map (file names hold dots)


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _status(kind: str, same: bool) -> str:
    if same:
        return "match"
    return "expected" if kind in ("timing", "provenance", "environment") else FAILING


def compare_json(rel: str, committed: Path, reproduced: Path, vp: VerifyParams) -> list[Row]:
    """One row per key of two JSON files (a file that does not parse fails loudly)."""
    a, b = dict(flatten(io.read_json(committed))), dict(flatten(io.read_json(reproduced)))
    rows = []
    for key in sorted(set(a) | set(b)):
        kind = classify_key(key, vp)
        va, vb = a.get(key, "<missing>"), b.get(key, "<missing>")
        rows.append(
            Row(f"{rel}:{key}", kind, _show(va), _show(vb), _status(kind, key in a and key in b and va == vb))
        )
    return rows


def compare_parquet(rel: str, committed: Path, reproduced: Path) -> Row:
    """sha256 first; when bytes differ, the logical hash says whether the rows do."""
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    if ha == hb:
        return Row(rel, "hash", ha[:12], hb[:12], "match")
    la, lb = io.logical_hash(io.read_parquet(committed)), io.logical_hash(io.read_parquet(reproduced))
    return Row(rel, "hash", f"rows {la[:12]}", f"rows {lb[:12]}", "content" if la == lb else FAILING)


def compare_weights(rel: str, committed: Path, reproduced: Path, tolerance: float | None) -> Row:
    """sha256; with a tolerance (CUDA record) the largest absolute weight difference decides."""
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    if ha == hb or tolerance is None:
        return Row(rel, "hash", ha[:12], hb[:12], "match" if ha == hb else FAILING)
    from safetensors.torch import load_file

    a, b = load_file(str(committed)), load_file(str(reproduced))
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return Row(rel, "hash", ha[:12], hb[:12], FAILING)
    diff = max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
    return Row(
        rel, "hash", ha[:12], f"{hb[:12]} (max |d| {diff:.2e})", "tolerance" if diff <= tolerance else FAILING
    )


def _same_bytes(a: Path, b: Path) -> bool:
    return io.sha256_file(a) == io.sha256_file(b)


def compare_file(
    rel: str, committed: Path | None, reproduced: Path | None, vp: VerifyParams, tolerance: float | None
) -> list[Row]:
    """Rows for one output file, by what it holds."""
    if committed is None or reproduced is None:
        kind = "timing" if any(fnmatch.fnmatchcase(rel, g) for g in vp.timing_files) else "hash"
        return [
            Row(
                rel,
                kind,
                "missing" if committed is None else "present",
                "missing" if reproduced is None else "present",
                FAILING,
            )
        ]
    if any(fnmatch.fnmatchcase(rel, g) for g in vp.timing_files):
        return [Row(rel, "timing", "", "", "match" if _same_bytes(committed, reproduced) else "expected")]
    if rel.endswith(".json") and (
        committed.stat().st_size <= LEAF_COMPARE_MAX_BYTES or not _same_bytes(committed, reproduced)
    ):
        return compare_json(rel, committed, reproduced, vp)
    if rel.endswith(".parquet"):
        return [compare_parquet(rel, committed, reproduced)]
    if rel.endswith(".safetensors"):
        return [compare_weights(rel, committed, reproduced, tolerance)]
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    return [Row(rel, "hash", ha[:12], hb[:12], "match" if ha == hb else FAILING)]


def adapter_tolerance(committed_root: Path, batch: str) -> float | None:
    """The committed training record's weight tolerance when it says re-runs are not byte-identical
    (``determinism`` is in records/train/<b>.json, the tolerance in metrics/train/<b>.json)."""
    metrics_path = committed_root / "metrics" / "train" / f"{batch}.json"
    record: dict[str, Any] = {}
    for path in (metrics_path, io.record_path(metrics_path)):
        if path.exists():
            record.update(io.read_json(path))
    return float(record.get("adapter_abs_tol", 0.0)) if record.get("determinism") == "tolerance" else None


def compare_outputs(
    committed_root: Path, reproduced_root: Path, paths: Sequence[str], batch: str, vp: VerifyParams
) -> list[Row]:
    """Rows for every file under the given output paths, committed vs reproduced."""
    tolerance = adapter_tolerance(committed_root, batch)
    rows = []
    for rel in paths:
        a, b = files_under(committed_root, rel), files_under(reproduced_root, rel)
        for key in sorted(set(a) | set(b)):
            rows += compare_file(key, a.get(key), b.get(key), vp, tolerance)
    return rows


# --- the command --------------------------------------------------------------------------
def verify(root: Path | str, target: str, vp: VerifyParams, *, keep: bool = False, log=print) -> VerifyResult:
    """Reproduce a commit's batches (or one batch at HEAD) from a clean checkout and compare.

    Args:
        root: the workspace (its git repository and DVC remote configuration are used, not its files).
        target: a commit-ish (every batch of that commit) or a batch name (that batch at HEAD).
        vp: the ``verify`` params.
        keep: keep the temporary checkout (its path is logged).
        log: progress lines.

    Returns:
        The comparison; ``result.failures`` empty means reproduced.

    Raises:
        ClapError: no dvc.lock or remote, a pull or re-run that fails, a dvc.lock that does
            not match the commit's files, a committed or reproduced file that does not parse.
    """
    started = time.perf_counter()
    root = Path(root).resolve()
    commit, batches = resolve_target(root, target)
    work = Path(tempfile.mkdtemp(prefix="clap-verify-"))
    try:
        batches, rows = _verify_in(root, commit, batches, work, vp, log)
    finally:
        if keep:
            log(f"kept the checkout: {work / 'checkout'}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return VerifyResult(commit, batches, rows, round(time.perf_counter() - started, 1))


def _verify_in(
    root: Path, commit: str, batches: list[str] | None, work: Path, vp: VerifyParams, log
) -> tuple[list[str], list[Row]]:
    clone = work / "checkout"
    log(f"checkout {commit[:12]} -> {clone}")
    checkout(root, commit, clone)
    lock = read_lock(clone)
    if batches is None:
        batches = [
            str(b)
            for b in yaml.safe_load((clone / "params.yaml").read_text(encoding="utf-8")).get("batches", [])
        ]
    rerun = [s for b in batches for s in batch_stages(lock, b, vp)]
    pulled = inputs_to_pull(lock, rerun, clone)
    log(f"dvc pull {' '.join(pulled + rerun)}")
    dvc(clone, "pull", *pulled, *rerun)
    require_clean_status(clone, pulled + rerun)
    paths = {b: [p for s in batch_stages(lock, b, vp) for p in outs(lock, s)] for b in batches}
    snapshot(clone, [p for ps in paths.values() for p in ps], work / "committed")
    log(f"dvc repro --force --no-run-cache --single-item {' '.join(rerun)}")
    dvc(clone, "repro", "--force", "--no-run-cache", "--single-item", *rerun)
    return batches, [r for b in batches for r in compare_outputs(work / "committed", clone, paths[b], b, vp)]


def require_clean_status(clone: Path, stages: Sequence[str]) -> None:
    """``dvc status`` of the pulled checkout must be clean: the lock matches the commit's files."""
    raw = dvc(clone, "status", "--json", *stages).strip() or "{}"
    try:
        status = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClapError(f"cannot parse `dvc status --json`: {raw[:500]}", rule="verify_command") from e
    if status:
        raise ClapError(
            f"dvc.lock does not match the commit's files (after dvc pull): {json.dumps(status, sort_keys=True)[:2000]}",
            file="dvc.lock",
            rule="lock_mismatch",
        )


# --- the table ----------------------------------------------------------------------------
def condensed(rows: Sequence[Row]) -> list[Row]:
    """Every decision, file and differing row; JSON keys that match (or differ as expected) are
    counted per file and kind instead of listed one by one."""
    out: list[Row] = []
    groups: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if ":" in r.artifact and r.kind != "decision" and r.status in ("match", "expected"):
            key = (r.artifact.split(":", 1)[0], r.kind, r.status)
            if key not in groups:
                out.append(Row(key[0], r.kind, "", "", r.status))
            groups[key] = groups.get(key, 0) + 1
        else:
            out.append(r)
    return [
        dataclasses.replace(r, artifact=f"{r.artifact} [{groups[(r.artifact, r.kind, r.status)]} keys]")
        if (r.artifact, r.kind, r.status) in groups
        else r
        for r in out
    ]


def render_table(result: VerifyResult) -> str:
    """The printed table (markdown) and a one-line verdict."""
    rows = condensed(result.rows)
    lines = ["| artifact | kind | committed | reproduced | status |", "|---|---|---|---|---|"]
    lines += [f"| {r.artifact} | {r.kind} | {r.committed} | {r.reproduced} | {r.status} |" for r in rows]
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    verdict = "REPRODUCED" if not result.failures else f"NOT REPRODUCED ({len(result.failures)} differences)"
    lines += [
        "",
        f"verify {result.commit[:12]} batches {', '.join(result.batches)}: {verdict}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; {result.wall_s} s",
    ]
    return "\n".join(lines)
