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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from clap.data.decoding import TooDeep, decode_file, describe, guess_delimiter, loads_bounded
from clap.data.sources import (
    ROW,
    SPLITS,
    FieldSpec,
    Node,
    RowProblem,
    Source,
    explode,
    hash_label,
    lookup,
    parse_sources,
    read_parquet,
    read_xlsx,
    render_row,
    render_template,
    shorten,
    table_rows,
)
from clap.errors import ClapError
from clap.task.answer import AnswerSchema

RULES = (
    "bad_encoding",
    "bad_json",
    "broken_quoting",
    "duplicate_id",
    "excluded",
    "field_count",
    "missing_field",
    "unknown_split",
    "wrong_type",
)

KB_COLUMNS = ("doc_id", "system", "record_ref", "title", "body", "source_file", "source_line")


def asset_columns(answer: AnswerSchema) -> dict[str, tuple[str, ...]]:
    """The asset columns of records, kb and question items for the declared answer (params ``task``).

    Each key field ``<k>`` is read raw into ``<k>_raw`` (normalize canonicalizes it), the value into
    ``value`` (records: a number, or text for a text value) / ``value_raw`` (items: as the reviewer
    wrote it), the unit (when the answer has one) into ``unit_raw``.
    """
    keys = tuple(f"{k}_raw" for k in answer.keys)
    unit = ("unit_raw",) if any(f.role == "unit" for f in answer.fields) else ()
    return {
        "records": ("record_id", "source_system", *keys, "value", *unit, "text", *_SOURCED),
        "kb": KB_COLUMNS,
        "items": (
            "item_id", "split", "question", "question_type", "context_doc_ids", *keys, "value_raw", *unit,
            "evidence", "evidence_doc_id", *_SOURCED,
        ),
    }  # fmt: skip


def target_columns(answer: AnswerSchema) -> dict[str, tuple[str, ...]]:
    """The asset columns a source of each target maps (records get source_system = the source's name)."""
    cols = asset_columns(answer)
    return {
        "records": tuple(c for c in cols["records"] if c not in (*_SOURCED, "source_system")),
        "documents": tuple(c for c in cols["kb"] if c not in _SOURCED),
        "questions": tuple(c for c in cols["items"] if c not in _SOURCED),
    }


REJECT_COLUMNS = (
    "source_file",
    "source_line",
    "source_system",
    "record_id",
    "rule",
    "column",
    "detail",
    "raw",
)
ASSETS = ("records", "kb", "sft", "eval", "replay", "grpo", "rejects")
_SOURCED = ("source_file", "source_line")


@dataclass(frozen=True)
class AssetizeParams:
    """params.yaml section ``assetize``."""

    sources: dict[str, Any]  # name -> declaration (clap.data.sources.parse_sources)
    ignore: list[str]  # globs of batch-folder files no source reads (e.g. a generator's manifest)
    max_bad_line_share: float  # a text file with more of its lines undecodable is a file-level error
    max_json_depth: int  # a JSON row nested deeper is a bad_json reject, never parsed (json recursion)
    max_reject_share: float  # a file rejecting more of its rows (bar `excluded` ones) is a file-level error

    def declared(self, answer: AnswerSchema) -> tuple[Source, ...]:
        return parse_sources(self.sources, target_columns(answer))


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


def _parse_record(
    text: str, pos: int, delim: str, multiline: frozenset[int], unquoted: re.Pattern
) -> tuple[list[str], int]:
    """Fields of the record starting at ``pos`` and the index of its terminating newline (or len)."""
    fields: list[str] = []
    i, n = pos, len(text)
    while True:
        idx = len(fields) + 1
        if i < n and text[i] == '"':
            value, i = _quoted(text, i, len(fields) in multiline, idx)
            if i < n and text[i] not in (delim, "\n") and text[i : i + 2] != "\r\n" and text[i:] != "\r":
                raise _Broken(f"unexpected {text[i]!r} after the closing quote of field {idx}", i, idx - 1)
            if text[i : i + 1] == "\r":
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
        if text[q + 1 : q + 2] == '"':
            parts.append('"')
            j = q + 2
            continue
        return "".join(parts), q + 1


