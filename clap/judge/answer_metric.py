"""TAT-QA's answer metrics: exact match (EM) and the numeracy-focused F1, scale included.

TAT-QA (Zhu et al., ACL 2021, arXiv:2105.07624) scores an answer with DROP's two metrics
(Dua et al., NAACL 2019, section 5) and two changes of its own: the sign of a number is kept
(DROP's normalizer splits on "-" and so loses it), and the answer's *scale* ("", thousand,
million, billion, percent) is part of the answer: "the numeracy-focused F1 score is set to 0
unless the predicted number multiplied by the predicted scale equals exactly the ground
truth" (quoted from TAT-DQA, Zhu et al. 2022, section 5.2, which adopts TAT-QA's metrics
and restates both changes; the TAT-QA paper's own wording was not checked against its
text). This module implements those definitions; it shares no code with the reference
evaluators.

Definitions, as implemented here:

* An answer is a list of spans (a string is one span, a number is one numeric span).
* A span that is one number as a whole ("$1,496.5", "(2,345)", "-3.1", "12%", "1.5 million")
  is a *numeric span*: its value is the number, rounded to 2 decimals in the unit it is
  written in, times the factor of its unit (thousand 1e3, million 1e6, billion 1e9, percent
  0.01, none 1), written as one canonical token ("1496500"). The unit is the span's own
  ("%" or a trailing scale word) if it has one, else the scale given with the answer.
* Any other span is a *text span*: lower-cased, split on whitespace, punctuation and the
  articles a/an/the removed, each number token canonicalized ("1,496.50" -> "1496.5",
  "(2,345)" -> "-2345", "12%" -> "12 percent"), and the scale word appended as one more
  token when the scale is not "".
* EM is 1 iff the two answers' normalized spans are the same multiset.
* F1: each span is a set of tokens; a predicted and a gold span score the F1 of their token
  sets, or 0 when their sets of number tokens differ (the numeracy rule); predicted and gold
  spans are aligned one-to-one by optimal assignment and the F1 is the sum over aligned
  pairs divided by the larger span count (unaligned spans score 0).
* A numeric gold (an arithmetic or count answer) has F1 = EM: a number is right or wrong.

How a right number with a wrong scale scores. TAT-QA compares number x scale, never the
scale strings: the reference evaluator (github.com/NExTplusplus/TAT-QA, ``tatqa_metric.py``
at commit c54088c, ``get_answer_str``; factors from ``scale_to_num`` in ``tatqa_utils.py``)
multiplies a numeric answer, rounded to 2 decimals, by its scale's factor and compares the
products, and for arithmetic and count golds sets F1 to EM. So 12 with scale million against
a gold 12 thousand scores EM 0 and F1 0, and so does a numeric span with a wrong scale (one
token, a different number); 12000 with no scale against a gold 12 thousand scores 1 and 1
(the same quantity). For a text span the reference appends the scale word to the text, so a
wrong scale costs one token: "net sales" with million against "net sales" with no scale is
EM 0 and F1 0.8 (precision 2/3, recall 1). This module does the same. The reference
reports scale accuracy (predicted scale == gold scale) as a separate number, not computed
here.

Decisions (where the definitions leave room, or this module departs from a reference):

* Negatives in parentheses: "(2,345)" is -2345, as TAT-QA's tables print negatives and as the
  reference reads them; with the sign kept, it differs from "2345" (EM 0, F1 0).
* Percent: "12%" and 12 with scale percent are both the value 0.12. A prediction that is one
  plain number given with no scale is also read to 4 decimals instead of 2, so 0.2342 with no
  scale matches 23.42 with scale percent: the fraction form of a percentage, which the
  reference also accepts (``add_percent_pred``). This rule makes ``score`` asymmetric in
  prediction and gold for percent answers. In a text span "%" is the word "percent".
* A span with its own unit ("12%", "12 million") is not scaled again by the answer's scale
  (the reference multiplies twice: "12 million" with scale million is 1.2e13 there).
* Multi-span answers are aligned span by span, as DROP defines. The reference joins the
  sorted spans of an answer into one string before scoring, so its multi-span F1 is one
  token-set F1 over all spans together; multi-span F1 values here differ from it.
* The numeracy rule requires equal number sets, which keeps it symmetric (DROP describes F1
  as 0 on any number mismatch; DROP's reference code only needs one of the gold's numbers in
  the prediction; TAT-QA's reference turns the rule off for spans and relies on F1 = EM for
  numeric golds).
* EM compares multisets (DROP's reference compares sets plus lengths).
* Rounding is half-up on the decimal digits as written (the reference uses Python's
  ``round`` on binary floats, which differs on some ties, e.g. 2.675); F1 is not rounded to
  2 decimals per item as the reference does.
* Scales are read case-insensitively, plurals and "%" accepted; a prediction with any other
  scale is unparseable. Number words ("three") and abbreviations ("1.5bn") are not numbers.

A prediction that is None, empty, blank, not a string/number/list of them, non-finite, or
given with an unknown scale scores (0, 0); ``score`` never raises on a prediction. A
malformed gold or gold scale raises :class:`~clap.errors.ClapError`.
"""

