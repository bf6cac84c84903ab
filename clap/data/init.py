"""``clap init``: draft a profile's source declarations from a folder of a company's own exports.

A person onboarding a new company has a folder of exports and an empty ``assetize.sources``.
Most of a declaration is a fact about the bytes (format, encoding, delimiter, decimal separator,
multi-line columns, the header or the JSON keys), and clap already decides those facts when it
reads a file: this module asks the same code (:func:`clap.data.decoding.decode_file`,
:func:`clap.data.decoding.guess_delimiter`, :func:`clap.data.assetize.split_csv`,
:func:`clap.data.assetize.parse_decimal`, :func:`clap.data.sources.read_xlsx` /
:func:`~clap.data.sources.read_parquet`) and writes down what it found, so the draft reads the
files exactly as assetize will. What the bytes cannot say (which asset a file feeds, which column
is the id, the answer value, the evidence, the split) is guessed where a candidate has evidence
(its name, its values: unique for an id, numbers for a value, dates or a key's vocabulary for a key
field, another source's ids for a reference; see :class:`Guess`) and written as the value, marked
``# guessed (<why>); other candidates: ...: check``: assetize runs on it, right or wrong, so a person
checks each. Where no candidate has evidence it is a ``TODO: <what>; candidates: <columns>`` string,
which :func:`clap.data.sources.parse_sources` refuses until a person replaces it.
A file that is none of the formats is reported
and not declared (assetize then refuses it as ``unknown_file`` until it is declared or ignored).

The draft is a params override (``extends: ../../params.yaml``, with ``replace: [assetize.sources]`` so
its sources replace the root's instead of merging into them), so the profile inherits everything else, including the
answer declaration (params ``task``) whose key fields name the asset columns drafted here.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clap.data.assetize import _cell_text, parse_decimal, split_csv, target_columns
from clap.data.decoding import decode_file, describe, guess_delimiter, loads_bounded
from clap.data.normalize import Vocab, canonical_key, label_key
from clap.data.sources import SPLITS, TARGETS, read_parquet, read_xlsx, render_row, table_rows
from clap.errors import ClapError
from clap.task.answer import AnswerSchema

TODO = "TODO"
# encodings init tries, in this order, through clap's own decision (decode_file): the evidence
# picks one; a UTF-8/ASCII/cp1252 file is declared with the demo's pair (decided per file later)
_TRY = ["utf-8-sig", "utf-16", "utf-32", "cp1252"]
_LEGACY_PAIR = ["utf-8-sig", "cp1252"]
_DELIMITERS = ",;\t|"
_SAMPLE = 500  # rows per file looked at for candidates, decimal separators and keys
_MAX_DEPTH = 64
_MAX_CANDIDATES = 12
_MOSTLY = 0.8  # a messy export may have a few broken rows: the share of rows that must agree

# asset column -> source names (lower-case, '_' for other characters) that make the mapping clear;
# a key field ``<k>_raw`` also matches ``<k>``
_ALIASES = {
    "record_id": ("record_id",),
    "doc_id": ("doc_id", "document_id"),
    "item_id": ("item_id", "question_id"),
    "split": ("split",),
    "question": ("question",),
    "question_type": ("question_type",),
    "context_doc_ids": ("context_doc_ids",),
    "evidence_doc_id": ("evidence_doc_id",),
    "title": ("title", "heading", "subject"),
    "body": ("body", "content", "text"),
    "system": ("system", "source_system"),
    "record_ref": ("record_ref",),
    "unit_raw": ("unit", "uom"),
    "text": ("text", "remark", "remarks", "comment", "comments", "note", "notes"),
}
# never declared by a name alone: the answer value and the evidence are guessed on their values too
_NOT_BY_NAME = ("value", "value_raw", "evidence")
_IDS = {"records": "record_id", "documents": "doc_id", "questions": "item_id"}


@dataclass
class View:
    """One set of rows in a file: a CSV/xlsx/parquet table, JSON Lines, or one records path of a JSON file."""

    records: str = ""  # json: the records path
    keys: list[str] = field(default_factory=list)  # columns, or dotted JSON leaf paths
    samples: dict[str, list[Any]] = field(default_factory=dict)  # key -> sampled values
    table: str = ""  # json: the key of a list of rows of cells under each record (a table source)
    rows: list[dict[str, Any]] = field(default_factory=list)  # the sampled rows, key -> value


@dataclass
class Sniffed:
    """What one export looks like, and the evidence for it (``format`` None: not recognised)."""

    file: str  # path relative to the exports folder
    format: str | None
    why: str  # the evidence (or why the file is not recognised)
    encodings: list[str] = field(default_factory=list)
    delimiter: str = ""
    decimal: str = "."
    multiline: list[str] = field(default_factory=list)
    sheet: str = ""
    views: list[View] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- sniffing -------------------------------------------------------------------------------------


def sniff_file(path: Path, rel: str) -> Sniffed:
    """Sniff one export with clap's own readers: format, encoding, CSV options, columns or JSON keys.

    Never raises for a file's content: a file none of clap's readers accepts is returned with
    ``format=None`` and the reason.
    """
    data = path.read_bytes()
    if not data:
        return Sniffed(rel, None, "empty file (0 bytes)")
    if data[:4] == b"PAR1":
        return _sniff_parquet(data, rel)
    if data[:4] == b"PK\x03\x04":
        return _sniff_xlsx(data, rel)
    try:
        dec = decode_file(data, _TRY, rel, max_bad_line_share=0.5)
    except ClapError as e:
        return Sniffed(rel, None, f"not text clap can decode ({e})")
    encodings = [dec.encoding] if dec.encoding in ("utf-16", "utf-32") else list(_LEGACY_PAIR)
    why = f"{dec.encoding}: {dec.evidence}"
    text = dec.text
    s = text.lstrip("\ufeff \t\r\n")
    if s[:1] in "[{":
        whole = _try_json(text)
        if _is_jsonl(text):
            return _sniff_jsonl(text, rel, encodings, why)
        if isinstance(whole, (list, dict)):
            sn = _sniff_json(whole, rel, encodings, why)
            if sn.format is None and isinstance(whole, dict) and s.rstrip().count("\n") == 0:
                # one flat object on one line: JSON Lines of one row
                return _sniff_jsonl(text, rel, encodings, why)
            return sn
    return _sniff_csv(text, rel, encodings, why, data)


def _try_json(text: str) -> Any:
    try:
        return loads_bounded(text, _MAX_DEPTH)
    except ValueError:
        return None


def _is_jsonl(text: str) -> bool:
    """Two or more non-blank lines, mostly (a messy export has broken lines) one JSON object each."""
    lines = [ln for ln in text.split("\n") if ln.strip()][:_SAMPLE]
    if len(lines) < 2:
        return False
    return sum(isinstance(_try_json(ln), dict) for ln in lines) >= _MOSTLY * len(lines)


def _leaves(value: Any, prefix: str, out: dict[str, list[Any]]) -> None:
    """Dotted leaf paths of an object (nested objects walked with '.'; lists and scalars are leaves)."""
    for k, v in value.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            _leaves(v, path + ".", out)
        else:
            out.setdefault(path, []).append(v)


def _object_view(objects: Iterable[dict], records: str = "", parents: Iterable[dict] = ()) -> View:
    """The view of a list of objects; ``parents`` (aligned): each object's enclosing element, whose
    scalar leaves become keys ``^.<path>`` (what a declaration reads as the enclosing element)."""
    samples: dict[str, list[Any]] = {}
    rows, parents = [], list(parents)
    for i, obj in enumerate(objects):
        row: dict[str, list[Any]] = {}
        _leaves(obj, "", row)
        if parents:
            _leaves({k: v for k, v in parents[i].items() if not isinstance(v, list)}, "^.", row)
        rows.append({k: v[0] for k, v in row.items() if not (k.startswith("^.") and isinstance(v[0], list))})
        for k, v in rows[-1].items():
            samples.setdefault(k, []).append(v)
    return View(records=records, keys=list(samples), samples=samples, rows=rows)


def _sniff_jsonl(text: str, rel: str, encodings: list[str], why: str) -> Sniffed:
    lines = [ln for ln in text.split("\n") if ln.strip()][:_SAMPLE]
    objs = [o for ln in lines if isinstance(o := _try_json(ln), dict)]
    what = f"{len(objs)} of the first {len(lines)} non-blank lines are JSON objects"
    return Sniffed(rel, "jsonl", f"{why}; {what}", encodings, views=[_object_view(objs)])


def _list_paths(
    value: Any, path: str, out: list[tuple[str, list[dict]]], tables: list[tuple[str, str]]
) -> None:
    """Paths (``[*]`` segments) that reach lists of objects, and table candidates below them."""
    if isinstance(value, list):
        objs = [v for v in value[:_SAMPLE] if isinstance(v, dict)]
        if value and len(objs) == len(value[:_SAMPLE]):
            here = f"{path}[*]" if path else "[*]"
            out.append((here, objs))
            for key in dict.fromkeys(k for o in objs for k in o):
                children = [o[key] for o in objs if key in o]
                child = children[0]
                if isinstance(child, dict):
                    cells = [k for k, v in child.items() if _is_cells(v)]
                    if cells:
                        tables.append((f"{here}.{key}", cells[0]))
                    merged = [c for c in children if isinstance(c, dict)]
                    _list_paths_in_dicts(merged, f"{here}.{key}", out, tables)
                elif isinstance(child, list):
                    flat = [x for c in children if isinstance(c, list) for x in c]
                    _list_paths(flat, f"{here}.{key}", out, tables)
    elif isinstance(value, dict):
        _list_paths_in_dicts([value], path, out, tables)


def _list_paths_in_dicts(objs: list[dict], path: str, out: list, tables: list) -> None:
    for key in dict.fromkeys(k for o in objs for k in o):
        children = [o[key] for o in objs if key in o]
        sub = f"{path}.{key}" if path else key
        if isinstance(children[0], list):
            _list_paths([x for c in children if isinstance(c, list) for x in c], sub, out, tables)
        elif isinstance(children[0], dict):
            _list_paths_in_dicts([c for c in children if isinstance(c, dict)], sub, out, tables)


def _is_cells(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(r, list) and all(isinstance(c, (str, int, float)) for c in r) for r in v)
    )


def _sniff_json(root: Any, rel: str, encodings: list[str], why: str) -> Sniffed:
    found: list[tuple[str, list[dict]]] = []
    tables: list[tuple[str, str]] = []
    _list_paths(root, "", found, tables)
    paths = [p for p, _ in found]
    # a list whose elements hold further lists of objects is a container: its leaves are the records
    leaves = [(p, objs) for p, objs in found if not any(q != p and q.startswith(p + ".") for q in paths)]
    shape = "a JSON array" if isinstance(root, list) else "a JSON object"
    if not leaves:
        return Sniffed(rel, None, f"{why}; {shape} with no list of objects (no records path to declare)")
    views = []
    for p, objs in leaves:
        # one list below a list of objects: each record's enclosing element (``^``) is one of those
        up = [q for q, _ in found if re.fullmatch(re.escape(q) + r"\.[^.\[\]]+\[\*\]", p)]
        if up:
            key = p[len(up[0]) + 1 : -3]
            pairs = [(c, o) for o in dict(found)[up[0]] for c in (o.get(key) or []) if isinstance(c, dict)]
            pairs = pairs[:_SAMPLE]
            views.append(_object_view([c for c, _ in pairs], p, [o for _, o in pairs]))
        else:
            views.append(_object_view(objs, p))
    for at, cells in tables:
        parents = [o for p, objs in found if at.startswith(p + ".") for o in objs]
        key = at.rsplit(".", 1)[1]
        sample = [o[key] for o in parents if isinstance(o.get(key), dict)]
        v = View(records=at, table=cells)
        v.samples = {"row": [], "label": [], "cells": [], "text": []}
        for obj in sample:
            header, data = table_rows(obj[cells], "auto")
            for number, row in data:
                one = {
                    "row": number,
                    "label": row[0] if row else "",
                    "cells": row,
                    "text": render_row(header, row),
                }
                one.update(
                    {
                        f"^.{k}": val
                        for k, val in obj.items()
                        if k != cells and not isinstance(val, (list, dict))
                    }
                )
                v.rows.append(one)
                for k, val in one.items():
                    v.samples.setdefault(k, []).append(val)
        v.keys = list(v.samples)
        views.append(v)
    found_paths = ", ".join(v.records + (f" (table at {v.table})" if v.table else "") for v in views)
    return Sniffed(rel, "json", f"{why}; {shape}; records paths: {found_paths}", encodings, views=views)


def _decimal_of(values: Iterable[Any]) -> tuple[str, str]:
    """('.' or ',', evidence) from text cells that read as a number with only one of the separators."""
    comma = dot = 0
    for v in values:
        if not isinstance(v, str) or not re.search(r"\d[.,]\d", v):
            continue
        ok = {d: _parses(v, d) for d in ".,"}
        comma += ok[","] and not ok["."]
        dot += ok["."] and not ok[","]
    if comma > dot:
        return ",", f"{comma} cells read only with decimal ',' ({dot} only with '.')"
    if dot:
        return ".", f"{dot} cells read only with decimal '.' ({comma} only with ',')"
    return ".", "no cell decides it (default '.')"


def _parses(text: str, decimal: str) -> bool:
    try:
        parse_decimal(text, decimal)
        return True
    except ValueError:
        return False


def _sniff_csv(text: str, rel: str, encodings: list[str], why: str, data: bytes) -> Sniffed:
    head = text.lstrip("\ufeff").split("\n", 1)[0]
    delimiter = guess_delimiter(head)
    how = "the header splits most on it"
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(text[:8192], delimiters=_DELIMITERS).delimiter
            how = "csv.Sniffer"
        except csv.Error:
            return Sniffed(rel, None, f"{why}; not JSON and no delimiter found: {describe(data)}")
    records = split_csv(text, delimiter, frozenset(range(head.count(delimiter) + 1)))
    if len(records) < 2 or records[0].error:
        return Sniffed(rel, None, f"{why}; {describe(data)}, but no header and rows on {delimiter!r}")
    header = list(records[0].fields)
    rows = [r.fields for r in records[1:] if not r.error and len(r.fields) == len(header)]
    if not rows or len(rows) < 0.5 * (len(records) - 1):
        return Sniffed(rel, None, f"{why}; {describe(data)}, but most rows do not have the header's fields")
    multiline = [h for j, h in enumerate(header) if any("\n" in r[j] for r in rows)]
    decimal, dwhy = _decimal_of(c for r in rows[:_SAMPLE] for c in r)
    samples = {h: [r[j] for r in rows[:_SAMPLE]] for j, h in enumerate(header)}
    sn = Sniffed(
        rel, "csv", f"{why}; delimiter {delimiter!r} ({how}); decimal {decimal!r}: {dwhy}", encodings
    )
    sn.delimiter, sn.decimal, sn.multiline = delimiter, decimal, multiline
    sn.views = [View(keys=header, samples=samples, rows=[dict(zip(header, r)) for r in rows[:_SAMPLE]])]
    if multiline:
        sn.notes.append(f"quoted text spans lines in {multiline}")
    return sn


def _sniff_parquet(data: bytes, rel: str) -> Sniffed:
    try:
        rows = read_parquet(data, rel)
    except ClapError as e:
        return Sniffed(rel, None, str(e))
    if not rows:
        return Sniffed(rel, None, "Parquet file with no rows")
    samples: dict[str, list[Any]] = {}
    for r in rows[:_SAMPLE]:
        for k, v in r.items():
            samples.setdefault(k, []).append(v)
    return Sniffed(
        rel,
        "parquet",
        f"Parquet (PAR1 magic), {len(rows)} rows",
        views=[View(keys=list(rows[0]), samples=samples, rows=rows[:_SAMPLE])],
    )


def _sniff_xlsx(data: bytes, rel: str) -> Sniffed:
    from python_calamine import CalamineWorkbook

    try:
        names = CalamineWorkbook.from_filelike(io.BytesIO(data)).sheet_names
    except Exception as e:  # calamine raises its own types; not a workbook is a finding, not a crash
        return Sniffed(rel, None, f"a ZIP container that is not an xlsx workbook ({e})")
    filled = []
    for name in names:
        sheet = read_xlsx(data, rel, name)
        if sheet and any(_cell_text(c) for c in sheet[0]):
            filled.append((name, sheet))
    if not filled:
        return Sniffed(rel, None, f"xlsx workbook with no non-empty sheet (sheets: {names})")
    name, sheet = filled[0]
    header = [_cell_text(c) for c in sheet[0]]
    while header and not header[-1]:
        header.pop()
    rows = [r for r in sheet[1:] if any(_cell_text(c) for c in r)]
    samples = {h: [r[j] if j < len(r) else "" for r in rows[:_SAMPLE]] for j, h in enumerate(header)}
    decimal, dwhy = _decimal_of(v for vs in samples.values() for v in vs)
    sn = Sniffed(
        rel, "xlsx", f"xlsx workbook, sheet {name!r} ({len(rows)} rows); decimal {decimal!r}: {dwhy}"
    )
    sn.sheet, sn.decimal = name, decimal
    sn.views = [
        View(keys=header, samples=samples, rows=[dict(zip(header, vs)) for vs in zip(*samples.values())])
    ]
    if len(filled) > 1:
        sn.notes.append(
            f"more sheets with a header: {[n for n, _ in filled[1:]]} (declare one source per sheet)"
        )
    return sn


# --- drafting ---------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _last(key: str) -> str:
    return _norm(key.rsplit(".", 1)[-1])


def _guess_target(view: View) -> tuple[str, str]:
    """The likeliest target and the evidence for it ("" when the shape says nothing)."""
    names = {_last(k) for k in view.keys}
    asked = [k for k in view.keys if _is_question(view.samples.get(k, []))]
    if "question" in names or asked:
        return "questions", f"a column of questions ({'question' if 'question' in names else asked[0]})"
    prose = [k for k in view.keys if _last(k) in ("text", "body", "content")]
    long = [k for k in prose if _mean_len(view.samples.get(k, [])) >= 40]
    if view.table or long:
        return "documents", "rows of a table" if view.table else f"a column of long text ({long[0]})"
    numbers = _candidates("value", view)
    if numbers:
        return "records", f"a numeric column ({numbers[0]}), no questions and no long text"
    return "records", ""


def _mean_len(values: list[Any]) -> float:
    texts = [v for v in values if isinstance(v, str)]
    return sum(map(len, texts)) / len(texts) if texts else 0.0


def _is_question(values: list[Any]) -> bool:
    texts = [v for v in values if isinstance(v, str)]
    return bool(texts) and sum(v.rstrip().endswith("?") for v in texts) >= 0.8 * len(texts)


def _todo(what: str, candidates: list[str]) -> str:
    shown = candidates[:_MAX_CANDIDATES] + (["..."] if len(candidates) > _MAX_CANDIDATES else [])
    return f"{TODO}: {what}; candidates: {', '.join(shown) if shown else 'none found'}"


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _candidates(role: str, view: View, used: Iterable[str] = (), hint: str = "") -> list[str]:
    """Columns/keys that could fill ``role``, the likeliest first (read from sampled values)."""
    keys, vals, used = view.keys, view.samples, set(used)

    def texts(k: str) -> list[str]:
        return [str(v) for v in vals.get(k, []) if v not in (None, "")]

    if role == "id":
        unique = [k for k in keys if all(_scalar(v) for v in vals.get(k, [])) and texts(k)
                  and len(set(texts(k))) >= 0.9 * len(vals.get(k, []))]  # fmt: skip
        hinted = [k for k in unique if _ID_NAME.search(_last(k))]
        if view.table:  # a table's rows: the table's id and the row number
            ids = [k for k in keys if k.startswith("^.") and re.search(r"(id|uid|key)$", _last(k))]
            return [f'{{template: "{{{k}}}/r{{row}}"}}' for k in ids] + hinted
        return hinted + [k for k in unique if k not in hinted]
    if role == "value":
        return [k for k in keys if texts(k) and _MOSTLY * len(texts(k)) <= sum(
                (isinstance(v, (int, float)) and not isinstance(v, bool)) or _parses(str(v), ".")
                or _parses(str(v), ",") for v in vals[k] if v not in (None, ""))]  # fmt: skip
    if role == "evidence":
        long = [k for k in keys if texts(k) and k not in used
                and all(isinstance(v, str) for v in vals[k] if v is not None)]  # fmt: skip
        return _hinted(sorted(long, key=lambda k: -sum(map(len, texts(k))) / max(1, len(texts(k)))), hint)[:6]
    if role == "split":
        return [k for k in keys if texts(k) and set(texts(k)) <= set(SPLITS)]
    if role == "text_list":
        return [k for k in keys if vals.get(k) and all(isinstance(v, list) for v in vals[k])]
    rest = [k for k in keys if all(_scalar(v) for v in vals.get(k, [])) and k not in used]
    if hint == "date":
        dated = [k for k in rest if texts(k) and all(_DATE.search(t) for t in texts(k)[:50])]
        rest = dated + [k for k in rest if k not in dated]
    return _hinted(rest, hint)


_DATE = re.compile(r"\d{1,4}[-./]\d{1,2}[-./]\d{1,4}|\d{1,2} [A-Z][a-z]+ \d{4}|[A-Z][a-z]+ \d{1,2}, \d{4}")
_ID_NAME = re.compile(r"(^|_)(id|uid|no|nr|key|ref)$")
# generic words in a column's name that support a guess (a name token, '_'-separated, lower-case)
_NAMED = {
    "value": {"value", "amount", "measured", "measurement", "reading", "result", "answer", "qty",
              "quantity", "total", "count"},
    "unit_raw": {"unit", "units", "uom", "scale", "currency"},
    "evidence": {"evidence", "quote", "citation", "excerpt", "passage", "snippet"},
    "question_type": {"type", "kind", "category", "class"},
    "title": {"title", "heading", "subject", "label", "name", "caption", "headline"},
    "record_ref": {"ref", "reference", "record"},
    "date": {"date", "time", "at", "day", "opened", "created", "recorded", "timestamp"},
}  # fmt: skip
_SPLIT_SHARES = {"train": 0.6, "eval": 0.25, "replay": 0.15}


def _hinted(keys: list[str], hint: str) -> list[str]:
    """``keys`` with those whose name contains ``hint`` first (a stable reorder)."""
    if not hint:
        return keys
    first = [k for k in keys if hint in _norm(k)]
    return first + [k for k in keys if k not in first]


def _named(key: str, role: str) -> bool:
    """A word of the key's last segment is one of the role's words (the value: its last word, so
    ``answer_type`` is no value)."""
    words = _last(key).split("_")
    return bool(set(words[-1:] if role == "value" else words) & _NAMED[role])


@dataclass
class Guess:
    """A choice init made on evidence: written as the value, marked for a person to check."""

    spec: Any  # the declaration written
    why: str  # the evidence
    others: list[str] = field(default_factory=list)  # the other candidates

    def note(self) -> str:
        others = ", ".join(self.others[:_MAX_CANDIDATES]) or "none"
        return f"guessed ({self.why}); other candidates: {others}: check"


@dataclass
class Draft:
    """One drafted source: its declaration (TODO strings where a person must choose) and why."""

    name: str
    file: str
    decl: dict[str, Any]
    todos: dict[str, str]  # dotted key in the source -> the TODO text
    declared: dict[str, str]  # asset column -> the source column it was mapped from (by name)
    guesses: dict[str, Guess] = field(default_factory=dict)  # dotted key in the source -> the guess
    view: View = field(default_factory=View, repr=False)


@dataclass
class _Source:
    """What drafting one source needs: the view, its target, the answer and what is mapped so far."""

    view: View
    target: str
    answer: AnswerSchema
    vocab: Vocab | None
    name: str
    used: set[str] = field(default_factory=set)
    only: tuple[str, list[Any]] | None = None
    value_key: str = ""


def draft_source(
    sn: Sniffed, view: View, name: str, answer: AnswerSchema, vocab: Vocab | None = None
) -> Draft:
    """The declaration of one view of a sniffed file: reading options sniffed, fields by name, by
    evidence (a :class:`Guess`, marked for checking) or TODO."""
    decl: dict[str, Any] = {"files": sn.file, "format": sn.format}
    if sn.format in ("csv", "jsonl", "json"):
        decl["encodings"] = list(sn.encodings)
    if sn.format == "csv":
        decl["csv"] = {"delimiter": sn.delimiter, "decimal": sn.decimal, "multiline": list(sn.multiline)}
    if sn.format == "json":
        decl["json"] = {"records": view.records}
    if sn.format == "xlsx":
        decl["xlsx"] = {"sheet": sn.sheet, "decimal": sn.decimal}
    if sn.format in ("csv", "xlsx", "parquet"):
        decl["columns"] = list(view.keys)
    if view.table:
        decl["table"] = {"cells": view.table, "header_rows": "auto"}
    guess, why = _guess_target(view)
    others = [t for t in TARGETS if t != guess]
    guesses: dict[str, Guess] = {}
    todos: dict[str, str] = {}
    if why:
        decl["target"] = guess
        guesses["target"] = Guess(guess, why, others)
    else:
        decl["target"] = todos["target"] = _todo(
            f"the asset this file feeds (records, documents or questions; the fields are drafted for {guess})",
            [guess, *others],
        )
    idcol = _IDS[guess]
    decl["id"], decl["unique"] = idcol, [idcol]
    src = _Source(view, guess, answer, vocab, name)
    columns = target_columns(answer)[guess]
    mapped: dict[str, str] = {}
    hits = {}
    for col in columns:
        aliases = _ALIASES.get(col, ())
        if col.endswith("_raw") and col != "value_raw":
            aliases = (*aliases, col[: -len("_raw")], col)
        hits[col] = [] if col in _NOT_BY_NAME else [k for k in view.keys if _last(k) in aliases]
        if len(hits[col]) == 1:
            mapped[col] = hits[col][0]
    src.used = set(mapped.values())
    fields: dict[str, Any] = {}
    for col in columns:
        if col in mapped:
            kind = _field_type(guess, col, answer)
            fields[col] = mapped[col] if kind == "text" else {"from": mapped[col], "type": kind}
    for col in sorted((c for c in columns if c not in mapped), key=_order):
        g = None if hits[col] else _guess_field(src, col, fields)
        if g is None:
            kind = _field_type(guess, col, answer)
            fields[col] = todos[f"fields.{col}"] = _todo(*_what(guess, col, kind, hits[col], view, src.used))
            continue
        fields[col], guesses[f"fields.{col}"] = g.spec, g
        src.used |= set(_paths_of(g.spec))
    decl["fields"] = {c: fields[c] for c in columns}
    if src.only:
        decl["only"] = {src.only[0]: src.only[1]}
        guesses["only"] = Guess(
            decl["only"], f"the rows whose {src.value_key} holds one value of the answer's type"
        )
    pair = _unique_pair(src, fields)
    if pair:
        decl["unique"], guesses["unique"] = pair.spec, pair
    return Draft(name, sn.file, decl, todos, mapped, guesses, view)


# fields guessed first constrain the later ones (what they map is no candidate for another field)
_FIRST = ("record_id", "doc_id", "item_id", "value", "value_raw", "question", "split", "evidence")
_LAST = ("evidence_doc_id", "context_doc_ids", "question_type", "title", "text")


def _order(col: str) -> int:
    if col in _FIRST:
        return _FIRST.index(col)
    return 100 + _LAST.index(col) if col in _LAST else 50


def _paths_of(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, dict):
        path = spec.get("from") or spec.get("hash") or spec.get("documents_of")
        return [path.removesuffix(".0")] if path else re.findall(r"\{([^{}]+)\}", spec.get("template", ""))
    return []


def _typed(src: _Source, col: str, key: str) -> Any:
    kind = _field_type(src.target, col, src.answer)
    return key if kind == "text" else {"from": key, "type": kind}


def _texts(src: _Source, key: str) -> list[str]:
    return [str(v) for v in src.view.samples.get(key, []) if v not in (None, "") and _scalar(v)]


def _free(src: _Source) -> list[str]:
    """Scalar keys of the source's own rows not mapped yet."""
    return [k for k in src.view.keys if k not in src.used and not k.startswith("^.")
            and all(_scalar(v) for v in src.view.samples.get(k, []))]  # fmt: skip


