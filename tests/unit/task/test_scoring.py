"""clap.task.scoring: parsing never raises, fields are judged as the design says."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPORT_ANSWER
from hypothesis import given, settings
from hypothesis import strategies as st

from clap.errors import ClapError
from clap.task.answer import load_answer_schema, parse_answer_schema
from clap.task.prompt import format_answer
from clap.task.scoring import (
    ParsedAnswer,
    ScoringParams,
    context_text,
    numbers_in,
    parse_answer,
    reward,
    score_item,
    scoring_params,
)

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")
FIELDS = ANSWER.names
P = ScoringParams(value_rel_tol=0.001, value_abs_tol=0.01, answer=ANSWER)
GOLD = {
    "metric": "scrap_rate",
    "value": 1.5,
    "unit": "%",
    "line": "L3",
    "shift": "B",
    "date": "2026-03-14",
    "evidence": "Scrap rate 1,5 % on L3",
}
CTX = context_text([("MES-0042", "Shift report L3/B 14.03.2026: Scrap rate 1,5 % on L3; OEE 78,4 %")])


def score(answer: dict | str, gold=GOLD, ctx=CTX) -> dict:
    text = answer if isinstance(answer, str) else format_answer(answer, ANSWER)
    return score_item(parse_answer(text, ANSWER), gold, ctx, P)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_answer_never_raises_on_arbitrary_text(text):
    parsed = parse_answer(text, ANSWER)
    assert isinstance(parsed, ParsedAnswer)
    assert parsed.ok == (parsed.error is None)


@settings(max_examples=100, deadline=None)
@given(st.binary())
def test_parse_answer_never_raises_on_non_text(blob):
    assert parse_answer(blob, ANSWER).ok is False
    assert parse_answer(None, ANSWER).ok is False


answers = st.fixed_dictionaries(
    {
        "metric": st.text(max_size=20),
        "value": st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False)),
        "unit": st.text(max_size=5),
        "line": st.text(max_size=5),
        "shift": st.text(max_size=3),
        "date": st.text(max_size=12),
        "evidence": st.text(max_size=60),
    }
)


@settings(max_examples=200, deadline=None)
@given(answers, st.text(max_size=30), st.text(max_size=30))
def test_format_answer_round_trips_through_junk(answer, before, after):
    text = format_answer(answer, ANSWER)
    parsed = parse_answer(before.replace("{", "(") + "```json\n" + text + "\n```" + after, ANSWER)
    assert parsed.ok
    assert parsed.fields["value"] == pytest.approx(answer["value"], rel=1e-6, abs=1e-6)
    assert {k: parsed.fields[k] for k in FIELDS if k != "value"} == {
        k: answer[k] for k in FIELDS if k != "value"
    }


def test_first_object_wins_and_broken_prefix_is_skipped():
    parsed = parse_answer(
        'note {not json} then {"metric": "oee", "colour": 2, "value": 1} and {"metric": "x"}', ANSWER
    )
    assert parsed.ok and parsed.fields == {"metric": "oee", "value": 1}  # only answer fields are kept


def test_perfect_answer_passes():
    s = score({**GOLD, "metric": "Scrap Rate", "line": " l3 "})
    assert s["pass"] and s["overall"] == 1.0 and not s["hallucination"] and not s["wrong_fact"]


def test_unparseable_is_wrong_on_every_field_and_recorded():
    s = score("I think the scrap rate was 1.5%")
    assert s["parse_ok"] is False and s["overall"] == 0.0 and not s["pass"]
    assert not any(s[f"{k}_correct"] for k in FIELDS)
    assert reward("garbage", GOLD, CTX, P) == 0.0


def test_value_tolerance_and_text_values():
    assert score({**GOLD, "value": 1.505})["value_correct"]
    assert not score({**GOLD, "value": 1.6})["value_correct"]
    s = score(
        '{"metric": "scrap_rate", "value": "1,5 %", "unit": "%", "line": "L3", "shift": "B", "date": "2026-03-14", "evidence": "Scrap rate 1,5 % on L3"}'
    )
    assert s["value_correct"] and s["pass"]
    as_bool = score('{"metric": "scrap_rate", "value": true}')
    assert as_bool["pred_value"] is None and not as_bool["value_correct"] and not as_bool["hallucination"]


def test_wrong_fact_vs_hallucination():
    wrong_fact = score({**GOLD, "value": 78.4})  # in the context (decimal comma), not the answer
    assert wrong_fact["wrong_fact"] and not wrong_fact["hallucination"] and not wrong_fact["pass"]
    invented = score({**GOLD, "value": 7.3})
    assert invented["hallucination"] and not invented["wrong_fact"]
    no_rag = score({**GOLD}, ctx=context_text(None))
    assert no_rag["value_correct"] and not no_rag["evidence_correct"] and not no_rag["hallucination"]


def test_digits_in_doc_ids_and_lines_are_not_context_values():
    assert score({**GOLD, "value": 42})["hallucination"]  # MES-0042 is an ID, not a value
    assert score({**GOLD, "value": 3})["hallucination"]  # L3 is a line, not a value


def test_evidence_must_be_verbatim_and_carry_the_value():
    assert not score({**GOLD, "evidence": "Scrap rate 1.5 % on L3"})["evidence_correct"]  # not verbatim
    assert not score({**GOLD, "evidence": "OEE 78,4 %"})["evidence_correct"]  # verbatim, wrong value
    assert score({**GOLD, "evidence": "Scrap rate  1,5 %"})["evidence_correct"]  # whitespace runs only
    assert not score({**GOLD, "evidence": ""})["evidence_correct"]
    ctx_hours = context_text([("CMMS-1", "Line L3 stopped: downtime 1,5 h due to jam")])
    gold_min = {**GOLD, "metric": "downtime", "value": 90.0, "unit": "min", "evidence": "downtime 1,5 h"}
    assert score({**gold_min, "evidence": "L3 stopped: downtime 1,5 h due"}, gold_min, ctx_hours)[
        "evidence_correct"
    ]


def test_overall_is_the_weighted_field_score():
    s = score({**GOLD, "shift": "C", "evidence": "nope"})
    assert s["overall"] == pytest.approx((9 - 1 - 2) / 9)
    assert (
        reward(format_answer({**GOLD, "shift": "C", "evidence": "nope"}, ANSWER), GOLD, CTX, P)
        == s["overall"]
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,5 %", [1.5]),
        ("1.234,5", [1234.5]),
        ("1,234.5", [1234.5]),
        ("1,234", [1.234, 1234.0]),
        ("\u22123,5", [-3.5]),
        ("L3 2026-03-14", [2026.0]),
        ("\uff19\uff18", [98.0]),
    ],
)
def test_numbers_in_handles_decimal_commas(text, expected):
    assert numbers_in(text) == pytest.approx(expected)


def test_bad_tolerances_are_refused():
    with pytest.raises(ClapError) as e:
        ScoringParams(-0.1, 0.0, ANSWER)
    assert (e.value.rule, e.value.column) == ("bad_params", "scoring.value_rel_tol")
    with pytest.raises(ClapError) as e:
        ScoringParams(0.0, -0.01, ANSWER)
    assert (e.value.rule, e.value.column) == ("bad_params", "scoring.value_abs_tol")
    # zero or negative weights are refused where they are declared: tests/unit/task/test_answer.py


def test_scoring_params_read_the_tolerances_and_the_declared_answer(tmp_path):
    sp = scoring_params(ROOT / "params.yaml")
    assert sp.answer == ANSWER and min(sp.value_rel_tol, sp.value_abs_tol) >= 0
    text = (ROOT / "params.yaml").read_text(encoding="utf-8")
    (tmp_path / "params.yaml").write_text(
        text.replace("scoring:\n", "scoring:\n  weights: {value: 2}\n", 1), encoding="utf-8"
    )
    with pytest.raises(ClapError) as e:  # the weights live in task.answer, not in scoring
        scoring_params(tmp_path / "params.yaml")
    assert (e.value.rule, e.value.column) == ("bad_params", "scoring.weights")


OTHER = parse_answer_schema({**REPORT_ANSWER, "slice_columns": []})  # keys row/period, a scale unit


def test_another_declaration_is_parsed_and_scored_by_its_own_fields_and_weights():
    p = ScoringParams(0.001, 0.01, OTHER)
    gold = {
        "row": "Net sales",
        "period": "2026-01-31",
        "evidence": "Net sales 12,5",
        "value": 12.5,
        "scale": "M",
    }
    ctx = context_text([("FIN-1", "January close: Net sales 12,5 M EUR; costs 9,1 M EUR")])
    text = format_answer({**gold, "metric": "oee"}, OTHER)
    assert text.startswith('{"row": "Net sales", "period": ') and "metric" not in text
    parsed = parse_answer(text, OTHER)
    assert parsed.fields == {**gold}
    s = score_item(parsed, gold, ctx, p)
    assert s["pass"] and s["overall"] == 1.0
    assert {k for k in s if k.endswith("_correct")} == {f"{k}_correct" for k in OTHER.names}
    wrong = score_item(
        parse_answer(format_answer({**gold, "period": "2026-02-28", "value": 9.1}, OTHER), OTHER),
        gold,
        ctx,
        p,
    )
    assert not wrong["period_correct"] and not wrong["value_correct"] and wrong["wrong_fact"]
    assert wrong["overall"] == pytest.approx((7 - 1 - 3) / 7)
    assert reward("nothing", gold, ctx, p) == 0.0