from __future__ import annotations

import math
import numbers
import re
import string
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Context, Decimal

import numpy as np
from scipy.optimize import linear_sum_assignment

from clap.errors import ClapError

SCALES: dict[str, Decimal] = {
    "": Decimal(1),
    "thousand": Decimal(1000),
    "million": Decimal(10**6),
    "billion": Decimal(10**9),
    "percent": Decimal("0.01"),
}  # TAT-QA's scales and their factors
SLICE_KEYS: tuple[str, ...] = ("answer_type", "answer_from")  # row columns :func:`aggregate` breaks down by

_ARTICLES = frozenset({"a", "an", "the"})
_CURRENCY = "$€£¥"
_LEADING = "\"'“”‘’`[{<"  # stripped from the start of a token before the number test
_TRAILING = "\"'“”‘’`]}>.,;:!?"  # stripped from its end (sentence punctuation, quotes)
_DIGITS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+", re.ASCII)
_NUMBER = re.compile(
    r"(?P<open>\()?(?P<sign>[-+−])?(?P<open2>\()?(?P<digits>[\d,.]+)(?P<pct>%)?(?P<close>\))?(?P<pct2>%)?",
    re.ASCII,
)
_CANONICAL = re.compile(r"-?\d+(?:\.\d+)?", re.ASCII)  # a number token after normalization
_CURRENCY_AT_EDGE = re.compile(rf"(?<!\d)[{_CURRENCY}]|[{_CURRENCY}](?!\d)")
# spaces next to a symbol ("$ 243,513", "12 %") join it to the number; next to a separator they
# do not ("1. 2" is two numbers, not 1.2)
_SPACE_NEXT_TO_SYMBOL = re.compile(r"\s+(?=[^\d\s.,])|(?<=[^\d\s.,])\s+")
_UNIT_WORDS = frozenset(SCALES) - {""}  # a trailing word that gives a number its own unit
_TWO_PLACES, _FOUR_PLACES = Decimal("0.01"), Decimal("0.0001")


def _exact(*values: Decimal) -> Context:
    """A decimal context wide enough that rounding to 4 places and scaling by 1e9 stay exact."""
    width = sum(len(v.as_tuple().digits) + abs(v.as_tuple().exponent) for v in values if v.is_finite())
    return Context(prec=max(28, width + 20))


