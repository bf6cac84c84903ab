"""Comparing a committed output with its re-run, file by file and JSON leaf by leaf.

Used by ``clap verify`` (:mod:`clap.release.verify`) and the pull-request check
(:mod:`clap.release.prcheck`). Every compared row says how (``by``):

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
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io

FAILING = "DIFFERS"
# status of a row that differs within the cross-hardware tolerance (or a hash of a float-made artifact)
CROSS_HARDWARE = "different hardware"
HARDWARE_LABEL = f" ({CROSS_HARDWARE})"
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


def files_under(root: Path, rel: str) -> dict[str, Path]:
    """Every file at or under ``root/rel``, keyed by repository path."""
    path = root / rel
    if path.is_file():
        return {rel: path}
    if not path.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}


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