def _guess_field(src: _Source, col: str, fields: dict[str, Any]) -> Guess | None:
    """The guess for one asset column from the sampled values (None: no candidate has evidence)."""
    view = src.view
    if col == _IDS[src.target]:
        cands = _candidates("id", view)
        if view.table and cands:
            return Guess(yaml.safe_load(cands[0]), "the table's id and the row number", cands[1:])
        if cands and _ID_NAME.search(_last(cands[0])):
            share = len(set(_texts(src, cands[0]))) / max(1, len(view.samples[cands[0]]))
            return Guess(cands[0], f"an id by its name, {share:.0%} of sampled values distinct", cands[1:])
        return None
    if col in ("value", "value_raw"):
        return _guess_value(src, col)
    if col == "question":
        asked = [k for k in view.keys if _is_question(view.samples.get(k, [])) and k not in src.used]
        return Guess(asked[0], "its values end in '?'", asked[1:]) if asked else None
    if col == "split":
        splits = [k for k in _candidates("split", view) if k not in src.used]
        if splits:
            return Guess(splits[0], "its values are train/eval/replay", splits[1:])
        groups = [k for k in view.keys if k.startswith("^.") and _ID_NAME.search(_last(k))]
        group = groups[0] if groups else next(iter(_paths_of(fields.get(_IDS[src.target]))), "")
        if not group:
            return None
        spec = {"hash": group, "seed": 0, "shares": dict(_SPLIT_SHARES)}
        why = f"no column holds train/eval/replay: a seeded hash of {group}, whose rows stay in one split; check the shares"
        return Guess(spec, why, groups[1:])
    if col.endswith("_raw") and col[:-4] in src.answer.keys:
        return _guess_key(src, col[:-4])
    if col == "unit_raw":
        return _guess_unit(src)
    if col == "evidence":
        named = [k for k in _free(src) if _named(k, "evidence")]
        if named:
            return Guess(named[0], "its name says evidence/quote", named[1:])
        if src.vocab is not None and src.vocab.evidence == "locate":
            return Guess(
                {"const": ""}, "no quote column, and normalize.evidence is locate: normalize finds the quote"
            )
        return None
    if col == "evidence_doc_id":
        if fields.get("evidence") == {"const": ""}:
            return Guess({"const": ""}, "no quote column: normalize.evidence locate finds the document")
        docs = [k for k in _free(src) if "doc" in _last(k).split("_") and _ID_NAME.search(_last(k))]
        return Guess(docs[0], "its name says a document's id", docs[1:]) if docs else None
    if col == "context_doc_ids":
        lists = [k for k in _candidates("text_list", view) if "doc" in _last(k)]
        return (
            Guess({"from": lists[0], "type": "text_list"}, "a list of document ids by its name")
            if lists
            else None
        )
    if col in ("question_type", "title", "text"):
        return _guess_text(src, col)
    if col == "system":
        tail = _norm(re.sub(r"\[\*\]", "", view.records).rsplit(".", 1)[-1]) or src.name
        return Guess({"const": tail}, "no column names the source system: the records path or file name")
    if col == "record_ref":
        named = [k for k in _free(src) if _named(k, "record_ref")]
        if named:
            return Guess(named[0], "its name says a reference", named[1:])
        up = [k for k in view.keys if k.startswith("^.") and _ID_NAME.search(_last(k))]
        if up:
            return Guess(up[0], "the enclosing element's id: the documents of one element share it", up[1:])
    return None