def _read_number(text: str) -> tuple[Decimal, str | None] | None:
    """``(value as written, own unit or None)`` when ``text`` is one number as a whole, else None.

    Accepts a sign or accounting parentheses (negative), currency symbols at the edges,
    thousands separators, a "%" sign and a trailing scale word, with spaces next to symbols
    ("$ 243,513", "12 %", "1.5 million"). The unit is "percent" for "%", the scale word if
    there is one, else None.
    """
    s = text.strip().lower()
    unit = None
    words = s.split()
    if len(words) >= 2:
        last = words[-1].rstrip(_TRAILING)
        last = last[:-1] if last.endswith("s") and last[:-1] in _UNIT_WORDS else last
        if last in _UNIT_WORDS:
            unit, s = last, " ".join(words[:-1])
    s = s.lstrip(_LEADING).rstrip(_TRAILING)
    s = _CURRENCY_AT_EDGE.sub("", _SPACE_NEXT_TO_SYMBOL.sub("", s))
    m = _NUMBER.fullmatch(s)
    if m is None or not _DIGITS.fullmatch(m["digits"]):
        return None
    opened = bool(m["open"]) + bool(m["open2"])
    if opened > 1 or opened != bool(m["close"]) or (m["pct"] and m["pct2"]):
        return None
    if m["pct"] or m["pct2"]:
        if unit is not None:
            return None  # "12% million"
        unit = "percent"
    value = Decimal(m["digits"].replace(",", ""))
    if opened or m["sign"] in ("-", "−"):
        value = -value
    return value, unit


def parse_number(text: str) -> Decimal | None:
    """The value of ``text`` when it is one number as a whole, with its own unit applied, else None.

    ``"$1,496.5"`` -> 1496.5, ``"(2,345)"`` -> -2345, ``"12%"`` -> 0.12, ``"1.5 million"`` ->
    1500000; ``"net income"`` and ``"12 to 13"`` -> None. Not rounded.
    """
    read = _read_number(text) if isinstance(text, str) else None
    if read is None:
        return None
    value, unit = read
    factor = SCALES[unit or ""]
    return _exact(value, factor).multiply(value, factor)


def format_number(value: Decimal | int | float) -> str:
    """The canonical token of a number: plain decimal notation, no trailing zeros, no "-0".

    ``Decimal("1496.50")`` -> ``"1496.5"``, ``12e6`` -> ``"12000000"``, ``-0.0`` -> ``"0"``.
    """
    d = value if isinstance(value, Decimal) else Decimal(repr(value) if isinstance(value, float) else value)
    if not d.is_finite():
        raise ValueError(f"not a finite number: {value!r}")
    if d == 0:
        return "0"
    s = format(d, "f")
    return s.rstrip("0").rstrip(".") if "." in s else s


def _scaled(value: Decimal, unit: str, places: Decimal = _TWO_PLACES) -> str:
    """``value`` rounded to ``places`` in the unit it is written in, times the unit's factor, as a token."""
    factor = SCALES[unit]
    ctx = _exact(value, factor)
    if value.as_tuple().exponent < places.as_tuple().exponent:
        value = value.quantize(places, rounding=ROUND_HALF_UP, context=ctx)
    return format_number(ctx.multiply(value, factor))


def _is_punctuation(ch: str) -> bool:
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def _text_tokens(text: str) -> list[str]:
    """Normalized tokens of a text span: lower-cased, number tokens canonical, punctuation and articles gone."""
    tokens: list[str] = []
    for raw in text.casefold().split():
        read = _read_number(raw)
        if read is not None:
            value, unit = read
            tokens.append(format_number(value))
            if unit is not None:
                tokens.append(unit)
            continue
        if raw == "%":
            tokens.append("percent")
            continue
        word = "".join(ch for ch in raw if not _is_punctuation(ch))
        if word and word not in _ARTICLES:
            tokens.append(word)
    return tokens


def _normalize(span: str | Decimal, scale: str, places: Decimal = _TWO_PLACES) -> str:
    """The normalized form of one span of an answer given with ``scale`` (a canonical scale)."""
    if isinstance(span, Decimal):
        return _scaled(span, scale, places)
    read = _read_number(span)
    if read is not None:
        value, unit = read
        return _scaled(value, unit if unit is not None else scale, places)
    tokens = _text_tokens(span)
    if scale:
        tokens.append(scale)
    return " ".join(tokens)


