"""Noise injection for the demo batches: every kind of the data-contract catalogue, counted exactly.

For each kind and each file it applies to, ``round(rate * clean rows of the file)`` rows
are drawn from the rows still untouched (one noise per row, so counts never interact).
Rows another noise depends on (an overlap's train partner, a twin's source) are reserved.
Records and KB documents that become malformed are orphans (referenced by no question),
so a rejected row never removes a fact a question needs.

Where each kind is caught (a row's ``noise`` names its kind):

- assetize rejects: ``duplicate_within_system`` (same ID again, rule ``duplicate_id``),
  ``malformed_missing_field`` (``missing_field``), ``malformed_wrong_type`` (``wrong_type``),
  ``malformed_broken_quoting`` (``broken_quoting`` in CSV, ``bad_json`` in JSONL);
- normalize repairs: ``numeric_prefix_label``, ``unit_variant``, ``date_format_variant``,
  ``trailing_whitespace``, ``unicode_lookalike``, ``evidence_not_verbatim`` (NFKC +
  whitespace collapse makes the quote a substring again);
- normalize removes: ``duplicate_across_systems`` (a second record of the same fact in
  another system, new ID, no KB document), ``evidence_not_verbatim_unrepairable``,
  ``evidence_missing_value``, ``overlap_id``/``overlap_text`` (the train partner goes).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from clap.demo import exports as A
from clap.demo import text as T
from clap.demo.render import Row, comma, gold_value, json_number, mes_data, qms_data, question_data
from clap.demo.world import World, number_tokens

CATALOGUE = (
    "numeric_prefix_label",
    "unit_variant",
    "date_format_variant",
    "duplicate_within_system",
    "duplicate_across_systems",
    "evidence_not_verbatim",
    "evidence_not_verbatim_unrepairable",
    "evidence_missing_value",
    "overlap_id",
    "overlap_text",
    "malformed_missing_field",
    "malformed_wrong_type",
    "malformed_broken_quoting",
    "trailing_whitespace",
    "unicode_lookalike",
    "non_utf8_file",
    "answer_wrong_column",
)
# Order of application: kinds that need clean partners or orphans first, copies last.
APPLY_ORDER = (
    "overlap_id",
    "overlap_text",
    "malformed_missing_field",
    "malformed_wrong_type",
    "malformed_broken_quoting",
    "evidence_not_verbatim_unrepairable",
    "evidence_missing_value",
    "evidence_not_verbatim",
    "numeric_prefix_label",
    "unit_variant",
    "date_format_variant",
    "trailing_whitespace",
    "unicode_lookalike",
    "duplicate_across_systems",
    "duplicate_within_system",
)
FILE_ORDER = (A.MES, A.QMS, A.CMMS, A.KB, A.QLOG)
RESERVED = "reserved"
CYRILLIC = {"A": "\u0410", "B": "\u0412", "C": "\u0421"}  # look like Latin A, B, C; NFKC keeps them
NBSP = "\u00a0"


def fullwidth(text: str) -> str:
    """Digits as fullwidth look-alikes (NFKC maps them back)."""
    return "".join(chr(0xFF10 + int(c)) if c.isdigit() else c for c in text)


def norm_text(text: str) -> str:
    """The normalization under which repairable evidence matches: NFKC, collapsed whitespace."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@dataclass
class Ctx:
    """What noise operations may look at: the world, all rows, the rng, ID counters for twins."""

    world: World
    rows: dict[str, list[Row]]
    rng: object
    next_id: dict[str, int]

    def pick(self, seq):
        return seq[self.rng.integers(len(seq))]


@dataclass(frozen=True)
class Op:
    """One noise kind on one file: which rows qualify, and how a chosen row is changed.

    A ``creates`` op adds a new row to its file (a copy or a twin of the chosen row) and
    ``apply`` returns it; ``source`` names the files its candidates come from (default:
    the op's own file).
    """

    eligible: Callable[[Row, Ctx], bool]
    apply: Callable[..., Row | None]
    source: tuple[str, ...] = ()
    creates: bool = False


def _get(obj: dict, path: str):
    for part in path.split("."):
        obj = obj[part]
    return obj


def _set(obj: dict, path: str, value) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = obj[part]
    obj[last] = value


def _delete(obj: dict, path: str) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = obj[part]
    del obj[last]