# --- rows of one file --------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One raw row: its 1-based line (record number for json/parquet), raw text, element or problem."""

    line: int
    raw: str
    node: Node | RowProblem
    rid: str | None = None  # the row's id when it is a problem row whose id can still be read (CSV)


def _bad_encoding(bad: dict[int, str], first: int, last: int) -> RowProblem | None:
    hit = [k for k in range(first, last + 1) if k in bad]
    return RowProblem("bad_encoding", ROW, bad[hit[0]]) if hit else None


def _csv_rows(src: Source, text: str, bad: dict[int, str], file: str) -> list[Row]:
    """The data records of a CSV file (after checking its header against the declaration)."""
    records = split_csv(text, src.delimiter, frozenset())
    header = _csv_header(src, records, file)
    multiline = frozenset(header.index(c) for c in src.multiline if c in header)
    if multiline:  # re-split now that the multi-line columns' positions are known
        records = split_csv(text, src.delimiter, multiline)
    id_path = src.fields[src.id].path
    at = header.index(id_path) if id_path in header else None
    out = []
    for r in records[1:]:
        last = r.line + r.raw.count("\n")
        problem = _bad_encoding(bad, r.line, last)
        if problem is None and r.error:
            column = header[r.error_field] if r.error_field < len(header) else ROW
            problem = RowProblem("broken_quoting", column, r.error)
        elif problem is None and len(r.fields) != len(header):
            problem = RowProblem("field_count", ROW, f"{len(r.fields)} fields, the header has {len(header)}")
        out.append(
            Row(r.line, r.raw, problem or Node(dict(zip(header, r.fields))), _csv_id(r, at, src.delimiter))
        )
    return out


def _csv_id(r: CsvRecord, at: int | None, delimiter: str) -> str | None:
    """The id field of a CSV record, also of a broken one (unless quoting makes it unreadable)."""
    if at is None:
        return None
    if r.error:
        parts = r.raw.split(delimiter)
        return parts[at] if at < len(parts) and '"' not in delimiter.join(parts[: at + 1]) else None
    return r.fields[at] if at < len(r.fields) else None


def _referenced(src: Source) -> list[str]:
    """The top-level columns/keys the declaration reads (paths' first segments, templates included)."""
    out = []
    for spec in src.fields.values():
        paths = re.findall(r"\{([^{}]+)\}", spec.template) if spec.kind == "template" else [spec.path]
        out.extend(p.split(".")[0] for p in paths if p and not p.startswith(("^", "#")))
    return list(dict.fromkeys(out))


def _check_columns(src: Source, header: list[str], file: str, line: int, looks: str) -> None:
    """The header has the declared columns (exactly, when ``columns`` is declared)."""
    required = list(src.columns) or _referenced(src)
    missing = [c for c in required if c not in header]
    unknown = [c for c in header if src.columns and c not in src.columns]
    if missing or unknown:
        column, rule = (missing[0], "missing_column") if missing else (unknown[0], "unknown_column")
        what = (
            f"required column {column!r} is missing (header: {header}){looks}"
            if missing
            else f"unexpected column {column!r} (declared: {list(src.columns)})"
        )
        raise ClapError(what, file=file, row=line, column=column, rule=rule)


def _csv_header(src: Source, records: list[CsvRecord], file: str) -> list[str]:
    if not records:
        raise ClapError("file has no header and no rows", file=file, rule="empty_file")
    head = records[0]
    if head.error or len(set(head.fields)) != len(head.fields):
        raise ClapError(f"header is malformed: {head.raw!r}", file=file, row=head.line, rule="bad_header")
    guess = guess_delimiter(head.raw)
    looks = (
        f"; the header splits into {len(head.raw.split(guess))} fields on {guess!r}, declared "
        f"{src.delimiter!r}"
        if guess and guess != src.delimiter and len(head.fields) == 1
        else ""
    )
    _check_columns(src, list(head.fields), file, head.line, looks)
    if len(records) == 1:
        raise ClapError("file has a header but no rows", file=file, row=head.line, rule="header_only")
    return list(head.fields)


