"""The one prompt builder: training, eval, replay and serving all build prompts here.

A model answers with one JSON object whose keys are ANSWER_FIELDS, in that order: first
the record's key (metric, line, shift, date, copied from the question), then the verbatim
evidence from the one context document with that key, and only then the value and unit,
copied from the evidence just written. Grounding before answering matters for a small model:
with the value first it commits to a number before it has located the record (SmolLM2-135M
then copied a distractor's value in about half of the held-out items). The
same ``format_answer`` renders SFT completions and GRPO references, so what the model is
trained to emit is exactly what the parser in ``clap.task.scoring`` reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ANSWER_FIELDS: tuple[str, ...] = ("metric", "line", "shift", "date", "evidence", "value", "unit")
CORE_FIELDS: tuple[str, ...] = ("metric", "line", "shift", "date")

SYSTEM_PROMPT = (  # short on purpose: every prompt token is paid in training, eval, replay and serving
    'Answer from the context only, as one JSON object with keys "metric", "line", "shift", "date", '
    '"evidence" (a verbatim quote from the context that contains the value), "value", "unit".'
)
NO_CONTEXT = "(no documents retrieved)"
# a calendar date in the canonical (ISO) form normalization writes
DATE_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def context_sentences(docs: Sequence[tuple[str, str]] | None) -> list[str]:
    """The quotable sentences of a context, in order, without their final punctuation (the evidence form)."""
    out: list[str] = []
    for _, text in docs or []:
        out.extend(s.strip().rstrip(".!?").strip() for s in _SENTENCE_END.split(text.strip()))
    return list(dict.fromkeys(s for s in out if s))


def answer_json_schema(
    vocabularies: Mapping[str, Sequence[str]],
    quotes: Sequence[str] | None = None,
    units: Mapping[str, str] | None = None,
    dates: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The JSON schema of an answer, as constrained decoding enforces it.

    Every ANSWER_FIELDS key, in that order, is required and no other is allowed; ``value`` is a
    JSON number, ``date`` a calendar date in ISO form, a field with a vocabulary
    (``vocabularies[field]``, e.g. the canonical metrics of params ``normalize``) one of its
    words, ``evidence`` one of ``quotes`` (the context's sentences, :func:`context_sentences`;
    None or empty: any string, as when there is no context), ``date`` one of ``dates`` when
    given (the dates the context mentions), any other field a string. With
    ``units`` (metric -> its canonical unit) the unit is the chosen metric's: one object
    schema per metric, so the unit is forced once the metric is chosen.
    """
    unknown = sorted(set(vocabularies) - set(ANSWER_FIELDS))
    if unknown:
        raise ValueError(f"vocabularies for fields that are not answer fields: {unknown}")
    props: dict[str, Any] = {}
    for field in ANSWER_FIELDS:
        if field in vocabularies:
            words = list(dict.fromkeys(str(w) for w in vocabularies[field]))
            if not words:
                raise ValueError(f"empty vocabulary for answer field {field!r}")
            props[field] = {"type": "string", "enum": words}
        elif field == "evidence" and quotes:
            props[field] = {"type": "string", "enum": list(dict.fromkeys(quotes))}
        elif field == "value":
            props[field] = {"type": "number"}
        elif field == "date" and dates:
            props[field] = {"type": "string", "enum": list(dict.fromkeys(dates))}
        elif field == "date":
            props[field] = {"type": "string", "pattern": DATE_PATTERN}
        else:
            props[field] = {"type": "string"}

    def obj(properties: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": properties,
            "required": list(ANSWER_FIELDS),
            "additionalProperties": False,
        }

    if not units:
        return obj(props)
    metrics = props["metric"].get("enum", list(units))
    missing = sorted(set(metrics) - set(units))
    if missing:
        raise ValueError(f"no unit for metrics {missing}")
    return {
        "anyOf": [
            obj(
                {
                    **props,
                    "metric": {"type": "string", "const": m},
                    "unit": {"type": "string", "const": units[m]},
                }
            )
            for m in metrics
        ]
    }


def format_context(docs: Iterable[tuple[str, str]]) -> str:
    """Render (doc_id, text) pairs as the context block; an empty list renders NO_CONTEXT."""
    lines = [f"[{doc_id}] {text.strip()}" for doc_id, text in docs]
    return "\n".join(lines) if lines else NO_CONTEXT


def build_messages(question: str, docs: Sequence[tuple[str, str]] | None) -> list[dict[str, str]]:
    """Chat messages (system + user) for one question; ``docs=None`` or ``[]`` is the no-RAG condition."""
    user = f"Context:\n{format_context(docs or [])}\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _num(v: float) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"answer value must be a finite number, got {v!r}")
    return int(v) if float(v).is_integer() else round(float(v), 6)


def format_answer(answer: Mapping[str, object]) -> str:
    """Canonical JSON text of an answer (fixed key order, value as a number)."""
    missing = [k for k in ANSWER_FIELDS if k not in answer]
    if missing:
        raise ValueError(f"answer is missing fields {missing}")
    obj = {k: answer[k] for k in ANSWER_FIELDS}
    obj["value"] = _num(obj["value"])  # type: ignore[arg-type]
    return json.dumps(obj, ensure_ascii=False)


def build_example(
    question: str, docs: Sequence[tuple[str, str]] | None, answer: Mapping[str, object]
) -> dict:
    """A TRL conversational prompt/completion example (completion-only loss by default)."""
    return {
        "prompt": build_messages(question, docs),
        "completion": [{"role": "assistant", "content": format_answer(answer)}],
    }


def gold_answer(row: Mapping[str, Any]) -> dict[str, Any]:
    """The reference answer of an item (the ANSWER_FIELDS of its gold)."""
    return {k: (float(row[k]) if k == "value" else str(row[k])) for k in ANSWER_FIELDS}
