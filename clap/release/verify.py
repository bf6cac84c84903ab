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

Every compared row says how (``by``):

- JSON (metrics, records, evidence, manifests), ``value``: leaf by leaf; each key is a
  decision, a hash, a value, a timing (expected to differ), provenance (where it ran) or
  environment (package versions, hardware);
- parquet, ``sha256`` then ``rows``: file sha256, then the logical hash (rows equal, bytes not:
  a pyarrow/pandas change);
- adapter weights, ``sha256`` or ``weights``: sha256; a CUDA record (``determinism: tolerance``)
  or another hardware class is compared within a tolerance;
- files holding timings (params ``verify.timing_files``): expected to differ;
- DVC-cached outputs without a remote, ``dvc.lock md5``; anything else, ``sha256``.

Hardware: training and eval records carry ``hardware`` (:func:`clap.determinism.hardware_class`).
When the re-run's class differs from the committed one, decisions, data hashes, counts and
strings must still match exactly; float values pass within ``verify.hardware_rel_tol`` /
``hardware_abs_tol``, adapter weights within ``hardware_adapter_abs_tol``, hashes of
float-made artifacts (``hardware_float_hashes``) and float CSV cells are compared likewise,
each such row labelled ``different hardware``.

Nothing here reads ``dvc metrics diff``: it exits 0 even when a metrics file fails to load.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io, params, vcs
from clap.errors import ClapError

FAILING = "DIFFERS"
# status of a row that differs within the cross-hardware tolerance (or a hash of a float-made artifact)
CROSS_HARDWARE = "different hardware"
HARDWARE_LABEL = f" ({CROSS_HARDWARE})"
MODE_REMOTE = "committed outputs pulled from DVC remote {name!r}"
MODE_NO_REMOTE = "rebuilt from data/raw, no remote"
MODE_UNREACHABLE = "rebuilt from data/raw, remote {name!r} unreachable or lacking objects"
BY_LOCK = "dvc.lock md5"
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
    hardware_rel_tol: float
    hardware_abs_tol: float
    hardware_abs_tol_keys: Mapping[str, float]  # key/column pattern -> absolute tolerance of that quantity
    hardware_adapter_abs_tol: float
    hardware_float_hashes: Sequence[str]


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared item: a file, or one key of a JSON file (``path:key``)."""

    artifact: str
    kind: str  # decision | hash | value | timing | provenance | environment
    committed: str
    reproduced: str
    status: str  # match | expected | tolerance | content | different hardware | DIFFERS
    by: str = ""  # how: value | sha256 | rows | weights | csv values | dvc.lock md5


@dataclasses.dataclass(frozen=True)
class Hardware:
    """The hardware class a batch's committed records name, and the re-run's ("" when not recorded)."""

    committed: str
    reproduced: str

    @property
    def differs(self) -> bool:
        """Both recorded and not equal: compare within the cross-hardware tolerances."""
        return bool(self.committed and self.reproduced) and self.committed != self.reproduced


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


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def within_hardware_tolerance(a: float, b: float, vp: VerifyParams, key: str = "") -> bool:
    """``|a - b| <= max(rel * max(|a|, |b|), abs)``: two floats equal up to another hardware's rounding.

    ``abs`` is ``hardware_abs_tol``, or the largest tolerance of ``hardware_abs_tol_keys`` whose
    pattern matches ``key`` (a flattened JSON key or a CSV column): for quantities whose scale is
    not their own magnitude (a log e-value near 0 against a threshold of 3, a KL of 1e-5 made
    from log-probabilities of order 1), a relative tolerance is meaningless."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    keyed = [tol for pattern, tol in vp.hardware_abs_tol_keys.items() if key and _matches(key, [pattern])]
    abs_tol = max([vp.hardware_abs_tol, *keyed])
    return abs(a - b) <= max(vp.hardware_rel_tol * max(abs(a), abs(b)), abs_tol)


