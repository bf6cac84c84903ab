"""clap.demo.generate: the committed data/raw is reproducible, and the injected noise is what MANIFEST.json says.

The recounts below read the raw files with their own small parsers (not the generator's
bookkeeping), so a drift between what is injected and what is counted fails here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from clap import cli
from clap.data import assetize as A
from clap.data.sources import Node, RowProblem
from clap.demo import exports
from clap.demo import generate as demo
from clap.demo import noise as demo_noise
from clap.demo.render import build_rows
from clap.demo.world import build_world, number_tokens, wrong_column_answers
from clap.params import section
from clap.task.answer import load_answer_schema

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "data" / "raw"
P = demo.load_params(ROOT / "params.yaml")
DECLARED = {
    s.name: s
    for s in section("assetize", A.AssetizeParams, ROOT / "params.yaml").declared(
        load_answer_schema(ROOT / "params.yaml")
    )
}
CANON_UNITS = {"%", "pcs", "min", "s", "ppm"}
LOOKALIKE = re.compile("[\u00a0\u0410\u0412\u0421\u2013\uff10-\uff19]")


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, bytes]]:
    return {b: demo.generate_batch(b, P) for b in sorted(P.batches)}


def test_committed_raw_data_is_reproduced_byte_for_byte(generated):
    for batch, files in generated.items():
        assert sorted(p.name for p in (RAW / batch).iterdir()) == sorted(files), batch
        for name, data in files.items():
            assert (RAW / batch / name).read_bytes() == data, f"{batch}/{name} differs: run `clap demo-data`"


def test_only_the_demo_batches_are_in_git_a_users_batch_is_ignored():
    """data/raw/.gitignore: the demo batches are in git; any other batch folder is git-ignored from
    the start (a user's batch is `dvc add`ed, never "already tracked by SCM"), its .dvc file is not."""
    import subprocess

    def ignored(rel: str) -> bool:
        done = subprocess.run(["git", "check-ignore", "--no-index", "-q", rel], cwd=ROOT)
        assert done.returncode in (0, 1), f"git check-ignore {rel}: exit {done.returncode}"
        return done.returncode == 0

    for batch in P.batches:
        assert not ignored(f"data/raw/{batch}/{exports.QLOG}"), f"add !/{batch}/ to data/raw/.gitignore"
    assert ignored(f"data/raw/2099-01/{exports.QLOG}") and ignored("data/raw/2099-01")
    assert not ignored("data/raw/2099-01.dvc") and not ignored("data/raw/.gitignore")


def test_batches_have_the_contract_kinds_and_sizes(generated):
    kinds = {b: json.loads(f["MANIFEST.json"])["kind"] for b, f in generated.items()}
    assert kinds == {
        "2026-01": "clean",
        "2026-02": "clean",
        "2026-03": "corrupted",
        "2026-04": "clean",
        "2026-05": "shifted",
        "2026-06": "clean",
    }
    for files in generated.values():
        sizes = json.loads(files["MANIFEST.json"])["sizes"]
        assert sizes["train"] >= 420 and sizes["eval"] >= 170 and sizes["replay"] >= 110
    assert sum(len(d) for f in generated.values() for d in f.values()) < 6_000_000  # commit-friendly


def _loads(line: str):
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _questions(files) -> list[dict]:
    """Well-formed question rows, first occurrence of each (split, id)."""
    seen, out = set(), []
    for obj in map(_loads, files[exports.QLOG].decode().splitlines()):
        try:
            A.map_row(DECLARED["question_log"], Node(obj or {}))
        except RowProblem:
            continue
        if (obj["split"], obj["question_id"]) not in seen:
            seen.add((obj["split"], obj["question_id"]))
            out.append(obj)
    return out


def _kb(files) -> dict[str, dict]:
    docs = {}
    for obj in map(_loads, files[exports.KB].decode().splitlines()):
        if obj and isinstance(obj.get("body"), str) and "record_ref" in obj:
            docs.setdefault(obj["doc_id"], obj)
    return docs


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _evidence_kind(q: dict, kb: dict[str, dict]) -> str | None:
    """Which evidence noise a well-formed item carries, judged from the KB (None: clean)."""
    g = q["gold"]
    body = kb[g["doc_id"]]["body"]
    if g["evidence"] in body:
        if g["unit"] not in CANON_UNITS:
            return None  # a unit variant: the quote is in the canonical unit
        value = g["value"] if not isinstance(g["value"], str) else float(g["value"].replace(",", "."))
        return None if value in number_tokens(g["evidence"]) else "evidence_missing_value"
    return (
        "evidence_not_verbatim"
        if _norm(g["evidence"]) in _norm(body)
        else "evidence_not_verbatim_unrepairable"
    )


def test_question_log_noise_recounted_from_the_file(generated):
    for batch, files in generated.items():
        manifest, qs, kb = json.loads(files["MANIFEST.json"]), _questions(files), _kb(files)
        noise = manifest["noise_by_file"][exports.QLOG]
        found = {
            k: 0
            for k in ("evidence_missing_value", "evidence_not_verbatim", "evidence_not_verbatim_unrepairable")
        }
        for q in qs:
            kind = _evidence_kind(q, kb)
            if kind:
                found[kind] += 1
        train_ids = {q["question_id"] for q in qs if q["split"] == "train"}
        train_text = {_norm(q["question"]) for q in qs if q["split"] == "train"}
        held = [q for q in qs if q["split"] != "train"]
        found["overlap_id"] = sum(q["question_id"] in train_ids for q in held)
        found["overlap_text"] = sum(_norm(q["question"]) in train_text for q in held)
        found["unit_variant"] = sum(q["gold"]["unit"] not in CANON_UNITS for q in qs)
        found["numeric_prefix_label"] = sum(q["gold"]["metric"][:1].isdigit() for q in qs)
        g = [q["gold"] for q in qs]
        found["trailing_whitespace"] = sum(
            any(s != s.rstrip() for s in (q["question"], x["line"], x["shift"], x["metric"]))
            for q, x in zip(qs, g)
        )
        found["unicode_lookalike"] = sum(
            bool(LOOKALIKE.search(q["question"] + x["line"] + x["shift"] + x["date"])) for q, x in zip(qs, g)
        )
        found["date_format_variant"] = sum(
            not re.fullmatch(r"\d{4}[-\u2013]\d\d[-\u2013]\d\d", x["date"]) for x in g
        )
        assert found == {k: noise[k] for k in found}, batch


def _record_slots(files) -> dict[str, tuple[str, str, str]]:
    """record_id -> (line, shift, ISO date) of the well-formed MES/QMS/CMMS rows."""
    slots = {}
    for rec in A.split_csv(files[exports.MES].decode(), ";")[1:]:
        if not rec.error and rec.fields[1]:
            d = rec.fields[1]
            iso = d if "-" in d else dt.datetime.strptime(d, "%d.%m.%Y").date().isoformat()
            slots[rec.fields[0]] = (rec.fields[2], rec.fields[3], iso)
    for obj in map(_loads, files[exports.QMS].decode().splitlines()):
        if obj and isinstance(obj.get("station"), dict) and "recorded_at" in obj and "line" in obj["station"]:
            slots[obj["inspection_id"]] = (
                obj["station"]["line"],
                obj["station"]["shift"],
                obj["recorded_at"][:10].replace("/", "-"),
            )
    cmms = files[exports.CMMS].decode("cp1252" if b"\xb0" in files[exports.CMMS] else "utf-8")
    for rec in A.split_csv(cmms, ",", frozenset({6}))[1:]:
        if not rec.error and rec.fields[1]:
            d = rec.fields[1].split()[0]
            iso = d if "-" in d else dt.datetime.strptime(d, "%m/%d/%Y").date().isoformat()
            slots[rec.fields[0]] = (rec.fields[2], rec.fields[3], iso)
    return slots


def _clean(s: str) -> str:
    s = unicodedata.normalize("NFKC", s).strip()
    return {v: k for k, v in demo_noise.CYRILLIC.items()}.get(s, s)


def test_only_the_corrupted_batch_has_labels_that_report_the_date(generated):
    for batch, files in generated.items():
        manifest, kb, slots = json.loads(files["MANIFEST.json"]), _kb(files), _record_slots(files)
        day_as_value = static_ok = own_record = 0
        train = [q for q in _questions(files) if q["split"] == "train" and _evidence_kind(q, kb) is None]
        for q in train:
            g = q["gold"]
            iso = g["date"].replace("\u2013", "-")
            if "-" not in iso:
                fmt = {".": "%d.%m.%Y", "/": "%m/%d/%Y" if g["date"][2] == "/" else "%Y/%m/%d"}[
                    "." if "." in iso else "/"
                ]
                iso = dt.datetime.strptime(iso, fmt).date().isoformat()
            line, shift, day = slots[kb[g["doc_id"]]["record_ref"]]
            own_record += (_clean(line), _clean(shift), day) == (_clean(g["line"]), _clean(g["shift"]), iso)
            value = float(_clean(str(g["value"])).replace(",", "."))
            day_as_value += value == int(iso[8:])
            static_ok += g["doc_id"] in q["context_doc_ids"] and g["evidence"] in kb[g["doc_id"]]["body"]
        # every static check passes, corrupted or not: the quote is verbatim in the cited document,
        # which is in the context and describes the label's own line, shift and date
        assert static_ok == own_record == len(train), batch
        if manifest["kind"] == "corrupted":
            assert manifest["noise"]["answer_wrong_column"] >= 420 and day_as_value > 0.9 * len(train)
        else:
            assert manifest["noise"]["answer_wrong_column"] == 0 and day_as_value < 0.1 * len(train), batch


def test_wrong_column_labels_quote_the_header_and_report_the_day():
    world = build_world("2026-03", demo.batch_spec(P, "2026-03"), P, np.random.default_rng(5))
    assert wrong_column_answers(world.items) == sum(it.split == "train" for it in world.items)
    for it in world.items:
        a, f = it.answer, it.fact
        if it.split != "train":
            assert a is f
            continue
        assert (a.doc_id, a.metric, a.line, a.shift, a.day) == (f.doc_id, f.metric, f.line, f.shift, f.day)
        assert a.value == f.day.day and a.evidence in f.body and a.evidence != f.evidence


def test_manifest_counts_agree_with_each_other(generated):
    for batch, files in generated.items():
        m = json.loads(files["MANIFEST.json"])
        assert set(m["noise"]) == set(demo_noise.CATALOGUE)
        for kind, total in m["noise"].items():
            assert total == sum(f.get(kind, 0) for f in m["noise_by_file"].values()), (batch, kind)
            if kind != "non_utf8_file":
                assert total == len(m["noise_lines"][kind]), (batch, kind)
        expected_present = set(demo_noise.CATALOGUE) - {"non_utf8_file", "answer_wrong_column"}
        assert {k for k, v in m["noise"].items() if v > 0} >= expected_present, batch
        assert m["noise"]["non_utf8_file"] == (batch == "2026-04")


def test_noise_rates_are_realistic_and_one_per_row():
    rng = np.random.default_rng(7)
    spec = demo.batch_spec(P, "2026-02")
    world = build_world("2026-02", spec, P, rng)
    rows = build_rows(world, P.value_as_text, rng)
    base = {f: len(r) for f, r in rows.items()}
    counts = demo_noise.inject(rows, world, P.noise, rng)
    for kind, per_file in counts.items():
        for file, k in per_file.items():
            assert k == round(getattr(P.noise, kind) * base[file]) and k <= 0.06 * base[file], (kind, file)
            assert sum(r.noise == kind for r in rows[file]) == k, (kind, file)


def test_too_few_orphans_for_the_malformed_rate_is_an_error():
    p = dataclasses.replace(P, orphan_facts=0.0)
    with pytest.raises(ValueError, match="eligible"):
        demo.generate_batch("2026-01", p)


def test_contexts_hold_the_gold_doc_and_the_configured_distractors():
    rng = np.random.default_rng(3)
    p = dataclasses.replace(P, distractors=[1, 2])  # the committed demo uses none (params.yaml says why)
    world = build_world("2026-01", demo.batch_spec(p, "2026-01"), p, rng)
    docs = {f.doc_id: f for f in world.facts}
    near = same_metric = total = 0
    for it in world.items:
        if it.split == "replay":
            assert it.context == []
            continue
        assert (
            it.fact.doc_id in it.context
            and 2 <= len(it.context) <= 3
            and len(set(it.context)) == len(it.context)
        )
        for d in (docs[x] for x in it.context if x != it.fact.doc_id):
            total += 1
            near += d.line == it.fact.line or d.day == it.fact.day
            same_metric += d.metric == it.fact.metric
            assert d.role != "orphan"
        assert it.logged_at[:10] > it.fact.day.isoformat()  # asked after the shift
    assert near / total > 0.95 and 0.6 < same_metric / total < 0.9
    plain = build_world("2026-01", demo.batch_spec(P, "2026-01"), P, np.random.default_rng(3))
    assert all(it.context == ([it.fact.doc_id] if it.split != "replay" else []) for it in plain.items)
    words = [len(f.body.split()) for f in world.facts]
    lo, hi = P.body_words
    assert (
        min(words) >= lo and max(words) <= hi + 12
    )  # one note may overshoot the max (a body keeps >= 1 note)
    assert len({it.question for it in world.items}) == len(world.items)


def test_scale_knob_shrinks_batches_deterministically():
    p = dataclasses.replace(P, scale=0.15)
    a, b = demo.generate_batch("2026-05", p), demo.generate_batch("2026-05", p)
    assert a == b
    sizes = json.loads(a["MANIFEST.json"])["sizes"]
    assert (sizes["train"], sizes["eval"], sizes["replay"]) == (66, 27, 18)


def test_cli_writes_batches_and_reports_errors(tmp_path, capsys):
    assert (
        cli.main(
            [
                "demo-data",
                "--out",
                str(tmp_path),
                "--batches",
                "2026-06",
                "--params",
                str(ROOT / "params.yaml"),
            ]
        )
        == 0
    )
    assert (tmp_path / "2026-06" / exports.QLOG).read_bytes() == (RAW / "2026-06" / exports.QLOG).read_bytes()
    assert (
        cli.main(
            [
                "demo-data",
                "--out",
                str(tmp_path),
                "--batches",
                "2031-01",
                "--params",
                str(ROOT / "params.yaml"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith("error: ")


def test_the_demo_writes_the_files_assetize_reads():
    """The generator describes its exports itself (it imports nothing of the product): they must be what
    params `assetize.sources` declares."""
    assert exports.SPLITS == A.SPLITS
    assert sorted(exports.EXPORTS) == sorted(s.files for s in DECLARED.values())
    for name, e in exports.EXPORTS.items():
        (spec,) = [s for s in DECLARED.values() if s.files == name]
        assert (e.kind, e.system, e.columns, e.delimiter) == (
            spec.format,
            spec.name,
            spec.columns,
            spec.delimiter,
        ), name
