"""profiles/tatqa: the committed TAT-QA batches are what derive_batches.py derives from the committed source;
a/b partition the source; the wrong-cell copy differs from reports-b only in corrupted training answers."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "tatqa"
SOURCE = PROFILE / "source" / "tatqa_dataset_dev.json"
RAW = PROFILE / "data" / "raw"
MANIFEST = PROFILE / "corruption_manifest.json"
GROUPS = ("reports-a", "reports-b")
WRONGCELL = "reports-b-wrongcell"


def _load_script():
    spec = importlib.util.spec_from_file_location("tatqa_derive_batches", PROFILE / "derive_batches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


D = _load_script()


def _split(table_uid: str) -> str:
    """The pipeline's split rule, written out again (not D.split_of)."""
    seed, shares = 20260305, {"train": 0.50, "eval": 0.35, "replay": 0.15}
    u = int.from_bytes(hashlib.sha256(f"{seed}:{table_uid}".encode()).digest()[:8], "big") / 2**64
    return "train" if u < shares["train"] else "eval" if u < shares["train"] + shares["eval"] else "replay"


@pytest.fixture(scope="module")
def source() -> list[dict]:
    return json.loads(SOURCE.read_bytes())


@pytest.fixture(scope="module")
def batches() -> dict[str, list[dict]]:
    return {name: json.loads((RAW / name / "reports.json").read_bytes()) for name in (*GROUPS, WRONGCELL)}


def test_source_is_the_pinned_tatqa_dev_split():
    assert hashlib.sha256(SOURCE.read_bytes()).hexdigest() == D.SOURCE_SHA256
    assert D.SOURCE_SHA256 == "8da095a819af6db3c14877c6df2d4d29960e41d1a63dd1fa853507bd2a616af5"


def test_rederiving_gives_the_committed_bytes(tmp_path):
    assert D.main([str(SOURCE), str(tmp_path / "raw"), "--manifest", str(tmp_path / "manifest.json")]) == 0
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == sorted((*GROUPS, WRONGCELL))
    for name in (*GROUPS, WRONGCELL):
        assert (tmp_path / "raw" / name / "reports.json").read_bytes() == (
            RAW / name / "reports.json"
        ).read_bytes(), name
    assert (tmp_path / "manifest.json").read_bytes() == MANIFEST.read_bytes()


def test_batch_folders_hold_only_the_batch_file():
    assert sorted(p.name for p in RAW.iterdir()) == sorted((*GROUPS, WRONGCELL))
    for name in (*GROUPS, WRONGCELL):
        assert [p.name for p in (RAW / name).iterdir()] == ["reports.json"]


def test_split_rule_is_the_pipelines(source):
    assert all(D.split_of(c["table"]["uid"]) == _split(c["table"]["uid"]) for c in source)


def test_split_rule_is_the_one_params_yaml_declares():
    declared = yaml.safe_load((PROFILE / "params.yaml").read_text(encoding="utf-8"))
    split = declared["assetize"]["sources"]["questions"]["fields"]["split"]
    assert split == {"hash": "^.table.uid", "seed": D.SEED, "shares": D.SHARES}
    assert list(split["shares"]) == list(D.SPLITS)  # cumulative in this order, as split_of reads them
    assert declared["batches"] == [*GROUPS, WRONGCELL]


def test_each_clean_batch_holds_enough_held_out_single_spans(batches):
    for name in GROUPS:
        spans = Counter(
            _split(c["table"]["uid"])
            for c in batches[name]
            for q in c["questions"]
            if q["answer_type"] == "span"
        )
        assert spans["eval"] >= 105, (name, spans)


def test_ab_partition_the_source_unchanged_and_in_order(source, batches):
    index = {c["table"]["uid"]: i for i, c in enumerate(source)}
    assert len(index) == len(source) == 278
    seen: list[int] = []
    for name in GROUPS:
        ix = [index[c["table"]["uid"]] for c in batches[name]]
        assert ix == sorted(ix), f"{name} keeps source order"
        assert all(c == source[i] for c, i in zip(batches[name], ix)), f"{name} contexts are unchanged"
        seen += ix
    assert sorted(seen) == list(range(len(source)))  # each context in exactly one of a/b
    sizes = [len(batches[name]) for name in GROUPS]
    assert max(sizes) - min(sizes) <= 3


def test_linked_contexts_share_a_batch(source, batches):
    batch_of = {c["table"]["uid"]: name for name in GROUPS for c in batches[name]}
    for group in D.linked_groups(source):
        assert len({batch_of[source[i]["table"]["uid"]] for i in group}) == 1, group