def _good_value(v: Any, text: bool) -> bool:
    if text:
        return isinstance(v, str) and bool(v.strip())
    if isinstance(v, bool):
        return False
    return isinstance(v, (int, float)) or (isinstance(v, str) and (_parses(v, ".") or _parses(v, ",")))


def _guess_value(src: _Source, col: str) -> Guess | None:
    """The answer value: a column (or a list's only element) whose values are of the answer's type;
    when only some rows hold one, the rows kept (``only``) by a column that separates them."""
    rows, text = src.view.rows, src.target != "records" and src.answer.value_is_text
    if not rows:
        return None

    def good(path: str) -> list[bool]:
        key, first = (path[:-2], True) if path.endswith(".0") else (path, False)
        out = []
        for r in rows:
            v = r.get(key)
            if first:
                v = v[0] if isinstance(v, list) and len(v) == 1 else None
            out.append(v is not None and _scalar(v) and _good_value(v, text))
        return out

    paths = []
    for k in src.view.keys:
        if k in src.used or k.startswith("^."):
            continue
        paths.append(k)
        if any(isinstance(v, list) for v in src.view.samples.get(k, [])):
            paths.append(f"{k}.0")
    scored = {p: good(p) for p in paths}
    share = {p: sum(g) / len(g) for p, g in scored.items()}
    paths.sort(key=lambda p: -share[p])
    mostly = [p for p in paths if share[p] >= _MOSTLY]
    named = [p for p in mostly if _named(p.removesuffix(".0"), "value")]
    kind = "text" if text else "number"
    if named or len(mostly) == 1:
        top = src.value_key = (named or mostly)[0]
        why = f"{share[top]:.0%} of sampled values are {kind}" + (
            ", and its name says value" if named else ", the only such column"
        )
        return Guess(_typed(src, col, top), why, [p for p in mostly if p != top])
    for p in sorted(
        (p for p in paths if _named(p.removesuffix(".0"), "value") and share[p] >= 0.2),
        key=lambda p: -share[p],
    ):
        keep = _separating(src, scored[p], p.removesuffix(".0"))
        if keep:
            src.only, src.value_key = keep, p
            why = (
                f"{share[p]:.0%} of sampled rows hold one {kind} there; only rows with {keep[0]} in {keep[1]}"
            )
            return Guess(_typed(src, col, p), why, [q for q in mostly if q != p])
    return None


