"""clap.data.normalize: canonical spellings, verifiable evidence, dedup and overlap, loud bad input."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clap import io, params
from clap.data.normalize import (
    CONFUSABLES,
    build_vocab,
    canonical_key,
    clean_text,
    dates_in,
    decimal_readings,
    dedup_records,
    evidence_status,
    from_canonical,
    input_hash,
    load_assets,
    normalize_batch,
    normalize_params,
    normalize_records,
    parse_date,
    parse_value,
    strip_value_affixes,
    to_canonical,
)
from clap.errors import ClapError

ROOT = Path(__file__).resolve().parents[3]
P = normalize_params(ROOT / "params.yaml")
V = build_vocab(P)

# --------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Scrap\u00a0rate  1,5 %\t ", "Scrap rate 1,5 %"),  # NBSP, runs, trailing whitespace
        ("L\u0456ne 3 \u0421ycle", "Line 3 Cycle"),  # Cyrillic i and C
        ("\uff11\uff12\uff13 pcs", "123 pcs"),  # fullwidth digits
        ("\u20133,5 \u2212 2", "-3,5 - 2"),  # en dash and minus sign
        ("zero\u200bwidth", "zerowidth"),
    ],
)
def test_clean_text_removes_lookalikes_and_whitespace(raw, clean):
    assert clean_text(raw) == clean


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_clean_text_is_idempotent(text):
    once = clean_text(text)
    assert clean_text(once) == once


latin = st.text(alphabet="ABEKMHOPCTXaeopcyx0123456789 %", min_size=1, max_size=30)
LOOKALIKE_OF = {
    latin_char: k
    for k, latin_char in CONFUSABLES.items()
    if latin_char and len(k) == 1 and "\u0400" <= k <= "\u04ff"
}


@settings(max_examples=200, deadline=None)
@given(latin, st.randoms(use_true_random=False))
def test_confusables_map_cyrillic_lookalikes_back_to_latin(text, rnd):
    spoofed = "".join(LOOKALIKE_OF[c] if c in LOOKALIKE_OF and rnd.random() < 0.5 else c for c in text)
    assert clean_text(spoofed) == clean_text(text)


# --------------------------------------------------------------------------- metric labels

CANONICAL_LABELS = sorted(
    {lbl for m, spec in P.keys["metric"]["words"].items() for lbl in [m, *spec["labels"]]}
)
numbers = st.builds(
    lambda v, d, comma: f"{v:.{d}f}".replace(".", "," if comma else "."),
    st.floats(0, 5000, allow_nan=False),
    st.integers(0, 2),
    st.booleans(),
)
unit_tokens = st.sampled_from(["", " ", "%", " %", " pcs", " min", " h", " ppm", " s"])


@pytest.mark.parametrize(
    ("label", "metric"),
    [
        ("98.2% First Pass Yield", "first_pass_yield"),
        ("12 Scrap pcs", "scrap_count"),
        ("scrap qty", "scrap_count"),
        ("scrap %", "scrap_rate"),
        ("Downtime: 45 min", "downtime"),
        ("DT min", "downtime"),
        ("1,5 h unplanned downtime", "downtime"),
        ("OEE 85,3 %", "oee"),
        ("avg cycle time", "cycle_time"),
        ("Defect Rate 120 ppm", "defect_rate"),
        ("first_pass_yield", "first_pass_yield"),
        ("\u0455crap rate", "scrap_rate"),
    ],
)
def test_canonical_metric(label, metric):
    assert canonical_key("metric", label, V) == metric


@pytest.mark.parametrize("label", ["Mystery KPI", "98.2%", "", "rate"])
def test_unknown_labels_have_no_metric(label):
    assert canonical_key("metric", label, V) is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CANONICAL_LABELS))
def test_prefix_stripping_never_changes_a_canonical_label(label):
    assert strip_value_affixes(label, V) == clean_text(label)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CANONICAL_LABELS), numbers, unit_tokens, st.booleans())
def test_value_affixes_do_not_change_the_metric(label, number, unit, as_prefix):
    noisy = f"{number}{unit} {label}" if as_prefix else f"{label} {number}{unit}"
    assert canonical_key("metric", noisy, V) == canonical_key("metric", label, V)
    assert strip_value_affixes(strip_value_affixes(noisy, V), V) == strip_value_affixes(noisy, V)


# --------------------------------------------------------------------------- units, lines, shifts, dates, values


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(P.units)), st.floats(-1e6, 1e6, allow_nan=False))
def test_unit_conversion_is_invertible(unit, value):
    canon, unit_out = to_canonical(value, unit, V)
    assert unit_out == P.units[unit][0]
    assert from_canonical(canon, unit, V) == pytest.approx(value, rel=1e-6, abs=10**-V.decimals)


@pytest.mark.parametrize(
    ("value", "unit", "expect"),
    [
        (0.982, "ratio", (98.2, "%")),
        (1.5, "h", (90.0, "min")),
        (12, "Stk", (12.0, "pcs")),
        (3, "SEC", (3.0, "s")),
    ],
)
def test_unit_conversion_examples(value, unit, expect):
    assert to_canonical(value, unit, V) == expect


def test_unknown_unit_raises_with_rule():
    with pytest.raises(ClapError) as e:
        to_canonical(1.0, "furlongs", V)
    assert e.value.rule == "unknown_unit" and "furlongs" in str(e.value)


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ("Line 3", "L3"),
        ("L-3", "L3"),
        ("l3", "L3"),
        ("LINE 03", "L3"),
        ("L\u00a07", "L7"),
        ("L9", None),
        ("Halle 2", None),
    ],
)
def test_canonical_line(raw, line):
    assert canonical_key("line", raw, V) == line


@pytest.mark.parametrize(
    ("raw", "shift"),
    [("Shift B", "B"), ("b", "B"), ("late", "B"), ("Early", "A"), ("NIGHT", "C"), ("C", "C"), ("D", None)],
)
def test_canonical_shift(raw, shift):
    assert canonical_key("shift", raw, V) == shift


@pytest.mark.parametrize(
    "raw",
    [
        "14.03.2026",
        "14.3.2026",
        "03/14/2026 07:15",
        "2026-03-14T06:40:00+01:00",
        "2026-03-14T23:10:00+02:00",
        "2026/03/14 06:40",
        "2026-03-14",
        "2026\u201303\u201314",
        "\uff12\uff10\uff12\uff16-03-14",
        "14 Mar 2026",
        "March 14, 2026",
        "2026-03-14 07:15",
    ],
)
def test_parse_date_formats(raw):
    assert parse_date(raw, V) == "2026-03-14"


@pytest.mark.parametrize("raw", ["14/03/2026", "2026-13-01", "yesterday", ""])
def test_unparseable_dates(raw):
    assert parse_date(raw, V) is None


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(
        dt.datetime(2000, 1, 1),
        dt.datetime(2099, 12, 31),
        timezones=st.sampled_from(
            [dt.UTC, dt.timezone(dt.timedelta(hours=1)), dt.timezone(dt.timedelta(hours=-5))]
        ),
    ),
    st.sampled_from(P.date_formats),
)
def test_date_parsing_round_trips(when, fmt):
    assert parse_date(when.strftime(fmt), V) == when.date().isoformat()


@pytest.mark.parametrize(
    ("token", "readings"),
    [
        ("98,2", [98.2]),
        ("98.2", [98.2]),
        ("1,234", [1.234, 1234.0]),
        ("1.234,5", [1234.5]),
        ("0.982", [0.982]),
        ("\u22123,5", [-3.5]),
        ("L3", []),
    ],
)
def test_decimal_readings(token, readings):
    assert decimal_readings(token) == readings


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("98,2", 98.2),
        (" 45 ", 45.0),
        (12, 12.0),
        (float("nan"), None),
        ("n/a", None),
        (True, None),
        (float("inf"), None),
    ],
)
def test_parse_value(raw, value):
    assert parse_value(raw) == value


# --------------------------------------------------------------------------- evidence

BODY = "Shift report SR-1 for line L3, shift B, 14 March 2026. Scrap rate was 1.5 %. The line stood still for 90 min."


@pytest.mark.parametrize(
    ("quote", "value", "raw", "status"),
    [
        ("Scrap rate was 1.5 %", 1.5, 1.5, "ok"),
        ("Scrap  rate was 1,5\u00a0%", 1.5, 1.5, "evidence_not_verbatim"),  # decimal comma is not in the body
        ("Scrap\u00a0rate  was 1.5 %", 1.5, 1.5, "repaired"),
        ("S\u0441rap rate was 1.5 %", 1.5, 1.5, "repaired"),  # Cyrillic es
        ("The line stood still for 90 min", 90.0, 1.5, "ok"),  # gold 1,5 h, quote in minutes
        ("Scrap rate was 2.5 %", 2.5, 2.5, "evidence_not_verbatim"),
        (
            "Shift report SR-1 for line L3, shift B",
            3.0,
            3.0,
            "evidence_missing_value",
        ),  # "L3" carries no number
        ("", 1.5, 1.5, "evidence_missing_value"),
        (None, 1.5, 1.5, "evidence_missing_value"),
    ],
)
def test_evidence_status(quote, value, raw, status):
    assert evidence_status(quote, BODY, value, raw, V)[0] == status


# --------------------------------------------------------------------------- whole batch


def _rec(rid, system, line, shift, date, label, value, unit, n):
    return dict(
        record_id=rid,
        source_system=system,
        line_raw=line,
        shift_raw=shift,
        date_raw=date,
        metric_raw=label,
        value=value,
        unit_raw=unit,
        text=f"{label} {value}",
        source_file=f"{system}.csv",
        source_line=n,
    )


def _doc(doc_id, system, ref, body, n):
    return dict(
        doc_id=doc_id,
        system=system,
        record_ref=ref,
        title=f" Title\u00a0{doc_id} ",
        body=body,
        source_file="kb_documents.jsonl",
        source_line=n,
    )


def _item(
    iid,
    split,
    q,
    n,
    ctx=("D1", "D2"),
    label="FPY",
    value="98,2",
    unit="pct",
    line="Line 3",
    shift="B",
    date="14.03.2026",
    ev="First pass yield was 98.2 %",
    doc="D1",
):
    return dict(
        item_id=iid,
        split=split,
        question=q,
        question_type="direct",
        context_doc_ids=json.dumps(list(ctx)),
        metric_raw=label,
        value_raw=value,
        unit_raw=unit,
        line_raw=line,
        shift_raw=shift,
        date_raw=date,
        evidence=ev,
        evidence_doc_id=doc,
        source_file="question_log.jsonl",
        source_line=n,
    )


def tiny_assets() -> dict[str, pd.DataFrame]:
    """Every noise kind once: each item's expected fate is in its question text."""
    records = pd.DataFrame([
        _rec("SR-1", "mes", "Line 3", "Shift B", "14.03.2026", "98,2% First Pass Yield", 98.2, "%", 2),
        _rec("QI-1", "qms", "L-3", "late", "2026-03-14T16:40:00+01:00", "FPY", 0.982, "ratio", 1),  # across systems
        _rec("WO-1", "cmms", "l1", "A", "03/14/2026 07:15", "DT min", 1.5, "h", 2),
        _rec("WO-2", "cmms", "L1", "early", "2026/03/14 06:40", "Downtime", 90.0, "minutes", 3),  # within system
        _rec("SR-2", "mes", "Line 9", "B", "14.03.2026", "OEE", 80.0, "%", 3),  # unknown line
        _rec("SR-3", "mes", "Line 2", "B", "32.03.2026", "OEE", 80.0, "%", 4),  # unparseable date
    ])  # fmt: skip
    kb = pd.DataFrame([
        _doc("D1", "mes", "SR-1", "Shift report for line L3, shift B, 14 March 2026. First pass yield was 98.2 %. No events.", 1),
        _doc("D2", "cmms", "WO-1", "Ticket on line L1, shift A. The line stood still for 90 min.", 2),
        _doc("D3", "qms", "QI-9", "Inspection on L3, late shift. FPY came in at 98.2%.", 3),
    ])  # fmt: skip
    sft = pd.DataFrame([
        _item("T1", "train", "keep: FPY on L3 B?", 1),
        _item("T2", "train", "repaired: downtime on L1 A?", 2, label="Downtime", value="1,5", unit="h", line="L1", shift="A", ev="The line stood\u00a0still for  90 min", doc="D2"),
        _item("T3", "train", "unknown metric", 3, label="Mystery KPI"),
        _item("T4", "train", "unparseable date", 4, date="someday"),
        _item("T5", "train", "evidence doc unknown", 5, doc="D404"),
        _item("T6", "train", "not verbatim", 6, ev="First pass yield was 98.3 %"),
        _item("T7", "train", "missing value", 7, ev="No events"),
        _item("T1", "train", "duplicate id", 8),
        _item("T8", "train", "KEEP: FPY on L3   B?", 9),  # same normalized input as T1
        _item("E1", "train", "overlap id (E1 is in eval)", 10),
        _item("T9", "train", "Held-out wins", 11),
        _item("T10", "train", "unit mismatch", 12, unit="min"),
        _item("T11", "train", "context doc unknown", 13, ctx=("D1", "D9")),
    ])  # fmt: skip
    evals = pd.DataFrame(
        [
            _item("E1", "eval", "eval one", 1),
            _item("E2", "eval", "held-out\u00a0wins", 2),
            _item("E3", "eval", "replay overlap", 3),
        ]
    )
    replay = pd.DataFrame([
        _item("R1", "replay", "replay kept", 1, ctx=(), value="0,982", unit="ratio", ev="FPY came in at 98.2%", doc="D3"),
        _item("R2", "replay", "Replay Overlap", 2, ctx=()),
    ])  # fmt: skip
    return {"records": records, "kb": kb, "sft": sft, "grpo": sft.copy(), "eval": evals, "replay": replay}