def _cross_status(kind: str, key: str, va: Any, vb: Any, vp: VerifyParams) -> str:
    """A differing leaf on another hardware class: a float value within tolerance or the hash
    of a float-made artifact is ``different hardware``; anything else (decisions, counts,
    strings, data hashes) still fails."""
    floats = _is_number(va) and _is_number(vb) and (isinstance(va, float) or isinstance(vb, float))
    if kind == "value" and floats and within_hardware_tolerance(float(va), float(vb), vp, key):
        return CROSS_HARDWARE
    if kind == "hash" and _matches(key, vp.hardware_float_hashes):
        return CROSS_HARDWARE
    return FAILING


def compare_json(
    rel: str, committed: Path, reproduced: Path, vp: VerifyParams, cross_hardware: bool = False
) -> list[Row]:
    """One row per key of two JSON files (a file that does not parse fails loudly); with
    ``cross_hardware`` a differing float within tolerance is labelled, not failed."""
    a, b = dict(flatten(io.read_json(committed))), dict(flatten(io.read_json(reproduced)))
    rows = []
    for key in sorted(set(a) | set(b)):
        kind = classify_key(key, vp)
        va, vb = a.get(key, "<missing>"), b.get(key, "<missing>")
        status = _status(kind, key in a and key in b and va == vb)
        if status == FAILING and cross_hardware and key in a and key in b:
            status = _cross_status(kind, key, va, vb, vp)
        shown = _show(vb) + (HARDWARE_LABEL if status == CROSS_HARDWARE else "")
        rows.append(Row(f"{rel}:{key}", kind, _show(va), shown, status, "value"))
    return rows


def compare_parquet(rel: str, committed: Path, reproduced: Path) -> Row:
    """sha256 first; when bytes differ, the logical hash says whether the rows do."""
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    if ha == hb:
        return Row(rel, "hash", ha[:12], hb[:12], "match", "sha256")
    la, lb = io.logical_hash(io.read_parquet(committed)), io.logical_hash(io.read_parquet(reproduced))
    return Row(rel, "hash", f"rows {la[:12]}", f"rows {lb[:12]}", "content" if la == lb else FAILING, "rows")


def compare_weights(
    rel: str, committed: Path, reproduced: Path, tolerance: float | None, cross_hardware: bool = False
) -> Row:
    """sha256; with a tolerance (CUDA record, another hardware class) the largest absolute weight
    difference decides (status ``tolerance``, or ``different hardware`` across hardware classes)."""
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    if ha == hb or tolerance is None:
        return Row(rel, "hash", ha[:12], hb[:12], "match" if ha == hb else FAILING, "sha256")
    from safetensors.torch import load_file

    a, b = load_file(str(committed)), load_file(str(reproduced))
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return Row(rel, "hash", ha[:12], hb[:12], FAILING, "weights")
    diff = max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
    ok = CROSS_HARDWARE if cross_hardware else "tolerance"
    label = HARDWARE_LABEL if cross_hardware else ""
    return Row(
        rel,
        "hash",
        ha[:12],
        f"{hb[:12]} (max |d| {diff:.2e}, tol {tolerance:g}){label}",
        ok if diff <= tolerance else FAILING,
        "weights",
    )


def compare_csv_values(rel: str, committed: Path, reproduced: Path, vp: VerifyParams) -> Row:
    """Across hardware classes: same header and rows, every cell equal or a float within tolerance."""
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    if ha == hb:
        return Row(rel, "hash", ha[:12], hb[:12], "match", "sha256")
    with (
        committed.open(newline="", encoding="utf-8") as fa,
        reproduced.open(newline="", encoding="utf-8") as fb,
    ):
        ra, rb = list(csv.reader(fa)), list(csv.reader(fb))

    def close(x: str, y: str, column: str) -> bool:
        if x == y:
            return True
        try:
            return within_hardware_tolerance(float(x), float(y), vp, column)
        except ValueError:
            return False

    same_shape = len(ra) == len(rb) and all(len(x) == len(y) for x, y in zip(ra, rb, strict=True))
    ok = same_shape and bool(ra) and ra[0] == rb[0]
    ok = ok and all(
        close(x, y, column)
        for row_a, row_b in zip(ra[1:], rb[1:], strict=True)
        for x, y, column in zip(row_a, row_b, ra[0], strict=True)
    )
    return Row(
        rel,
        "value",
        ha[:12],
        hb[:12] + (HARDWARE_LABEL if ok else ""),
        CROSS_HARDWARE if ok else FAILING,
        "csv values",
    )


