"""clap.chain.retrieval: the analyzer (entities, concepts, words) and the BM25 index (no model)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from clap import params
from clap.chain.chain import ChainParams
from clap.chain.retrieval import Analyzer, KBIndex, RetrievalParams
from clap.errors import ClapError

RP = RetrievalParams(
    k1=1.5,
    b=0.75,
    entity_weight=2,
    stopwords="en",
    concepts={
        "downtime": ["downtime", "stoppage", "stood still"],
        "percent": ["%", "percent"],
        "cycle_time": ["cycle time", "ct"],
        "defects": ["defect", "defects", "ppm"],
        "oee": ["oee", "overall equipment effectiveness"],
    },
    entities={
        "line": {"kind": "code", "letter": "l", "prefixes": ["line", "ln"]},
        "shift": {
            "kind": "anchored",
            "anchor": "shift",
            "words": {"A": ["early", "morning"], "B": ["late"], "C": ["night"]},
        },
        "date": {"kind": "date"},
    },
)
AN = Analyzer(RP)


@pytest.mark.parametrize("text", ["line 5", "Line L5", "L5", "L-5", "line 05", "LINE\u00a05"])
def test_line_variants(text):
    assert {e for e in AN.entities(text) if e.startswith("line=")} == {"line=l5"}


@pytest.mark.parametrize(
    "text, shift",
    [
        ("the late shift (B)", "b"),
        ("B shift", "b"),
        ("shift b", "b"),
        ("night shift (C)", "c"),
        ("in shift (c)", "c"),
        ("L1 / A shift / 30.01.", "a"),
        ("the early shift", "a"),
        ("a-shift", "a"),
    ],
)
def test_shift_variants(text, shift):
    assert {e for e in AN.entities(text) if e.startswith("shift=")} == {f"shift={shift}"}


@pytest.mark.parametrize(
    "text", ["Morning! Any idea what the OEE was?", "first pass yield", "shift and line", "the shift lead"]
)
def test_no_shift_where_none_is_named(text):
    assert not {e for e in AN.entities(text) if e.startswith("shift=")}


@pytest.mark.parametrize(
    "text, year",
    [
        ("27.01.", None),
        ("on 27.01.2026", "2026"),
        ("2026-01-27", "2026"),
        ("27 Jan 2026", "2026"),
        ("the 27th of January", None),
        ("January 27, 2026", "2026"),
        ("01/27/2026", "2026"),
        ("Tuesday 27 January 2026", "2026"),
        ("jan. 27", None),
    ],
)
def test_date_variants(text, year):
    found = AN.entities(text)
    assert "date=01-27" in found
    assert {e for e in found if e.startswith("year=")} == ({f"year={year}"} if year else set())


@pytest.mark.parametrize(
    "text",
    ["FPY came in at 95.0%.", "Scrap reached 3.3 percent", "cycle time 70.1 s", "1049 ppm", "March 2026"],
)
def test_values_are_not_dates(text):
    assert not {e for e in AN.entities(text) if e.startswith("date=")}


def test_concepts_match_phrases_and_symbols_not_substrings():
    assert AN.terms("The line stood still for 86 min").count("concept=downtime") == 1
    assert "concept=downtime" in AN.terms("stoppage time")
    assert "concept=percent" in AN.terms("FPY came in at 95.0%")
    assert "concept=cycle_time" not in AN.terms("a defect pattern")  # "ct" inside "defect" is no match
    assert "concept=oee" in AN.terms("Overall-equipment effectiveness")


def test_matched_spans_leave_the_word_stream():
    terms = AN.terms("Defect rate for line 5 the late shift on 2026-01-27?")
    assert {"line=l5", "shift=b", "date=01-27", "year=2026", "concept=defects"} <= set(terms)
    assert not {"late", "2026", "01", "27", "defect", "line"} & set(terms)
    assert "rate" in terms


def test_entity_repeat_and_extra():
    terms = AN.terms("L5", extra={"shift=a"}, entity_repeat=2)
    assert terms.count("line=l5") == 2 and terms.count("shift=a") == 2


def test_metadata_entities_skip_missing():
    assert AN.metadata({"line": "L3", "shift": "B", "date": "2026-03-14"}) == {
        "line=l3",
        "shift=b",
        "date=03-14",
        "year=2026",
    }
    assert AN.metadata({"line": None, "shift": float("nan"), "date": None}) == set()
    assert AN.metadata({"line": "Mill 3", "date": "14.03.2026"}) == set()  # not the declared forms


def test_entities_are_declared_not_built_in():
    # another domain: a report's fiscal quarter (code "q3") and segment ("segment North"), no dates
    other = Analyzer(
        RetrievalParams(
            k1=1.5,
            b=0.75,
            entity_weight=1,
            stopwords="en",
            concepts={},
            entities={
                "quarter": {"kind": "code", "letter": "q", "prefixes": ["quarter", "fiscal quarter"]},
                "segment": {"kind": "anchored", "anchor": "segment", "words": {"north": ["northern"]}},
            },
        )
    )
    assert other.entities("revenue in fiscal quarter 3 of the northern segment, line 5 on 2026-03-14") == {
        "quarter=q3",
        "segment=north",
    }
    assert other.metadata({"quarter": "Q3", "segment": "North", "line": "L5"}) == {
        "quarter=q3",
        "segment=north",
    }
    bare = Analyzer(
        RetrievalParams(k1=1.5, b=0.75, entity_weight=1, stopwords="en", concepts={}, entities={})
    )
    assert bare.entities("line 5, the late shift, 2026-03-14") == set()  # nothing declared: plain words only
    assert "line" in bare.terms("line 5, the late shift")


def _kb(rows):
    return pd.DataFrame(rows, columns=["doc_id", "title", "body", "line", "shift", "date"])


KB = _kb(
    [
        (
            "D1",
            "Shift report",
            "Line L2 shift B closing report from 10 January 2026. OEE was 71.0 %.",
            "L2",
            "B",
            "2026-01-10",
        ),
        (
            "D2",
            "Shift report",
            "Line L2 shift B closing report from 10 January 2026. The line stood still for 40 min.",
            "L2",
            "B",
            "2026-01-10",
        ),
        (
            "D3",
            "Ticket",
            "Work order on line L3 during the night shift, Thursday 22 January. Downtime booked: 12 min.",
            "L3",
            "C",
            "2026-01-22",
        ),
        (
            "D4",
            "Shift report",
            "Line L2 shift A closing report from 10 January 2026. OEE was 66.0 %.",
            "L2",
            "A",
            "2026-01-10",
        ),
        ("D5", "Note", "Preventive maintenance of the gripper is due next week.", None, None, None),
    ]
)


def test_search_matches_paraphrases():
    index = KBIndex(KB, RP)
    assert (
        index.search("What was the overall equipment effectiveness on line 2, the late shift, 10.01.?", 3)[
            0
        ].doc_id
        == "D1"
    )
    assert index.search("stoppage time for L2 / B shift / January 10", 3)[0].doc_id == "D2"
    assert index.search("downtime on line 3, C shift, 22.01.2026", 1)[0].doc_id == "D3"
    assert index.search("OEE of L2 early shift on 2026-01-10", 1)[0].doc_id == "D4"


def test_search_limits_orders_and_drops_unrelated():
    index = KBIndex(KB, RP)
    hits = index.search("OEE line 2", 10)
    assert [h.doc_id for h in hits] == ["D1", "D4", "D2"]  # D1 and D4 tie on score: KB order decides
    assert hits[0].score == pytest.approx(hits[1].score) and hits[1].score > hits[2].score
    assert [h.doc_id for h in index.search("OEE line 2", 1)] == ["D1"]
    assert index.search("zebra crossing", 3) == [] and index.search("", 3) == []
    assert index.search("gripper", 3)[0].text == KB.loc[4, "body"]


def test_empty_and_bad_kb():
    assert KBIndex(_kb([]), RP).search("OEE line 2", 3) == []
    with pytest.raises(ClapError, match="repeats doc_id"):
        KBIndex(pd.concat([KB, KB.head(1)]), RP)
    with pytest.raises(ClapError, match="lacks columns"):
        KBIndex(KB.drop(columns=["title"]), RP)
    # a knowledge base without key columns (another answer declaration): words and concepts only
    plain = KBIndex(KB.drop(columns=["line", "shift", "date"]), RP)
    assert plain.search("OEE line 2", 3)


def test_params_section_is_valid_and_bad_values_refused():
    p = params.section("chain", ChainParams)
    assert p.top_k >= 1 and p.retrieval.entity_weight >= 1
    with pytest.raises(ClapError, match="stopwords") as e:
        RetrievalParams(k1=1.5, b=0.75, entity_weight=1, stopwords="klingon", concepts={}, entities={})
    assert (e.value.rule, e.value.column) == ("bad_params", "chain.retrieval.stopwords")
    with pytest.raises(ClapError) as e:
        RetrievalParams(k1=1.5, b=1.5, entity_weight=1, stopwords="en", concepts={}, entities={})
    assert (e.value.rule, e.value.column) == ("bad_params", "chain.retrieval.b")
    for bad, key in (
        ({"kind": "colour"}, "kind"),
        ({"kind": "code", "letter": "ln", "prefixes": []}, "letter"),
        ({"kind": "code", "letter": "L"}, "prefixes"),  # missing
        ({"kind": "date", "anchor": "x"}, "anchor"),  # not a key of a date
    ):
        with pytest.raises(ClapError, match="entities.line") as e:
            RetrievalParams(
                k1=1.5, b=0.75, entity_weight=1, stopwords="en", concepts={}, entities={"line": bad}
            )
        assert (e.value.rule, e.value.column) == ("bad_params", f"chain.retrieval.entities.line.{key}")
    with pytest.raises(ClapError) as e:
        dataclasses.replace(p, max_new_tokens=0)
    assert (e.value.rule, e.value.column) == ("bad_params", "chain.max_new_tokens")
