"""A value declared ``type: text`` end to end in clap.task: declaration, gold, prompt and completion,
JSON schema, parsing and scoring (correct, wrong fact, hallucination, evidence), the text normalization."""

from __future__ import annotations

import json

import pytest
from conftest import TEXT_ANSWER
from hypothesis import given, settings
from hypothesis import strategies as st

from clap.task import prompt
from clap.task.answer import gold_of, parse_answer_schema
from clap.task.scoring import (
    ScoringParams,
    context_text,
    normalize_text,
    parse_answer,
    reward,
    score_item,
)

ANSWER = parse_answer_schema(TEXT_ANSWER)
P = ScoringParams(0.001, 0.01, ANSWER)
BODY = (
    "Revenue by contract type: Fixed Price contracts $1,496.5 million; Time and Materials contracts "
    "$812.0 million. Net loss was (2,345) thousand."
)
CTX = context_text([("R-1", BODY)])
GOLD = {
    "row": "Revenue by contract type",
    "evidence": "Fixed Price contracts $1,496.5 million",
    "value": "Fixed Price",
    "scale": "none",
}


def score(answer: dict | str, gold=GOLD, ctx=CTX) -> dict:
    text = answer if isinstance(answer, str) else prompt.format_answer(answer, ANSWER)
    return score_item(parse_answer(text, ANSWER), gold, ctx, P)


def test_a_text_value_is_a_first_class_declaration():
    assert ANSWER.value_is_text and ANSWER.field("value").type == "text"
    assert ANSWER.names == ("row", "evidence", "value", "scale")
    assert ANSWER.slices == ("question_type", "source_system")
    assert ANSWER.perturbations == ("wrong_value", "wrong_row", "other_doc_evidence", "unparseable")
    row = {**GOLD, "value": "$1,496.5", "item_id": "Q-1", "question_type": "span"}
    assert gold_of(row, ANSWER) == {**GOLD, "value": "$1,496.5"}  # as the report prints it, a str


def test_completion_and_prompt_write_the_value_as_a_json_string():
    text = prompt.format_answer({**GOLD, "value": "$1,496.5"}, ANSWER)
    assert text == (
        '{"row": "Revenue by contract type", "evidence": "Fixed Price contracts $1,496.5 million", '
        '"value": "$1,496.5", "scale": "none"}'
    )
    assert json.loads(text)["value"] == "$1,496.5"
    assert parse_answer(text, ANSWER).fields == {**GOLD, "value": "$1,496.5"}
    ex = prompt.build_example("What was it?", [("R-1", BODY)], GOLD, ANSWER)
    assert ex["prompt"][0]["content"] == (
        'Answer from the report only, as one JSON object with keys "row", "evidence", "value", "scale".'
    )
    assert ex["completion"][0]["content"] == prompt.format_answer(GOLD, ANSWER)
    for bad in (12.5, "", "   ", None):
        with pytest.raises(ValueError, match="non-blank string"):
            prompt.format_answer({**GOLD, "value": bad}, ANSWER)


def test_json_schema_makes_the_value_a_bounded_string():
    words = {"scale": ["none", "thousand", "million", "billion", "percent"]}
    s = prompt.answer_json_schema(ANSWER, words, ["Fixed Price contracts $1,496.5 million"])
    assert s["properties"]["value"] == {"type": "string", "maxLength": prompt.TEXT_VALUE_MAX_CHARS}
    assert prompt.TEXT_VALUE_MAX_CHARS == 200
    assert s["properties"]["evidence"] == {
        "type": "string",
        "enum": ["Fixed Price contracts $1,496.5 million"],
    }
    assert s["required"] == list(ANSWER.names) and s["additionalProperties"] is False


def test_right_value_scores_right_whatever_its_case_spacing_and_article():
    for variant in ("Fixed Price", "fixed price", "  The FIXED   price. ", '"Fixed Price"'):
        s = score({**GOLD, "value": variant})
        assert s["value_correct"] and s["pass"] and s["overall"] == 1.0, variant
        assert s["pred_value"] == variant and not s["hallucination"] and not s["wrong_fact"]


def test_a_wrong_value_in_the_context_is_a_wrong_fact_and_one_absent_a_hallucination():
    fact = score({**GOLD, "value": "Time and Materials"})
    assert not fact["value_correct"] and fact["wrong_fact"] and not fact["hallucination"]
    assert fact["overall"] == pytest.approx(3 / 6)
    made_up = score({**GOLD, "value": "Cost Plus"})
    assert made_up["hallucination"] and not made_up["wrong_fact"] and made_up["pred_value"] == "Cost Plus"
    missing = score('{"row": "Revenue by contract type", "evidence": "x", "scale": "none"}')
    assert missing["pred_value"] is None and not missing["hallucination"] and not missing["wrong_fact"]


def test_numbers_and_brackets_are_compared_as_text():
    gold = {**GOLD, "value": "(2,345)", "evidence": "Net loss was (2,345) thousand"}
    assert score({**gold, "value": "(2,345)"}, gold)["value_correct"]
    minus = score({**gold, "value": "2,345"}, gold)  # the sign is kept: a different value, in the context
    assert not minus["value_correct"] and minus["wrong_fact"]
    as_number = score_item(parse_answer('{"value": 1496.5}', ANSWER), {**GOLD, "value": "1496.5"}, CTX, P)
    assert as_number["value_correct"] and as_number["pred_value"] == "1496.5"  # a JSON number, read as text


def test_evidence_must_be_verbatim_and_carry_the_gold_text_or_quote():
    assert score(GOLD)["evidence_correct"]
    carries = score({**GOLD, "evidence": "Fixed Price contracts"})  # holds the gold value's text
    assert carries["evidence_correct"]
    other = score({**GOLD, "evidence": "Time and Materials contracts $812.0 million"})
    assert not other["evidence_correct"]  # verbatim but without the value
    assert not score({**GOLD, "evidence": "Fixed Price revenue"})["evidence_correct"]  # not in the context
    assert reward(prompt.format_answer(GOLD, ANSWER), GOLD, CTX, P) == 1.0


def test_normalize_text_examples():
    assert normalize_text(" The  'Fixed Price'. ") == "fixed price"
    assert normalize_text("ＦＩＸＥＤ Price") == "fixed price"  # NFKC
    assert normalize_text("12%") == "12%" and normalize_text("$1,496.5") == "$1,496.5"
    assert normalize_text("an apple a day") == "apple a day"
    assert normalize_text("the") == "the"  # an article alone is the value itself
    assert normalize_text("...") is None and normalize_text(None) is None and normalize_text(True) is None


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_normalize_text_is_idempotent(text):
    once = normalize_text(text)
    assert once is None or normalize_text(once) == once


VALUES = st.text(alphabet=st.characters(categories=("L", "N", "Zs", "P", "S")), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(VALUES, st.sampled_from([str.upper, str.lower, str.title]), st.integers(1, 3), st.integers(0, 2))
def test_case_and_whitespace_variants_score_correct(value, case, spaces, pad):
    if normalize_text(value) is None:
        return
    variant = " " * pad + (" " * spaces).join(case(value).split(" ")) + "\t" * pad
    if normalize_text(case(value)) != normalize_text(value):  # a case mapping that is not case folding
        return  # (e.g. "ǅ".upper()); case-folded equality is the contract, not every str method
    gold = {**GOLD, "value": value}
    s = score_item(parse_answer(json.dumps({"value": variant}), ANSWER), gold, CTX, P)
    assert s["value_correct"]