def _metric(row: Row):
    ref = row.ref
    return T.METRICS[(ref.fact if hasattr(ref, "fact") else ref).metric]


def _answer(row: Row):
    return row.ref.answer


# --- question log ------------------------------------------------------------------------


def _partner(ctx: Ctx) -> Row:
    cands = [r for r in ctx.rows[A.QLOG] if r.noise is None and r.ref.split == "train"]
    partner = ctx.pick(cands)
    partner.noise = RESERVED
    return partner


def _q_overlap_id(row: Row, ctx: Ctx) -> None:
    row.data["question_id"] = _partner(ctx).data["question_id"]


def _q_overlap_text(row: Row, ctx: Ctx) -> None:
    partner = _partner(ctx)
    new = question_data(partner.ref, partner.value_style, clean=True)
    for key in ("question_id", "logged_at", "split"):
        new[key] = row.data[key]
    spaces = [m.start() for m in re.finditer(" ", new["question"])]
    at = ctx.pick(spaces)
    new["question"] = new["question"][:at] + "  " + new["question"][at + 1 :]
    if row.ref.split == "replay":
        new["context_doc_ids"] = []
    row.data = new


def _q_missing(row: Row, ctx: Ctx) -> None:
    _delete(row.data, ctx.pick(("gold.value", "gold.evidence", "question", "gold.doc_id", "gold.date")))


def _q_wrong_type(row: Row, ctx: Ctx) -> None:
    forms = ["gold.value", "gold.line"] + (["context_doc_ids"] if row.data["context_doc_ids"] else [])
    path = ctx.pick(forms)
    old = _get(row.data, path)
    if path == "gold.value":
        _set(row.data, path, [old])  # a spreadsheet cell exported as an array
    elif path == "gold.line":
        _set(row.data, path, int(old[1:]))
    else:
        _set(row.data, path, ";".join(old))


def _quote_word(text: str, ctx: Ctx) -> str:
    word = ctx.pick(re.findall(r"[^\W\d_]{3,}", text))
    return text.replace(word, f'"{word}"', 1)


def _q_broken(row: Row, ctx: Ctx) -> None:
    row.data["question"] = _quote_word(row.data["question"], ctx)
    row.unescaped = "question"


def _q_unrepairable(row: Row, ctx: Ctx) -> None:
    ans, m = _answer(row), _metric(row)
    v = T.fmt_value(ans.value, m.decimals)
    forms = [
        f"{ctx.pick(m.labels)} {v} {m.unit}",
        f"{ctx.pick(m.labels)}: {v}{m.unit}",
        f"reported {ctx.pick(m.asked)} of {v} {m.unit}",
    ]
    body = norm_text(ans.body).casefold()
    text = next(f for f in forms if norm_text(f).casefold() not in body)
    row.data["gold"]["evidence"] = text


def _no_value_sentences(row: Row) -> list[str]:
    ans = row.ref.answer
    return [s for s in ans.others if ans.value not in number_tokens(s)]


def _q_missing_value(row: Row, ctx: Ctx) -> None:
    row.data["gold"]["evidence"] = ctx.pick(_no_value_sentences(row))


def _q_not_verbatim(row: Row, ctx: Ctx) -> None:
    e = row.data["gold"]["evidence"]
    at = ctx.pick([m.start() for m in re.finditer(" ", e)])
    form = int(ctx.rng.integers(4))
    blurred = fullwidth(e) if form == 3 else e[:at] + ("  ", NBSP, "\n")[form] + e[at + 1 :]
    assert blurred != e and norm_text(blurred) == norm_text(e)
    row.data["gold"]["evidence"] = blurred


def _prefix(value: float, m, decimal: str = ".") -> str:
    v = T.fmt_value(value, m.decimals).replace(".", decimal)
    return f"{v}%" if m.unit == "%" else v  # as the contract's "98.2% First Pass Yield", "12 Scrap pcs"


def _q_prefix(row: Row, ctx: Ctx) -> None:
    m = _metric(row)
    row.data["gold"]["metric"] = f"{_prefix(_answer(row).value, m)} {ctx.pick(m.labels)}"


def _convert(value: float, unit: str) -> float:
    """``value`` (canonical unit) expressed in the variant ``unit``."""
    return round(value / 100, 6) if unit == "ratio" else (round(value / 60, 4) if unit == "h" else value)


def _variants(m, value: float) -> list[str]:
    return [u for u in m.unit_variants if u != "h" or value % 6 == 0]


