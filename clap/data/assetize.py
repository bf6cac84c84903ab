"""assetize: parse one raw batch (five source exports) into typed assets and rejects.

Every raw row (CSV record, JSONL line) ends in exactly one asset row or one reject row
with a machine-readable rule (docs/data-contract.md). Row-level problems are rejects;
file-level problems (missing/unknown file, undecodable bytes, missing column, header-only
file, a JSON line that is not an object, ...) raise :class:`ClapError`. Strings stay as
found: only record values are parsed (decimal comma in the MES export); question gold
values are kept as text for normalize.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from clap.errors import ClapError

MES, QMS, CMMS, KB, QLOG = (
    "mes_shift_reports.csv", "quality_inspections.jsonl", "maintenance_tickets.csv",
    "kb_documents.jsonl", "question_log.jsonl",
)
IGNORED_FILES = ("MANIFEST.json",)  # written by the generator for tests; stages never read it
SPLITS = ("train", "eval", "replay")
RULES = ("bad_json", "broken_quoting", "duplicate_id", "field_count", "missing_field", "unknown_split", "wrong_type")


@dataclass(frozen=True)
class FileSpec:
    """How one raw export is laid out (fixed by the data contract, not a knob)."""

    kind: str  # csv | jsonl
    system: str  # mes | qms | cmms | kb | question_log
    columns: tuple[str, ...] = ()  # CSV header
    delimiter: str = ""
    multiline: tuple[str, ...] = ()  # CSV columns whose quoted text may span lines


RAW_FILES: dict[str, FileSpec] = {
    MES: FileSpec("csv", "mes", ("report_id", "shift_date", "line", "shift", "kpi", "value", "uom", "remark"), ";"),
    QMS: FileSpec("jsonl", "qms"),
    CMMS: FileSpec("csv", "cmms", ("ticket_id", "opened", "line", "shift", "category", "downtime_min", "summary"),
                   ",", ("summary",)),
    KB: FileSpec("jsonl", "kb"),
    QLOG: FileSpec("jsonl", "question_log"),
}

RECORD_COLUMNS = ("record_id", "source_system", "line_raw", "shift_raw", "date_raw", "metric_label", "value",
                  "unit_raw", "text", "source_file", "source_line")
KB_COLUMNS = ("doc_id", "system", "record_ref", "title", "body", "source_file", "source_line")
ITEM_COLUMNS = ("item_id", "split", "question", "question_type", "context_doc_ids", "metric_label", "value_raw",
                "unit_raw", "line_raw", "shift_raw", "date_raw", "evidence", "evidence_doc_id", "source_file",
                "source_line")
REJECT_COLUMNS = ("source_file", "source_line", "source_system", "record_id", "rule", "column", "detail", "raw")
ASSETS = ("records", "kb", "sft", "eval", "replay", "grpo", "rejects")
ROW = "<row>"  # the ``column`` of a reject about the whole row


@dataclass(frozen=True)
class AssetizeParams:
    """params.yaml section ``assetize``."""

    encodings: list[str]  # tried in order on every raw file; the first that decodes wins


# --- parsing primitives ------------------------------------------------------------------

def parse_decimal(text: str, decimal: str) -> float:
    """Parse a number written with ``decimal`` as separator and optional thousands grouping.

    Args:
        text: e.g. ``"2,4"``, ``"1.250,5"`` (decimal ``,``) or ``"1,250.5"`` (decimal ``.``);
            surrounding whitespace is ignored.
        decimal: ``","`` or ``"."``; the other one is the thousands separator.

    Returns:
        The finite float.

    Raises:
        ValueError: the text is not such a number.
    """
    thousands = "." if decimal == "," else ","
    t, d = re.escape(thousands), re.escape(decimal)
    s = text.strip()
    if not re.fullmatch(rf"[+-]?(?:\d{{1,3}}(?:{t}\d{{3}})+|\d+)(?:{d}\d+)?", s):
        raise ValueError(f"{text!r} is not a number with decimal {decimal!r}")
    return float(s.replace(thousands, "").replace(decimal, "."))


@dataclass(frozen=True)
class CsvRecord:
    """One CSV record: where it starts, its raw text, its fields, or why it is broken."""

    line: int
    raw: str
    fields: tuple[str, ...]
    error: str | None = None
    error_field: int | None = None  # 0-based index of the field where quoting broke


class _Broken(Exception):
    """Broken quoting in field ``index`` at text index ``at`` (resync at that line's end)."""

    def __init__(self, detail: str, at: int, index: int):
        super().__init__(detail)
        self.at, self.index = at, index


def split_csv(text: str, delimiter: str, multiline: frozenset[int] = frozenset()) -> list[CsvRecord]:
    """Split CSV text into records (RFC 4180 quoting; ``\\n`` or ``\\r\\n`` line ends).

    A quoted field may span lines only if its index is in ``multiline``. A quote inside an
    unquoted field, text after a closing quote, or an unterminated quote is broken quoting:
    that record gets ``error`` set and parsing resumes on the next physical line. Empty
    lines are not records.

    Args:
        text: the decoded file.
        delimiter: one character.
        multiline: 0-based indexes of fields that may contain line breaks.

    Returns:
        Records in file order, each with its 1-based physical start line.
    """
    unquoted = re.compile(f'[^{re.escape(delimiter)}"\\n]*')
    records, pos, line, n = [], 0, 1, len(text)
    while pos < n:
        eol = _line_end(text, pos)
        if text[pos:eol] in ("", "\r"):
            pos, line = eol + 1, line + 1
            continue
        try:
            fields, end = _parse_record(text, pos, delimiter, multiline, unquoted)
            error, index = None, None
        except _Broken as e:
            fields, end, error, index = [], _line_end(text, e.at), str(e), e.index
        records.append(CsvRecord(line, _strip_cr(text[pos:end]), tuple(fields), error, index))
        line += text.count("\n", pos, end) + 1
        pos = end + 1
    return records


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end == -1 else end


def _strip_cr(s: str) -> str:
    return s[:-1] if s.endswith("\r") else s


def _parse_record(text: str, pos: int, delim: str, multiline: frozenset[int], unquoted: re.Pattern) -> tuple[list[str], int]:
    """Fields of the record starting at ``pos`` and the index of its terminating newline (or len)."""
    fields: list[str] = []
    i, n = pos, len(text)
    while True:
        idx = len(fields) + 1
        if i < n and text[i] == '"':
            value, i = _quoted(text, i, len(fields) in multiline, idx)
            if i < n and text[i] not in (delim, "\n") and text[i:i + 2] != "\r\n" and text[i:] != "\r":
                raise _Broken(f"unexpected {text[i]!r} after the closing quote of field {idx}", i, idx - 1)
            if text[i:i + 1] == "\r":
                i += 1
        else:
            end = unquoted.match(text, i).end()
            if end < n and text[end] == '"':
                raise _Broken(f"quote inside unquoted field {idx}", end, idx - 1)
            value, i = text[i:end], end
            if i >= n or text[i] == "\n":
                value = _strip_cr(value)
        fields.append(value)
        if i >= n or text[i] == "\n":
            return fields, i
        i += 1  # the delimiter


def _quoted(text: str, i: int, may_span: bool, idx: int) -> tuple[str, int]:
    """The quoted field opening at ``i``: its unescaped value and the index after the closing quote."""
    limit = len(text) if may_span else _line_end(text, i)
    parts, j = [], i + 1
    while True:
        q = text.find('"', j, limit)
        if q == -1:
            raise _Broken(f"unterminated quoted field {idx}", limit, idx - 1)
        parts.append(text[j:q])
        if text[q + 1:q + 2] == '"':
            parts.append('"')
            j = q + 2
            continue
        return "".join(parts), q + 1


def decode(data: bytes, encodings: list[str], file: str) -> tuple[str, str]:
    """Decode with the first encoding of ``encodings`` that works.

    Returns:
        (text, encoding used).

    Raises:
        ClapError: rule ``bad_encoding`` naming each encoding's failing byte offset and line.
    """
    failures = []
    for enc in encodings:
        try:
            return data.decode(enc), enc
        except UnicodeDecodeError as e:
            failures.append((enc, e.start))
        except LookupError as e:
            raise ClapError(f"unknown encoding {enc!r} in params assetize.encodings", column="encodings",
                            rule="bad_params") from e
    detail = "; ".join(f"{enc} fails at byte offset {at} (0x{data[at]:02x})" for enc, at in failures)
    first = failures[0][1]
    raise ClapError(f"file cannot be decoded with any of {encodings}: {detail}", file=file,
                    row=data.count(b"\n", 0, first) + 1, rule="bad_encoding")


# --- row checks ------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


TYPE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "opt_str": (lambda v: isinstance(v, str), "a string"),
    "number": (_is_number, "a finite JSON number"),
    "value": (lambda v: _is_number(v) or isinstance(v, str), "a number or a string"),
    "str_list": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}