def _same_bytes(a: Path, b: Path) -> bool:
    return io.sha256_file(a) == io.sha256_file(b)


def is_timing_file(rel: str, vp: VerifyParams) -> bool:
    """A file whose bytes hold timings (params ``verify.timing_files``)."""
    return any(fnmatch.fnmatchcase(rel, g) for g in vp.timing_files)


def compare_file(
    rel: str,
    committed: Path | None,
    reproduced: Path | None,
    vp: VerifyParams,
    tolerance: float | None,
    cross_hardware: bool = False,
) -> list[Row]:
    """Rows for one output file, by what it holds (``cross_hardware``: the re-run ran on another
    hardware class; ``tolerance`` then already holds the cross-hardware weight tolerance)."""
    if committed is None or reproduced is None:
        kind = "timing" if is_timing_file(rel, vp) else "hash"
        return [
            Row(
                rel,
                kind,
                "missing" if committed is None else "present",
                "missing" if reproduced is None else "present",
                FAILING,
                "sha256",
            )
        ]
    if is_timing_file(rel, vp):
        return [
            Row(
                rel, "timing", "", "", "match" if _same_bytes(committed, reproduced) else "expected", "sha256"
            )
        ]
    if rel.endswith(".json") and (
        committed.stat().st_size <= LEAF_COMPARE_MAX_BYTES or not _same_bytes(committed, reproduced)
    ):
        return compare_json(rel, committed, reproduced, vp, cross_hardware)
    if rel.endswith(".parquet"):
        return [compare_parquet(rel, committed, reproduced)]
    if rel.endswith(".safetensors"):
        return [compare_weights(rel, committed, reproduced, tolerance, cross_hardware)]
    if rel.endswith(".csv") and cross_hardware:
        return [compare_csv_values(rel, committed, reproduced, vp)]
    ha, hb = io.sha256_file(committed), io.sha256_file(reproduced)
    return [Row(rel, "hash", ha[:12], hb[:12], "match" if ha == hb else FAILING, "sha256")]


def adapter_tolerance(committed_root: Path, batch: str) -> float | None:
    """The committed training record's weight tolerance when it says re-runs are not byte-identical
    (``determinism`` is in records/train/<b>.json, the tolerance in metrics/train/<b>.json)."""
    metrics_path = committed_root / "metrics" / "train" / f"{batch}.json"
    record: dict[str, Any] = {}
    for path in (metrics_path, io.record_path(metrics_path)):
        if path.exists():
            record.update(io.read_json(path))
    return float(record.get("adapter_abs_tol", 0.0)) if record.get("determinism") == "tolerance" else None


HARDWARE_RECORDS = ("train", "eval")  # the stages whose records name the hardware class (determinism.record)


def recorded_hardware(root: Path, batch: str) -> str:
    """The hardware class the batch's training (else eval) record names; "" when none does
    (a commit made before records carried it)."""
    for stage in HARDWARE_RECORDS:
        path = root / "records" / stage / f"{batch}.json"
        if path.exists():
            value = io.read_json(path).get("hardware")
            if value:
                return str(value)
    return ""


def batch_hardware(committed_root: Path, reproduced_root: Path, batch: str) -> Hardware:
    """The committed and reproduced hardware classes of a batch."""
    return Hardware(recorded_hardware(committed_root, batch), recorded_hardware(reproduced_root, batch))