def normalize_answer(text: str) -> str:
    """The normalized form of one answer span given with no scale, as EM compares it.

    A span that is one number becomes its canonical value rounded to 2 decimals in its
    written unit (``"$1,496.5"`` and ``"1496.50"`` -> ``"1496.5"``, ``"(2,345)"`` ->
    ``"-2345"``, ``"12%"`` -> ``"0.12"``); any other span is lower-cased with punctuation
    and articles removed, whitespace collapsed and number tokens canonical (``"The Net
    Income, 2019."`` -> ``"net income 2019"``).
    """
    return _normalize(text, "")


def canonical_scale(scale: str | None) -> str | None:
    """One of :data:`SCALES` for a scale as written (``"Millions"`` -> ``"million"``, ``"%"`` ->
    ``"percent"``, None -> ``""``), or None when it is not a scale."""
    if scale is None:
        return ""
    if not isinstance(scale, str):
        return None
    s = scale.strip().lower()
    if s == "%":
        return "percent"
    if s.endswith("s") and s[:-1] in SCALES and s[:-1]:
        s = s[:-1]
    return s if s in SCALES else None


def _as_span(item: object) -> str | Decimal | None:
    """A string span, or the exact decimal of a finite number; None for anything else."""
    if isinstance(item, bool):
        return None
    if isinstance(item, str):
        return item
    if isinstance(item, numbers.Integral):
        return Decimal(int(item))
    if isinstance(item, numbers.Real) and math.isfinite(item):
        return Decimal(repr(float(item)))
    return None


def _spans(answer: object) -> list[str | Decimal] | None:
    """The spans of an answer (string, number, or list/tuple of them), or None when malformed or blank."""
    items = list(answer) if isinstance(answer, list | tuple) else [answer]
    spans = [_as_span(item) for item in items]
    if not spans or any(s is None for s in spans):
        return None
    if all(isinstance(s, str) and not s.strip() for s in spans):
        return None
    return spans


def _number_tokens(normalized: str) -> frozenset[str]:
    return frozenset(t for t in normalized.split() if _CANONICAL.fullmatch(t))


def _span_f1(pred: str, gold: str) -> float:
    """Token-set F1 of two normalized spans, 0 when their number tokens differ (the numeracy rule)."""
    if _number_tokens(pred) != _number_tokens(gold):
        return 0.0
    p, g = set(pred.split()), set(gold.split())
    if not p and not g:
        return 1.0
    common = len(p & g)
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def _em_f1(pred: Sequence[str], gold: Sequence[str]) -> tuple[float, float]:
    """EM and aligned F1 of two lists of normalized spans."""
    em = float(sorted(pred) == sorted(gold))
    scores = np.array([[_span_f1(p, g) for p in pred] for g in gold])
    rows, cols = linear_sum_assignment(scores, maximize=True)
    f1 = float(scores[rows, cols].sum()) / max(len(pred), len(gold))
    return em, min(f1, 1.0)