def _separating(src: _Source, good: list[bool], skip: str) -> tuple[str, list[Any]] | None:
    """A column of few values, present in every sampled row, whose values on the ``good`` rows never
    occur on the others: (column, the values of the good rows)."""
    found = []
    for k in _free(src):
        if k == skip:
            continue
        vals = [r.get(k) for r in src.view.rows]
        if any(v is None or isinstance(v, (float, bool)) for v in vals) or len(set(vals)) > _MAX_CANDIDATES:
            continue
        yes = {v for v, g in zip(vals, good) if g}
        no = {v for v, g in zip(vals, good) if not g}
        if yes and not yes & no:
            found.append((k, sorted(yes, key=str)))
    return min(found, key=lambda f: len(f[1])) if found else None


def _read_share(src: _Source, key: str, read: Any) -> float:
    texts = _texts(src, key)
    return sum(read(t) is not None for t in texts) / len(texts) if texts else 0.0


def _guess_key(src: _Source, key: str) -> Guess | None:
    """A key field ``<key>_raw``: the column whose values its normalizer reads (params normalize.keys);
    else a word of the value column's name that it reads (e.g. a column ``downtime_min``)."""
    vocab, free = src.vocab, _free(src)
    kind = "date" if src.answer.field(key).type == "date" else ""
    how = "a date pattern"
    if vocab is not None and key in {k.name for k in vocab.keys}:
        kind, how = vocab.key(key).kind, f"normalize.keys.{key}"
        if kind == "text":
            return None  # any text reads: no evidence in the values

        def read(t: str) -> Any:
            return canonical_key(key, t, vocab)
    else:

        def read(t: str) -> Any:
            return _DATE.search(t) if kind == "date" else None

    share = {k: _read_share(src, k, read) for k in free}
    best = sorted((k for k in free if share[k] >= 0.5), key=lambda k: (-share[k], not _named(k, "date")))
    if kind == "date":
        best.sort(key=lambda k: not _named(k, "date"))
    if best:
        return Guess(best[0], f"{share[best[0]]:.0%} of sampled values read as {key} ({how})", best[1:])
    for word in _name_words(src):
        if read(word) is not None:
            return Guess({"const": word}, f"the value column's name says it ({word!r} reads as {key})")
    return None