@pytest.fixture(scope="module")
def result():
    return normalize_batch(tiny_assets(), P)


def _fate(result, artifact: str) -> dict[str, tuple[str, str]]:
    rej = result.rejects[result.rejects["artifact"] == artifact]
    return {(i, r): a for i, r, a in zip(rej["item_id"], rej["rule"], rej["action"])}


def test_items_get_their_expected_fate(result):
    fate = _fate(result, "sft")
    assert fate == {
        ("T2", "evidence_not_verbatim"): "repaired",
        ("T3", "unknown_metric"): "rejected",
        ("T4", "unparseable_date"): "rejected",
        ("T5", "evidence_doc_unknown"): "rejected",
        ("T6", "evidence_not_verbatim"): "rejected",
        ("T7", "evidence_missing_value"): "rejected",
        ("T1", "duplicate_item_id"): "deduplicated",
        ("T8", "duplicate_input"): "deduplicated",
        ("E1", "overlap_id"): "deduplicated",
        ("T9", "overlap_text"): "deduplicated",
        ("T10", "unit_mismatch"): "rejected",
        ("T11", "context_doc_unknown"): "rejected",
    }
    assert list(result.frames["sft"]["item_id"]) == ["T1", "T2"]
    assert _fate(result, "grpo") == fate  # D_grpo is the same rows as D_sft
    assert _fate(result, "replay") == {("R2", "overlap_text"): "deduplicated"}


