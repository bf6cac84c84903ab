"""clap.data.init (`clap init`): on copies of the three committed source sets (the demo exports, TAT-QA's
report file, the third company's xlsx + parquet + nested JSON) the sniffed reading options equal the
committed declarations, clap reads every drafted file exactly as it reads the committed declaration,
the TODOs sit where a person must choose, and a TODO left in a declaration is refused by name."""

from __future__ import annotations

import csv
import fnmatch
import io
import os
import re
import shutil
import string
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clap import params as clap_params
from clap.cli import main
from clap.data import assetize as A
from clap.data import init as I
from clap.data import sources as S
from clap.data.decoding import decode_file
from clap.errors import ClapError
from clap.params import raw_section
from clap.task.answer import load_answer_schema
from tests.unit.data.test_sources import DEMO_ANSWER, THIRD, THIRD_ANSWER, params
from tests.unit.data.test_third_source import write_company

ROOT = Path(__file__).resolve().parents[3]
TATQA = ROOT / "profiles" / "tatqa"
READING = ("files", "format", "encodings", "csv", "json", "xlsx", "columns", "table")


def _draft(exports: Path, tmp_path: Path, answer, ignore=()) -> tuple[str, dict, I.Init]:
    shutil.copy(
        ROOT / "params.yaml", tmp_path / "params.yaml"
    )  # the root params a profile under profiles/ extends
    path, result = I.write_profile(
        exports, "mine", tmp_path / "profiles", answer, ignore, base=tmp_path / "params.yaml"
    )
    text = path.read_text(encoding="utf-8")
    return text, clap_params.load(path), result  # the draft merged onto the root, as the stages read it


def _match(drafted: dict, committed: dict) -> dict[str, str]:
    """committed source -> the drafted source reading the same file (and records path)."""
    out = {}
    for name, decl in committed.items():
        hits = [
            d
            for d, dd in drafted.items()
            if fnmatch.fnmatch(dd["files"], decl["files"])
            and dd.get("json", {}).get("records") == decl.get("json", {}).get("records")
        ]
        assert len(hits) == 1, (name, hits)
        out[name] = hits[0]
    return out


def _paths(decl: dict) -> list[str]:
    """The source paths a committed declaration's fields read (templates' placeholders included)."""
    out = []
    for spec in decl["fields"].values():
        if isinstance(spec, str):
            out.append(spec)
        elif "from" in spec:
            out.append(spec["from"])
        elif "template" in spec:
            out.extend(re.findall(r"\{([^{}]+)\}", spec["template"]))
        elif "documents_of" in spec or "hash" in spec:
            out.append(spec.get("documents_of") or spec["hash"])
    return out


def _keys_cover(result: I.Init, drafted_name: str, decl: dict) -> None:
    """Every path the committed fields read is a sniffed column/key (or its list/number suffix)."""
    draft = next(d for d in result.drafts if d.name == drafted_name)
    sn = next(s for s in result.sniffed if s.file == draft.file)
    view = next(v for v in sn.views if v.records == draft.decl.get("json", {}).get("records", ""))
    for p in _paths(decl):
        if p.startswith("^") and not view.table:
            continue  # the enclosing element: not a key of the records themselves
        base = re.sub(r"(\.\d+)+$", "", p)
        assert base in view.keys, (drafted_name, p, view.keys)


def _filled(committed: dict, drafted: dict, match: dict[str, str]) -> dict:
    """The committed declaration with every reading option taken from the draft."""
    return {
        name: {**{k: v for k, v in decl.items() if k not in READING}, **{k: drafted[match[name]][k] for k in READING if k in drafted[match[name]]}}
        for name, decl in committed.items()
    }  # fmt: skip


def _same_assets(a: A.Assetized, b: A.Assetized) -> None:
    assert len(a.assets["kb"]) and len(a.assets["sft"]) + len(a.assets["eval"])
    for name in A.ASSETS:
        pd.testing.assert_frame_equal(a.assets[name], b.assets[name], check_dtype=False)