def _name_words(src: _Source) -> list[str]:
    """The words of the name of the column the answer value was guessed from."""
    return [w for w in _last(src.value_key.removesuffix(".0")).split("_") if w] if src.value_key else []


def _guess_unit(src: _Source) -> Guess | None:
    named = [k for k in _free(src) if _named(k, "unit_raw")]
    units = src.vocab.unit_by_variant if src.vocab is not None else {}
    known = [
        k for k in _free(src) if units and _read_share(src, k, lambda t: units.get(label_key(t))) >= _MOSTLY
    ]
    top = [k for k in named if k in known] or named or known
    if top:
        why = "its name says unit" if top[0] in named else "its values are units (normalize.units)"
        if top[0] in known and top[0] in named:
            why += ", and its values are units (normalize.units)"
        return Guess(
            {"from": top[0], "type": "optional_text"}, why, [k for k in named + known if k != top[0]]
        )
    for word in _name_words(src):
        if label_key(word) in units:
            return Guess(
                {"const": word}, f"the value column's name says it ({word!r} is a unit in normalize.units)"
            )
    return None


def _guess_text(src: _Source, col: str) -> Guess | None:
    """question_type: a column of a few labels; title: a column named like a title; text: the
    longest free text left (records' optional text)."""
    free = [k for k in _free(src) if not src.only or k != src.only[0]]
    if col == "question_type":
        labels = [k for k in free if 2 <= len(set(_texts(src, k))) <= _MAX_CANDIDATES
                  and len(_texts(src, k)) >= _MOSTLY * len(src.view.samples[k])
                  and all(isinstance(v, str) for v in src.view.samples[k])]  # fmt: skip
        labels.sort(key=lambda k: not _named(k, "question_type"))
        return Guess(labels[0], "a column of a few labels", labels[1:]) if labels else None
    if col == "title":
        named = [k for k in free if _named(k, "title")]
        if named:
            empty = len(_texts(src, named[0])) < len(src.view.samples[named[0]])
            spec = {"from": named[0], "type": "optional_text"} if empty else named[0]
            return Guess(spec, "its name says title", named[1:])
        return Guess({"const": ""}, "no column names a title: left empty")
    texts = sorted((k for k in free if all(isinstance(v, str) for v in src.view.samples[k])),
                   key=lambda k: -_mean_len(src.view.samples[k]))  # fmt: skip
    if texts:
        return Guess(
            {"from": texts[0], "type": "optional_text"},
            "the longest text not mapped to another field",
            texts[1:],
        )
    return Guess({"const": ""}, "no text column left: empty")