def test_kept_items_are_canonical_and_verifiable(result):
    t2 = result.frames["sft"].set_index("item_id").loc["T2"]
    assert (t2["metric"], t2["value"], t2["unit"], t2["line"], t2["shift"], t2["date"]) == (
        "downtime",
        90.0,
        "min",
        "L1",
        "A",
        "2026-03-14",
    )
    assert t2["evidence"] == "The line stood still for 90 min" and t2["source_system"] == "cmms"
    assert t2["input_hash"] == input_hash("repaired: downtime on L1 A?")
    r1 = result.frames["replay"].iloc[0]
    assert (r1["value"], r1["unit"], r1["context_doc_ids"]) == (98.2, "%", "[]")
    kb = result.frames["kb"].set_index("doc_id")
    for row in result.frames["sft"].itertuples():
        assert row.evidence in kb.loc[row.evidence_doc_id, "body"]


def test_records_deduplicated_within_and_across_systems(result):
    rec = _fate(result, "records")
    assert rec == {
        ("QI-1", "duplicate_across_systems"): "deduplicated",
        ("WO-2", "duplicate_within_system"): "deduplicated",
        ("SR-2", "unknown_line"): "rejected",
        ("SR-3", "unparseable_date"): "rejected",
    }
    assert sorted(result.frames["records"]["record_id"]) == ["SR-1", "WO-1"]


