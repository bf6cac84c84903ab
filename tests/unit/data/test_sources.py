"""clap.data.sources + assetize: declared sources in every format, and what a wrong declaration or a
malformed file gives (a ClapError naming file/row/column/rule, or rejects; never a crash)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clap.data import assetize as A
from clap.data import sources as S
from clap.errors import ClapError
from clap.params import raw_section
from clap.task.answer import load_answer_schema, parse_answer_schema

ROOT = Path(__file__).resolve().parents[3]
TATQA = ROOT / "profiles" / "tatqa" / "source" / "tatqa_dataset_dev.json"
LIMITS = {"ignore": [], "max_bad_line_share": 0.5, "max_json_depth": 64, "max_reject_share": 0.5}

# A third company, declared from scratch: an ERP spreadsheet of facts, a parquet document store and a
# JSON question export nested under "data.items" -- formats, column names and nesting the demo never uses.
THIRD = {
    "erp": {
        "files": "erp/*.xlsx",
        "format": "xlsx",
        "xlsx": {"sheet": "Facts", "decimal": ","},
        "target": "records",
        "id": "record_id",
        "unique": ["record_id"],
        "fields": {
            "record_id": "Fact No",
            "site_raw": "Site",
            "period_raw": "Period",
            "measure_raw": "Measure",
            "value": {"from": "Amount", "type": "number"},
            "unit_raw": "Currency",
            "text": {"from": "Comment", "type": "optional_text"},
        },
    },
    "docstore": {
        "files": "docs.parquet",
        "format": "parquet",
        "target": "documents",
        "id": "doc_id",
        "unique": ["doc_id"],
        "fields": {
            "doc_id": "key",
            "system": {"const": "erp"},
            "record_ref": "fact",
            "title": "heading",
            "body": "content",
        },
    },
    "asked": {
        "files": "questions.json",
        "format": "json",
        "encodings": ["utf-8"],
        "json": {"records": "data.items[*]"},
        "target": "questions",
        "id": "item_id",
        "unique": ["item_id"],
        "fields": {
            "item_id": "ref",
            "split": "use",
            "question": "q.text",
            "question_type": {"const": "lookup"},
            "context_doc_ids": {"from": "cites", "type": "text_list"},
            "measure_raw": "a.measure",
            "value_raw": {"from": "a.amount", "type": "value"},
            "unit_raw": "a.currency",
            "site_raw": "a.site",
            "period_raw": "a.period",
            "evidence": "a.quote",
            "evidence_doc_id": {"template": "D-{a.fact}"},
        },
    },
}


# ... and its answer: another key-field set (a measure from a vocabulary, a site and a period as text)
THIRD_TASK = {
    "instruction": "Answer from the context only, as one JSON object with keys",
    "answer": {
        "measure": {"role": "key", "type": "vocabulary", "weight": 1.0},
        "site": {"role": "key", "type": "text", "weight": 1.0},
        "period": {"role": "key", "type": "text", "weight": 1.0},
        "evidence": {"role": "evidence", "weight": 1.0},
        "value": {"role": "value", "type": "number", "weight": 2.0},
        "unit": {"role": "unit", "weight": 1.0},
    },
    "slice_columns": ["question_type"],
    "show_doc_ids": True,
    "context": {"docs": 0, "cues": []},
}
THIRD_ANSWER = parse_answer_schema(THIRD_TASK)
DEMO_ANSWER = load_answer_schema(ROOT / "params.yaml")


def params(sources: dict, **limits) -> A.AssetizeParams:
    return A.AssetizeParams(sources=sources, **{**LIMITS, **limits})


def write_third(batch: Path, facts_rows: list[list] | None = None) -> Path:
    from openpyxl import Workbook

    (batch / "erp").mkdir(parents=True)
    wb = Workbook()
    ws = wb.active
    ws.title = "Facts"
    for row in [["Fact No", "Site", "Period", "Measure", "Amount", "Currency", "Comment"]] + (
        facts_rows
        or [
            ["F-1", "Hamburg", "2026-Q1", "Revenue", "1.496,5", "EUR", None],
            ["F-2", "Bremen", "2026-Q1", "Revenue", 880.25, "EUR", "booked late"],
            ["F-3", "Bremen", "2026-Q1", "Revenue", "n/a", "EUR", None],  # not a number: a reject
        ]
    ):
        ws.append(row)
    wb.save(batch / "erp" / "facts-2026q1.xlsx")
    pq.write_table(
        pa.table(
            {
                "key": ["D-F-1", "D-F-2"],
                "fact": ["F-1", "F-2"],
                "heading": ["Hamburg", "Bremen"],
                "content": ["Hamburg booked revenue of 1.496,5 EUR.", "Bremen booked 880,25 EUR."],
            }
        ),
        batch / "docs.parquet",
    )
    items = [
        {
            "ref": f"X-{i}",
            "use": s,
            "q": {"text": "Revenue in Hamburg, 2026-Q1?"},
            "cites": ["D-F-1"],
            "a": {
                "measure": "Revenue",
                "amount": "1.496,5",
                "currency": "EUR",
                "site": "Hamburg",
                "period": "2026-Q1",
                "quote": "Hamburg booked revenue of 1.496,5 EUR",
                "fact": "F-1",
            },
        }
        for i, s in enumerate(["train", "eval", "replay"])
    ]
    (batch / "questions.json").write_text(json.dumps({"data": {"items": items}}), encoding="utf-8")
    return batch


def test_a_third_source_set_in_other_formats_needs_no_code(tmp_path):
    res = A.assetize_batch(write_third(tmp_path / "b"), params(THIRD), THIRD_ANSWER)
    m = A.batch_metrics(res)
    assert m["conservation_ok"] and m["rows_in"] == 3 + 2 + 3 and m["rows_rejected"] == 1
    rec = res.assets["records"].set_index("record_id")
    assert rec["value"].to_dict() == {"F-1": 1496.5, "F-2": 880.25}  # "1.496,5" read with the declared comma
    assert set(rec["source_system"]) == {"erp"} and rec.loc["F-1", "text"] == ""
    (rej,) = res.assets["rejects"].to_dict("records")
    assert (rej["source_file"], rej["source_line"], rej["rule"], rej["column"], rej["record_id"]) == (
        "erp/facts-2026q1.xlsx",
        4,
        "wrong_type",
        "Amount",
        "F-3",
    )
    assert res.assets["eval"]["evidence_doc_id"].tolist() == ["D-F-1"]
    assert json.loads(res.assets["sft"]["context_doc_ids"][0]) == ["D-F-1"]
    assert res.assets["kb"]["record_ref"].tolist() == ["F-1", "F-2"]


def test_a_declared_column_missing_from_the_sheet_names_file_row_and_column(tmp_path):
    batch = write_third(tmp_path / "b")
    decl = {**THIRD, "erp": {**THIRD["erp"], "fields": {**THIRD["erp"]["fields"], "period_raw": "Month"}}}
    with pytest.raises(ClapError) as e:
        A.assetize_batch(batch, params(decl), THIRD_ANSWER)
    assert (e.value.rule, e.value.column, e.value.row) == ("missing_column", "Month", 1)
    assert Path(e.value.file).as_posix().endswith("erp/facts-2026q1.xlsx")


def test_a_file_that_is_not_what_was_declared_is_a_file_level_error(tmp_path):
    batch = write_third(tmp_path / "b")
    (batch / "docs.parquet").write_text("key,fact\n", encoding="utf-8")
    with pytest.raises(ClapError) as e:
        A.assetize_batch(batch, params(THIRD), THIRD_ANSWER)
    assert e.value.rule == "wrong_shape" and "PAR1" in str(e.value)


def test_json_records_path_that_does_not_match_the_file(tmp_path):
    batch = write_third(tmp_path / "b")
    (batch / "questions.json").write_text(json.dumps([{"ref": "X-1"}]), encoding="utf-8")
    with pytest.raises(ClapError) as e:
        A.assetize_batch(batch, params(THIRD), THIRD_ANSWER)
    assert (e.value.rule, e.value.column) == ("wrong_shape", "data") and "got [" in str(e.value)


@pytest.mark.parametrize(
    "change,key,rule",
    [
        ({"format": "xml"}, "format", "bad_params"),
        ({"target": "facts"}, "target", "bad_params"),
        ({"fields": {**THIRD["erp"]["fields"], "colour": "Site"}}, "fields.colour", "bad_params"),
        (
            {"fields": {k: v for k, v in THIRD["erp"]["fields"].items() if k != "unit_raw"}},
            "fields.unit_raw",
            "missing_param",
        ),
        (
            {"fields": {**THIRD["erp"]["fields"], "value": {"from": "Amount", "type": "money"}}},
            "fields.value.type",
            "bad_params",
        ),
        ({"xlsx": {"sheet": "Facts"}}, "xlsx.decimal", "missing_param"),
        ({"encodings": ["utf-8"]}, "encodings", "unknown_param"),
        ({"unique": ["colour"]}, "unique", "bad_params"),
    ],
)
def test_a_wrong_declaration_names_the_params_key(change, key, rule):
    with pytest.raises(ClapError) as e:
        params({**THIRD, "erp": {**THIRD["erp"], **change}}).declared(THIRD_ANSWER)
    assert (e.value.file, e.value.column, e.value.rule) == (
        "params.yaml",
        f"assetize.sources.erp.{key}",
        rule,
    )


def test_the_same_id_in_two_files_of_one_source_is_a_duplicate(tmp_path):
    batch = write_third(tmp_path / "b")
    (batch / "erp" / "facts-2026q1.xlsx").rename(batch / "erp" / "a.xlsx")
    write_third(tmp_path / "c")
    (tmp_path / "c" / "erp" / "facts-2026q1.xlsx").rename(batch / "erp" / "b.xlsx")
    with pytest.raises(ClapError) as e:  # a re-sent copy yields nothing new: the file is refused
        A.assetize_batch(batch, params(THIRD), THIRD_ANSWER)
    assert e.value.rule == "source_empty" and str(e.value.file).endswith("b.xlsx")
    with mock.patch.object(A, "check_yield", lambda *a: None):  # the row-level duplicates it holds
        res = A.assetize_batch(batch, params(THIRD), THIRD_ANSWER)
    dup = res.assets["rejects"].query("rule == 'duplicate_id'").to_dict("records")
    assert [(d["source_file"], d["record_id"]) for d in dup] == [("erp/b.xlsx", "F-1"), ("erp/b.xlsx", "F-2")]
    assert "erp/a.xlsx line 2" in dup[0]["detail"]


# --- the demo's exports: the three problems malformed files showed ---------------------------------

DEMO = raw_section("assetize", ROOT / "params.yaml")


def demo_source(name: str) -> S.Source:
    return next(s for s in A.AssetizeParams(**DEMO).declared(DEMO_ANSWER) if s.name == name)


def read(name: str, file: str, data: bytes):
    return A.parse_file(demo_source(name), file, data, A.AssetizeParams(**DEMO), {})


KB_LINE = '{{"doc_id": "KB-{i}", "system": "qms", "record_ref": "QI-{i}", "title": "t", "body": "{body}"}}\n'


def test_a_few_bad_bytes_are_rejects_not_a_whole_file_of_mojibake():
    lines = [KB_LINE.format(i=i, body="Prüfer Weiß: FPY 98.2 %").encode() for i in range(10)]
    lines[3] = (
        KB_LINE.format(i=3, body="Pr\x00fer").encode().replace(b"\x00", b"\xfc")
    )  # a cp1252 byte in UTF-8
    res = read("kb", "kb_documents.jsonl", b"".join(lines))
    assert res.encoding == "utf-8-sig" and len(res.rows) == 9
    assert all("Weiß" in r["body"] for r in res.rows)  # never re-decoded as cp1252 ("WeiÃŸ")
    (rej,) = res.rejects
    assert (rej["rule"], rej["source_line"]) == ("bad_encoding", 4) and "0xfc" in rej["detail"]


def test_a_bad_byte_inside_a_multiline_csv_record_rejects_that_record():
    head = "ticket_id,opened,line,shift,category,downtime_min,summary\r\n"
    good = 'WO-{i},03/14/2026 07:15,L3,A,Mechanical,42,"Belt at 85 °C.\r\nRe-tensioned."\r\n'
    data = (head + good.format(i=1)).encode() + good.format(i=2).encode().replace(
        b"tensioned", b"tensi\xf6ned"
    )
    res = read("cmms", "maintenance_tickets.csv", data + good.format(i=3).encode())
    assert [r["record_id"] for r in res.rows] == ["WO-1", "WO-3"] and "85 °C" in res.rows[0]["text"]
    assert [(r["rule"], r["source_line"], r["record_id"]) for r in res.rejects] == [
        ("bad_encoding", 4, "WO-2")
    ]


def test_a_json_array_where_json_lines_are_declared_is_a_file_level_error():
    data = ("[\n" + ",\n".join(KB_LINE.format(i=i, body="x").strip() for i in range(3)) + "\n]\n").encode()
    with pytest.raises(ClapError) as e:
        read("kb", "kb_documents.jsonl", data)
    assert e.value.rule == "wrong_shape" and "JSON array" in str(e.value)


def test_a_pathologically_nested_line_is_a_reject_not_a_crash():
    data = (KB_LINE.format(i=1, body="x") + "[" * 100_000 + "\n" + KB_LINE.format(i=2, body="y")).encode()
    res = read("kb", "kb_documents.jsonl", data)
    assert [r["doc_id"] for r in res.rows] == ["KB-1", "KB-2"]
    (rej,) = res.rejects
    assert (rej["rule"], rej["source_line"]) == ("bad_json", 2) and "deeper" in rej["detail"]


def test_a_utf16_export_says_so():
    with pytest.raises(ClapError) as e:
        read("kb", "kb_documents.jsonl", KB_LINE.format(i=1, body="x").encode("utf-16"))
    assert e.value.rule == "bad_encoding" and "UTF-16" in str(e.value)


def test_a_comma_file_declared_with_semicolons_says_what_it_looks_like():
    data = b"report_id,shift_date,line,shift,kpi,value,uom,remark\nSR-1,14.03.2026,L3,B,OEE,70,%,\n"
    with pytest.raises(ClapError) as e:
        read("mes", "mes_shift_reports.csv", data)
    assert e.value.rule == "missing_column" and "splits into 8 fields on ','" in str(e.value)


# --- paths, hashing, tables --------------------------------------------------------------------------


def test_paths_step_into_objects_and_out_to_the_enclosing_element():
    root = [{"table": {"uid": "T1"}, "questions": [{"uid": "Q1"}, {"uid": "Q2"}]}]
    nodes = list(S.explode(root, "[*].questions[*]", "f.json"))
    assert [S.lookup(n, "uid") for n in nodes] == [(True, "Q1"), (True, "Q2")]
    assert S.lookup(nodes[1], "^.table.uid") == (True, "T1") and S.lookup(nodes[1], "#") == (True, 1)
    assert S.lookup(nodes[0], "missing") == (False, None)
    with pytest.raises(S.RowProblem) as e:
        S.lookup(nodes[0], "uid.deeper")
    assert e.value.rule == "wrong_type"


def test_an_element_without_the_list_is_one_reject_row():
    nodes = list(S.explode([{"questions": [{"uid": "Q1"}]}, {"other": 1}], "[*].questions[*]", "f.json"))
    assert isinstance(nodes[1].value, S.RowProblem) and nodes[1].value.rule == "missing_field"


@given(st.text(min_size=1, max_size=30))
def test_hash_split_is_a_pure_function_of_the_key(key):
    shares = (("train", 0.55), ("eval", 0.3), ("replay", 0.15))
    assert S.hash_label(key, 7, shares) == S.hash_label(key, 7, shares) in {"train", "eval", "replay"}


def test_hash_split_shares_hold_over_many_keys():
    shares = (("train", 0.55), ("eval", 0.3), ("replay", 0.15))
    got = [S.hash_label(f"T{i}", 20260305, shares) for i in range(20000)]
    for label, share in shares:  # binomial sd at n=20000 is <= 0.0036: 4 sd
        assert abs(got.count(label) / len(got) - share) < 0.015


def test_table_rows_render_with_their_column_headers():
    cells = [
        ["", "", "Years Ended September 30,", ""],
        ["", "2019", "2018", "2017"],
        ["Fixed Price", "$  1,452.4", "$  1,146.2", "$  1,036.9"],
        ["Total sales", "$1,496.5", "", "$1,107.7"],
    ]
    header, data = S.table_rows(cells, "auto")
    assert len(header) == 2 and [k for k, _ in data] == [3, 4]
    assert S.render_row(header, data[1][1]) == "Total sales: 2019 $1,496.5; 2017 $1,107.7"
    assert S.render_row(header, data[0][1]).startswith(
        "Fixed Price: 2019 $  1,452.4; Years Ended September 30, 2018"
    )


TATQA_SOURCES = {
    "tables": {
        "files": "*.json",
        "format": "json",
        "encodings": ["utf-8"],
        "json": {"records": "[*].table"},
        "table": {"cells": "table", "header_rows": "auto"},
        "target": "documents",
        "id": "doc_id",
        "unique": ["doc_id"],
        "fields": {
            "doc_id": {"template": "{^.uid}/r{row}"},
            "system": {"const": "table"},
            "record_ref": "^.uid",
            "title": {"from": "label", "type": "optional_text"},
            "body": "text",
        },
    },
    "paragraphs": {
        "files": "*.json",
        "format": "json",
        "encodings": ["utf-8"],
        "json": {"records": "[*].paragraphs[*]"},
        "target": "documents",
        "id": "doc_id",
        "unique": ["doc_id"],
        "fields": {
            "doc_id": "uid",
            "system": {"const": "text"},
            "record_ref": "^.table.uid",
            "title": {"template": "paragraph {order}"},
            "body": "text",
        },
    },
}


@pytest.mark.skipif(not TATQA.exists(), reason="TAT-QA source not committed")
def test_tatqa_reports_read_as_declared_documents(tmp_path):
    batch = tmp_path / "b"
    batch.mkdir()
    (batch / "reports.json").write_bytes(TATQA.read_bytes())
    res = A.assetize_batch(batch, params(TATQA_SOURCES), DEMO_ANSWER)
    contexts = json.loads(TATQA.read_text(encoding="utf-8"))
    kb = res.assets["kb"]
    assert A.batch_metrics(res)["conservation_ok"]
    rejects = res.assets["rejects"]  # exactly the table rows with no text in any cell
    assert len(rejects) == 2 and set(rejects.rule) == {"missing_field"}
    assert all(not any(c.strip() for c in json.loads(raw)) for raw in rejects.raw)
    assert (kb.system == "text").sum() == sum(len(c["paragraphs"]) for c in contexts)
    assert kb.record_ref.nunique() == len(contexts)
    first = kb[kb.doc_id == contexts[0]["table"]["uid"] + "/r5"].body.item()
    assert first == "Total sales: 2019 $1,496.5; Years Ended September 30, 2018 $1,202.9; 2017 $1,107.7"
