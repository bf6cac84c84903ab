"""Rows of the five raw exports of a demo batch, and their rendering to file text.

A :class:`Row` holds one record as its source system would export it (CSV fields as
strings, JSON objects as nested dicts). Noise edits rows in place; :func:`render` then
writes each file the way its system does (MES ``;`` + decimal comma + day-first dates;
CMMS ``,`` + CRLF + quoted multi-line text + US dates; JSONL for QMS, KB and question log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clap.demo import exports as A
from clap.demo import text as T
from clap.demo.world import Fact, Item, World, local_offset

JSON_SEPARATORS = {A.QMS: (",", ":"), A.KB: (", ", ": "), A.QLOG: (", ", ": ")}
BROKEN = "@@BROKEN@@"  # placeholder for a JSON string written with unescaped quotes


@dataclass
class Row:
    """One exported record.

    Attributes:
        data: CSV column -> text, or the JSON object.
        ref: the Fact (records, KB) or Item (questions) the row came from.
        order: sort key inside its file (copies and twins slot in between originals).
        noise: the noise kind applied, ``"reserved"`` for a row another noise depends on.
        unescaped: a field written between quotes without escaping (broken quoting).
        value_style: questions only: ``number`` | ``text`` | ``text_comma`` for gold.value.
        line: physical line where the record starts (set by :func:`render`).
    """

    data: dict[str, Any]
    ref: Fact | Item
    order: float
    orphan: bool = False
    noise: str | None = None
    unescaped: str | None = None
    value_style: str = "number"
    line: int = 0


def comma(value: float, decimals: int) -> str:
    """A number the way the MES writes it: decimal comma."""
    return T.fmt_value(value, decimals).replace(".", ",")


def json_number(value: float, decimals: int) -> int | float:
    """A value as a JSON number: an int for whole-number metrics (pcs, min, ppm)."""
    return int(value) if decimals == 0 and float(value).is_integer() else float(value)


def iso_stamp(f: Fact) -> str:
    """QMS timestamp: ISO-8601 local time with the plant's offset."""
    return f"{f.day.isoformat()}T{f.minute // 60:02d}:{f.minute % 60:02d}:00{local_offset(f.day)}"


def us_stamp(f: Fact) -> str:
    """CMMS timestamp: US ``MM/DD/YYYY HH:MM``."""
    return f"{f.day.month:02d}/{f.day.day:02d}/{f.day.year} {f.minute // 60:02d}:{f.minute % 60:02d}"


def mes_data(f: Fact, rng) -> dict[str, str]:
    """The MES row of a fact (one KPI per row, label variant drawn from ``rng``)."""
    m = T.METRICS[f.metric]
    return {
        "report_id": f.record_id,
        "shift_date": f.day.strftime("%d.%m.%Y"),
        "line": f.line,
        "shift": f.shift,
        "kpi": m.labels[rng.integers(len(m.labels))],
        "value": comma(f.value, m.decimals),
        "uom": m.unit,
        "remark": f.note,
    }


def qms_data(f: Fact, rng) -> dict[str, Any]:
    """The nested QMS object of a fact."""
    m = T.METRICS[f.metric]
    return {
        "inspection_id": f.record_id,
        "recorded_at": iso_stamp(f),
        "station": {"line": f.line, "shift": f.shift},
        "result": {
            "characteristic": m.labels[rng.integers(len(m.labels))],
            "measured": json_number(f.value, m.decimals),
            "unit": m.unit,
        },
        "inspector": f.note,
    }


def cmms_data(f: Fact) -> dict[str, str]:
    """The CMMS ticket of a downtime fact."""
    return {
        "ticket_id": f.record_id,
        "opened": us_stamp(f),
        "line": f.line,
        "shift": f.shift,
        "category": f.category,
        "downtime_min": T.fmt_value(f.value, 0),
        "summary": f.note,
    }


def kb_data(f: Fact) -> dict[str, str]:
    """The KB document describing a fact."""
    return {
        "doc_id": f.doc_id,
        "system": f.system,
        "record_ref": f.record_id,
        "title": f.title,
        "body": f.body,
    }