def test_the_documented_copy_of_a_duplicate_is_kept():
    rows = [
        _rec("WO-7", "cmms", "L2", "C", "2026-03-02", "Downtime", 45.0, "min", 9),
        _rec("SR-7", "mes", "L2", "C", "2026-03-02", "Downtime", 45.0, "min", 4),
    ]
    records, _ = normalize_records(pd.DataFrame(rows), V)
    kept, rejects = dedup_records(records, ["WO-7"], ["mes", "qms", "cmms"], V.answer.keys)
    assert list(kept["record_id"]) == ["WO-7"]
    assert [(r["item_id"], r["rule"]) for r in rejects] == [("SR-7", "duplicate_across_systems")]
    kept, _ = dedup_records(
        records, [], ["mes", "qms", "cmms"], V.answer.keys
    )  # no document: system priority decides
    assert list(kept["record_id"]) == ["SR-7"]


def test_kb_joins_facts_of_its_record_even_when_deduplicated(result):
    kb = result.frames["kb"].set_index("doc_id")
    assert tuple(kb.loc["D1", ["line", "shift", "date"]]) == ("L3", "B", "2026-03-14")
    assert kb.loc["D1", "title"] == "Title D1"
    assert kb.loc["D3", ["line", "shift", "date"]].isna().all()  # QI-9 is no record


