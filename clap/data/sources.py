"""Declared raw sources: how each export of a batch is read, and how its fields map onto the assets.

A batch folder holds a company's exports as they are. params ``assetize.sources`` declares each
of them (docs/data-contract.md, "Declaring a source"): which files (a glob), the format
(``csv``, ``jsonl``, ``json``, ``parquet``, ``xlsx``) with its options (encodings, delimiter,
decimal separator, multi-line columns, a JSON records path, a sheet), which canonical asset it
feeds (``records``: facts, ``documents``: what retrieval searches and evidence is quoted from,
``questions``: the question log with gold answers) and a mapping from asset columns to the
source's columns or (nested) keys. This module turns that declaration into checked
:class:`Source` objects and reads a file into rows (:class:`Row`); clap.data.assetize maps the
rows onto assets and rejects. No source is known to the code: the demo's five exports are one
declaration, TAT-QA's report format another.

Paths: ``a.b.c`` walks nested objects, ``^`` steps to the enclosing element of an exploded list
(``^.table.uid`` from a question of a TAT-QA context is that context's table uid), ``#`` is the
element's 0-based position in its list, a number picks a list's element (``answer.0``). A source may
keep only rows whose value at a path is one of a list (``only: {answer_type: [span]}``): any other row
is an ``excluded`` reject, so the declaration, not the code, says what a source contributes. A records path ending a segment in ``[*]`` explodes a
list: ``[*].questions[*]`` yields every question of every context.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from clap.errors import ClapError
from clap.params import bad_param

FORMATS = ("csv", "jsonl", "json", "parquet", "xlsx")
TEXT_FORMATS = ("csv", "jsonl", "json")
TARGETS = ("records", "documents", "questions")
FIELD_TYPES = ("text", "optional_text", "number", "value", "text_list", "json")
SPLITS = ("train", "eval", "replay")
PARAMS = "params.yaml"
ROW = "<row>"  # the ``column`` of a reject about the whole row


class RowProblem(Exception):
    """A row-level problem: the row goes to rejects with this rule/column/detail."""

    def __init__(self, rule: str, column: str, detail: str):
        super().__init__(detail)
        self.rule, self.column, self.detail = rule, column, detail


# --- the declaration -------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """Where one asset column comes from.

    Exactly one form: ``path`` (with ``type``), ``const``, ``template`` (``{path}`` placeholders),
    ``hash`` (a seeded hash of ``path``'s value picks one of ``shares``' labels: a split assigned
    per group, e.g. per report table) or ``documents_of`` (the ids of every document of the batch
    whose ``record_ref`` equals that path's value).
    """

    kind: str  # path | const | template | hash | documents_of
    path: str = ""
    type: str = "text"
    const: Any = None
    template: str = ""
    seed: int = 0
    shares: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class TableSpec:
    """A documents source whose records are tables: every data row becomes one document."""

    cells: str  # path (from the record) of the rows: a list of lists of cell strings
    header_rows: int | str  # an int, or "auto": the leading rows whose first cell is blank (at least 1)


@dataclass(frozen=True)
class Source:
    """One declared raw export (params ``assetize.sources.<name>``)."""

    name: str  # also the ``source_system`` of its records and rejects
    files: str  # glob relative to the batch folder
    format: str
    target: str
    id: str  # asset column whose raw value names a row in rejects and duplicate messages
    unique: tuple[str, ...]  # asset columns that identify a row: a repeat is a duplicate_id reject
    fields: Mapping[str, FieldSpec]
    encodings: tuple[str, ...] = ()
    delimiter: str = ""
    decimal: str = "."
    multiline: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()  # csv/xlsx/parquet: when given, the header must be exactly these
    records: str = ""  # json: the records path ("[*]": the top-level array)
    sheet: str = ""  # xlsx: the sheet name
    table: TableSpec | None = None
    only: tuple[
        tuple[str, tuple[Any, ...]], ...
    ] = ()  # (path, kept values): other rows are `excluded` rejects

    def where(self, key: str = "") -> str:
        return f"assetize.sources.{self.name}" + (f".{key}" if key else "")


def _keys(raw: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(raw, dict):
        raise bad_param(where, f"{where} must be a mapping, got {type(raw).__name__}")
    missing, unknown = sorted(required - set(raw)), sorted(set(raw) - required - set(optional))
    if missing:
        raise ClapError(
            f"missing key {missing[0]!r} in {where}",
            file=PARAMS,
            column=f"{where}.{missing[0]}",
            rule="missing_param",
        )
    if unknown:
        raise ClapError(
            f"unknown key {unknown[0]!r} in {where} (allowed: {sorted(required | set(optional))})",
            file=PARAMS,
            column=f"{where}.{unknown[0]}",
            rule="unknown_param",
        )
    return raw


def parse_field(raw: Any, where: str) -> FieldSpec:
    """One ``fields`` entry: a path string, or a mapping of exactly one form (see :class:`FieldSpec`)."""
    if isinstance(raw, str):
        return FieldSpec("path", path=raw)
    forms = {
        "from": ({"from"}, {"type"}),
        "const": ({"const"}, set()),
        "template": ({"template"}, set()),
        "hash": ({"hash", "seed", "shares"}, set()),
        "documents_of": ({"documents_of"}, set()),
    }
    if not isinstance(raw, dict) or len([f for f in forms if f in raw]) != 1:
        raise bad_param(where, f"{where} must be a column/key path or a mapping with one of {sorted(forms)}")
    form = next(f for f in forms if f in raw)
    _keys(raw, where, *forms[form])
    if form == "from":
        kind = raw.get("type", "text")
        if kind not in FIELD_TYPES:
            raise bad_param(f"{where}.type", f"{where}.type {kind!r} is not one of {list(FIELD_TYPES)}")
        return FieldSpec("path", path=str(raw["from"]), type=kind)
    if form == "const":
        return FieldSpec("const", const=raw["const"])
    if form == "template":
        return FieldSpec("template", template=str(raw["template"]))
    if form == "documents_of":
        return FieldSpec("documents_of", path=str(raw["documents_of"]))
    shares = raw["shares"]
    if (
        not isinstance(shares, dict)
        or not shares
        or not all(isinstance(v, (int, float)) and v >= 0 for v in shares.values())
        or abs(sum(shares.values()) - 1) > 1e-9
    ):
        raise bad_param(f"{where}.shares", f"{where}.shares must map labels to shares >= 0 that sum to 1")
    return FieldSpec(
        "hash",
        path=str(raw["hash"]),
        seed=int(raw["seed"]),
        shares=tuple((str(k), float(v)) for k, v in shares.items()),
    )


def parse_sources(raw: Any, columns: Mapping[str, tuple[str, ...]]) -> tuple[Source, ...]:
    """Check the declaration ``assetize.sources`` and build its sources.

    Args:
        raw: the mapping name -> declaration from params.yaml.
        columns: target -> the asset columns a source of that target must map (every one).

    Raises:
        ClapError: naming params.yaml and the dotted key of the first problem.
    """
    if not isinstance(raw, dict) or not raw:
        raise bad_param("assetize.sources", "assetize.sources must map source names to declarations")
    return tuple(_parse_source(name, decl, columns) for name, decl in raw.items())


def _refuse_todo(value: Any, where: str) -> None:
    """A ``TODO: ...`` string left in a declaration (``clap init`` drafts them) is a choice not made yet.

    Read as a path it would silently map a column named "TODO: ..."; refused first, naming the key.
    """
    if isinstance(value, str) and value.lstrip().startswith("TODO"):
        raise ClapError(
            f"{where} is still a TODO of `clap init` ({value[:160]!r}): choose it (docs/init.md)",
            file=PARAMS,
            column=where,
            rule="todo_param",
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse_todo(v, f"{where}.{k}")
    elif isinstance(value, list):
        for k, v in enumerate(value):
            _refuse_todo(v, f"{where}.{k}")


# the keys each format's declaration has besides the common ones
_FORMAT_KEYS = {
    "csv": {"csv", "encodings"},
    "jsonl": {"encodings"},
    "json": {"json", "encodings"},
    "parquet": set(),
    "xlsx": {"xlsx"},
}


def _parse_source(name: Any, decl: Any, columns: Mapping[str, tuple[str, ...]]) -> Source:
    """One source's declaration (``assetize.sources.<name>``), checked, as a :class:`Source`."""
    where = f"assetize.sources.{name}"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", str(name)):
        raise bad_param(where, f"source name {name!r} must be lower-case letters, digits and '_'")
    _refuse_todo(decl, where)
    fmt = decl.get("format") if isinstance(decl, dict) else None
    if fmt not in _FORMAT_KEYS:
        raise bad_param(f"{where}.format", f"{where}.format must be one of {list(FORMATS)}, got {fmt!r}")
    _keys(
        decl,
        where,
        {"files", "format", "target", "id", "unique", "fields"} | _FORMAT_KEYS[fmt],
        {"columns", "table", "only"},
    )
    target = decl["target"]
    if target not in TARGETS:
        raise bad_param(f"{where}.target", f"{where}.target must be one of {list(TARGETS)}, got {target!r}")
    fields = decl["fields"]
    have = _mapped_columns(fields, columns, target, where)
    unique = tuple(decl["unique"]) if isinstance(decl["unique"], list) else ()
    if not unique or not set(unique) <= have or decl["id"] not in have:
        raise bad_param(f"{where}.unique", f"{where}.unique (a list) and {where}.id must name mapped columns")
    kw = _read_options(decl, fmt, where)
    kw.update(_row_options(decl, fmt, target, where))
    return Source(
        name=str(name),
        files=str(decl["files"]),
        format=fmt,
        target=target,
        id=str(decl["id"]),
        unique=unique,
        fields={k: parse_field(v, f"{where}.fields.{k}") for k, v in fields.items()},
        **kw,
    )


def _mapped_columns(fields: Any, columns: Mapping[str, tuple[str, ...]], target: str, where: str) -> set[str]:
    """The asset columns ``fields`` maps: exactly the columns of ``target`` assets (``columns[target]``)."""
    if not isinstance(fields, dict):
        raise bad_param(f"{where}.fields", f"{where}.fields must map asset columns to source fields")
    need, have = columns[target], set(fields)
    if sorted(have - set(need)):
        bad = sorted(have - set(need))[0]
        raise bad_param(
            f"{where}.fields.{bad}",
            f"{where}.fields.{bad}: {target} assets have no column {bad!r} (columns: {list(need)})",
        )
    if [c for c in need if c not in have]:
        miss = [c for c in need if c not in have][0]
        raise ClapError(
            f"{where}.fields must map the {target} column {miss!r}",
            file=PARAMS,
            column=f"{where}.fields.{miss}",
            rule="missing_param",
        )
    return have


def _read_options(decl: dict, fmt: str, where: str) -> dict[str, Any]:
    """How a file of the source is read (:class:`Source` keywords): encodings, the csv, json and xlsx
    options of its format, the exact header (``columns``)."""
    kw: dict[str, Any] = {}
    if fmt in TEXT_FORMATS:
        enc = decl["encodings"]
        if not isinstance(enc, list) or not enc or not all(isinstance(e, str) for e in enc):
            raise bad_param(
                f"{where}.encodings", f"{where}.encodings must be a non-empty list of encoding names"
            )
        kw["encodings"] = tuple(enc)
    if fmt == "csv":
        c = _keys(decl["csv"], f"{where}.csv", {"delimiter", "decimal", "multiline"})
        if len(str(c["delimiter"])) != 1 or c["delimiter"] in '"\n\r':
            raise bad_param(
                f"{where}.csv.delimiter", f"{where}.csv.delimiter must be one character other than a quote"
            )
        kw.update(delimiter=c["delimiter"], multiline=tuple(c["multiline"]))
        kw["decimal"] = _decimal(c["decimal"], f"{where}.csv.decimal")
    if fmt == "json":
        kw["records"] = str(_keys(decl["json"], f"{where}.json", {"records"})["records"])
    if fmt == "xlsx":
        x = _keys(decl["xlsx"], f"{where}.xlsx", {"sheet", "decimal"})
        kw.update(sheet=str(x["sheet"]), decimal=_decimal(x["decimal"], f"{where}.xlsx.decimal"))
    if "columns" in decl:
        if fmt not in ("csv", "xlsx", "parquet"):
            raise bad_param(f"{where}.columns", f"{where}.columns applies to csv, xlsx and parquet sources")
        kw["columns"] = tuple(decl["columns"])
    return kw


def _row_options(decl: dict, fmt: str, target: str, where: str) -> dict[str, Any]:
    """Which rows the source yields (:class:`Source` keywords): the kept values (``only``) and the
    table a documents source's records hold (``table``)."""
    kw: dict[str, Any] = {}
    if "only" in decl:
        only = decl["only"]
        if (
            not isinstance(only, dict)
            or not only
            or not all(isinstance(v, list) and v for v in only.values())
        ):
            raise bad_param(
                f"{where}.only", f"{where}.only must map paths to the non-empty list of values a kept row has"
            )
        kw["only"] = tuple((str(k), tuple(v)) for k, v in only.items())
    if "table" in decl:
        t = _keys(decl["table"], f"{where}.table", {"cells", "header_rows"})
        if target != "documents" or fmt not in ("json", "jsonl"):
            raise bad_param(f"{where}.table", f"{where}.table applies to json/jsonl documents sources")
        if not (t["header_rows"] == "auto" or (isinstance(t["header_rows"], int) and t["header_rows"] >= 0)):
            raise bad_param(
                f"{where}.table.header_rows", f"{where}.table.header_rows must be 'auto' or an int >= 0"
            )
        kw["table"] = TableSpec(str(t["cells"]), t["header_rows"])
    return kw


def _decimal(value: Any, where: str) -> str:
    if value not in (".", ","):
        raise bad_param(where, f"{where} must be '.' or ','")
    return value


# --- paths -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One element of a parsed file: its value, the element it was exploded from, its list position."""

    value: Any
    parent: Node | None = None
    index: int = 0


def shorten(v: Any) -> str:
    try:
        text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        text = repr(text) if isinstance(v, str) else text
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def lookup(node: Node, path: str) -> tuple[bool, Any]:
    """``(present, value)`` of ``path`` from ``node``; a non-object on the way is a wrong type.

    Raises:
        RowProblem: ``wrong_type`` when a segment other than the last meets a non-object.
    """
    cur: Node | None = node
    value: Any = node.value
    parts = path.split(".") if path else []
    for k, part in enumerate(parts):
        if part == "^":
            cur = cur.parent if cur is not None else None
            if cur is None:
                raise RowProblem("wrong_type", path, f"{path}: no enclosing element at '^' number {k + 1}")
            value = cur.value
            continue
        if part == "#":
            return True, cur.index if cur is not None else 0
        if part.isdigit() and isinstance(value, list):  # a list element by its 0-based position
            if int(part) >= len(value):
                return False, None
            value, cur = value[int(part)], None
            continue
        if not isinstance(value, dict):
            prefix = ".".join(parts[:k]) or "<row>"
            raise RowProblem("wrong_type", prefix, f"{prefix} must be an object, got {shorten(value)}")
        if part not in value:
            return False, None
        value, cur = value[part], None
    return True, value


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def render_template(node: Node, template: str) -> str:
    """``template`` with each ``{path}`` replaced by that path's value (a missing value is a reject)."""

    def one(m: re.Match) -> str:
        present, v = lookup(node, m.group(1))
        if not present or v is None or isinstance(v, (dict, list)):
            raise RowProblem(
                "missing_field", m.group(1), f"{m.group(1)} (in template {template!r}) is missing"
            )
        return str(v)

    return _PLACEHOLDER.sub(one, template)


def hash_label(key: str, seed: int, shares: tuple[tuple[str, float], ...]) -> str:
    """The label a seeded hash of ``key`` falls into: cumulative ``shares`` over u in [0, 1).

    ``u = int(sha256(f"{seed}:{key}")[:8 bytes]) / 2**64``; the same key always gets the same
    label, so every row of one group (e.g. one report table) lands in one split.
    """
    u = int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") / 2**64
    acc = 0.0
    for label, share in shares:
        acc += share
        if u < acc:
            return label
    return shares[-1][0]


def explode(root: Any, path: str, file: str) -> Iterator[Node]:
    """The elements of ``root`` at the records path (``[*]`` segments explode lists).

    Every element's parent (``^``) is the object it was taken from. A value on the way that is
    not what the path says is a file-level error before the first list is exploded (the file's
    shape is not the declared one) and a row-level problem below it, yielded as a :class:`Node`
    whose value is the :class:`RowProblem` (one reject for the element that lacks it).
    """
    segments = [s for s in path.split(".") if s] if path else []
    yield from _explode(Node(root), segments, file, exploded=False)


def _explode(node: Node, segments: list[str], file: str, exploded: bool) -> Iterator[Node]:
    if not segments:
        yield node
        return
    seg, rest = segments[0], segments[1:]
    key, star = (seg[:-3], True) if seg.endswith("[*]") else (seg, False)
    value = node.value
    if key:
        if not isinstance(value, dict) or key not in value:
            problem = f"expected an object with key {key!r}, got {shorten(value)}"
            if not exploded:
                raise ClapError(f"records path: {problem}", file=file, column=key, rule="wrong_shape")
            yield Node(RowProblem("missing_field", key, f"{key} is missing: {problem}"), node, node.index)
            return
        value = value[key]
    if not star:
        yield from _explode(Node(value, node, node.index), rest, file, exploded)
        return
    if not isinstance(value, list):
        what = f"{key or 'the file'} must be a JSON array, got {shorten(value)}"
        if not exploded:
            raise ClapError(f"records path: {what}", file=file, column=key or ROW, rule="wrong_shape")
        yield Node(RowProblem("wrong_type", key, what), node, node.index)
        return
    for i, v in enumerate(value):
        yield from _explode(Node(v, node, i), rest, file, exploded=True)


# --- tabular formats ---------------------------------------------------------------------------


def read_parquet(data: bytes, file: str) -> list[dict[str, Any]]:
    """Rows of a Parquet file as dicts (column -> Python value); a non-Parquet file is an error."""
    import pyarrow.parquet as pq

    if data[:4] != b"PAR1":
        raise ClapError("file is not Parquet (no PAR1 magic)", file=file, rule="wrong_shape")
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as e:  # pyarrow raises several types for broken files
        raise ClapError(f"Parquet file cannot be read: {e}", file=file, rule="wrong_shape") from e
    return table.to_pylist()


def read_xlsx(data: bytes, file: str, sheet: str) -> list[list[Any]]:
    """The cell values of one sheet, row by row (header first); a non-xlsx file is an error."""
    from python_calamine import CalamineWorkbook

    if data[:4] != b"PK\x03\x04":
        raise ClapError("file is not an xlsx workbook (no ZIP signature)", file=file, rule="wrong_shape")
    try:
        wb = CalamineWorkbook.from_filelike(io.BytesIO(data))
    except Exception as e:  # calamine raises its own error types
        raise ClapError(f"workbook cannot be read: {e}", file=file, rule="wrong_shape") from e
    if sheet not in wb.sheet_names:
        raise ClapError(
            f"sheet {sheet!r} not in the workbook (sheets: {wb.sheet_names})",
            file=file,
            column=sheet,
            rule="missing_sheet",
        )
    return wb.get_sheet_by_name(sheet).to_python(skip_empty_area=False)


def table_rows(cells: Any, header_rows: int | str) -> tuple[list[list[str]], list[tuple[int, list[str]]]]:
    """``(header rows, [(1-based row number, data row)])`` of a table given as lists of cell strings."""
    rows = [[str(c) for c in r] for r in cells]
    if header_rows == "auto":
        n = 1
        while n < len(rows) and not rows[n][:1] == [] and not rows[n][0].strip():
            n += 1
        header_rows = min(n, len(rows))
    return rows[:header_rows], [(k + 1, r) for k, r in enumerate(rows) if k >= header_rows]


def render_row(header: list[list[str]], row: list[str]) -> str:
    """One table row as retrievable text: ``label: col header cell; col header cell; ...``.

    A column's header is its header rows' non-blank cells joined by a space; the first cell is
    the row's label. Blank cells are left out.
    """
    label = row[0].strip() if row else ""
    parts = []
    for j, cell in enumerate(row[1:], start=1):
        if not cell.strip():
            continue
        head = " ".join(h[j].strip() for h in header if j < len(h) and h[j].strip())
        parts.append(f"{head} {cell.strip()}" if head else cell.strip())
    return f"{label}: {'; '.join(parts)}" if label else "; ".join(parts)