def hardware_note(batch: str, hw: Hardware, vp: VerifyParams, *, with_weights: bool) -> str:
    """One line on how the batch's floats were compared."""
    if hw.differs:
        weights = (
            f"adapter weights within {vp.hardware_adapter_abs_tol:g} (max |d|)"
            if with_weights
            else "adapter weights not available without a remote (their hashes are reported, not decided)"
        )
        return (
            f"{batch}: {CROSS_HARDWARE}: committed on {hw.committed}, re-run on {hw.reproduced}; decisions, "
            f"counts, strings and data hashes compared exactly, floats within rel {vp.hardware_rel_tol:g} / "
            f"abs {vp.hardware_abs_tol:g}"
            + "".join(f", {k} abs {v:g}" for k, v in vp.hardware_abs_tol_keys.items())
            + f", {weights}"
        )
    if not hw.committed:
        return f"{batch}: the commit records no hardware class: compared as the same hardware (bytes)"
    return f"{batch}: same hardware class ({hw.committed}): compared by bytes"


def compare_outputs(
    committed_root: Path,
    reproduced_root: Path,
    paths: Sequence[str],
    batch: str,
    vp: VerifyParams,
    hardware: Hardware | None = None,
) -> list[Row]:
    """Rows for every file under the given output paths, committed vs reproduced (``hardware``
    differing: within the cross-hardware tolerances)."""
    cross = hardware is not None and hardware.differs
    tolerance = adapter_tolerance(committed_root, batch)
    if cross:
        tolerance = max(tolerance or 0.0, vp.hardware_adapter_abs_tol)
    rows = []
    for rel in paths:
        a, b = files_under(committed_root, rel), files_under(reproduced_root, rel)
        for key in sorted(set(a) | set(b)):
            rows += compare_file(key, a.get(key), b.get(key), vp, tolerance, cross)
    return rows


def _lock_outs(lock: Mapping[str, Any], stage: str) -> dict[str, Mapping[str, Any]]:
    return {o["path"]: o for o in lock.get(stage, {}).get("outs", [])}


def _md5(entry: Mapping[str, Any] | None) -> str:
    return str((entry or {}).get("md5", "")) or "<missing>"


def compare_lock_outs(
    committed_lock: Mapping[str, Any],
    reproduced_lock: Mapping[str, Any],
    stages: Sequence[str],
    in_git: set[str],
    reproduced_root: Path,
    vp: VerifyParams,
    cross_hardware: bool = False,
) -> list[Row]:
    """Without a remote, the DVC-cached outputs (not in git) of the re-run stages: the md5 the
    committed dvc.lock records against the re-run's. A folder that holds timing files cannot
    match: its file count decides (its data files' hashes are in the records, compared by value)."""
    rows = []
    for stage in stages:
        before, after = _lock_outs(committed_lock, stage), _lock_outs(reproduced_lock, stage)
        for path in sorted(set(before) | set(after)):
            if path in in_git:
                continue  # compared file by file
            a, b = before.get(path), after.get(path)
            ma, mb = _md5(a), _md5(b)
            timing = [k for k in files_under(reproduced_root, path) if is_timing_file(k, vp)]
            kind = "timing" if timing else "hash"
            if a is None or b is None:
                status = FAILING
            elif ma == mb:
                status = "match"
            elif timing:
                status = "expected" if a.get("nfiles") == b.get("nfiles") else FAILING
                ma, mb = f"{ma[:12]} ({a.get('nfiles')} files)", f"{mb[:12]} ({b.get('nfiles')} files)"
            elif cross_hardware and _matches(path, vp.hardware_float_hashes):
                status = CROSS_HARDWARE
            else:
                status = FAILING
            rows.append(
                Row(
                    path,
                    kind,
                    ma[:40],
                    mb[:40] + (HARDWARE_LABEL if status == CROSS_HARDWARE else ""),
                    status,
                    BY_LOCK,
                )
            )
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
    out or as another stage's dep."""
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
                bad = {
                    p: c for p, c in changes.items() if not (p in cached and c in ("not in cache", "deleted"))
                }
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