def _todo_keys(drafted: dict, name: str) -> set[str]:
    d = drafted[name]
    keys = {k for k, v in d.items() if isinstance(v, str) and v.startswith("TODO")}
    return keys | {
        f"fields.{k}" for k, v in d["fields"].items() if isinstance(v, str) and v.startswith("TODO")
    }


# --- (a) the demo exports vs the root params.yaml -----------------------------------------------


def test_demo_exports_sniff_as_declared_and_read_the_same(tmp_path):
    batch = tmp_path / "exports"
    shutil.copytree(ROOT / "data" / "raw" / "2026-01", batch)
    committed = raw_section("assetize", ROOT / "params.yaml")["sources"]
    text, doc, result = _draft(batch, tmp_path, DEMO_ANSWER, ignore=["MANIFEST.json"])
    assert text.startswith("#") and "\nextends: ../../params.yaml\n" in text
    assert "\nreplace: [assetize.sources]" in text and "\nbatches: []" in text
    drafted = doc["assetize"]["sources"]
    match = _match(drafted, committed)
    assert len(drafted) == len(committed) == 5
    for name, decl in committed.items():
        d = drafted[match[name]]
        assert d["format"] == decl["format"] and d["encodings"] == decl["encodings"], name
        assert d.get("csv") == decl.get("csv") and d.get("columns") == decl.get("columns"), name
        _keys_cover(result, match[name], decl)

    # clap reads every drafted file as it reads the committed declaration
    want = A.assetize_batch(batch, params(committed, ignore=["MANIFEST.json"]), DEMO_ANSWER)
    got = A.assetize_batch(
        batch, params(_filled(committed, drafted, match), ignore=["MANIFEST.json"]), DEMO_ANSWER
    )
    _same_assets(want, got)

    # TODOs where a person must choose; what the column names make clear is declared
    todo = {name: _todo_keys(drafted, match[name]) for name in committed}
    assert all("target" in t for t in todo.values())
    assert {"fields.value_raw", "fields.evidence"} <= todo["question_log"]
    assert not {"fields.question", "fields.split", "fields.item_id"} & todo["question_log"]
    assert drafted[match["question_log"]]["fields"]["split"] == "split"
    assert {"fields.record_id", "fields.value"} <= todo["mes"] and {"fields.value"} <= todo["cmms"]
    assert todo["kb"] == {"target"}
    assert drafted[match["kb"]]["fields"] == committed["kb"]["fields"]
    assert "candidates: value" in drafted[match["mes"]]["fields"]["value"]
    assert "candidates: gold.evidence" in drafted[match["question_log"]]["fields"]["evidence"]


def test_a_remaining_todo_is_refused_naming_source_and_key(tmp_path):
    batch = tmp_path / "exports"
    shutil.copytree(ROOT / "data" / "raw" / "2026-01", batch)
    committed = raw_section("assetize", ROOT / "params.yaml")["sources"]
    _, doc, _ = _draft(batch, tmp_path, DEMO_ANSWER, ignore=["MANIFEST.json"])
    drafted = doc["assetize"]["sources"]
    columns = A.target_columns(DEMO_ANSWER)
    with pytest.raises(ClapError) as e:
        S.parse_sources(drafted, columns)  # the draft as written: its first TODO
    first = next(iter(drafted))
    assert (e.value.rule, e.value.column) == ("todo_param", f"assetize.sources.{first}.target")
    assert "TODO" in str(e.value) and "params.yaml" in str(e.value)

    filled = _filled(committed, drafted, _match(drafted, committed))
    S.parse_sources(filled, columns)  # every choice made: accepted
    filled["mes"]["fields"]["value"] = drafted[_match(drafted, committed)["mes"]]["fields"]["value"]
    with pytest.raises(ClapError) as e:
        S.parse_sources(filled, columns)
    assert (e.value.rule, e.value.column) == ("todo_param", "assetize.sources.mes.fields.value")
    filled["mes"]["fields"]["value"] = {"from": "value", "type": "number"}
    filled["mes"]["unique"] = ["TODO: the unique columns; candidates: record_id"]
    with pytest.raises(ClapError, match=r"assetize\.sources\.mes\.unique\.0"):
        S.parse_sources(filled, columns)


