"""Per-item scoring of a model answer against its gold answer and the context it was given.

The model answers with one JSON object (see ``clap.task.prompt``). ``parse_answer`` never raises
on model output: an answer that cannot be parsed is returned with ``ok=False`` and scores
wrong on every field, so it is counted, never dropped. ``score_item`` decides each field,
``pass`` (every field right), ``overall`` (weighted field score, the GRPO reward and admit's
reward margin via :func:`reward`), ``hallucination`` (the predicted value occurs nowhere in
the provided context) and ``wrong_fact`` (it occurs in the context but is not the answer).

A ``number`` value is compared within the ``scoring`` tolerances and found in the context as a
number; a ``text`` value (params ``task.answer.value.type: text``) is compared after
:func:`normalize_text` and found in the context as a substring of the context folded the same way
(NFKC, case-folded, whitespace collapsed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap.params import bad_param, check_keys, raw_section, stray_key
from clap.task.answer import PARAMS, AnswerSchema, load_answer_schema


@dataclasses.dataclass(frozen=True)
class ScoringParams:
    """Params section ``scoring`` and the declared answer it scores (params ``task``: fields, weights)."""

    value_rel_tol: float
    value_abs_tol: float
    answer: AnswerSchema

    def __post_init__(self) -> None:
        check_keys(
            {
                "scoring.value_rel_tol": self.value_rel_tol >= 0,
                "scoring.value_abs_tol": self.value_abs_tol >= 0,
            },
            "scoring tolerances must be >= 0",
        )


def scoring_params(path: Path | str = PARAMS) -> ScoringParams:
    """Params ``scoring`` with the answer schema of params ``task``."""
    raw = raw_section("scoring", path)
    tolerances = ("value_rel_tol", "value_abs_tol")
    if not isinstance(raw, dict) or set(raw) != set(tolerances):
        raise bad_param(
            stray_key("scoring", raw, tolerances),
            "scoring must have exactly value_rel_tol and value_abs_tol (the field weights are "
            "params task.answer.<field>.weight)",
            path,
        )
    return ScoringParams(raw["value_rel_tol"], raw["value_abs_tol"], load_answer_schema(path))


@dataclasses.dataclass(frozen=True)
class ParsedAnswer:
    """A model answer after parsing.

    Attributes:
        ok: a JSON object was found in the text.
        fields: the object's keys that are answer fields (possibly fewer than all).
        error: why parsing failed (None when ``ok``).
    """

    ok: bool
    fields: dict[str, Any]
    error: str | None


_DECODER = json.JSONDecoder()
_MAX_OPEN_BRACES = 64  # bounded work on adversarial text: model answers start early

# A number not glued to a word (so "L3" or "MES-0012" carry no number), with "," or "."
# separators; the minus may be ASCII, U+2212 or an en dash (look-alike noise in exports).
_NUMBER = re.compile(r"(?<![\w.,\-\u2212\u2013])([-\u2212\u2013]?)(\d+(?:[.,]\d+)*)")
_SEPARATORS = re.compile(r"[.,]")


def parse_answer(text: Any, schema: AnswerSchema) -> ParsedAnswer:
    """Extract the first JSON object from model output; never raises.

    Leading prose, code fences and trailing junk are tolerated: decoding starts at each
    ``{`` in turn and the first complete object wins.

    Args:
        text: the raw generated text (anything; non-strings fail to parse).
        schema: the declared answer (which keys are answer fields).

    Returns:
        ParsedAnswer with ``ok=False`` and an error message when no object is found.
    """
    if not isinstance(text, str):
        return ParsedAnswer(False, {}, f"output is {type(text).__name__}, not text")
    start = text.find("{")
    tries = 0
    while start != -1 and tries < _MAX_OPEN_BRACES:
        try:
            obj, _ = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            return ParsedAnswer(True, {k: obj[k] for k in schema.names if k in obj}, None)
        start, tries = text.find("{", start + 1), tries + 1
    return ParsedAnswer(False, {}, "no JSON object found" if tries else "no '{' in output")


def context_text(docs: Sequence[tuple[str, str]] | None) -> str:
    """The text a model was given as context: the documents' texts, one per line.

    Document IDs are left out so that digits in an ID never count as a value "in context".
    """
    return "\n".join(text for _, text in (docs or []))


def _readings(sign: str, token: str) -> list[float]:
    """All plausible values of one number token (decimal comma or point, thousands groups)."""
    seps = _SEPARATORS.findall(token)
    parts = _SEPARATORS.split(token)
    out: list[float] = []
    if not seps:
        out.append(float(token))
    elif len(seps) == 1:
        out.append(float(token.replace(",", ".")))
        if len(parts[1]) == 3:  # "1,234" / "1.234" may be a thousands group
            out.append(float(parts[0] + parts[1]))
    elif len(set(seps[:-1])) == 1 and seps[-1] != seps[0]:  # "1.234,5" / "1,234.5"
        out.append(float("".join(parts[:-1]) + "." + parts[-1]))
    elif len(set(seps)) == 1 and all(len(p) == 3 for p in parts[1:]):  # "1.234.567"
        out.append(float("".join(parts)))
    return [-v if sign else v for v in out]


def numbers_in(text: str) -> list[float]:
    """Every number readable in ``text`` (each reading of an ambiguous token included)."""
    text = unicodedata.normalize("NFKC", text)
    return [v for m in _NUMBER.finditer(text) for v in _readings(m.group(1), m.group(2))]


def to_number(value: Any) -> float | None:
    """A predicted value as a float: numbers, or text such as "98,2 %"; None if not one number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        found = numbers_in(value)
        return found[0] if found else None
    return None


# text values: what surrounds a value without being part of it (sentence punctuation and quotes; not
# brackets, "%", "$" or "-": "(2,345)" is a negative and "12%" a percentage in a financial report)
_EDGE_PUNCTUATION = ".,;:!?\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb "
_LEADING_ARTICLE = re.compile(r"^(?:a|an|the) ")


def _fold(text: str) -> str:
    """NFKC, case-folded (then NFKC again: case folding can leave a non-NFKC sequence), single spaces."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


def value_text(value: Any) -> str | None:
    """A predicted ``text`` value as text: a string, or a finite number as JSON writes it; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return json.dumps(value)
    return None


def normalize_text(value: Any) -> str | None:
    """The form a ``text`` value is compared in; None for a value that is not text or is blank.

    NFKC, case-folded, whitespace runs as one space, then, until nothing changes, the sentence
    punctuation and quotes around it (``. , ; : ! ?`` and straight and curly quotes) and one leading
    article ("a", "an", "the") stripped: ``" The  'Fixed Price'."`` -> ``"fixed price"``. Brackets,
    signs, "%" and currency symbols are kept (``"(2,345)"`` stays a negative). Idempotent.
    """
    text = value_text(value)
    if text is None:
        return None
    out, before = _fold(text), None
    while out != before:
        before = out
        out = _LEADING_ARTICLE.sub("", _fold(out.strip(_EDGE_PUNCTUATION)))
    return out or None


def text_in(value: Any, text: str) -> bool:
    """A ``text`` value occurs in ``text``: its :func:`normalize_text` form is a substring of ``text``
    folded the same way (NFKC, case-folded, single spaces); a blank value occurs nowhere."""
    norm = normalize_text(value)
    return norm is not None and norm in _fold(text)


def value_close(pred: float, gold: float, p: ScoringParams) -> bool:
    """Equal within ``max(value_abs_tol, value_rel_tol * |gold|)``."""
    return abs(pred - gold) <= max(p.value_abs_tol, p.value_rel_tol * abs(gold))


def _label(value: Any) -> str | None:
    """Light normalization of a label field: NFKC, case-folded, whitespace/hyphens as '_'."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return None
    text = unicodedata.normalize("NFKC", str(value)).strip().casefold()
    return re.sub(r"[\s\-]+", "_", text) or None


def _squash(text: str) -> str:
    """NFKC and single spaces: quotes compare verbatim up to whitespace runs."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def evidence_ok(
    pred: Any, gold_value: float | str, gold_evidence: str, context: str, p: ScoringParams
) -> bool:
    """The quote is verbatim in the context and carries the value.

    It carries the value when it holds a number equal to the gold value (a ``text`` value: the
    quote, folded, contains the normalized gold text), or contains the gold evidence quote (whose
    value may be written in another unit, e.g. hours).
    """
    if not isinstance(pred, str) or not _squash(pred):
        return False
    quote = _squash(pred)
    if quote not in _squash(context):
        return False
    if p.answer.value_is_text:
        if text_in(gold_value, quote):
            return True
    elif any(value_close(v, gold_value, p) for v in numbers_in(quote)):  # type: ignore[arg-type]
        return True
    gold_quote = _squash(gold_evidence or "")
    return bool(gold_quote) and gold_quote in quote


