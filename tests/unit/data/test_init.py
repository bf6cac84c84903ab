"""clap.data.init (`clap init`): on copies of the three committed source sets (the demo exports, TAT-QA's
report file, the third company's xlsx + parquet + nested JSON) the sniffed reading options equal the
committed declarations, clap reads every drafted file exactly as it reads the committed declaration,
the demo's and TAT-QA's drafts run through assetize unedited, a stated number of guessed fields equal
the committed declaration, the TODOs sit where no candidate has evidence, and a TODO left in a
declaration is refused by name."""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import os
import re
import shutil
import string
import subprocess
import sys
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
from clap.data.normalize import build_vocab, normalize_params
from clap.errors import ClapError
from clap.params import raw_section
from clap.task.answer import load_answer_schema
from tests.unit.data.test_sources import DEMO_ANSWER, THIRD, THIRD_ANSWER, params
from tests.unit.data.test_third_source import NORMALIZE, write_company

ROOT = Path(__file__).resolve().parents[3]
TATQA = ROOT / "profiles" / "tatqa"
READING = ("files", "format", "encodings", "csv", "json", "xlsx", "columns", "table")


DEMO_VOCAB = build_vocab(normalize_params(ROOT / "params.yaml"))


def _draft(
    exports: Path, tmp_path: Path, answer, ignore=(), base=None, vocab=None
) -> tuple[str, dict, I.Init]:
    if base is None:  # the root params a profile under profiles/ extends
        base = tmp_path / "params.yaml"
        shutil.copy(ROOT / "params.yaml", base)
    path, result = I.write_profile(
        exports, "mine", tmp_path / "profiles", answer, ignore, base=base, vocab=vocab
    )
    text = path.read_text(encoding="utf-8")
    return text, clap_params.load(path), result  # the draft merged onto the root, as the stages read it


def _assetize_draft(batch: Path, tmp_path: Path, monkeypatch) -> tuple[dict, A.Assetized]:
    """stages/assetize.py run in the profile's folder on the draft as written (its params.yaml merged
    onto what it extends; assets schema-checked, rows conserved), and the library call it makes."""
    profile = tmp_path / "profiles" / "mine"
    out = profile / "metrics" / "assetize" / "b.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "assetize.py"), str(batch), str(profile / "data" / "assets" / "b"), str(out)],
        cwd=profile, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    metrics = json.loads(out.read_text())
    monkeypatch.chdir(profile)
    p = clap_params.section("assetize", A.AssetizeParams)
    return metrics, A.assetize_batch(batch, p, load_answer_schema())


def _same_field(a, b) -> bool:
    """The same source column (text and optional_text alike), constant, template, hash or group."""

    def norm(spec):
        spec = {"from": spec} if isinstance(spec, str) else dict(spec)
        if spec.get("type") in ("text", "optional_text"):
            del spec["type"]
        return spec

    return norm(a) == norm(b)


def _agreeing(drafted: dict, committed: dict, match: dict[str, str]) -> tuple[int, int]:
    """(fields the draft maps as the committed declaration does, fields declared)."""
    pairs = [(drafted[match[n]]["fields"].get(c), spec) for n, decl in committed.items() for c, spec in decl["fields"].items()]  # fmt: skip
    return sum(_same_field(a, b) for a, b in pairs), len(pairs)


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


def test_demo_exports_sniff_as_declared_and_read_the_same(tmp_path, monkeypatch):
    batch = tmp_path / "exports"
    shutil.copytree(ROOT / "data" / "raw" / "2026-01", batch)
    committed = raw_section("assetize", ROOT / "params.yaml")["sources"]
    text, doc, result = _draft(batch, tmp_path, DEMO_ANSWER, ignore=["MANIFEST.json"], vocab=DEMO_VOCAB)
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

    # no TODO: every choice declared by name or guessed on evidence, each guess marked for checking
    assert not any(_todo_keys(drafted, match[name]) for name in committed)
    assert I.counts(result) == (24, 0)
    assert text.count("   # guessed (") == 24 and "target: records   # guessed (a numeric column" in text
    assert drafted[match["cmms"]]["fields"]["metric_raw"] == {"const": "downtime"}  # from downtime_min
    assert drafted[match["cmms"]]["fields"]["unit_raw"] == {"const": "min"}
    assert drafted[match["question_log"]]["unique"] == ["split", "item_id"]
    # 41 of the 42 fields map what the committed declaration maps (38 equal it to the letter: the
    # 3 unit_raw fields are drafted optional_text where the committed says text)
    assert _agreeing(drafted, committed, match) == (41, 42)
    wrong = {(n, c) for n, decl in committed.items() for c, spec in decl["fields"].items()
             if not _same_field(drafted[match[n]]["fields"][c], spec)}  # fmt: skip
    assert wrong == {("cmms", "metric_raw")}  # 'downtime' where the committed says 'Downtime'

    # assetize runs on the draft as written
    m, got = _assetize_draft(batch, tmp_path, monkeypatch)
    assert m["conservation_ok"] and len(got.assets["records"]) and len(got.assets["kb"])
    assert len(got.assets["sft"]) + len(got.assets["eval"]) + len(got.assets["replay"]) > 0


