"""clap.data.assetize: parsing primitives (property tests) and conservation on the committed batches."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clap.data import assetize as A
from clap.demo.render import csv_field
from clap.params import section
from clap.task.answer import load_answer_schema

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "data" / "raw"
BATCHES = sorted(p.name for p in RAW.iterdir() if p.is_dir()) if RAW.is_dir() else []
P = section("assetize", A.AssetizeParams, ROOT / "params.yaml")
ANSWER = load_answer_schema(ROOT / "params.yaml")
# noise kind (MANIFEST.json) -> the reject rules assetize gives it
CAUGHT = {
    "duplicate_within_system": {"duplicate_id"},
    "malformed_missing_field": {"missing_field"},
    "malformed_wrong_type": {"wrong_type"},
    "malformed_broken_quoting": {"broken_quoting", "bad_json"},
}


# --- parse_decimal -----------------------------------------------------------------------


@given(
    st.integers(0, 10**9),
    st.integers(0, 9999),
    st.integers(0, 4),
    st.sampled_from([",", "."]),
    st.booleans(),
    st.booleans(),
)
def test_parse_decimal_reads_grouped_and_plain_numbers(whole, frac, digits, decimal, grouped, negative):
    thousands = "." if decimal == "," else ","
    int_text = f"{whole:,}".replace(",", thousands) if grouped else str(whole)
    frac_text = str(frac).zfill(4)[:digits]
    text = ("-" if negative else "") + int_text + (decimal + frac_text if digits else "")
    expected = float(("-" if negative else "") + str(whole) + ("." + frac_text if digits else ""))
    assert A.parse_decimal(f" {text} ", decimal) == expected


@pytest.mark.parametrize(
    "text,decimal",
    [
        ("2.4", ","),
        ("2,4", "."),
        ("n/a", ","),
        ("", ","),
        ("1.25,0", ","),
        ("12,34.5", "."),
        ("1 000", ","),
        ("2,", ","),
        (",5", ","),
        ("1e3", "."),
    ],
)
def test_parse_decimal_refuses_ambiguous_or_foreign_numbers(text, decimal):
    with pytest.raises(ValueError):
        A.parse_decimal(text, decimal)


# --- split_csv ---------------------------------------------------------------------------

FIELD = st.text(alphabet='ab ;,"\r\n1é', max_size=8)


@st.composite
def csv_tables(draw):
    """(delimiter, newline, records); only the last column may hold line breaks."""
    delim = draw(st.sampled_from([";", ","]))
    ncols = draw(st.integers(2, 4))
    rows = draw(
        st.lists(
            st.tuples(*[FIELD.map(lambda s: s.replace("\n", " ")) for _ in range(ncols - 1)], FIELD),
            min_size=1,
            max_size=6,
        )
    )
    return delim, draw(st.sampled_from(["\n", "\r\n"])), [list(r) for r in rows]


@settings(max_examples=120, deadline=None)
@given(csv_tables())
def test_split_csv_round_trips_records_and_start_lines(table):
    delim, newline, rows = table
    records = [delim.join(csv_field(f, delim) for f in r) for r in rows]
    text = newline.join(records) + newline
    out = A.split_csv(text, delim, frozenset({len(rows[0]) - 1}))
    assert [list(r.fields) for r in out] == rows
    starts, line = [], 1
    for rec in records:
        starts.append(line)
        line += rec.count("\n") + 1
    assert [r.line for r in out] == starts
    assert all(r.error is None for r in out)
    # what the generator writes is standard CSV: Python's reader agrees
    assert list(csv.reader(io.StringIO(text, newline=""), delimiter=delim)) == rows


@given(
    st.lists(
        st.lists(st.text(alphabet="ab 1é.-", max_size=5), min_size=2, max_size=3), min_size=1, max_size=5
    )
)
def test_split_csv_without_quotes_is_a_plain_split(rows):
    text = "".join(";".join(r) + "\n" for r in rows)
    out = A.split_csv(text, ";")
    assert [list(r.fields) for r in out] == rows
    assert [r.line for r in out] == list(range(1, len(rows) + 1))


@pytest.mark.parametrize("bad,index", [('x;"a "b" c";z', 1), ('x;a"b;z', 1), ('x;"ab"c;z', 1), ('"x;y;z', 0)])
def test_split_csv_flags_broken_quoting_and_resumes_on_the_next_line(bad, index):
    out = A.split_csv(f"h1;h2;h3\n{bad}\nr;s;t\n", ";")
    assert [r.line for r in out] == [1, 2, 3]
    assert out[1].error and out[1].error_field == index and out[1].raw == bad
    assert out[2].fields == ("r", "s", "t")


def test_split_csv_skips_blank_lines_but_counts_them():
    out = A.split_csv("a;b\r\n\r\nc;d\r\n\ne;f", ";")
    assert [(r.line, r.fields) for r in out] == [(1, ("a", "b")), (3, ("c", "d")), (5, ("e", "f"))]


# --- date strings pass through unchanged -------------------------------------------------


@given(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
        min_size=1,
        max_size=20,
    ).filter(str.strip)
)
def test_mes_dates_are_kept_as_found(date_text):
    spec = next(s for s in P.declared(ANSWER) if s.name == "mes")
    row = ["SR-1", date_text, "L3", "B", "Scrap Rate", "2,4", "%", ""]
    text = ";".join(spec.columns) + "\n" + ";".join(csv_field(f, ";") for f in row) + "\n"
    res = A.parse_file(spec, "mes_shift_reports.csv", text.encode("utf-8"), P, {})
    assert res.rejects == [] and res.rows[0]["date_raw"] == date_text and res.rows[0]["value"] == 2.4


# --- whole batches -----------------------------------------------------------------------


@pytest.fixture(scope="module", params=BATCHES)
def batch(request):
    return request.param, A.assetize_batch(RAW / request.param, P, ANSWER)


def test_every_raw_row_lands_in_exactly_one_place(batch):
    name, res = batch
    manifest = json.loads((RAW / name / "MANIFEST.json").read_text())
    m = A.batch_metrics(res)
    assert m["conservation_ok"] and m["rows_in"] == m["rows_assets"] + m["rows_rejected"]
    assert len(res.files) == len(manifest["rows"])
    for fr in res.files:
        assert fr.rows_in == manifest["rows"][fr.file] == len(fr.rows) + len(fr.rejects)
    kept = {(r["source_file"], r["source_line"]) for fr in res.files for r in fr.rows}
    rejected = {(r["source_file"], r["source_line"]) for fr in res.files for r in fr.rejects}
    assert not kept & rejected and len(kept) + len(rejected) == m["rows_in"]


def test_rejects_are_exactly_the_injected_malformed_and_duplicate_rows(batch):
    name, res = batch
    manifest = json.loads((RAW / name / "MANIFEST.json").read_text())
    rejects = res.assets["rejects"]
    for kind, rules in CAUGHT.items():
        got = sorted(
            f"{f}:{n}"
            for f, n, r in zip(rejects.source_file, rejects.source_line, rejects.rule)
            if r in rules
        )
        assert got == sorted(manifest["noise_lines"][kind]), kind
    assert set(rejects.rule) <= set().union(*CAUGHT.values())


def test_source_lines_point_at_the_row_start(batch):
    name, res = batch
    texts = {f.file: (RAW / name / f.file).read_bytes().decode(f.encoding).split("\n") for f in res.files}
    for asset, key in (("records", "record_id"), ("kb", "doc_id"), ("sft", "item_id"), ("eval", "item_id")):
        df = res.assets[asset]
        for file, line, rid in zip(df.source_file, df.source_line, df[key]):
            assert rid in texts[file][line - 1], (file, line)


def test_assets_split_the_question_log_and_grpo_mirrors_sft(batch):
    _, res = batch
    a = res.assets
    assert (
        set(a["sft"].split) == {"train"}
        and set(a["eval"].split) == {"eval"}
        and set(a["replay"].split) == {"replay"}
    )
    assert a["grpo"].equals(a["sft"])
    assert a["records"]["value"].dtype == "float64" and a["records"]["value"].notna().all()


def test_only_the_windows_export_needs_cp1252(batch):
    name, res = batch
    manifest = json.loads((RAW / name / "MANIFEST.json").read_text())
    for fr in res.files:
        assert fr.encoding == ("cp1252" if manifest["encodings"][fr.file] == "cp1252" else "utf-8-sig"), (
            fr.file
        )
    assert res.assets["records"]["text"].str.contains("°C").any()
