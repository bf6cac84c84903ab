"""clap.task.prompt: one builder for training, eval, replay and serving."""

from __future__ import annotations

import json

import pytest

from clap.task import prompt

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
    text = prompt.format_answer({**ANSWER, "extra": 1})
    assert list(json.loads(text)) == list(prompt.ANSWER_FIELDS)
    assert '"value": 2,' in text  # integral values render without a trailing .0


def test_answer_refuses_missing_fields_and_non_finite_values():
    with pytest.raises(ValueError):
        prompt.format_answer({k: v for k, v in ANSWER.items() if k != "date"})
    with pytest.raises(ValueError):
        prompt.format_answer({**ANSWER, "value": float("nan")})


def test_messages_with_and_without_context():
    docs = [("D1", "Scrap rate on L3 was 2.0 %.  "), ("D2", "OEE 71 %")]
    rag = prompt.build_messages(" What was it? ", docs)
    assert [m["role"] for m in rag] == ["system", "user"]
    assert "[D1] Scrap rate on L3 was 2.0 %.\n[D2] OEE 71 %" in rag[1]["content"]
    assert rag[1]["content"].endswith("Question: What was it?")
    assert prompt.NO_CONTEXT in prompt.build_messages("q", None)[1]["content"]
    ex = prompt.build_example("q", docs, ANSWER)
    assert ex["completion"][0]["content"] == prompt.format_answer(ANSWER)