def test_kb_documents_with_an_empty_body_are_rejected():
    assets = tiny_assets()
    assets["kb"].loc[2, "body"] = " \u200b\u00a0"
    res = normalize_batch(assets, P)
    assert _fate(res, "kb") == {("D3", "empty_body"): "rejected"}
    assert _fate(res, "replay")[("R1", "evidence_doc_unknown")] == "rejected"  # R1 cited D3


def test_metrics_account_for_every_row(result):
    m = result.metrics
    for name in ("records", "kb", "sft", "grpo", "eval", "replay"):
        dropped = sum(
            v
            for k, v in m.items()
            if k.startswith(f"{name}_rejected_") or k.startswith(f"{name}_deduplicated_")
        )
        assert m[f"{name}_rows_in"] == m[f"{name}_rows_out"] + dropped, name
    assert m["sft_rejected_unknown_metric"] == 1 and m["total_repaired"] == 2
    assert all(isinstance(v, int) for v in m.values())


def test_normalize_is_deterministic_and_order_free():
    a = normalize_batch(tiny_assets(), P)
    shuffled = {k: v.sample(frac=1.0, random_state=3) for k, v in tiny_assets().items()}
    b = normalize_batch(shuffled, P)
    for name in a.frames:
        assert io.logical_hash(a.frames[name]) == io.logical_hash(b.frames[name]), name


# --------------------------------------------------------------------------- bad input


def test_conflicting_vocabulary_is_refused():
    words = {**P.keys["metric"]["words"], "oee": {"unit": "%", "labels": ["fpy"]}}
    keys = {**P.keys, "metric": {**P.keys["metric"], "words": words}}
    with pytest.raises(ClapError) as e:
        build_vocab(dataclasses.replace(P, keys=keys))
    assert e.value.rule == "bad_params" and "fpy" in str(e.value)


def test_params_with_a_missing_key_name_the_key(tmp_path):
    raw = params.raw_section("normalize", ROOT / "params.yaml")
    del raw["date_formats"]
    (tmp_path / "params.yaml").write_text(json.dumps({"normalize": raw}))
    with pytest.raises(ClapError) as e:
        normalize_params(tmp_path / "params.yaml")
    assert e.value.rule == "missing_param" and e.value.column == "normalize.date_formats"


def _write_assets(folder: Path) -> None:
    for name, df in tiny_assets().items():
        io.write_parquet(folder / f"{name}.parquet", df)


def test_missing_asset_file_names_it(tmp_path):
    _write_assets(tmp_path)
    (tmp_path / "kb.parquet").unlink()
    with pytest.raises(ClapError) as e:
        load_assets(tmp_path, P.answer)
    assert e.value.rule == "missing_file" and str(e.value.file).endswith("kb.parquet")