def reference_free_checks(parsed: ParsedAnswer, context: str, p: ScoringParams) -> dict[str, bool]:
    """What can be checked of an answer without its gold answer (a served request has none).

    ``parse_ok``: the output parsed; ``evidence_verbatim``: the evidence quote occurs in the retrieved
    context (up to whitespace runs); ``value_in_evidence``: the value is in that quote (a number equal
    within the tolerances to one the quote holds; a ``text`` value, folded, inside the folded quote);
    ``ok``: all three.
    """
    fields, schema = (parsed.fields if parsed.ok else {}), p.answer
    quote = fields.get(schema.evidence)
    quote = _squash(quote) if isinstance(quote, str) else ""
    verbatim = bool(quote) and quote in _squash(context)
    value = fields.get(schema.value)
    if schema.value_is_text:
        in_quote = verbatim and text_in(value, quote)
    else:
        number = to_number(value)
        in_quote = (
            verbatim and number is not None and any(value_close(number, v, p) for v in numbers_in(quote))
        )
    checks = {"parse_ok": parsed.ok, "evidence_verbatim": verbatim, "value_in_evidence": in_quote}
    return {**checks, "ok": all(checks.values())}


def score_item(
    parsed: ParsedAnswer, gold: Mapping[str, Any], context: str, p: ScoringParams
) -> dict[str, Any]:
    """Score one parsed answer.

    Args:
        parsed: output of :func:`parse_answer`.
        gold: the gold answer (every answer field; the value a number in the canonical unit, or
            a string for a ``text`` value).
        context: the provided context as :func:`context_text` renders it ("" for no RAG).
        p: scoring params; ``p.answer`` the declared answer: labels compare case-folded, the
            value within the tolerances (a ``text`` value: equal after :func:`normalize_text`), the
            evidence verbatim in the context and carrying the value.

    Returns:
        ``parse_ok``, ``<field>_correct`` for every answer field, ``pass``, ``overall`` in
        [0, 1] (the declared weights), ``hallucination``, ``wrong_fact`` and ``pred_value`` (a
        float, or the predicted text for a ``text`` value; None when there is none).
    """
    f, schema = (parsed.fields if parsed.ok else {}), p.answer
    value, evidence = schema.value, schema.evidence
    correct = {k: _label(f.get(k)) is not None and _label(f.get(k)) == _label(gold[k]) for k in schema.labels}
    pred_value: float | str | None
    if schema.value_is_text:
        gold_value: float | str = str(gold[value])
        pred_norm = normalize_text(f.get(value))
        pred_value = value_text(f.get(value)) if pred_norm is not None else None
        correct[value] = pred_norm is not None and pred_norm == normalize_text(gold_value)
        in_context = text_in(pred_norm, context)
    else:
        gold_value = float(gold[value])
        pred_value = to_number(f.get(value))
        correct[value] = pred_value is not None and value_close(pred_value, gold_value, p)
        in_context = pred_value is not None and any(
            value_close(pred_value, v, p) for v in numbers_in(context)
        )
    correct[evidence] = evidence_ok(f.get(evidence), gold_value, str(gold.get(evidence) or ""), context, p)
    weights = schema.weights
    overall = sum(weights[k] * correct[k] for k in schema.names) / sum(weights.values())
    wrong_value = pred_value is not None and not correct[value]
    out: dict[str, Any] = {f"{k}_correct": bool(correct[k]) for k in schema.names}
    out.update(
        parse_ok=parsed.ok,
        **{"pass": all(correct.values())},
        overall=float(overall),
        hallucination=wrong_value and not in_context,
        wrong_fact=wrong_value and in_context,
        pred_value=pred_value,
    )
    return out


def reward(completion_text: str, gold: Mapping[str, Any], context: str, p: ScoringParams) -> float:
    """The scalar reward of one completion: its ``overall`` score in [0, 1].

    Used as the GRPO reward and by admit's reward-margin check.
    """
    return score_item(parse_answer(completion_text, p.answer), gold, context, p)["overall"]