def _jsonl_rows(src: Source, text: str, bad: dict[int, str], file: str, max_depth: int) -> list[Row]:
    """One row per non-blank line; a line that is not one JSON object is a reject, never a crash."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        first = stripped.split("\n", 1)[0].strip()
        whole = _try_json(text, max_depth)
        if first == "[" or isinstance(whole, list):
            raise ClapError(
                "file is a JSON array (starts with '['), declared jsonl: one JSON object per line",
                file=file,
                rule="wrong_shape",
            )
    out = []
    for k, raw in enumerate(text.split("\n"), start=1):
        raw = _strip_cr(raw)
        if not raw.strip():
            continue
        if k in bad:
            out.append(Row(k, raw, RowProblem("bad_encoding", ROW, bad[k])))
            continue
        try:
            obj = loads_bounded(raw, max_depth)
        except TooDeep as e:
            # the reject keeps the line's first 2000 characters: a hostile line may be megabytes of '['
            out.append(Row(k, raw[:2000], RowProblem("bad_json", ROW, f"invalid JSON: {e}")))
            continue
        except json.JSONDecodeError as e:
            out.append(Row(k, raw, RowProblem("bad_json", ROW, f"invalid JSON: {e.msg} at column {e.colno}")))
            continue
        if not isinstance(obj, dict):
            raise ClapError(
                f"line is JSON {type(obj).__name__}, not an object", file=file, row=k, rule="not_an_object"
            )
        out.append(Row(k, raw, Node(obj)))
    if not out:
        raise ClapError("file has no rows", file=file, rule="empty_file")
    return out


def _try_json(text: str, max_depth: int) -> Any:
    try:
        return loads_bounded(text, max_depth)
    except ValueError:
        return None


def _json_rows(src: Source, text: str, file: str, max_depth: int) -> list[Row]:
    """The elements at the declared records path, numbered 1.. in document order."""
    try:
        root = loads_bounded(text, max_depth)
    except TooDeep as e:
        raise ClapError(
            f"file nests deeper than assetize.max_json_depth: {e}", file=file, rule="bad_json"
        ) from e
    except json.JSONDecodeError as e:
        raise ClapError(
            f"file is not JSON ({describe(text.encode()[:4096])}): {e.msg}",
            file=file,
            row=e.lineno,
            rule="bad_json",
        ) from e
    rows = [
        Row(k, _dump(n.value), n.value if isinstance(n.value, RowProblem) else n)
        for k, n in enumerate(explode(root, src.records, file), start=1)
    ]
    if not rows:
        raise ClapError(
            f"no records at records path {src.records!r}", file=file, column=src.records, rule="empty_file"
        )
    return rows


def _dump(v: Any) -> str:
    if isinstance(v, RowProblem):
        return v.detail
    return json.dumps(v, ensure_ascii=False)


def _table_rows(src: Source, rows: list[Row]) -> list[Row]:
    """Each table record becomes its data rows (``row``, ``label``, ``cells``, ``text``; ``^`` the table)."""
    out = []
    for r in rows:
        if isinstance(r.node, RowProblem):
            out.append(r)
            continue
        present, cells = lookup(r.node, src.table.cells)
        if (
            not present
            or not isinstance(cells, list)
            or not all(
                isinstance(row, list) and all(isinstance(c, (str, int, float)) for c in row) for row in cells
            )
        ):
            out.append(
                Row(
                    r.line,
                    r.raw,
                    RowProblem(
                        "wrong_type", src.table.cells, f"{src.table.cells} must be a list of rows of cells"
                    ),
                )
            )
            continue
        header, data = table_rows(cells, src.table.header_rows)
        for k, (number, cells_k) in enumerate(data):
            value = {
                "row": number,
                "label": cells_k[0] if cells_k else "",
                "cells": cells_k,
                "text": render_row(header, cells_k),
            }
            out.append(Row(r.line, _dump(cells_k), Node(value, r.node, k)))
    return out


def _tabular_rows(src: Source, data: bytes, file: str) -> list[Row]:
    """Rows of a parquet or xlsx file as column -> value dicts (xlsx: the first row is the header)."""
    if src.format == "parquet":
        dicts = read_parquet(data, file)
        if not dicts:
            raise ClapError("file has no rows", file=file, rule="empty_file")
        _check_columns(src, list(dicts[0]), file, 1, "")
        return [Row(k, _dump_cells(d), Node(d)) for k, d in enumerate(dicts, start=1)]
    sheet = read_xlsx(data, file, src.sheet)
    if not sheet:
        raise ClapError(f"sheet {src.sheet!r} is empty", file=file, rule="empty_file")
    header = [_cell_text(c) for c in sheet[0]]
    while header and not header[-1]:
        header.pop()
    _check_columns(src, header, file, 1, "")
    out = []
    for k, cells in enumerate(sheet[1:], start=2):
        if all(_cell_text(c) == "" for c in cells):
            continue
        values = {h: cells[j] if j < len(cells) else "" for j, h in enumerate(header)}
        out.append(Row(k, _dump_cells(values), Node(values)))
    if not out:
        raise ClapError("sheet has a header but no rows", file=file, row=1, rule="header_only")
    return out


def _cell_text(v: Any) -> str:
    """A spreadsheet/parquet cell as text: integral floats without '.0', dates in ISO form."""
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _dump_cells(d: dict) -> str:
    return json.dumps(
        {k: _cell_text(v) if not isinstance(v, (list, dict)) else v for k, v in d.items()},
        ensure_ascii=False,
        default=str,
    )


# --- one row -> one asset row ------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _field(src: Source, spec: FieldSpec, node: Node) -> Any:
    """The value of one asset column for ``node`` (a :class:`RowProblem` when the row is bad)."""
    if spec.kind == "const":
        return spec.const
    if spec.kind == "template":
        return render_template(node, spec.template)
    present, v = lookup(node, spec.path)
    tabular = src.format in ("csv", "xlsx", "parquet")
    if spec.kind in ("hash", "documents_of"):
        if not present or v is None or isinstance(v, (dict, list)) or not str(v).strip():
            raise RowProblem("missing_field", spec.path, f"required field {spec.path} is missing or empty")
        return hash_label(str(v), spec.seed, spec.shares) if spec.kind == "hash" else ("documents_of", str(v))
    if spec.type == "optional_text" and (not present or v is None):
        return ""
    if not present or v is None or (isinstance(v, str) and not v.strip() and spec.type != "optional_text"):
        how = "is empty" if tabular and present else "is missing or empty"
        raise RowProblem("missing_field", spec.path, f"required field {spec.path} {how}")
    if spec.type == "number":
        if tabular and isinstance(v, str):
            try:
                return parse_decimal(v, src.decimal)
            except ValueError as e:
                raise RowProblem(
                    "wrong_type", spec.path, f"{spec.path} {v!r} is not a number (decimal {src.decimal!r})"
                ) from e
        if _is_number(v):
            return float(v)
        what = "a finite number" if tabular else "a finite JSON number"
        raise RowProblem("wrong_type", spec.path, f"{spec.path} must be {what}, got {shorten(v)}")
    if tabular and not isinstance(v, (list, dict)):
        v = _cell_text(v)
    if spec.type in ("text", "optional_text"):
        if isinstance(v, str):
            return v
        raise RowProblem("wrong_type", spec.path, f"{spec.path} must be a string, got {shorten(v)}")
    if spec.type == "value":
        if isinstance(v, str) or _is_number(v):
            return v if isinstance(v, str) else json.dumps(v)
        raise RowProblem(
            "wrong_type", spec.path, f"{spec.path} must be a number or a string, got {shorten(v)}"
        )
    if spec.type == "text_list":
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return json.dumps(v, ensure_ascii=False)
        raise RowProblem("wrong_type", spec.path, f"{spec.path} must be a list of strings, got {shorten(v)}")
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)  # json: any value, strings as found


def _raw_id(src: Source, row: Row) -> str | None:
    spec, node = src.fields[src.id], row.node
    if isinstance(node, RowProblem) or spec.kind != "path":
        return row.rid if isinstance(row.rid, str) and row.rid.strip() else None
    try:
        present, v = lookup(node, spec.path)
    except RowProblem:
        return None
    v = _cell_text(v) if src.format in ("csv", "xlsx", "parquet") and not isinstance(v, (list, dict)) else v
    return v if present and isinstance(v, str) and v.strip() else None


def map_row(src: Source, node: Node) -> dict[str, Any]:
    """The asset row of one element; the first problem raises :class:`RowProblem`."""
    for path, kept in src.only:
        present, v = lookup(node, path)
        if not present or v not in kept:
            raise RowProblem(
                "excluded", path, f"{path} is {shorten(v)}: the declaration keeps only {list(kept)}"
            )
    row = {c: _field(src, spec, node) for c, spec in src.fields.items()}
    if src.target == "records":
        row["source_system"] = src.name
    if src.target == "questions" and row["split"] not in SPLITS:
        raise RowProblem("unknown_split", "split", f"split {row['split']!r} is not one of {list(SPLITS)}")
    return row


# --- files ---------------------------------------------------------------------------------------


@dataclass
class FileResult:
    """What one raw file produced for one source."""

    source: str
    file: str  # path relative to the batch folder
    encoding: str  # "" for binary formats
    rows: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    rows_in: int = 0


def _reject(src: Source, file: str, row: Row, problem: RowProblem) -> dict[str, Any]:
    return {
        "source_file": file,
        "source_line": row.line,
        "source_system": src.name,
        "record_id": _raw_id(src, row),
        "rule": problem.rule,
        "column": problem.column,
        "detail": problem.detail,
        "raw": row.raw,
    }


def read_rows(src: Source, file: str, data: bytes, p: AssetizeParams) -> tuple[str, list[Row]]:
    """``(encoding, rows)`` of one file of ``src`` (file-level problems raise :class:`ClapError`)."""
    if not data:
        raise ClapError("file is empty (0 bytes)", file=file, rule="empty_file")
    if src.format in ("parquet", "xlsx"):
        return "", _tabular_rows(src, data, file)
    decoded = decode_file(
        data,
        list(src.encodings),
        file,
        max_bad_line_share=p.max_bad_line_share,
        keys=(src.where("encodings"), "assetize.max_bad_line_share"),
    )
    if src.format == "csv":
        rows = _csv_rows(src, decoded.text, decoded.bad_lines, file)
    elif src.format == "jsonl":
        rows = _jsonl_rows(src, decoded.text, decoded.bad_lines, file, p.max_json_depth)
    else:
        if decoded.bad_lines:
            k = min(decoded.bad_lines)
            raise ClapError(
                f"undecodable bytes in a JSON document: {decoded.bad_lines[k]}",
                file=file,
                row=k,
                rule="bad_encoding",
            )
        rows = _json_rows(src, decoded.text, file, p.max_json_depth)
    return decoded.encoding, (_table_rows(src, rows) if src.table else rows)


def parse_file(src: Source, file: str, data: bytes, p: AssetizeParams, seen: dict) -> FileResult:
    """Read one file of ``src`` into asset rows and rejects (each row in exactly one).

    ``seen`` (unique key -> (file, line)) is shared by all files of the source, so the same id
    in two files is a duplicate.
    """
    encoding, rows = read_rows(src, file, data, p)
    result = FileResult(src.name, file, encoding, rows_in=len(rows))
    id_column = src.fields[src.id].path or src.id
    for row in rows:
        try:
            if isinstance(row.node, RowProblem):
                raise row.node
            asset_row = map_row(src, row.node)
            key = tuple(str(asset_row[c]) for c in src.unique)
            if key in seen:
                at_file, at_line = seen[key]
                where = f"line {at_line}" if at_file == file else f"{at_file} line {at_line}"
                raise RowProblem("duplicate_id", id_column, f"{key[-1]} already seen at {where}")
            seen[key] = (file, row.line)
            result.rows.append({**asset_row, "source_file": file, "source_line": row.line})
        except RowProblem as problem:
            result.rejects.append(_reject(src, file, row, problem))
    return result


def check_yield(src: Source, res: FileResult, path: Path, max_share: float) -> None:
    """Refuse a file that lost its source: it yields no asset row, or more than ``max_share`` of the
    rows it holds were rejected for a problem. Rows the source's own ``only`` filter leaves out
    (``excluded``) are a declared choice, not a problem, and count on neither side of the share.

    A few bad rows are rejects (kept, with their reason); a file that is mostly rejects is an export
    that changed shape, or was written in another format than declared (a JSON array on one line where
    JSON Lines is declared reads as one bad row), and a batch must not run on without it.

    Raises:
        ClapError: rule ``source_empty`` or ``reject_share``, naming the file and its commonest rules.
    """
    rules = Counter(r["rule"] for r in res.rejects)
    why = ", ".join(f"{rule} x{n}" for rule, n in rules.most_common(3))
    first = res.rejects[0]["source_line"] if res.rejects else None
    if not res.rows:  # a file of no rows at all is refused earlier (empty_file, header_only)
        raise ClapError(
            f"source {src.name!r} yields no asset from this file: all {res.rows_in} of its rows were "
            f"rejected ({why})",
            file=path,
            row=first,
            rule="source_empty",
        )
    failed = len(res.rejects) - rules["excluded"]
    considered = res.rows_in - rules["excluded"]
    if failed > max_share * considered:
        raise ClapError(
            f"source {src.name!r} rejects {failed} of the {considered} rows of this file "
            f"({failed / considered:.0%}, more than assetize.max_reject_share {max_share}): {why}",
            file=path,
            row=first,
            rule="reject_share",
        )


# --- batch -----------------------------------------------------------------------------------------


@dataclass
class Assetized:
    """Assets of one batch and what each (source, file) contributed."""

    assets: dict[str, pd.DataFrame]
    files: list[FileResult]


def list_batch(raw_dir: Path, sources: tuple[Source, ...], ignore: list[str]) -> dict[str, list[str]]:
    """source name -> its files (paths relative to the batch folder, sorted).

    Every file of the folder must be read by a source or ignored, and every source must find a file.
    """
    if not raw_dir.is_dir():
        raise ClapError("batch folder does not exist", file=raw_dir, rule="missing_batch")
    present = sorted(p.relative_to(raw_dir).as_posix() for p in raw_dir.rglob("*") if p.is_file())
    if not present:
        raise ClapError("batch folder is empty", file=raw_dir, rule="empty_batch")
    out = {s.name: _glob(raw_dir, s.files) for s in sources}
    read, ignored = set().union(*out.values()), set().union(*(_glob(raw_dir, g) for g in ignore))
    for f in present:
        if f not in read and f not in ignored:
            declared = sorted({s.files for s in sources})
            raise ClapError(
                f"unexpected file in the batch folder: no source reads it (declared: {declared}) and "
                f"assetize.ignore does not list it",
                file=raw_dir / f,
                rule="unknown_file",
            )
    for s in sources:
        if not out[s.name]:
            raise ClapError(
                f"source {s.name!r} finds no file matching {s.files!r}",
                file=raw_dir / s.files,
                rule="missing_file",
            )
    return out


def _glob(raw_dir: Path, pattern: str) -> list[str]:
    return sorted(p.relative_to(raw_dir).as_posix() for p in raw_dir.glob(pattern) if p.is_file())


def assetize_batch(raw_dir: Path | str, p: AssetizeParams, answer: AnswerSchema) -> Assetized:
    """Parse every raw file of a batch folder, as declared, into the asset frames of the data contract.

    Args:
        raw_dir: ``data/raw/<batch>``.
        p: the ``assetize`` params (its ``sources`` declare every export).
        answer: the declared answer (params ``task``): its key fields name the asset columns.

    Returns:
        Frames ``records, kb, sft, eval, replay, grpo, rejects`` and per-(source, file) results.
    """
    raw_dir = Path(raw_dir)
    sources = p.declared(answer)
    columns = asset_columns(answer)
    value_dtype = "float64" if answer.field(answer.value).type == "number" else "str"
    listed = list_batch(raw_dir, sources, p.ignore)
    seen: dict[str, dict] = {s.name: {} for s in sources}
    # in file-path order (then declaration order): the assets' row order does not depend on how the
    # declaration happens to be ordered
    pairs = sorted(((f, k) for k, s in enumerate(sources) for f in listed[s.name]))
    files = []
    for f, k in pairs:
        files.append(parse_file(sources[k], f, (raw_dir / f).read_bytes(), p, seen[sources[k].name]))
        check_yield(sources[k], files[-1], raw_dir / f, p.max_reject_share)
    target = {"records": "records", "documents": "kb", "questions": "items"}
    rows: dict[str, list[dict]] = {"records": [], "kb": [], "items": [], "rejects": []}
    by_name = {s.name: s for s in sources}
    for res in files:
        rows[target[by_name[res.source].target]].extend(res.rows)
        rows["rejects"].extend(res.rejects)
    _resolve_documents_of(rows["items"], rows["kb"])
    items = _frame(rows["items"], columns["items"])
    sft = items[items["split"] == "train"].reset_index(drop=True)
    assets = {
        "records": _frame(rows["records"], columns["records"], value_dtype),
        "kb": _frame(rows["kb"], KB_COLUMNS),
        "sft": sft,
        "eval": items[items["split"] == "eval"].reset_index(drop=True),
        "replay": items[items["split"] == "replay"].reset_index(drop=True),
        "grpo": sft.copy(),
        "rejects": _frame(rows["rejects"], REJECT_COLUMNS),
    }
    return Assetized(assets, files)


def _resolve_documents_of(items: list[dict], docs: list[dict]) -> None:
    """``documents_of`` fields become the JSON list of the ids of the documents of that group."""
    groups: dict[str, list[str]] = {}
    for d in docs:
        groups.setdefault(str(d["record_ref"]), []).append(str(d["doc_id"]))
    for it in items:
        for k, v in it.items():
            if isinstance(v, tuple) and v[:1] == ("documents_of",):
                it[k] = json.dumps(groups.get(v[1], []), ensure_ascii=False)


def _frame(rows: list[dict], columns: tuple[str, ...], value_dtype: str = "str") -> pd.DataFrame:
    """Rows as a frame with the contract's dtypes (also when there are no rows)."""
    dtypes = {c: "int64" if c == "source_line" else value_dtype if c == "value" else "str" for c in columns}
    return pd.DataFrame(rows, columns=list(columns)).astype(dtypes)