def test_a_remaining_todo_is_refused_naming_source_and_key(tmp_path):
    batch = tmp_path / "b"
    write_company(batch)  # the third company's draft keeps TODOs (no candidate with evidence)
    _, doc, _ = _draft(batch, tmp_path, THIRD_ANSWER, vocab=build_vocab(NORMALIZE))
    drafted = doc["assetize"]["sources"]
    columns = A.target_columns(THIRD_ANSWER)
    with pytest.raises(ClapError) as e:
        S.parse_sources(drafted, columns)  # the draft as written: its first TODO
    first = next(
        f"{n}.fields.{c}"
        for n, d in drafted.items()
        for c, v in d["fields"].items()
        if str(v).startswith("TODO")
    )
    assert (e.value.rule, e.value.column) == ("todo_param", f"assetize.sources.{first}")
    assert "TODO" in str(e.value) and "params.yaml" in str(e.value)

    match = _match(drafted, THIRD)
    filled = _filled(THIRD, drafted, match)
    S.parse_sources(filled, columns)  # every choice made: accepted
    filled["erp"]["fields"]["value"] = "TODO: the answer value, value; candidates: Amount"
    with pytest.raises(ClapError) as e:
        S.parse_sources(filled, columns)
    assert (e.value.rule, e.value.column) == ("todo_param", "assetize.sources.erp.fields.value")
    filled["erp"]["fields"]["value"] = {"from": "Amount", "type": "number"}
    filled["erp"]["unique"] = ["TODO: the unique columns; candidates: record_id"]
    with pytest.raises(ClapError, match=r"assetize\.sources\.erp\.unique\.0"):
        S.parse_sources(filled, columns)


# --- (b) TAT-QA's report file vs profiles/tatqa/params.yaml --------------------------------------


def test_tatqa_report_file_sniffs_as_declared_and_reads_the_same(tmp_path, monkeypatch):
    batch = tmp_path / "reports-a"
    shutil.copytree(TATQA / "data" / "raw" / "reports-a", batch)
    assetize = raw_section("assetize", TATQA / "params.yaml")
    committed = assetize["sources"]
    vocab = build_vocab(normalize_params(TATQA / "params.yaml"))
    answer = vocab.answer  # TAT-QA's task (no key fields): `clap init --params profiles/tatqa/params.yaml`
    text, doc, result = _draft(batch, tmp_path, answer, base=TATQA / "params.yaml", vocab=vocab)
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

    # no TODO; 16 of the 19 fields map what the committed declaration maps
    assert not any(_todo_keys(drafted, match[name]) for name in committed)
    assert I.counts(result) == (20, 0) and text.count("   # guessed (") == 20
    assert _agreeing(drafted, committed, match) == (16, 19)
    wrong = {(n, c) for n, decl in committed.items() for c, spec in decl["fields"].items()
             if not _same_field(drafted[match[n]]["fields"][c], spec)}  # fmt: skip
    assert wrong == {("paragraphs", "system"), ("paragraphs", "title"), ("questions", "split")}
    q = drafted[match["questions"]]
    # the same group as the committed split, another seed and shares
    assert q["fields"]["split"]["hash"] == committed["questions"]["fields"]["split"]["hash"]
    assert q["only"] == committed["questions"]["only"]  # the rows whose answer is one span
    assert q["fields"]["context_doc_ids"] == {"documents_of": "^.table.uid"}

    # assetize runs on the draft as written, with TAT-QA's task (the profile it extends)
    m, got = _assetize_draft(batch, tmp_path, monkeypatch)
    assert m["conservation_ok"] and m["rows_in"] == 2714
    assert len(got.assets["kb"]) == len(want.assets["kb"])
    n_items = sum(len(got.assets[a]) for a in ("sft", "eval", "replay"))
    assert n_items == sum(len(want.assets[a]) for a in ("sft", "eval", "replay"))

    # with the root's task (key fields metric, line, shift, date) the report says the task may not fit
    report = I.render_report(I.init_profile(batch, DEMO_ANSWER, (), DEMO_VOCAB))
    assert "most key fields have no column in ['reports_questions']" in report


# --- (c) the third company's xlsx + parquet + nested JSON ----------------------------------------


def test_third_company_sniffs_as_declared_and_reads_the_same(tmp_path):
    batch = tmp_path / "b"
    write_company(batch)
    _, doc, result = _draft(batch, tmp_path, THIRD_ANSWER, vocab=build_vocab(NORMALIZE))
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

    # 21 of the 24 fields map what the committed declaration maps (19 to the letter: 2 unit_raw fields
    # are drafted optional_text); 2 TODOs where no candidate has evidence, and system {const: docs}
    todo = {name: _todo_keys(drafted, match[name]) for name in THIRD}
    assert todo == {
        "erp": set(),
        "docstore": set(),
        "asked": {"fields.question_type", "fields.evidence_doc_id"},
    }
    assert I.counts(result) == (16, 2)
    assert _agreeing(drafted, THIRD, match) == (21, 24)
    assert "candidates: a.fact" in asked["fields"]["evidence_doc_id"]  # committed: {template: "D-{a.fact}"}
    assert (asked["fields"]["split"], asked["fields"]["question"], asked["fields"]["evidence"]) == (
        "use",
        "q.text",
        "a.quote",
    )
    # its lists hold the docstore's ids
    assert asked["fields"]["context_doc_ids"] == {"from": "cites", "type": "text_list"}
    assert (erp["fields"]["record_id"], erp["fields"]["value"]) == (
        "Fact No",
        {"from": "Amount", "type": "number"},
    )
    assert (docstore["fields"]["title"], docstore["fields"]["body"]) == ("heading", "content")
    assert docstore["fields"]["record_ref"] == "fact"  # its values are the erp facts' ids


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
    assert (
        "erp/facts.xlsx: xlsx" in printed
        and "fields.value: {from: Amount, type: number}   # guessed" in printed
    )
    assert "guesses to check" in printed and "fields.metric_raw: TODO" in printed  # the root's task here
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