def test_corrupt_asset_parquet_names_it(tmp_path):
    _write_assets(tmp_path)
    (tmp_path / "eval.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ClapError) as e:
        load_assets(tmp_path, P.answer)
    assert e.value.rule == "corrupt_parquet" and str(e.value.file).endswith("eval.parquet")


def test_asset_missing_a_column_names_it(tmp_path):
    _write_assets(tmp_path)
    io.write_parquet(tmp_path / "sft.parquet", tiny_assets()["sft"].drop(columns="evidence_doc_id"))
    with pytest.raises(ClapError) as e:
        load_assets(tmp_path, P.answer)
    assert (e.value.rule, e.value.column) == ("missing_column", "evidence_doc_id") and str(
        e.value.file
    ).endswith("sft.parquet")


def test_malformed_context_is_a_row_reject():
    assets = tiny_assets()
    assets["eval"].loc[0, "context_doc_ids"] = "D1, D2"
    rej = normalize_batch(assets, P).rejects
    row = rej[(rej["artifact"] == "eval") & (rej["item_id"] == "E1")].iloc[0]
    assert row["rule"] == "malformed_context" and "context_doc_ids" in row["detail"]


# --------------------------------------------------------------------------- dates in prose


@settings(max_examples=60, deadline=None)
@given(
    day=st.dates(min_value=dt.date(2000, 1, 1), max_value=dt.date(2099, 12, 31)),
    fmt=st.sampled_from(["%Y-%m-%d", "%d.%m.%Y", "%d %B %Y", "%B %d, %Y", "%d %b %Y"]),
    before=st.sampled_from(["", "Report from", "Line L3, shift B,", "("]),
    after=st.sampled_from(["", ".", ",", ")", "; scrap 4 pcs."]),
)
def test_dates_in_finds_a_written_date_in_prose(day, fmt, before, after):
    text = f"{before} {day.strftime(fmt)}{after} The OEE was 81.5 %."
    assert dates_in(text, V) == [day.isoformat()]


def test_dates_in_keeps_order_and_ignores_numbers_that_are_no_date():
    text = "From 2026-01-05 to 7 January 2026 the OEE was 81.5 % and 14 pcs; 2026-01-05 again."
    assert dates_in(text, V) == ["2026-01-05", "2026-01-07"]
    assert dates_in("Scrap 12.5 % on line 3, 1200 ppm.", V) == []


def _dates_in_every_run(text: str, vocab, max_words: int = 4) -> list[str]:
    """dates_in's definition by brute force: every run of words tried, nothing skipped or memoized."""
    words = clean_text(text).split()
    found = []
    for i in range(len(words)):
        for j in range(min(len(words), i + max_words), i, -1):
            iso = parse_date(" ".join(words[i:j]).rstrip(",.;:)").lstrip("("), vocab)
            if iso is not None:
                found.append(iso)
                break
    return list(dict.fromkeys(found))


_PROSE_WORDS = ["14", "Mar", "March", "2026", "2026-03-14", "03/14/2026", "14.03.2026", "(", "),", "line",
                "L5", "shift", "B,", "at", "08:30", "2026-03-14T08:30:00", "scrap", "4.5", "%", "pcs.", "١٤",
                "１４", "March 14,", "the"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(_PROSE_WORDS), max_size=14))
def test_dates_in_equals_trying_every_run(words):
    """The digit-free runs dates_in skips and its memo change nothing: the brute force finds the same dates."""
    text = " ".join(words)
    assert dates_in(text, V) == _dates_in_every_run(text, V)
    assert dates_in(text, V) == _dates_in_every_run(text, V)  # again, from the memo


def test_dates_in_skips_digit_free_runs_only_when_every_format_reads_digits():
    """A format without a numeric directive (%B alone) can match a digit-free run: then nothing is skipped."""
    monthly = dataclasses.replace(V, date_formats=(*V.date_formats, "%B"))
    assert dates_in("in March the OEE fell", V) == []
    assert dates_in("in March the OEE fell", monthly) == ["1900-03-01"]