# --- (b) TAT-QA's report file vs profiles/tatqa/params.yaml --------------------------------------


def test_tatqa_report_file_sniffs_as_declared_and_reads_the_same(tmp_path):
    batch = tmp_path / "reports-a"
    shutil.copytree(TATQA / "data" / "raw" / "reports-a", batch)
    assetize = raw_section("assetize", TATQA / "params.yaml")
    committed = assetize["sources"]
    answer = load_answer_schema(TATQA / "params.yaml")
    _, doc, result = _draft(batch, tmp_path, answer)
    drafted = doc["assetize"]["sources"]
    match = _match(drafted, committed)  # one source per records path, as TAT-QA declares them
    assert len(drafted) == 3
    for name, decl in committed.items():
        d = drafted[match[name]]
        assert (d["format"], d["json"], d.get("table")) == (decl["format"], decl["json"], decl.get("table"))
        _keys_cover(result, match[name], decl)
        data = (batch / "reports.json").read_bytes()
        same = [decode_file(data, enc, "reports.json", max_bad_line_share=0.5) for enc in (d["encodings"], decl["encodings"])]  # fmt: skip
        assert same[0].text == same[1].text  # the drafted encodings read the file as the committed ones

    limits = {k: assetize[k] for k in ("ignore", "max_bad_line_share", "max_json_depth", "max_reject_share")}
    want = A.assetize_batch(batch, A.AssetizeParams(sources=committed, **limits), answer)
    got = A.assetize_batch(
        batch, A.AssetizeParams(sources=_filled(committed, drafted, match), **limits), answer
    )
    _same_assets(want, got)

    todo = {name: _todo_keys(drafted, match[name]) for name in committed}
    assert {"target", "fields.item_id", "fields.split", "fields.evidence", "fields.value_raw"} <= todo[
        "questions"
    ]
    assert "fields.question" not in todo["questions"]
    assert drafted[match["questions"]]["fields"]["question"] == "question"
    assert (
        "candidates: none found" in drafted[match["questions"]]["fields"]["split"]
    )  # no split column: hash it
    assert {"target", "fields.doc_id"} <= todo["tables"] and "fields.body" not in todo["tables"]
    assert '{template: "{^.uid}/r{row}"}' in drafted[match["tables"]]["fields"]["doc_id"]
    assert drafted[match["paragraphs"]]["fields"]["body"] == "text"


# --- (c) the third company's xlsx + parquet + nested JSON ----------------------------------------


def test_third_company_sniffs_as_declared_and_reads_the_same(tmp_path):
    batch = tmp_path / "b"
    write_company(batch)
    _, doc, result = _draft(batch, tmp_path, THIRD_ANSWER)
    drafted = doc["assetize"]["sources"]
    match = _match(drafted, THIRD)
    assert len(drafted) == 3
    erp, docstore, asked = (drafted[match[n]] for n in ("erp", "docstore", "asked"))
    assert (erp["format"], erp["xlsx"]) == ("xlsx", THIRD["erp"]["xlsx"])
    assert erp["columns"] == ["Fact No", "Site", "Period", "Measure", "Amount", "Currency", "Comment"]
    assert (docstore["format"], docstore["columns"]) == ("parquet", ["key", "fact", "heading", "content"])
    assert (asked["format"], asked["json"]) == ("json", THIRD["asked"]["json"])
    assert "encodings" not in erp and "encodings" not in docstore
    for name, decl in THIRD.items():
        _keys_cover(result, match[name], decl)

    want = A.assetize_batch(batch, params(THIRD), THIRD_ANSWER)
    got = A.assetize_batch(batch, params(_filled(THIRD, drafted, match)), THIRD_ANSWER)
    _same_assets(want, got)
    assert len(got.assets["records"]) == 48

    todo = {name: _todo_keys(drafted, match[name]) for name in THIRD}
    assert {"target", "fields.item_id", "fields.split", "fields.question", "fields.value_raw"} <= todo[
        "asked"
    ]
    assert "candidates: use" in asked["fields"]["split"]  # the column whose values are splits
    assert "candidates: q.text" in asked["fields"]["question"]  # the column of questions
    assert "candidates: a.quote" in asked["fields"]["evidence"]
    assert {"target", "fields.record_id", "fields.value"} <= todo["erp"]
    assert "candidates: Amount" in erp["fields"]["value"]
    assert (docstore["fields"]["title"], docstore["fields"]["body"]) == ("heading", "content")