def batch_metrics(result: Assetized) -> dict[str, Any]:
    """Flat metrics: conservation per source and batch, rejects per rule, asset sizes; encodings per file."""
    m: dict[str, Any] = {}
    per: dict[str, list[int]] = {}
    for res in result.files:
        c = per.setdefault(res.source, [0, 0, 0])
        c[0], c[1], c[2] = c[0] + res.rows_in, c[1] + len(res.rows), c[2] + len(res.rejects)
        if res.encoding:
            m[f"{res.source}.{res.file}.encoding"] = res.encoding
    for name, (n_in, n_assets, n_rej) in per.items():
        m.update(
            {
                f"{name}.rows_in": n_in,
                f"{name}.rows_assets": n_assets,
                f"{name}.rows_rejected": n_rej,
                f"{name}.conservation_ok": n_in == n_assets + n_rej,
            }
        )
    rules = result.assets["rejects"]["rule"].value_counts()
    m.update({f"rejected.{r}": int(rules.get(r, 0)) for r in RULES})
    m.update({f"assets.{a}": len(result.assets[a]) for a in ASSETS})
    total = [sum(c[k] for c in per.values()) for k in range(3)]
    m.update({"rows_in": total[0], "rows_assets": total[1], "rows_rejected": total[2]})
    m["conservation_ok"] = total[0] == total[1] + total[2] and all(m[f"{n}.conservation_ok"] for n in per)
    return m