def _q_unit(row: Row, ctx: Ctx) -> None:
    m, value = _metric(row), _answer(row).value
    unit = ctx.pick(_variants(m, value))
    decimals = m.decimals if _convert(value, unit) == value else 6
    row.data["gold"]["unit"] = unit
    row.data["gold"]["value"] = gold_value(_convert(value, unit), decimals, row.value_style)


def _date_variant(day, ctx: Ctx) -> str:
    # the source systems' own formats: dotted = day-first, slashed with the year last = US
    return ctx.pick((day.strftime("%d.%m.%Y"), day.strftime("%m/%d/%Y"), day.strftime("%Y/%m/%d")))


def _q_date(row: Row, ctx: Ctx) -> None:
    row.data["gold"]["date"] = _date_variant(row.ref.fact.day, ctx)


def _q_trailing(row: Row, ctx: Ctx) -> None:
    path, pad = ctx.pick((("question", " "), ("gold.line", " "), ("gold.shift", "\t"), ("gold.metric", " ")))
    _set(row.data, path, _get(row.data, path) + pad)


def _q_lookalike(row: Row, ctx: Ctx) -> None:
    g = row.data["gold"]
    form = int(ctx.rng.integers(4))
    if form == 0:
        g["shift"] = CYRILLIC[g["shift"]]
    elif form == 1:
        g["line"] = "L" + fullwidth(g["line"][1:])
    elif form == 2:
        g["date"] = g["date"].replace("-", "\u2013")  # en dash
    else:
        q = row.data["question"]
        at = ctx.pick([m.start() for m in re.finditer(" ", q)])
        row.data["question"] = q[:at] + NBSP + q[at + 1 :]


# --- source records and KB ---------------------------------------------------------------


def _orphan(row: Row, ctx: Ctx) -> bool:
    return row.orphan


def _any(row: Row, ctx: Ctx) -> bool:
    return True


