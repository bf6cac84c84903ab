"""clap.task.answer: the answer contract declared in params ``task``; one good declaration, one bad per rule."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPORT_ANSWER

from clap import params
from clap.errors import ClapError
from clap.task.answer import gold_of, load_answer_schema, parse_answer_schema
from clap.task.prompt import DATE_PATTERN, answer_json_schema

ROOT = Path(__file__).resolve().parents[3]
RAW = params.raw_section("task", ROOT / "params.yaml")
ANSWER = load_answer_schema(ROOT / "params.yaml")

OTHER_RAW = REPORT_ANSWER  # keys row/period, a scale unit (tests/conftest.py)


def test_the_params_declaration_is_the_demo_contract():
    assert ANSWER.names == ("metric", "line", "shift", "date", "evidence", "value", "unit")
    assert ANSWER.keys == ("metric", "line", "shift", "date")
    assert ANSWER.labels == ("metric", "line", "shift", "date", "unit")
    assert ANSWER.slices == ("metric", "line", "shift", "source_system", "question_type")
    assert (ANSWER.value, ANSWER.evidence) == ("value", "evidence")
    assert ANSWER.weights == {
        "metric": 1.0,
        "line": 1.0,
        "shift": 1.0,
        "date": 1.0,
        "evidence": 2.0,
        "value": 2.0,
        "unit": 1.0,
    }
    assert ANSWER.perturbations == (
        "wrong_value",
        "wrong_metric",
        "wrong_line",
        "wrong_shift",
        "wrong_date",
        "other_doc_evidence",
        "unparseable",
    )
    assert ANSWER.system_prompt == (
        'Answer from the context only, as one JSON object with keys "metric", "line", "shift", "date", '
        '"evidence" (a verbatim quote from the context that contains the value), "value", "unit".'
    )
    assert ANSWER.field("unit").of == "metric" and ANSWER.field("unit").type == "vocabulary"  # default type
    assert ANSWER.field("evidence").type == "text"  # default type of the evidence
    assert ANSWER.field("date").type == "date" and ANSWER.field("value").type == "number"
    assert parse_answer_schema(copy.deepcopy(RAW)) == ANSWER


def test_gold_of_takes_the_answer_fields_of_an_item_row():
    row = {
        "item_id": "Q-1",
        "metric": "oee",
        "line": "L1",
        "shift": "A",
        "date": "2026-01-05",
        "evidence": "OEE was 81.5 %",
        "value": "81.5",
        "unit": "%",
        "question": "q",
    }
    gold = gold_of(row, ANSWER)
    assert list(gold) == list(ANSWER.names)
    assert gold["value"] == 81.5 and isinstance(gold["value"], float)
    assert all(isinstance(gold[k], str) for k in ANSWER.names if k != "value")


def _with(path: tuple[str, ...], value) -> dict:
    """RAW with ``path`` set to ``value`` (None deletes the key)."""
    raw = copy.deepcopy(RAW)
    node = raw
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


def _zero_weights() -> dict:
    raw = copy.deepcopy(RAW)
    for decl in raw["answer"].values():
        decl["weight"] = 0
    return raw


def _renamed(old: str, new: str) -> dict:
    raw = copy.deepcopy(RAW)
    raw["answer"] = {(new if k == old else k): v for k, v in raw["answer"].items()}
    return raw


BAD = [
    (_zero_weights(), "task.answer"),  # the weights must have a positive sum
    (_with(("answer", "line", "weight"), -1.0), "task.answer.line.weight"),
    (_with(("answer", "line", "weight"), True), "task.answer.line.weight"),
    (_with(("answer", "line", "role"), "colour"), "task.answer.line.role"),
    (_with(("answer", "line", "type"), "color"), "task.answer.line.type"),
    (_with(("answer", "value", "type"), "date"), "task.answer.value.type"),  # a value is a number or text
    (_with(("answer", "line", "type"), "number"), "task.answer.line.type"),  # keys compare as labels
    (_renamed("value", "amount"), "task.answer.amount"),  # the value field is named "value"
    (_renamed("evidence", "quote"), "task.answer.quote"),  # the evidence field is named "evidence"
    (_with(("answer", "unit", "of"), "colour"), "task.answer.unit.of"),  # of names a key field
    (_with(("answer", "line", "of"), "metric"), "task.answer.line.of"),  # only a unit has one
    (_with(("answer", "line"), {"role": "value", "type": "number", "weight": 1}), "task.answer"),  # one value
    (_with(("answer", "evidence"), None), "task.answer"),  # exactly one evidence field
    (_with(("answer", "line", "weight"), None), "task.answer.line.weight"),  # role and weight are required
    (_with(("answer", "line", "colour"), 1), "task.answer.line.colour"),  # no other keys
    (_with(("answer",), {}), "task.answer"),
    (_with(("slice_columns",), "source_system"), "task.slice_columns"),
    (_with(("instruction",), None), "task.instruction"),
    (_with(("show_doc_ids",), "yes"), "task.show_doc_ids"),
    (_with(("context", "docs"), -1), "task.context.docs"),  # 0 (every document) or a positive count
    (_with(("context", "docs"), 2.5), "task.context.docs"),
    (_with(("context", "docs"), True), "task.context.docs"),
    (_with(("context", "cues"), "thousands"), "task.context.cues"),  # a list of words
    (_with(("context", "cues"), [""]), "task.context.cues"),
    (_with(("context", "colour"), 1), "task.context.colour"),
]


@pytest.mark.parametrize("raw, column", BAD, ids=[f"{i}-{c}" for i, (_, c) in enumerate(BAD)])
def test_bad_declarations_are_refused_naming_the_key(raw, column):
    with pytest.raises(ClapError) as e:
        parse_answer_schema(raw)
    assert e.value.rule == "bad_params"
    assert e.value.column == column
    assert e.value.file == "params.yaml"


def test_another_declaration_shapes_everything(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"task": OTHER_RAW}, sort_keys=False))
    other = load_answer_schema(tmp_path / "params.yaml")
    assert other == parse_answer_schema(OTHER_RAW)
    assert other.names == ("row", "period", "evidence", "value", "scale")
    assert other.keys == ("row", "period")
    assert other.labels == ("row", "period", "scale")
    assert other.slices == ("source_system",)  # no vocabulary key field: only the declared slice columns
    assert other.weights == {"row": 1.0, "period": 1.0, "evidence": 1.0, "value": 3.0, "scale": 1.0}
    assert other.perturbations == (
        "wrong_value",
        "wrong_row",
        "wrong_period",
        "other_doc_evidence",
        "unparseable",
    )
    assert other.system_prompt == (
        'Answer with one JSON object with keys "row", "period", "evidence", "value", "scale".'
    )
    assert other.field("scale").type == "vocabulary" and other.field("scale").of == ""

    s = answer_json_schema(other, {"scale": ["k", "M"]}, ["Row 7 was 12 k"], {"x": "y"})
    assert "anyOf" not in s  # a unit without ``of`` is not tied to a key: units change nothing
    assert list(s["properties"]) == list(other.names) and s["required"] == list(other.names)
    assert s["additionalProperties"] is False
    assert s["properties"] == {
        "row": {"type": "string"},
        "period": {"type": "string", "pattern": DATE_PATTERN},
        "evidence": {"type": "string", "enum": ["Row 7 was 12 k"]},
        "value": {"type": "number"},
        "scale": {"type": "string", "enum": ["k", "M"]},
    }
    with pytest.raises(ValueError, match="empty vocabulary"):
        answer_json_schema(other, {})
    with pytest.raises(ValueError, match="not answer fields"):
        answer_json_schema(other, {"scale": ["k"], "metric": ["oee"]})
    gold = gold_of({"row": "7", "period": "2026-01-31", "evidence": "e", "value": 12, "scale": "k"}, other)
    assert gold == {"row": "7", "period": "2026-01-31", "evidence": "e", "value": 12.0, "scale": "k"}