def _unique_pair(src: _Source, fields: dict[str, Any]) -> Guess | None:
    """Questions whose id repeats but whose (split, id) repeats less: ``unique: [split, item_id]``."""
    ids, splits = fields.get(_IDS[src.target]), fields.get("split")
    if src.target != "questions" or not isinstance(ids, str) or not isinstance(splits, str):
        return None
    pairs = [(r.get(splits), r.get(ids)) for r in src.view.rows]
    alone = len(set(p[1] for p in pairs))
    if alone < len(pairs) and len(set(pairs)) > alone:
        why = f"{len(pairs) - alone} sampled ids repeat, {len(pairs) - len(set(pairs))} in the same split"
        return Guess(["split", "item_id"], why, ["item_id"])
    return None


def _values(view: View, spec: Any) -> set[str]:
    """The sampled values of a field mapped from one path ({} for a constant, template or hash)."""
    path = spec if isinstance(spec, str) else spec.get("from", "") if isinstance(spec, dict) else ""
    return {str(v) for v in view.samples.get(path, []) if v not in (None, "") and _scalar(v)}


def _within(view: View, key: str, known: set[str], each: bool = False) -> float:
    """The share of ``key``'s sampled values (``each``: of the elements of its lists) in ``known``."""
    vals = view.samples.get(key, [])
    vals = [x for v in vals if isinstance(v, list) for x in v] if each else vals
    vals = [str(v) for v in vals if v not in (None, "") and _scalar(v)]
    return sum(v in known for v in vals) / len(vals) if vals and known else 0.0