def _cells(table):
    return {cell.strip() for row in table for cell in row}


def test_wrongcell_changes_only_training_span_answers_to_other_verbatim_facts(batches):
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    by_uid = {e["question_uid"]: e for e in manifest["corrupted"]}
    orig, bad = batches["reports-b"], batches[WRONGCELL]
    assert len(orig) == len(bad)
    changed, kinds = set(), {"cell": 0, "paragraph_number": 0, "other_answer": 0}
    for c, w in zip(orig, bad):
        assert {k: v for k, v in c.items() if k != "questions"} == {
            k: v for k, v in w.items() if k != "questions"
        }
        table = c["table"]["table"]
        for q, qw in zip(c["questions"], w["questions"], strict=True):
            assert list(q) == list(qw)  # same fields, same order: TAT-QA's schema
            assert {k: v for k, v in q.items() if k != "answer"} == {
                k: v for k, v in qw.items() if k != "answer"
            }
            if q["answer"] == qw["answer"]:
                continue
            changed.add(q["uid"])
            assert _split(c["table"]["uid"]) == "train" and q["answer_type"] == "span"
            (old,), (new,) = q["answer"], qw["answer"]
            e = by_uid[q["uid"]]
            assert (e["old_answer"], e["new_answer"], e["table_uid"]) == (old, new, c["table"]["uid"])
            assert old.strip() not in new and new not in old.strip()
            kinds[e["kind"]] += 1
            if e["kind"] == "cell":
                assert old.strip() in _cells(table) and new in _cells(table) and new != old.strip()
                (r, k), (r2, k2) = e["old_cell"], e["new_cell"]
                assert table[r][k].strip() == old.strip() and table[r2][k2].strip() == new
                assert k2 == k and r2 != r, "same column, another row"
                assert r >= D.header_rows(table) and r2 >= D.header_rows(table), "data rows"
            elif e["kind"] == "paragraph_number":  # another number of the paragraph holding the old one
                (para,) = [p for p in c["paragraphs"] if p["order"] == e["paragraph_order"]]
                assert old.strip() in para["text"] and new in para["text"]
                assert D.is_number(old) and not re.fullmatch(r"(19|20)\d\d", new.strip("()$€£%"))
            else:  # the gold answer of another single-span question of the same context
                (other,) = [o for o in c["questions"] if o["uid"] == e["answer_of"]]
                assert other["uid"] != q["uid"] and other["answer_type"] == "span"
                assert other["answer"][0].strip() == new
    assert changed == set(by_uid)
    assert kinds == {"cell": 38, "paragraph_number": 8, "other_answer": 115}


def test_every_corruptible_training_question_was_corrupted_or_accounted_for(batches):
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    candidates = [
        q
        for c in batches["reports-b"]
        for q in c["questions"]
        if _split(c["table"]["uid"]) == "train" and D.corruptible(q)
    ]
    skipped = manifest["spans_not_corrupted"]
    train_skipped = sum(n for why, n in skipped.items() if why.startswith("train"))
    assert len(candidates) == len(manifest["corrupted"]) + train_skipped


def test_readme_table_matches_the_batches(batches):
    text = (PROFILE / "README.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- batch-table:begin -->\n(.*?)<!-- batch-table:end -->", text, re.S).group(1)
    n_corrupted = len(json.loads(MANIFEST.read_text(encoding="utf-8"))["corrupted"])
    assert table == D.stats_table(batches, {WRONGCELL: n_corrupted})
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table.splitlines()[2:]}
    assert sum(int(x) for x in rows["contexts"][: len(GROUPS)]) == 278
    assert sum(int(x) for x in rows["questions"][: len(GROUPS)]) == 1668


def test_attribution_and_license_ship_with_the_data():
    for name in ("README.md", "LICENSE-DATA.md"):
        text = (PROFILE / name).read_text(encoding="utf-8")
        for needle in (
            "Creative Commons Attribution 4.0 International",
            "CC BY 4.0",
            "github.com/NExTplusplus/TAT-QA",
            "870accc",
            "Zhu",
        ):
            assert needle in text, (name, needle)
    assert "https://creativecommons.org/licenses/by/4.0/" in (PROFILE / "LICENSE-DATA.md").read_text(
        encoding="utf-8"
    )
    assert "CC BY 4.0" in json.loads(MANIFEST.read_text(encoding="utf-8"))["attribution"]