def _blank(*columns: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        row.data[ctx.pick(columns)] = ""

    return apply


def _text_value(column: str, *junk: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        row.data[column] = ctx.pick(junk)

    return apply


def _csv_broken(column: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        word = ctx.pick(("jam", "fixed", "OK", "urgent", "see photo"))
        action = ctx.pick(ctx.pick(T.CMMS_EVENTS)[2])
        row.data[column] = f'Operator wrote "{word}" on the tag, {action[0].lower()}{action[1:]}'
        row.unescaped = column

    return apply


def _json_missing(*paths: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        _delete(row.data, ctx.pick(paths))

    return apply


def _qms_wrong_type(row: Row, ctx: Ctx) -> None:
    if ctx.rng.random() < 0.5:
        row.data["result"]["measured"] = ctx.pick(("n.i.O.", "i.O.", "see report"))
    else:
        row.data["station"] = f"{row.data['station']['line']}/{row.data['station']['shift']}"


def _json_broken(field: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        row.data[field] = _quote_word(row.data[field], ctx)
        row.unescaped = field

    return apply


def _kb_wrong_type(row: Row, ctx: Ctx) -> None:
    row.data["body"] = [s + "." for s in row.data["body"].split(". ")]


def _mes_prefix(row: Row, ctx: Ctx) -> None:
    row.data["kpi"] = f"{_prefix(row.ref.value, _metric(row), ',')} {row.data['kpi']}"


def _qms_prefix(row: Row, ctx: Ctx) -> None:
    res = row.data["result"]
    res["characteristic"] = f"{_prefix(row.ref.value, _metric(row))} {res['characteristic']}"


def _has_variant(row: Row, ctx: Ctx) -> bool:
    return bool(_variants(_metric(row), row.ref.value))


def _mes_unit(row: Row, ctx: Ctx) -> None:
    m, value = _metric(row), row.ref.value
    unit = ctx.pick(_variants(m, value))
    converted = _convert(value, unit)
    row.data["uom"] = unit
    row.data["value"] = (
        comma(converted, m.decimals) if converted == value else f"{converted:g}".replace(".", ",")
    )


def _qms_unit(row: Row, ctx: Ctx) -> None:
    m, value = _metric(row), row.ref.value
    unit = ctx.pick(_variants(m, value))
    row.data["result"]["unit"] = unit
    row.data["result"]["measured"] = json_number(_convert(value, unit), m.decimals)


def _mes_date(row: Row, ctx: Ctx) -> None:
    day = row.ref.day
    row.data["shift_date"] = ctx.pick((day.isoformat(), f"{day.day}.{day.month}.{day.year}"))


def _qms_date(row: Row, ctx: Ctx) -> None:
    f = row.ref
    row.data["recorded_at"] = f"{f.day.strftime('%Y/%m/%d')} {f.minute // 60:02d}:{f.minute % 60:02d}"


def _cmms_date(row: Row, ctx: Ctx) -> None:
    f = row.ref
    row.data["opened"] = f"{f.day.isoformat()} {f.minute // 60:02d}:{f.minute % 60:02d}"


def _pad(*path: str) -> Callable[[Row, Ctx], None]:
    def apply(row: Row, ctx: Ctx) -> None:
        p = ".".join(path)
        _set(row.data, p, _get(row.data, p) + ctx.pick((" ", "  ", "\t")))

    return apply


def _mes_lookalike(row: Row, ctx: Ctx) -> None:
    if ctx.rng.random() < 0.5:
        row.data["line"] = "L" + fullwidth(row.data["line"][1:])
    else:
        row.data["shift"] = CYRILLIC[row.data["shift"]]


def _qms_lookalike(row: Row, ctx: Ctx) -> None:
    row.data["station"]["shift"] = CYRILLIC[row.data["station"]["shift"]]


# --- rows created by noise ---------------------------------------------------------------


def _is_fpy(row: Row, ctx: Ctx) -> bool:
    return row.ref.metric == "first_pass_yield"


def _twin_source(row: Row, ctx: Ctx) -> bool:
    return row.ref.metric in ("first_pass_yield", "downtime")


def _twin(target: str) -> Callable[[Row, Ctx], Row]:
    """The same fact recorded again by ``target``'s system, under a new ID (no KB document)."""

    def apply(src: Row, ctx: Ctx, file: str) -> Row:
        system = A.EXPORTS[target].system
        ctx.next_id[system] += 1
        prefix = {"mes": "SR", "qms": "QI"}[system]
        fact = dataclasses.replace(
            src.ref, system=system, record_id=f"{prefix}-{ctx.world.tag}-{ctx.next_id[system]:05d}"
        )
        data = mes_data(fact, ctx.rng) if system == "mes" else qms_data(fact, ctx.rng)
        if system == "mes":
            data["remark"] = f"Synced from {src.ref.system.upper()} {src.ref.record_id}"
        src.noise = RESERVED
        when = [(r.ref.day, r.ref.minute) for r in sorted(ctx.rows[target], key=lambda r: r.order)]
        at = sum(w <= (fact.day, fact.minute) for w in when)
        return Row(data, fact, at - 0.5, fact.role == "orphan")  # ties keep creation order

    return apply


def _duplicate(row: Row, ctx: Ctx, file: str) -> Row:
    """An exact re-export of ``row`` (same ID), somewhere after the original."""
    top = max(r.order for r in ctx.rows[file])
    order = row.order + (top + 1 - row.order) * float(ctx.rng.uniform(0.01, 1.0))
    return Row(
        copy.deepcopy(row.data),
        row.ref,
        order,
        row.orphan,
        unescaped=row.unescaped,
        value_style=row.value_style,
    )


def _heldout(row: Row, ctx: Ctx) -> bool:
    return row.ref.split in ("eval", "replay")


OPS: dict[str, dict[str, Op]] = {
    "overlap_id": {A.QLOG: Op(_heldout, _q_overlap_id)},
    "overlap_text": {A.QLOG: Op(_heldout, _q_overlap_text)},
    "malformed_missing_field": {
        A.MES: Op(_orphan, _blank("value", "line", "shift_date", "kpi")),
        A.QMS: Op(_orphan, _json_missing("result.measured", "station.line", "recorded_at")),
        A.CMMS: Op(_orphan, _blank("downtime_min", "line", "opened")),
        A.KB: Op(_orphan, _json_missing("body", "record_ref", "title")),
        A.QLOG: Op(_any, _q_missing),
    },
    "malformed_wrong_type": {
        A.MES: Op(_orphan, _text_value("value", "n/a", "#WERT!", "k. A.")),
        A.QMS: Op(_orphan, _qms_wrong_type),
        A.CMMS: Op(_orphan, _text_value("downtime_min", "approx. 30", "tbd", "n/a")),
        A.KB: Op(_orphan, _kb_wrong_type),
        A.QLOG: Op(_any, _q_wrong_type),
    },
    "malformed_broken_quoting": {
        A.MES: Op(_orphan, _csv_broken("remark")),
        A.QMS: Op(_orphan, _json_broken("inspector")),
        A.CMMS: Op(_orphan, _csv_broken("summary")),
        A.KB: Op(_orphan, _json_broken("title")),
        A.QLOG: Op(_any, _q_broken),
    },
    "evidence_not_verbatim_unrepairable": {A.QLOG: Op(_any, _q_unrepairable)},
    "evidence_missing_value": {A.QLOG: Op(lambda r, c: bool(_no_value_sentences(r)), _q_missing_value)},
    "evidence_not_verbatim": {A.QLOG: Op(_any, _q_not_verbatim)},
    "numeric_prefix_label": {
        A.MES: Op(_any, _mes_prefix),
        A.QMS: Op(_any, _qms_prefix),
        A.QLOG: Op(_any, _q_prefix),
    },
    "unit_variant": {
        A.MES: Op(_has_variant, _mes_unit),
        A.QMS: Op(_has_variant, _qms_unit),
        A.QLOG: Op(lambda r, c: bool(_variants(_metric(r), _answer(r).value)), _q_unit),
    },
    "date_format_variant": {
        A.MES: Op(_any, _mes_date),
        A.QMS: Op(_any, _qms_date),
        A.CMMS: Op(_any, _cmms_date),
        A.QLOG: Op(_any, _q_date),
    },
    "trailing_whitespace": {
        A.MES: Op(_any, _pad("line")),
        A.QMS: Op(_any, _pad("station", "line")),
        A.CMMS: Op(_any, _pad("line")),
        A.QLOG: Op(_any, _q_trailing),
    },
    "unicode_lookalike": {
        A.MES: Op(_any, _mes_lookalike),
        A.QMS: Op(_any, _qms_lookalike),
        A.QLOG: Op(_any, _q_lookalike),
    },
    "duplicate_across_systems": {
        A.MES: Op(_twin_source, _twin(A.MES), (A.QMS, A.CMMS), True),
        A.QMS: Op(_is_fpy, _twin(A.QMS), (A.MES,), True),
    },
    "duplicate_within_system": {f: Op(_any, _duplicate, creates=True) for f in FILE_ORDER},
}


def inject(rows: dict[str, list[Row]], world: World, rates, rng) -> dict[str, dict[str, int]]:
    """Apply every rated noise kind to ``rows`` in place (new rows are appended).

    Args:
        rows: file -> clean rows (from :func:`clap.demo.render.build_rows`).
        world: the batch's world.
        rates: :class:`clap.demo.generate.NoiseRates` (fraction of a file's clean rows per kind).
        rng: the batch's generator.

    Returns:
        kind -> file -> number of rows that got it.

    Raises:
        ValueError: a file has too few eligible rows for a rate.
    """
    base = {f: len(rows[f]) for f in FILE_ORDER}
    ctx = Ctx(world, rows, rng, _id_counters(rows))
    counts: dict[str, dict[str, int]] = {}
    for kind in APPLY_ORDER:
        for file, op in OPS[kind].items():
            k = round(getattr(rates, kind) * base[file])
            pool = [
                r for f in (op.source or (file,)) for r in rows[f] if r.noise is None and op.eligible(r, ctx)
            ]
            if k > len(pool):
                raise ValueError(f"{kind}: {k} rows wanted in {file}, only {len(pool)} eligible")
            for i in sorted(int(x) for x in rng.choice(len(pool), size=k, replace=False)):
                _apply(kind, file, op, pool[i], ctx)
            counts.setdefault(kind, {})[file] = k
    return counts


def _apply(kind: str, file: str, op: Op, row: Row, ctx: Ctx) -> None:
    if op.creates:
        new = op.apply(row, ctx, file)
        new.noise = kind
        ctx.rows[file].append(new)
    else:
        op.apply(row, ctx)
        row.noise = kind


def _id_counters(rows: dict[str, list[Row]]) -> dict[str, int]:
    def top(file: str, key: str) -> int:
        return max((int(r.data[key].rsplit("-", 1)[1]) for r in rows[file]), default=100)

    return {"mes": top(A.MES, "report_id"), "qms": top(A.QMS, "inspection_id")}