def _link(drafts: list[Draft]) -> None:
    """Guesses across sources: a documents source's ``record_ref`` is the column whose values are a
    records source's ids; a questions source's ``context_doc_ids`` are the documents whose
    ``record_ref`` is one of its columns' values (``documents_of``)."""

    def fill(d: Draft, col: str, g: Guess) -> None:
        d.decl["fields"][col], d.guesses[f"fields.{col}"] = g.spec, g
        d.todos.pop(f"fields.{col}")

    by = {t: [d for d in drafts if d.decl["target"] == t or d.guesses.get("target", Guess(None, "")).spec == t]
          for t in TARGETS}  # fmt: skip
    for d in by["documents"]:
        if "fields.record_ref" not in d.todos:
            continue
        for r in by["records"]:
            ids = _values(r.view, r.decl["fields"].get("record_id"))
            hit = [k for k in d.view.keys if _within(d.view, k, ids) >= _MOSTLY]
            if hit:
                fill(d, "record_ref", Guess(hit[0], f"its values are ids of source {r.name}", hit[1:]))
                break
    for q in by["questions"]:
        if "fields.context_doc_ids" not in q.todos:
            continue
        for d in by["documents"]:
            ids = _values(d.view, d.decl["fields"].get("doc_id"))
            lists = [
                k for k in _candidates("text_list", q.view) if _within(q.view, k, ids, each=True) >= _MOSTLY
            ]
            if lists:
                why = f"its lists hold ids of source {d.name}'s documents"
                fill(q, "context_doc_ids", Guess({"from": lists[0], "type": "text_list"}, why, lists[1:]))
                break
        for d in (d for d in by["documents"] if d.file == q.file and "fields.context_doc_ids" in q.todos):
            refs = _values(d.view, d.decl["fields"].get("record_ref"))
            hit = [k for k in q.view.keys if _within(q.view, k, refs) >= _MOSTLY]
            if hit:
                why = f"its values are the record_ref of source {d.name}'s documents"
                fill(q, "context_doc_ids", Guess({"documents_of": hit[0]}, why, hit[1:]))
                break


def _field_type(target: str, col: str, answer: AnswerSchema) -> str:
    if target == "records" and col == "value":
        return "text" if answer.value_is_text else "number"
    if (target, col) == ("records", "text") or col == "unit_raw":
        return "optional_text"
    return {"value_raw": "value", "context_doc_ids": "text_list"}.get(col, "text")


def _what(
    target: str, col: str, kind: str, hits: list[str], view: View, used: Iterable[str]
) -> tuple[str, list[str]]:
    form = f"{{from: <column>, type: {kind}}}" if kind != "text" else "<column>"
    if hits:
        return f"{col}: several columns match its name ({form})", hits
    if col == _IDS[target]:
        return f"the id of a row, {col} ({form}; or {{template: ...}})", _candidates("id", view)
    if col in ("value", "value_raw"):
        return f"the answer value, {col} ({form})", _candidates("value", view)
    if col == "evidence":
        return f"the evidence quote ({form}; or {{const: ''}} with normalize.evidence: locate)", _candidates(
            "evidence", view, used, "evidence"
        )
    if col == "split":
        return (
            "the split, train/eval/replay (<column>; or {hash: <group column>, seed: <int>, shares: {...}})",
            _candidates("split", view),
        )
    if kind == "text_list":
        return f"{col} ({form}; or {{documents_of: <column>}})", _candidates("text_list", view)
    if col == "question":
        asked = [k for k in view.keys if _is_question(view.samples.get(k, []))]
        return f"the question text ({form})", asked + [
            k for k in _candidates("", view, used) if k not in asked
        ]
    if col in ("system", "question_type"):
        return f"{col} (<column>; or {{const: <label>}})", _candidates("", view, used)
    hint = {"evidence_doc_id": "doc", "record_ref": "ref"}.get(col, col.removesuffix("_raw"))
    return f"the column of {col} ({form}; or {{const: ...}})", _candidates("", view, used, hint)


def _source_name(rel: str, view: View, several: bool, taken: set[str]) -> str:
    base = _norm(Path(rel).name.split(".")[0]) or "source"
    if not base[0].isalpha():
        base = f"s_{base}"
    if several:
        tail = _norm(re.sub(r"\[\*\]", "", (view.records or "").rsplit(".", 1)[-1]))
        base = f"{base}_{tail}" if tail else base
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


@dataclass
class Init:
    """What ``clap init`` found and drafted for a folder of exports."""

    sniffed: list[Sniffed]
    drafts: list[Draft]
    ignored: list[str]  # files not sniffed (matched by ``ignore``)
    ignore: list[str] = field(default_factory=list)  # the globs, as given (written to assetize.ignore)
    keys: tuple[str, ...] = ()  # the answer's key fields the drafts map (``<key>_raw``)


def init_profile(
    exports: Path | str, answer: AnswerSchema, ignore: Iterable[str] = (), vocab: Vocab | None = None
) -> Init:
    """Sniff every file of ``exports`` and draft one source per file (per records path of a JSON file).

    Args:
        exports: the folder of a company's exports (one batch's files, nested folders allowed).
        answer: the answer declaration (params ``task``) the profile inherits: its key fields name
            the asset columns each source must map.
        ignore: globs (relative to ``exports``) of files not to sniff, e.g. a generator's manifest.
        vocab: the compiled params ``normalize`` of the same params (key vocabularies, units,
            ``evidence``): evidence for key, unit and evidence guesses (None: names and shapes only).

    Raises:
        ClapError: rule ``missing_batch`` when the folder does not exist, ``empty_batch`` when it
            has no file.
    """
    root = Path(exports)
    if not root.is_dir():
        raise ClapError("exports folder does not exist", file=root, rule="missing_batch")
    skip = {p.relative_to(root).as_posix() for g in ignore for p in root.glob(g)}
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    if not files:
        raise ClapError("exports folder has no file", file=root, rule="empty_batch")
    sniffed = [sniff_file(root / f, f) for f in files if f not in skip]
    drafts, taken = [], set()
    for sn in sniffed:
        if sn.format is None:
            continue
        for view in sn.views:
            name = _source_name(sn.file, view, len(sn.views) > 1, taken)
            drafts.append(draft_source(sn, view, name, answer, vocab))
    _link(drafts)
    return Init(sniffed, drafts, sorted(skip), list(ignore), answer.keys)


