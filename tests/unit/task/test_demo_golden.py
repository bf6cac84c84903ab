"""The demo declaration's prompt, SFT completion and constrained-decoding JSON schema, byte for byte.

Pinned when text values were added (a ``text`` value must change nothing for the demo's ``number``
value): the strings are literal, the JSON schemas their sha256 over ``json.dumps`` (key order included).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from clap.task import prompt
from clap.task.answer import gold_of, load_answer_schema

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_answer_schema(ROOT / "params.yaml")
ANSWER = {
    "metric": "oee",
    "line": "L2",
    "shift": "A",
    "date": "2026-01-05",
    "evidence": "OEE on L2 was 81.5 %",
    "value": 81.5,
    "unit": "%",
}
VOCAB = {"metric": ["oee", "scrap_count"], "line": ["L1", "L2"], "shift": ["A", "B"], "unit": ["%", "pcs"]}
COMPLETION = (
    '{"metric": "oee", "line": "L2", "shift": "A", "date": "2026-01-05", '
    '"evidence": "OEE on L2 was 81.5 %", "value": 81.5, "unit": "%"}'
)


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()


def test_demo_prompt_and_completion_are_unchanged():
    ex = prompt.build_example("What was OEE?", [("KB-1", "OEE on L2 was 81.5 %.")], ANSWER, SCHEMA)
    assert ex["prompt"] == [
        {
            "role": "system",
            "content": 'Answer from the context only, as one JSON object with keys "metric", "line", "shift", '
            '"date", "evidence" (a verbatim quote from the context that contains the value), "value", "unit".',
        },
        {"role": "user", "content": "Context:\n[KB-1] OEE on L2 was 81.5 %.\n\nQuestion: What was OEE?"},
    ]
    assert ex["completion"] == [{"role": "assistant", "content": COMPLETION}]
    assert prompt.format_answer({**ANSWER, "value": 82.0}, SCHEMA) == COMPLETION.replace("81.5,", "82,", 1)
    assert '"value": 0.333333,' in prompt.format_answer({**ANSWER, "value": 1 / 3}, SCHEMA)
    row = {**ANSWER, "value": "81.5", "item_id": "Q-1"}
    assert gold_of(row, SCHEMA)["value"] == 81.5 and isinstance(gold_of(row, SCHEMA)["value"], float)


def test_demo_json_schemas_are_unchanged():
    grounded = prompt.answer_json_schema(
        SCHEMA, VOCAB, ["OEE on L2 was 81.5 %"], {"oee": "%", "scrap_count": "pcs"}, ["2026-01-05"]
    )
    assert _sha(grounded) == "896f5a5c7fe20a20ce2be679efe1e3949ef8bc837c71582e1877fe2d0659d8f0"
    assert _sha(prompt.answer_json_schema(SCHEMA, VOCAB)) == (
        "df50af6481f0e47303dfe6b5e198ca94353fed574b7ffeba24144e774a73cb38"
    )
    assert grounded["anyOf"][0]["properties"]["value"] == {"type": "number"}