# --- what is not recognised, and the command --------------------------------------------------------


def test_an_unrecognised_file_is_reported_never_guessed(tmp_path):
    batch = tmp_path / "exports"
    batch.mkdir()
    (batch / "notes.txt").write_text("Just some prose without any delimiter at all\nand a second line\n")
    (batch / "blob.bin").write_bytes(b"\x00\x01\x02PAR1 not really\xff" * 10)
    (batch / "ok.csv").write_text("a;b\n1,5;x\n2,5;y\n", encoding="utf-8")
    (batch / "one.jsonl").write_text('{"doc_id": "D-1", "body": "a single record on a single line"}\n')
    text, doc, result = _draft(batch, tmp_path, DEMO_ANSWER)
    assert [d.file for d in result.drafts] == ["ok.csv", "one.jsonl"]
    assert doc["assetize"]["sources"]["one"]["format"] == "jsonl"
    assert doc["assetize"]["sources"]["ok"]["csv"] == {"delimiter": ";", "decimal": ",", "multiline": []}
    assert "# NOT DECLARED notes.txt" in text and "# NOT DECLARED blob.bin" in text
    report = I.render_report(result)
    assert "notes.txt: NOT RECOGNISED" in report and "blob.bin: NOT RECOGNISED" in report


def test_the_command_writes_the_profile_and_refuses_to_overwrite(tmp_path, capsys):
    batch = tmp_path / "exports"
    write_company(batch)
    out = tmp_path / "profiles"
    args = ["init", str(batch), "--name", "acme", "--out", str(out), "--params", str(ROOT / "params.yaml")]
    assert main(args) == 0
    extends = Path(os.path.relpath(ROOT / "params.yaml", out / "acme")).as_posix()
    assert f"\nextends: {extends}\n" in (out / "acme" / "params.yaml").read_text()
    printed = capsys.readouterr().out
    assert "erp/facts.xlsx: xlsx" in printed and "fields.value: TODO" in printed
    assert f"wrote {out / 'acme' / 'params.yaml'}" in printed
    assert main(args) == 2 and "rule exists" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


# --- delimiter and decimal of generated CSVs ---------------------------------------------------------

_NAMES = st.lists(
    st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(lambda n: n != "note"),
    min_size=2,
    max_size=5,
    unique=True,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=_NAMES,
    delimiter=st.sampled_from(",;\t|"),
    decimal=st.sampled_from(".,"),
    numbers=st.lists(st.tuples(st.integers(0, 99999), st.integers(1, 99)), min_size=2, max_size=8),
    multiline=st.booleans(),
)
def test_generated_csvs_sniff_their_delimiter_decimal_and_multiline_column(
    tmp_path, names, delimiter, decimal, numbers, multiline
):
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    w.writerow([*names, "note"])
    for k, (whole, frac) in enumerate(numbers):
        number = f"{whole}{decimal}{frac:02d}"
        note = f"line one\nline two {k}" if multiline and k == 0 else f"plain note {k}"
        w.writerow([number, *(f"v {k} {j}" for j in range(1, len(names))), note])
    f = tmp_path / f"gen-{abs(hash((tuple(names), delimiter, decimal)))}.csv"
    f.write_text(buf.getvalue(), encoding="utf-8")
    sn = I.sniff_file(f, f.name)
    assert (sn.format, sn.delimiter, sn.decimal) == ("csv", delimiter, decimal), sn.why
    assert sn.views[0].keys == [*names, "note"]
    assert sn.multiline == (["note"] if multiline else [])
    (decl,) = yaml.load(
        I._dump({"s": I.draft_source(sn, sn.views[0], "s", DEMO_ANSWER).decl}), Loader=yaml.SafeLoader
    ).values()
    assert decl["csv"] == {
        "delimiter": delimiter,
        "decimal": decimal,
        "multiline": sn.multiline,
    }  # survives YAML