# --- writing ---------------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block mappings, flow lists and small flow mappings (csv/json/xlsx/table options)."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    small = "hash" in data or (
        len(data) <= 3
        and all(
            isinstance(v, (int, float, list)) or (isinstance(v, str) and not v.startswith(TODO))
            for v in data.values()
        )
    )
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=small)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(dict, _represent_dict)


def _dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096).rstrip("\n")


def render_params(result: Init, exports: Path | str, extends: str = "../../params.yaml") -> str:
    """The profile's params.yaml text: an override of ``extends`` (relative to the profile) with the drafted sources."""
    out = [
        f"# Drafted by `clap init {exports}` (docs/init.md). Check every line marked `# guessed`: the value",
        "# was chosen on evidence and assetize runs with it, right or wrong. Replace every TODO: clap refuses",
        "# a declaration that still has one (rule todo_param). The rest comes from the params it extends.",
        f"extends: {extends}",
        "replace: [assetize.sources]   # these sources replace the extended params' own (clap/params.py)",
        "",
        f"# The fields map the answer `task` of the extended params (key fields: {', '.join(result.keys) or 'none'}):",
        "# TODO: if your answer has other key fields, set `task` and normalize.keys here and map their <key>_raw fields.",
        "",
        "# TODO: the batch folders (profiles/<name>/data/raw/<batch>/) this profile runs, oldest first",
        "batches: []",
        "",
        "assetize:",
        f"  ignore: {_dump(list(result.ignore))}",
        "  sources:",
    ]
    for d in result.drafts:
        sn = next(s for s in result.sniffed if s.file == d.file)
        out.append(f"    # {d.file}: {sn.why}")
        for note in sn.notes:
            out.append(f"    # {note}")
        out.extend("    " + line for line in _marked(_dump({d.name: d.decl}), d.guesses))
    for sn in result.sniffed:
        if sn.format is None:
            out.append(f"    # NOT DECLARED {sn.file}: {sn.why} (declare it by hand or list it in ignore)")
    return "\n".join(out) + "\n"


def _marked(body: str, guesses: dict[str, Guess]) -> list[str]:
    """The lines of one dumped source with ``# guessed (...)`` after each guessed key's line."""
    out, section = [], ""
    for line in body.splitlines():
        m = re.match(r"( {2}| {4})([^ #:][^:]*):", line)
        if m and len(m.group(1)) == 2:
            section = m.group(2)
        key = m and (m.group(2) if len(m.group(1)) == 2 else f"{section}.{m.group(2)}")
        out.append(f"{line}   # {guesses[key].note()}" if key in guesses else line)
    return out


def counts(result: Init) -> tuple[int, int]:
    """(guesses to check, TODOs) over the drafted sources."""
    return sum(len(d.guesses) for d in result.drafts), sum(len(d.todos) for d in result.drafts)


def render_report(result: Init) -> str:
    """A short readable report: per file what was found, what was declared, what is TODO and why."""
    lines = []
    for sn in result.sniffed:
        if sn.format is None:
            lines.append(f"{sn.file}: NOT RECOGNISED, not declared: {sn.why}")
            continue
        lines.append(f"{sn.file}: {sn.format}; {sn.why}")
        for d in (d for d in result.drafts if d.file == sn.file):
            reading = "; ".join(
                f"{k} {_dump(d.decl[k])}"
                for k in ("encodings", "csv", "json", "xlsx", "table")
                if k in d.decl
            )
            if "columns" in d.decl:
                reading += f"{'; ' if reading else ''}{len(d.decl['columns'])} columns (exactly)"
            what = ", ".join(f"{k} <- {v}" for k, v in d.declared.items()) or "none by name"
            lines.append(f"  source {d.name}: declared {reading or d.decl['format']}; fields {what}")
            for key, g in d.guesses.items():
                lines.append(f"    {key}: {_dump([g.spec])[1:-1]}   # {g.note()}")
            for key, text in d.todos.items():
                lines.append(f"    {key}: {text}")
    for f in result.ignored:
        lines.append(f"{f}: ignored (--ignore)")
    lines.append(
        f"fields are drafted for the answer's key fields {list(result.keys)} (params `task` of --params): "
        f"another answer needs its own `task`"
    )
    keys = [f"fields.{k}_raw" for k in result.keys]
    unmapped = [d.name for d in result.drafts if keys and sum(k in d.todos for k in keys) > len(keys) / 2]
    if unmapped:
        lines.append(
            f"most key fields have no column in {unmapped}: the exports may answer another `task`; "
            f"pass --params of a project whose `task` fits them (docs/init.md)"
        )
    guessed, todos = counts(result)
    lines.append(f"{guessed} guesses to check, {todos} TODOs")
    return "\n".join(lines)


def write_profile(exports: Path | str, name: str, out_root: Path | str, answer: AnswerSchema,
                  ignore: Iterable[str] = (), force: bool = False,
                  base: Path | str = "params.yaml", vocab: Vocab | None = None) -> tuple[Path, Init]:  # fmt: skip
    """Sniff ``exports``, write ``<out_root>/<name>/params.yaml`` and return its path and the result.

    The file ``extends`` ``base`` (the params whose ``task`` gave ``answer``), by a path relative
    to the profile's folder: ``../../params.yaml`` for ``profiles/<name>/`` in the repository root.

    Raises:
        ClapError: rule ``bad_name`` for a name that is not a folder name, ``exists`` when the
            profile's params.yaml exists and ``force`` is not set.
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
        raise ClapError(
            f"profile name {name!r} must be lower-case letters, digits, '-' and '_'", rule="bad_name"
        )
    target = Path(out_root) / name / "params.yaml"
    if target.exists() and not force:
        raise ClapError(
            "profile params exist already (pass --force to overwrite)", file=target, rule="exists"
        )
    result = init_profile(exports, answer, ignore, vocab)
    target.parent.mkdir(parents=True, exist_ok=True)
    extends = Path(os.path.relpath(Path(base).resolve(), target.parent.resolve())).as_posix()
    target.write_text(render_params(result, exports, extends), encoding="utf-8")
    return target, result