def gold_value(value: float, decimals: int, style: str) -> int | float | str:
    """gold.value as the reviewer typed it: a JSON number or text (decimal point or comma)."""
    if style == "number":
        return json_number(value, decimals)
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text.replace(".", ",") if style == "text_comma" else text


def question_data(it: Item, style: str, *, clean: bool = False) -> dict[str, Any]:
    """The logged question; ``clean`` uses the uncorrupted answer."""
    ans = it.fact if clean else it.answer
    m = T.METRICS[it.fact.metric]
    gold = {
        "metric": it.metric_label,
        "value": gold_value(ans.value, m.decimals, style),
        "unit": m.unit,
        "line": it.fact.line,
        "shift": it.fact.shift,
        "date": it.fact.day.isoformat(),
        "evidence": ans.evidence,
        "doc_id": ans.doc_id,
    }
    return {
        "question_id": it.qid,
        "logged_at": it.logged_at,
        "split": it.split,
        "question": it.question,
        "question_type": it.qtype,
        "context_doc_ids": list(it.context),
        "gold": gold,
    }


def build_rows(world: World, value_as_text: float, rng) -> dict[str, list[Row]]:
    """Clean rows of every raw file, in export order."""
    by_system = {s: [f for f in world.facts if f.system == s] for s in ("mes", "qms", "cmms")}
    rows = {
        A.MES: [Row(mes_data(f, rng), f, i, f.role == "orphan") for i, f in enumerate(by_system["mes"])],
        A.QMS: [Row(qms_data(f, rng), f, i, f.role == "orphan") for i, f in enumerate(by_system["qms"])],
        A.CMMS: [Row(cmms_data(f), f, i, f.role == "orphan") for i, f in enumerate(by_system["cmms"])],
        A.KB: [
            Row(kb_data(f), f, i, f.role == "orphan")
            for i, f in enumerate(sorted(world.facts, key=lambda f: f.doc_id))
        ],
    }
    questions = []
    for i, it in enumerate(sorted(world.items, key=lambda it: (it.logged_at, it.qid))):
        u = rng.random()
        style = "number" if u >= value_as_text else ("text" if u < value_as_text / 2 else "text_comma")
        questions.append(Row(question_data(it, style), it, i, value_style=style))
    rows[A.QLOG] = questions
    return rows


def csv_field(text: str, delim: str) -> str:
    """Minimal quoting, as spreadsheet exports do: quote only when needed, double inner quotes."""
    if any(c in text for c in (delim, '"', "\n", "\r")):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv_record(row: Row, columns: tuple[str, ...], delim: str) -> str:
    cells = [f'"{row.data[c]}"' if c == row.unescaped else csv_field(row.data[c], delim) for c in columns]
    return delim.join(cells)


def _json_record(row: Row, separators: tuple[str, str]) -> str:
    if row.unescaped is None:
        return json.dumps(row.data, ensure_ascii=False, separators=separators)
    obj = dict(row.data, **{row.unescaped: BROKEN})
    text = json.dumps(obj, ensure_ascii=False, separators=separators)
    return text.replace(f'"{BROKEN}"', f'"{row.data[row.unescaped]}"')


def render(file: str, rows: list[Row]) -> str:
    """The file's text; sets every row's ``line`` (1-based physical start line)."""
    spec = A.EXPORTS[file]
    ordered = sorted(rows, key=lambda r: r.order)
    if spec.kind == "csv":
        records = [_csv_record(r, spec.columns, spec.delimiter) for r in ordered]
        newline = "\r\n" if file == A.CMMS else "\n"  # the CMMS runs on Windows
        lines_before, line = [spec.delimiter.join(spec.columns)], 2
    else:
        records = [_json_record(r, JSON_SEPARATORS[file]) for r in ordered]
        newline, lines_before, line = "\n", [], 1
    for r, rec in zip(ordered, records):
        r.line = line
        line += rec.count("\n") + 1
    return newline.join(lines_before + records) + newline