def score(
    pred: str | list[str] | float | int | None,
    gold: str | list[str] | float | int,
    pred_scale: str,
    gold_scale: str,
) -> tuple[float, float]:
    """EM and numeracy-focused F1 of one predicted answer against its gold answer, both in [0, 1].

    Args:
        pred: the predicted answer: a span, a list of spans (multi-span) or a number. None,
            blank or malformed predictions score (0, 0).
        gold: the gold answer as TAT-QA gives it: a span, a list of spans, or a number
            (arithmetic and count answers, whose F1 equals their EM).
        pred_scale: the predicted scale ("", thousand, million, billion, percent; case and
            plurals ignored, "%" is percent). Any other scale scores (0, 0).
        gold_scale: the gold scale, from the same set.

    Returns:
        ``(em, f1)``; em is 0.0 or 1.0, and em == 1 implies f1 == 1.

    Raises:
        ClapError: the gold answer or gold scale is malformed.
    """
    g_scale = canonical_scale(gold_scale)
    if g_scale is None:
        raise ClapError(
            f"unknown gold scale {gold_scale!r}; expected one of {sorted(SCALES)}", rule="bad_gold"
        )
    gold_spans = _spans(gold)
    if gold_spans is None:
        raise ClapError(
            f"gold answer must be a non-blank string, a finite number or a list of them, got {gold!r}",
            rule="bad_gold",
        )
    numeric_gold = not isinstance(gold, str | list | tuple)  # arithmetic or count: F1 = EM
    p_scale = canonical_scale(pred_scale)
    pred_spans = _spans(pred)
    if p_scale is None or pred_spans is None:
        return 0.0, 0.0
    gold_norm = [_normalize(s, g_scale) for s in gold_spans]
    candidates = [[_normalize(s, p_scale) for s in pred_spans]]
    if p_scale == "" and len(pred_spans) == 1:  # the fraction form of a percentage: 0.2342 for 23.42 %
        only = pred_spans[0]
        read = (only, None) if isinstance(only, Decimal) else _read_number(only)
        if read is not None and read[1] is None:
            candidates.append([_scaled(read[0], "", _FOUR_PLACES)])
    em, f1 = max(_em_f1(c, gold_norm) for c in candidates)
    return em, em if numeric_gold else f1


def _fraction(row: Mapping, key: str, index: int) -> float:
    value = row[key]
    if isinstance(value, numbers.Real) and math.isfinite(value) and 0.0 <= value <= 1.0:
        return float(value)
    raise ClapError(
        f"{key} must be a number in [0, 1], got {value!r}", row=index, column=key, rule="bad_score"
    )


def aggregate(rows: Iterable[Mapping], slice_keys: Sequence[str] = SLICE_KEYS) -> dict[str, float | int]:
    """Mean EM and F1 over scored rows, overall and per answer type and answer source.

    Args:
        rows: mappings with ``em`` and ``f1`` (in [0, 1], as :func:`score` returns them),
            ``answer_type`` and ``answer_from`` (non-empty strings).
        slice_keys: the row keys to break down by instead of TAT-QA's ``answer_type`` and
            ``answer_from`` (eval passes the declared answer's slice columns).

    Returns:
        Flat, JSON-serializable metrics: ``em``, ``f1`` (fractions, not percentages) and
        ``n``, then for each slice present, in sorted order, ``em.<key>=<value>``,
        ``f1.<key>=<value>`` and ``n.<key>=<value>`` (e.g. ``f1.answer_type=span``).

    Raises:
        ClapError: no rows, a missing key, a score outside [0, 1] or a blank slice value.
    """
    ems: list[float] = []
    f1s: list[float] = []
    members: dict[str, list[int]] = {}
    for index, row in enumerate(rows, start=1):
        for key in ("em", "f1", *slice_keys):
            if key not in row:
                raise ClapError(f"scored row lacks {key!r}", row=index, column=key, rule="missing_column")
        ems.append(_fraction(row, "em", index))
        f1s.append(_fraction(row, "f1", index))
        for key in slice_keys:
            value = row[key]
            if not isinstance(value, str) or not value.strip():
                raise ClapError(
                    f"{key} must be a non-empty string, got {value!r}",
                    row=index,
                    column=key,
                    rule="bad_slice",
                )
            members.setdefault(f"{key}={value}", []).append(len(ems) - 1)
    if not ems:
        raise ClapError("no scored rows to aggregate", rule="empty")
    out: dict[str, float | int] = {
        "em": math.fsum(ems) / len(ems),
        "f1": math.fsum(f1s) / len(f1s),
        "n": len(ems),
    }
    for name in sorted(members):
        idx = members[name]
        out[f"em.{name}"] = math.fsum(ems[i] for i in idx) / len(idx)
        out[f"f1.{name}"] = math.fsum(f1s[i] for i in idx) / len(idx)
        out[f"n.{name}"] = len(idx)
    return out
