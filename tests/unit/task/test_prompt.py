"""clap.task.prompt: one builder for training, eval, replay and serving."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clap.task import prompt
from clap.task.answer import load_answer_schema
from clap.task.prompt import DATE_PATTERN

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_answer_schema(ROOT / "params.yaml")
FIELDS = ("metric", "line", "shift", "date", "evidence", "value", "unit")  # the declared order

ANSWER = {
    "metric": "scrap_rate",
    "value": 2.0,
    "unit": "%",
    "line": "L3",
    "shift": "B",
    "date": "2026-03-14",
    "evidence": "scrap rate 2.0 %",
}


def test_answer_is_canonical_json_in_field_order():
    assert SCHEMA.names == FIELDS
    text = prompt.format_answer({**ANSWER, "extra": 1}, SCHEMA)
    assert list(json.loads(text)) == list(FIELDS)
    assert '"value": 2,' in text  # integral values render without a trailing .0


def test_answer_refuses_missing_fields_and_non_finite_values():
    with pytest.raises(ValueError):
        prompt.format_answer({k: v for k, v in ANSWER.items() if k != "date"}, SCHEMA)
    with pytest.raises(ValueError):
        prompt.format_answer({**ANSWER, "value": float("nan")}, SCHEMA)


def test_messages_with_and_without_context():
    docs = [("D1", "Scrap rate on L3 was 2.0 %.  "), ("D2", "OEE 71 %")]
    rag = prompt.build_messages(" What was it? ", docs, SCHEMA)
    assert [m["role"] for m in rag] == ["system", "user"]
    assert (
        rag[0]["content"]
        == SCHEMA.system_prompt
        == (
            'Answer from the context only, as one JSON object with keys "metric", "line", "shift", "date", '
            '"evidence" (a verbatim quote from the context that contains the value), "value", "unit".'
        )
    )
    assert "[D1] Scrap rate on L3 was 2.0 %.\n[D2] OEE 71 %" in rag[1]["content"]
    assert rag[1]["content"].endswith("Question: What was it?")
    assert prompt.NO_CONTEXT in prompt.build_messages("q", None, SCHEMA)[1]["content"]
    ex = prompt.build_example("q", docs, ANSWER, SCHEMA)
    assert ex["prompt"] == prompt.build_messages("q", docs, SCHEMA)
    assert ex["completion"][0]["content"] == prompt.format_answer(ANSWER, SCHEMA)


def test_context_without_doc_ids_shows_each_documents_text_on_its_own_line():
    docs = [("9989ca79-5332-47be-a08e-85f2648cdde7/r3", "Revenue: 2019 154,159 "), ("p-1", "It grew.")]
    hidden = dataclasses.replace(SCHEMA, show_doc_ids=False)
    user = prompt.build_messages("q", docs, hidden)[1]["content"]
    assert user == "Context:\nRevenue: 2019 154,159\nIt grew.\n\nQuestion: q"
    assert "[p-1] It grew." in prompt.build_messages("q", docs, SCHEMA)[1]["content"]


def test_answer_schema_ties_unit_to_metric_and_grounds_evidence_and_date():
    from clap.task.prompt import answer_json_schema, context_sentences

    vocab = {"metric": ["oee", "scrap_count"], "line": ["L1"], "shift": ["A", "B"], "unit": ["%", "pcs"]}
    docs = [("KB-1", "OEE was 81.5 %. Line L1 ran on 2026-01-05!  Fine?"), ("KB-2", "OEE was 81.5 %.")]
    quotes = context_sentences(docs)
    assert quotes == ["OEE was 81.5 %", "Line L1 ran on 2026-01-05", "Fine"]
    s = answer_json_schema(SCHEMA, vocab, quotes, {"oee": "%", "scrap_count": "pcs"}, ["2026-01-05"])
    assert [alt["properties"]["metric"]["const"] for alt in s["anyOf"]] == ["oee", "scrap_count"]
    assert [alt["properties"]["unit"]["const"] for alt in s["anyOf"]] == ["%", "pcs"]
    alt = s["anyOf"][0]
    assert list(alt["properties"]) == list(FIELDS) and alt["required"] == list(FIELDS)
    assert alt["additionalProperties"] is False
    assert alt["properties"]["evidence"]["enum"] == quotes
    assert alt["properties"]["date"]["enum"] == ["2026-01-05"]
    assert alt["properties"]["value"] == {"type": "number"}
    free = answer_json_schema(SCHEMA, vocab)  # no context: a free string and any calendar date
    assert "anyOf" not in free and list(free["properties"]) == list(FIELDS)
    assert free["properties"]["evidence"] == {"type": "string"}
    assert free["properties"]["date"]["pattern"] == DATE_PATTERN
    assert free["properties"]["unit"] == {"type": "string", "enum": ["%", "pcs"]}  # not tied to the metric
    with pytest.raises(ValueError, match="no unit"):
        answer_json_schema(SCHEMA, vocab, None, {"oee": "%"})
    with pytest.raises(ValueError, match="not answer fields"):
        answer_json_schema(SCHEMA, {**vocab, "colour": ["red"]})
    with pytest.raises(ValueError, match="empty vocabulary"):
        answer_json_schema(SCHEMA, {**vocab, "line": []})


def test_date_pattern_accepts_calendar_dates_only():
    import re

    assert re.fullmatch(DATE_PATTERN, "2026-12-31") and re.fullmatch(DATE_PATTERN, "2026-01-01")
    for bad in ("2401-00-00", "2026-13-01", "2026-01-32", "26-01-01", "2026-1-1"):
        assert not re.fullmatch(DATE_PATTERN, bad)
