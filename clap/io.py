"""The only module that writes files: atomic writes, stable JSON, deterministic parquet, hashes.

Every writer goes through a temporary file (or folder) in the destination's directory and
``os.replace``: a stage killed at any point leaves either the old file or nothing, never a
half-written file at a final path. Temporaries are named ``.<name>.<pid>.<random>.tmp``; the
next write of the same path removes those whose process is gone (left by a killed run).

Fault injection (crash-safety tests): ``CLAP_CRASH_BEFORE_RENAME`` holds comma-separated
fnmatch patterns; a write whose final (absolute) path matches one SIGKILLs its own process after the
temporary is complete and before the rename, the moment a non-atomic writer would leave a
partial file behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hashlib
import json
import math
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from clap.errors import ClapError

# mkstemp/mkdtemp create owner-only entries; published outputs get the usual umask modes.
_UMASK = os.umask(0)
os.umask(_UMASK)
CRASH_ENV = "CLAP_CRASH_BEFORE_RENAME"
_TEMP_TAIL = re.compile(r"(\d+)\.[A-Za-z0-9_]+\.tmp")  # <pid>.<mkstemp random>.tmp


def _crash_point(path: Path) -> None:
    """SIGKILL this process if ``path`` matches a pattern in ``$CLAP_CRASH_BEFORE_RENAME`` (tests only)."""
    patterns = [p for p in os.environ.get(CRASH_ENV, "").split(",") if p]
    if any(fnmatch.fnmatch(path.absolute().as_posix(), p) for p in patterns):
        os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temp_prefix(path: Path) -> str:
    """Prefix of ``path``'s temporaries; sweeps those a killed process left behind first."""
    head = f".{path.name}."
    for stale in path.parent.glob(f"{glob.escape(head)}*.tmp"):
        own = _TEMP_TAIL.fullmatch(
            stale.name[len(head) :]
        )  # not another name's temp (".x.json.*" under ".x.")
        if own and not _alive(int(own.group(1))):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    return f"{head}{os.getpid()}."


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        _crash_point(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def dumps_json(obj: Any) -> str:
    """Stable JSON: sorted keys, 2-space indent, trailing newline; NaN/inf are refused."""
    return (
        json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False, default=_json_default)
        + "\n"
    )


def _json_default(o: Any):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        if not math.isfinite(float(o)):
            raise ValueError(f"non-finite number {o!r} cannot be written to JSON")
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_json(path: Path | str, obj: Any) -> None:
    atomic_write_text(path, dumps_json(obj))