QMS_FIELDS = (("inspection_id", "str"), ("recorded_at", "str"), ("station.line", "str"), ("station.shift", "str"),
              ("result.characteristic", "str"), ("result.measured", "number"), ("result.unit", "str"),
              ("inspector", "opt_str"))
KB_FIELDS = (("doc_id", "str"), ("system", "str"), ("record_ref", "str"), ("title", "str"), ("body", "str"))
QLOG_FIELDS = (("question_id", "str"), ("logged_at", "str"), ("split", "str"), ("question", "str"),
               ("question_type", "str"), ("context_doc_ids", "str_list"), ("gold.metric", "str"),
               ("gold.value", "value"), ("gold.unit", "str"), ("gold.line", "str"), ("gold.shift", "str"),
               ("gold.date", "str"), ("gold.evidence", "str"), ("gold.doc_id", "str"))


class RowProblem(Exception):
    """A row-level problem: the row goes to rejects with this rule/column/detail."""

    def __init__(self, rule: str, column: str, detail: str):
        super().__init__(detail)
        self.rule, self.column, self.detail = rule, column, detail


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _lookup(obj: dict, path: str) -> tuple[bool, Any]:
    """(present, value) of a dotted path; a non-object on the way is a wrong type."""
    cur: Any = obj
    parts = path.split(".")
    for k, part in enumerate(parts):
        if not isinstance(cur, dict):
            prefix = ".".join(parts[:k])
            raise RowProblem("wrong_type", prefix, f"{prefix} must be an object, got {_short(cur)}")
        if part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def check_fields(obj: dict, fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """Values of ``fields`` (path, type) in ``obj``; the first problem raises :class:`RowProblem`.

    A required field that is absent, null or a blank string is ``missing_field``; a value of
    another type is ``wrong_type``. ``opt_str`` fields may be absent or null (read as "").
    """
    out = {}
    for path, kind in fields:
        present, v = _lookup(obj, path)
        if not present or v is None or (isinstance(v, str) and not v.strip()):
            if kind == "opt_str":
                out[path] = "" if v is None else v
                continue
            raise RowProblem("missing_field", path, f"required field {path} is missing or empty")
        ok, what = TYPE_CHECKS[kind]
        if not ok(v):
            raise RowProblem("wrong_type", path, f"{path} must be {what}, got {_short(v)}")
        out[path] = v
    return out


def _number_field(values: dict[str, str], column: str, decimal: str) -> float:
    try:
        return parse_decimal(values[column], decimal)
    except ValueError as e:
        raise RowProblem("wrong_type", column, f"{column} {values[column]!r} is not a number (decimal {decimal!r})") from e


# --- per-file parsers: row dict -> asset row ---------------------------------------------

def _mes_row(v: dict[str, str]) -> dict[str, Any]:
    _require(v, ("report_id", "shift_date", "line", "shift", "kpi", "value", "uom"))
    return {"record_id": v["report_id"], "source_system": "mes", "line_raw": v["line"], "shift_raw": v["shift"],
            "date_raw": v["shift_date"], "metric_label": v["kpi"], "value": _number_field(v, "value", ","),
            "unit_raw": v["uom"], "text": v["remark"]}


def _cmms_row(v: dict[str, str]) -> dict[str, Any]:
    # The CMMS books downtime in its own column: the label and unit come from that column.
    _require(v, ("ticket_id", "opened", "line", "shift", "downtime_min"))
    return {"record_id": v["ticket_id"], "source_system": "cmms", "line_raw": v["line"], "shift_raw": v["shift"],
            "date_raw": v["opened"], "metric_label": "Downtime", "value": _number_field(v, "downtime_min", "."),
            "unit_raw": "min", "text": v["summary"]}


def _require(v: dict[str, str], columns: tuple[str, ...]) -> None:
    for c in columns:
        if not v[c].strip():
            raise RowProblem("missing_field", c, f"required field {c} is empty")


def _qms_row(obj: dict) -> dict[str, Any]:
    v = check_fields(obj, QMS_FIELDS)
    return {"record_id": v["inspection_id"], "source_system": "qms", "line_raw": v["station.line"],
            "shift_raw": v["station.shift"], "date_raw": v["recorded_at"], "metric_label": v["result.characteristic"],
            "value": float(v["result.measured"]), "unit_raw": v["result.unit"], "text": v["inspector"]}


def _kb_row(obj: dict) -> dict[str, Any]:
    v = check_fields(obj, KB_FIELDS)
    return {"doc_id": v["doc_id"], "system": v["system"], "record_ref": v["record_ref"], "title": v["title"],
            "body": v["body"]}


def _item_row(obj: dict) -> dict[str, Any]:
    v = check_fields(obj, QLOG_FIELDS)
    if v["split"] not in SPLITS:
        raise RowProblem("unknown_split", "split", f"split {v['split']!r} is not one of {list(SPLITS)}")
    value = v["gold.value"]
    return {"item_id": v["question_id"], "split": v["split"], "question": v["question"],
            "question_type": v["question_type"], "context_doc_ids": json.dumps(v["context_doc_ids"], ensure_ascii=False),
            "metric_label": v["gold.metric"], "value_raw": value if isinstance(value, str) else json.dumps(value),
            "unit_raw": v["gold.unit"], "line_raw": v["gold.line"], "shift_raw": v["gold.shift"],
            "date_raw": v["gold.date"], "evidence": v["gold.evidence"], "evidence_doc_id": v["gold.doc_id"]}


@dataclass(frozen=True)
class Parser:
    """How one file's rows become assets: target asset, row function, duplicate key."""

    asset: str  # records | kb | items
    row: Callable[[Any], dict[str, Any]]
    key: Callable[[dict[str, Any]], tuple]


PARSERS = {
    MES: Parser("records", _mes_row, lambda r: (r["record_id"],)),
    CMMS: Parser("records", _cmms_row, lambda r: (r["record_id"],)),
    QMS: Parser("records", _qms_row, lambda r: (r["record_id"],)),
    KB: Parser("kb", _kb_row, lambda r: (r["doc_id"],)),
    # a question may recur across splits (that is train/eval overlap, removed by normalize)
    QLOG: Parser("items", _item_row, lambda r: (r["split"], r["item_id"])),
}
ID_FIELDS = {MES: "report_id", CMMS: "ticket_id", QMS: "inspection_id", KB: "doc_id", QLOG: "question_id"}


# --- files -------------------------------------------------------------------------------

@dataclass
class FileResult:
    """What one raw file produced."""

    encoding: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    rows_in: int = 0


def _reject(file: str, line: int, record_id: Any, problem: RowProblem, raw: str) -> dict[str, Any]:
    rid = record_id if isinstance(record_id, str) and record_id.strip() else None
    return {"source_file": file, "source_line": line, "source_system": RAW_FILES[file].system, "record_id": rid,
            "rule": problem.rule, "column": problem.column, "detail": problem.detail, "raw": raw}


def _csv_rows(text: str, file: str) -> list[tuple[int, str, dict[str, str] | RowProblem, Any]]:
    """(line, raw, column->text or problem, record id) per data record of a CSV file."""
    spec = RAW_FILES[file]
    multiline = frozenset(spec.columns.index(c) for c in spec.multiline)
    records = split_csv(text, spec.delimiter, multiline)
    header = _csv_header(records, file)
    out = []
    for r in records[1:]:
        if r.error:
            column = header[r.error_field] if r.error_field < len(header) else ROW
            out.append((r.line, r.raw, RowProblem("broken_quoting", column, r.error), _first_field(r.raw, spec.delimiter)))
        elif len(r.fields) != len(header):
            problem = RowProblem("field_count", ROW, f"{len(r.fields)} fields, the header has {len(header)}")
            out.append((r.line, r.raw, problem, r.fields[0]))
        else:
            out.append((r.line, r.raw, dict(zip(header, r.fields)), r.fields[header.index(ID_FIELDS[file])]))
    return out


def _first_field(raw: str, delim: str) -> str | None:
    head = raw.split(delim, 1)[0]
    return None if '"' in head else head


def _csv_header(records: list[CsvRecord], file: str) -> list[str]:
    spec = RAW_FILES[file]
    if not records:
        raise ClapError("file has no header and no rows", file=file, rule="empty_file")
    head = records[0]
    if head.error or len(set(head.fields)) != len(head.fields):
        raise ClapError(f"header is malformed: {head.raw!r}", file=file, row=head.line, rule="bad_header")
    missing = [c for c in spec.columns if c not in head.fields]
    if missing:
        raise ClapError(f"required column {missing[0]!r} is missing (header: {list(head.fields)})", file=file,
                        row=head.line, column=missing[0], rule="missing_column")
    unknown = [c for c in head.fields if c not in spec.columns]
    if unknown:
        raise ClapError(f"unexpected column {unknown[0]!r} (expected {list(spec.columns)})", file=file,
                        row=head.line, column=unknown[0], rule="unknown_column")
    if len(records) == 1:
        raise ClapError("file has a header but no rows", file=file, row=head.line, rule="header_only")
    return list(head.fields)


def _jsonl_rows(text: str, file: str) -> list[tuple[int, str, dict | RowProblem, Any]]:
    """(line, raw, object or problem, record id) per non-blank line of a JSONL file."""
    out = []
    for k, raw in enumerate(text.split("\n"), start=1):
        raw = _strip_cr(raw)
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            out.append((k, raw, RowProblem("bad_json", ROW, f"invalid JSON: {e.msg} at column {e.colno}"), None))
            continue
        if not isinstance(obj, dict):
            raise ClapError(f"line is JSON {type(obj).__name__}, not an object", file=file, row=k, rule="not_an_object")
        out.append((k, raw, obj, obj.get(ID_FIELDS[file])))
    if not out:
        raise ClapError("file has no rows", file=file, rule="empty_file")
    return out


def parse_file(file: str, data: bytes, encodings: list[str]) -> FileResult:
    """Decode and parse one raw file into asset rows and rejects (each row in exactly one).

    Raises:
        ClapError: a file-level problem (empty, undecodable, bad header, non-object JSON line).
    """
    if not data:
        raise ClapError("file is empty (0 bytes)", file=file, rule="empty_file")
    text, encoding = decode(data, encodings, file)
    rows = (_csv_rows if RAW_FILES[file].kind == "csv" else _jsonl_rows)(text, file)
    parser, result, seen = PARSERS[file], FileResult(encoding, rows_in=len(rows)), {}
    for line, raw, parsed, rid in rows:
        try:
            if isinstance(parsed, RowProblem):
                raise parsed
            row = parser.row(parsed)
            key = parser.key(row)
            if key in seen:
                raise RowProblem("duplicate_id", ID_FIELDS[file], f"{key[-1]} already seen at line {seen[key]}")
            seen[key] = line
            result.rows.append({**row, "source_file": file, "source_line": line})
        except RowProblem as problem:
            result.rejects.append(_reject(file, line, rid, problem, raw))
    return result


# --- batch -------------------------------------------------------------------------------

@dataclass
class Assetized:
    """Assets of one batch and what each raw file contributed."""

    assets: dict[str, pd.DataFrame]
    files: dict[str, FileResult]


def list_batch(raw_dir: Path) -> list[str]:
    """The batch's raw file names; any unexpected entry, missing file or empty folder is an error."""
    if not raw_dir.is_dir():
        raise ClapError("batch folder does not exist", file=raw_dir, rule="missing_batch")
    names = sorted(p.name for p in raw_dir.iterdir())
    if not names:
        raise ClapError("batch folder is empty", file=raw_dir, rule="empty_batch")
    for name in names:
        if (name not in RAW_FILES and name not in IGNORED_FILES) or (raw_dir / name).is_dir():
            raise ClapError(f"unexpected entry in the batch folder (expected {sorted(RAW_FILES)})",
                            file=raw_dir / name, rule="unknown_file")
    missing = sorted(set(RAW_FILES) - set(names))
    if missing:
        raise ClapError(f"required raw file {missing[0]!r} is missing", file=raw_dir / missing[0], rule="missing_file")
    return sorted(RAW_FILES)


def assetize_batch(raw_dir: Path | str, p: AssetizeParams) -> Assetized:
    """Parse every raw file of a batch folder into the asset frames of the data contract.

    Args:
        raw_dir: ``data/raw/<batch>``.
        p: the ``assetize`` params.

    Returns:
        Frames ``records, kb, sft, eval, replay, grpo, rejects`` and per-file results.
    """
    raw_dir = Path(raw_dir)
    files = {name: parse_file(name, (raw_dir / name).read_bytes(), p.encodings) for name in list_batch(raw_dir)}
    rows: dict[str, list[dict]] = {"records": [], "kb": [], "items": [], "rejects": []}
    for name, res in files.items():
        rows[PARSERS[name].asset].extend(res.rows)
        rows["rejects"].extend(res.rejects)
    items = _frame(rows["items"], ITEM_COLUMNS)
    sft = items[items["split"] == "train"].reset_index(drop=True)
    assets = {
        "records": _frame(rows["records"], RECORD_COLUMNS),
        "kb": _frame(rows["kb"], KB_COLUMNS),
        "sft": sft,
        "eval": items[items["split"] == "eval"].reset_index(drop=True),
        "replay": items[items["split"] == "replay"].reset_index(drop=True),
        "grpo": sft.copy(),
        "rejects": _frame(rows["rejects"], REJECT_COLUMNS),
    }
    return Assetized(assets, files)


def _frame(rows: list[dict], columns: tuple[str, ...]) -> pd.DataFrame:
    """Rows as a frame with the contract's dtypes (also when there are no rows)."""
    dtypes = {c: "int64" if c == "source_line" else "float64" if c == "value" else "str" for c in columns}
    return pd.DataFrame(rows, columns=list(columns)).astype(dtypes)


def batch_metrics(result: Assetized) -> dict[str, Any]:
    """Flat metrics: conservation per file and batch, rejects per rule, asset sizes, encodings."""
    m: dict[str, Any] = {}
    total_in = total_assets = total_rej = 0
    for name, res in result.files.items():
        stem = name.split(".")[0]
        n_assets, n_rej = len(res.rows), len(res.rejects)
        m.update({f"{stem}.rows_in": res.rows_in, f"{stem}.rows_assets": n_assets, f"{stem}.rows_rejected": n_rej,
                  f"{stem}.encoding": res.encoding, f"{stem}.conservation_ok": res.rows_in == n_assets + n_rej})
        total_in, total_assets, total_rej = total_in + res.rows_in, total_assets + n_assets, total_rej + n_rej
    rules = result.assets["rejects"]["rule"].value_counts()
    m.update({f"rejected.{r}": int(rules.get(r, 0)) for r in RULES})
    m.update({f"assets.{a}": len(result.assets[a]) for a in ASSETS})
    m.update({"rows_in": total_in, "rows_assets": total_assets, "rows_rejected": total_rej})
    m["conservation_ok"] = total_in == total_assets + total_rej and all(
        m[f"{n.split('.')[0]}.conservation_ok"] for n in result.files)
    return m
