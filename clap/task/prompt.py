"""The one prompt builder: training, eval, replay and serving all build prompts here.

A model answers with one JSON object whose keys are the declared answer's fields
(:mod:`clap.task.answer`, params ``task``), in that order. The demo's declaration puts the
record's key first (metric, line, shift, date, copied from the question), then the verbatim
evidence from the one context document with that key, and only then the value and unit, copied
from the evidence just written. Grounding before answering matters for a small model: with the
value first it commits to a number before it has located the record (SmolLM2-135M then copied a
distractor's value in about half of the held-out items). The same ``format_answer`` renders SFT
completions and GRPO references, so what the model is trained to emit is exactly what the parser
in ``clap.task.scoring`` reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clap.task.answer import AnswerSchema

NO_CONTEXT = "(no documents retrieved)"
# a calendar date in the canonical (ISO) form normalization writes
DATE_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# the longest text value constrained decoding lets a model write (characters; TAT-QA's spans are far
# shorter: it bounds a rambling answer, it is not a knob)
TEXT_VALUE_MAX_CHARS = 200


def context_sentences(docs: Sequence[tuple[str, str]] | None) -> list[str]:
    """The quotable sentences of a context, in order, without their final punctuation (the evidence form)."""
    out: list[str] = []
    for _, text in docs or []:
        out.extend(s.strip().rstrip(".!?").strip() for s in _SENTENCE_END.split(text.strip()))
    return list(dict.fromkeys(s for s in out if s))


def answer_json_schema(
    schema: AnswerSchema,
    vocabularies: Mapping[str, Sequence[str]],
    quotes: Sequence[str] | None = None,
    units: Mapping[str, str] | None = None,
    dates: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The JSON schema of an answer, as constrained decoding enforces it.

    Every answer field, in order, is required and no other is allowed; the value is a JSON
    number (a ``text`` value: a JSON string of at most :data:`TEXT_VALUE_MAX_CHARS` characters), a ``date`` field a calendar date in ISO form (one of ``dates`` when given: the dates
    the context mentions), a ``vocabulary`` field one of ``vocabularies[field]``, the evidence
    one of ``quotes`` (the context's sentences, :func:`context_sentences`; None or empty: any
    string, as when there is no context), any other field a string. With ``units`` (each value of
    the unit's ``of`` key field -> its unit) there is one object schema per value of that key
    field, so the unit is forced once the key is chosen.
    """
    unknown = sorted(set(vocabularies) - set(schema.names))
    if unknown:
        raise ValueError(f"vocabularies for fields that are not answer fields: {unknown}")
    props: dict[str, Any] = {}
    for f in schema.fields:
        if f.type == "vocabulary":
            words = list(dict.fromkeys(str(w) for w in vocabularies.get(f.name, [])))
            if not words:
                raise ValueError(f"empty vocabulary for answer field {f.name!r}")
            props[f.name] = {"type": "string", "enum": words}
        elif f.role == "evidence" and quotes:
            props[f.name] = {"type": "string", "enum": list(dict.fromkeys(quotes))}
        elif f.type == "number":
            props[f.name] = {"type": "number"}
        elif f.role == "value":  # a text value
            props[f.name] = {"type": "string", "maxLength": TEXT_VALUE_MAX_CHARS}
        elif f.type == "date" and dates:
            props[f.name] = {"type": "string", "enum": list(dict.fromkeys(dates))}
        elif f.type == "date":
            props[f.name] = {"type": "string", "pattern": DATE_PATTERN}
        else:
            props[f.name] = {"type": "string"}

    def obj(properties: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": properties,
            "required": list(schema.names),
            "additionalProperties": False,
        }

    unit = next((f for f in schema.fields if f.role == "unit" and f.of), None)
    if not units or unit is None:
        return obj(props)
    keys = props[unit.of].get("enum", list(units))
    missing = sorted(set(keys) - set(units))
    if missing:
        raise ValueError(f"no {unit.name} for {unit.of} {missing}")
    return {
        "anyOf": [
            obj(
                {
                    **props,
                    unit.of: {"type": "string", "const": k},
                    unit.name: {"type": "string", "const": units[k]},
                }
            )
            for k in keys
        ]
    }


def format_context(docs: Iterable[tuple[str, str]], show_doc_ids: bool = True) -> str:
    """Render (doc_id, text) pairs as the context block, one document per line, each after its
    ``[doc_id]`` when ``show_doc_ids``; an empty list renders NO_CONTEXT."""
    lines = [f"[{doc_id}] {text.strip()}" if show_doc_ids else text.strip() for doc_id, text in docs]
    return "\n".join(lines) if lines else NO_CONTEXT


def build_messages(
    question: str, docs: Sequence[tuple[str, str]] | None, schema: AnswerSchema
) -> list[dict[str, str]]:
    """Chat messages (system + user) for one question; ``docs=None`` or ``[]`` is the no-RAG condition."""
    user = f"Context:\n{format_context(docs or [], schema.show_doc_ids)}\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": schema.system_prompt}, {"role": "user", "content": user}]


def _num(v: float) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"answer value must be a finite number, got {v!r}")
    return int(v) if float(v).is_integer() else round(float(v), 6)


def _text(v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"a text answer value must be a non-blank string, got {v!r}")
    return v


def format_answer(answer: Mapping[str, object], schema: AnswerSchema) -> str:
    """Canonical JSON text of an answer (the declared key order, the value as a number, or as a
    JSON string when it is declared ``type: text``)."""
    missing = [k for k in schema.names if k not in answer]
    if missing:
        raise ValueError(f"answer is missing fields {missing}")
    obj = {k: answer[k] for k in schema.names}
    value = obj[schema.value]
    obj[schema.value] = _text(value) if schema.value_is_text else _num(value)  # type: ignore[arg-type]
    return json.dumps(obj, ensure_ascii=False)


def build_example(
    question: str, docs: Sequence[tuple[str, str]] | None, answer: Mapping[str, object], schema: AnswerSchema
) -> dict:
    """A TRL conversational prompt/completion example (completion-only loss by default)."""
    return {
        "prompt": build_messages(question, docs, schema),
        "completion": [{"role": "assistant", "content": format_answer(answer, schema)}],
    }