def read_json(path: Path | str) -> Any:
    """Read JSON; a missing or corrupt file is a loud ClapError, never an empty result."""
    path = Path(path)
    if not path.exists():
        raise ClapError("required JSON file is missing", file=path, rule="missing_file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ClapError(f"file is not valid JSON: {e}", file=path, rule="corrupt_json") from e


def write_jsonl(path: Path | str, rows: list[dict]) -> None:
    text = "".join(
        json.dumps(r, sort_keys=True, ensure_ascii=False, allow_nan=False, default=_json_default) + "\n"
        for r in rows
    )
    atomic_write_text(path, text)


def write_parquet(path: Path | str, df: pd.DataFrame) -> None:
    """Deterministic parquet: no pandas index, fixed compression, no created-by variance beyond pins."""
    table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
    sink = pa.BufferOutputStream()
    pq.write_table(
        table, sink, compression="zstd", compression_level=3, write_statistics=False, store_schema=True
    )
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def read_parquet(path: Path | str) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise ClapError(
            "required data file is missing (did the previous stage run?)", file=path, rule="missing_file"
        )
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise ClapError(f"cannot read parquet: {e}", file=path, rule="corrupt_parquet") from e


@contextlib.contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``path`` in one rename.

    On any exception the temporary folder is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_UMASK)
        _crash_point(path)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    path = Path(path)
    if not path.exists():
        raise ClapError("cannot hash a missing file", file=path, rule="missing_file")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def md5_file(path: Path | str, chunk: int = 1 << 20) -> str:
    """DVC 3's hash of a file: md5 of its bytes (no line-ending conversion), as dvc.lock records it."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_dir(path: Path | str) -> str:
    """Hash of a folder: sha256 over sorted (relative path, file sha256) lines."""
    path = Path(path)
    lines = [
        f"{p.relative_to(path).as_posix()}\t{sha256_file(p)}\n"
        for p in sorted(path.rglob("*"))
        if p.is_file()
    ]
    return sha256_bytes("".join(lines).encode())


def logical_hash(df: pd.DataFrame) -> str:
    """Content hash independent of parquet bytes: columns sorted by name, rows canonicalized and sorted.

    A pandas/pyarrow upgrade that changes file bytes but not content keeps this hash.
    """
    cols = sorted(df.columns)
    rows = sorted(
        json.dumps([_canon(v) for v in rec], ensure_ascii=False, default=str)
        for rec in df[cols].itertuples(index=False, name=None)
    )
    return sha256_bytes(("\t".join(cols) + "\n" + "\n".join(rows)).encode("utf-8"))


def _canon(v: Any) -> Any:
    import numpy as np

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_canon(x) for x in v]
    if pd.isna(v) if not isinstance(v, (str, bytes, dict)) else False:
        return None
    return v


# ---------------------------------------------------------------- metrics vs records
#
# A stage builds ONE flat record; this is the only place that splits it. ``metrics/<stage>/<b>.json``
# (a DVC metrics file: ``dvc metrics show/diff``, ``dvc exp show``) keeps what a reviewer compares:
# counts, rates, the numbers behind decisions, timings and the decision words. Provenance goes to
# ``records/<stage>/<b>.json`` (a DVC out with ``cache: false``: in git, versioned with the commit,
# never a metric). A key goes to the record when it matches one of RECORD_KEY_PATTERNS (fnmatch, on
# the whole key and on its last dotted part), or when its value is a string that reads as a sha256
# or a version number (a safety net: a new hash/version key cannot drift into the metrics).
# Nothing is lost: metrics | record == the flat record, and the two never share a key.

RECORD_KEY_PATTERNS: tuple[str, ...] = (
    # hashes: file, folder, logical (content) hashes of data, adapters, base weights, replay cases
    "*sha256*",
    # installed package versions
    "*_version",
    # randomness and threading of the run
    "seed",
    "*_seed",
    "torch_threads",
    "*_torch_threads",
    "world_size",
    # where and how it ran: device, machine, hardware class, precision, determinism mode
    "device",
    "*_device",
    "machine",
    "hardware",
    "*_hardware",
    "precision",
    "decoding",
    "determinism",
    "*_determinism",
    "deterministic_algorithms",
    "*_deterministic_algorithms",
    # lineage: what a run resumed or started from, the commit, the incumbent it was compared with
    "resumed_from",
    "start_from",
    "git_commit",
    "incumbent_batch",
    # answers reused from an earlier identical run or generated and kept, with their key (clap/model/memo.py)
    "*_answers_memo",
    # input files' encodings (assetize: "<file>.encoding")
    "encoding",
    # the base model's source and format (stage base)
    "source",
    "source_file",
    "source_kind",
    "weights_files",
    "architecture",
    "dtype",
    "chat_template",  # tokenizer | params: where the base's prompt format comes from
    # the layers the adapter adapts, read from the model (their count and trainable parameters stay metrics)
    "lora_targets",
    # detector constants echoed from params `detector` (the numbers it decides with stay:
    # detector_log_threshold, detector_max_log_e, detector_alarm_step, ...)
    "detector_enabled",
    "detector_alpha",
    "detector_clip",
    "detector_lambdas",
    "detector_weights",
    "detector_m0",
    "detector_null_gap",
    "detector_probe_draw",
    "detector_process",
)
_SHA256_VALUE = re.compile(r"[0-9a-f]{64}")
_VERSION_VALUE = re.compile(r"v?\d+\.\d+(\.\d+)*([.+-][0-9A-Za-z.+-]*)?")


def is_record_value(value: Any) -> bool:
    """A string that reads as a sha256 or a package version (never a metric)."""
    return isinstance(value, str) and bool(_SHA256_VALUE.fullmatch(value) or _VERSION_VALUE.fullmatch(value))


def is_record_key(key: str, value: Any = None) -> bool:
    """Whether ``key`` (with ``value``) belongs to the record file rather than the metrics file."""
    last = key.rsplit(".", 1)[-1]
    return any(
        fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(last, p) for p in RECORD_KEY_PATTERNS
    ) or is_record_value(value)


def split_record(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(metrics, record)`` of one flat record, by :func:`is_record_key`."""
    metrics = {k: v for k, v in flat.items() if not is_record_key(k, v)}
    record = {k: v for k, v in flat.items() if k not in metrics}
    return metrics, record


def record_path(metrics_path: Path | str) -> Path:
    """The record file of a metrics file: ``.../metrics/<stage>/<b>.json`` -> ``.../records/<stage>/<b>.json``
    (the last folder named ``metrics`` becomes ``records``); a metrics file outside any ``metrics``
    folder gets ``<name>.record.json`` beside it."""
    path = Path(metrics_path)
    parts = path.parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "metrics":
            return Path(*parts[:i], "records", *parts[i + 1 :])
    return path.with_name(f"{path.stem}.record.json")


def write_metrics_and_record(
    metrics_path: Path | str, record_path_: Path | str | None, flat: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``flat`` (:func:`split_record`) and write both files (the record first, atomically each);
    ``record_path_`` None means :func:`record_path` of ``metrics_path``. Returns ``(metrics, record)``."""
    metrics, record = split_record(flat)
    write_json(record_path(metrics_path) if record_path_ is None else record_path_, record)
    write_json(metrics_path, metrics)
    return metrics, record


def read_flat(metrics_path: Path | str) -> dict[str, Any]:
    """The whole flat record of a stage: its metrics file merged with its record file
    (:func:`record_path`; a missing record file is a loud error, like a missing metrics file)."""
    metrics_path = Path(metrics_path)
    out: dict[str, Any] = {}
    for path in (metrics_path, record_path(metrics_path)):
        part = read_json(path)
        if not isinstance(part, dict):
            raise ClapError("record must be a flat JSON object", file=path, rule="corrupt_record")
        out.update(part)
    return out
