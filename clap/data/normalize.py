"""normalize: typed assets -> canonical, verifiable, deduplicated, leak-free assets.

Every value is brought to one spelling. The answer's key fields (params ``task``: role ``key``)
are canonicalized by the normalizer params ``normalize.keys`` declares for each of them:
``vocabulary`` (canonical words and their aliases, optionally with value-bearing numeric
affixes stripped: "98.2% First Pass Yield" -> ``first_pass_yield``), ``code`` (a prefix word
and a number: "Line 03" -> ``L3``), ``date`` (any of ``date_formats`` -> ISO) or ``text``
(Unicode-cleaned). A number value is converted to its canonical unit (ratio -> % x100,
h -> min x60); a text value is cleaned. Text is Unicode-cleaned (:func:`clean_text`). Evidence
must be a substring of its cited document's body and carry the value; with
``evidence: locate`` an item without a quote gets the first sentence of its context that
carries the value (a question log that cites no quote, such as TAT-QA's). Duplicates and
train/held-out overlap are removed. No row disappears silently: every dropped or repaired
row becomes a row of the rejects frame (``artifact, item_id, rule, action, detail``).

The domain vocabulary (key words, unit factors, date formats) comes from params.yaml
``normalize``: it is deployment policy, not code. Unicode look-alike facts
(:data:`CONFUSABLES`) are code: they do not vary by deployment.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from clap import io, params
from clap.data.assetize import asset_columns
from clap.errors import ClapError
from clap.params import bad_param, stray_key
from clap.task.answer import PARAMS, AnswerSchema, load_answer_schema
from clap.task.context import parse_doc_ids
from clap.task.prompt import context_sentences

# --------------------------------------------------------------------------- params

KEY_KINDS = {
    "vocabulary": "vocabulary",
    "code": "vocabulary",
    "date": "date",
    "text": "text",
}  # kind -> answer type
EVIDENCE_MODES = ("given", "locate")


@dataclasses.dataclass(frozen=True)
class NormalizeSection:
    """Params section ``normalize`` as written (see the comments in params.yaml)."""

    keys: dict  # key field -> its normalizer: {kind: vocabulary|code|date|text, ...}
    units: dict
    date_formats: list
    evidence: str  # given | locate
    value_decimals: int
    value_rel_tol: float
    value_abs_tol: float
    duplicate_system_priority: list


@dataclasses.dataclass(frozen=True)
class NormalizeParams(NormalizeSection):
    """Params ``normalize`` and the declared answer (params ``task``) whose key fields it normalizes."""

    answer: AnswerSchema | None = None


def normalize_params(path: Path | str = PARAMS) -> NormalizeParams:
    """Params ``normalize`` with the answer schema of params ``task``."""
    section = params.build(
        NormalizeSection, params.raw_section("normalize", path), where="normalize", file=path
    )
    fields = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
    return NormalizeParams(**fields, answer=load_answer_schema(path))


@dataclasses.dataclass(frozen=True)
class KeyNorm:
    """The compiled normalizer of one key field (params ``normalize.keys.<name>``)."""

    name: str
    kind: str  # vocabulary | code | date | text
    words: tuple[str, ...] = ()  # canonical words (vocabulary, code), in declared order
    by_alias: Mapping[str, str] = dataclasses.field(default_factory=dict)  # label_key(alias) -> word
    word_unit: Mapping[str, str] = dataclasses.field(
        default_factory=dict
    )  # vocabulary word -> its canonical unit
    strip_affixes: bool = False  # vocabulary: remove value-bearing numbers around a label first
    code_re: re.Pattern | None = None  # code: prefix word and number
    code_format: str = ""  # code: canonical form, "{n}" the number


@dataclasses.dataclass(frozen=True)
class Vocab:
    """Lookup tables compiled once from :class:`NormalizeParams` (keys are :func:`label_key` forms)."""

    answer: AnswerSchema
    keys: tuple[KeyNorm, ...]
    unit_by_variant: dict[str, tuple[str, float]]
    date_formats: tuple[str, ...]
    evidence: str
    affix_prefix: re.Pattern
    affix_suffix: re.Pattern
    quote_number: re.Pattern
    decimals: int
    rel_tol: float
    abs_tol: float

    def key(self, name: str) -> KeyNorm:
        return next(k for k in self.keys if k.name == name)

    @property
    def unit_field(self) -> str | None:
        """The answer's unit field (None: the answer has no unit)."""
        return next((f.name for f in self.answer.fields if f.role == "unit"), None)

    @property
    def unit_of(self) -> str:
        """The key field whose word decides the unit ("" when none does)."""
        return next((f.of for f in self.answer.fields if f.role == "unit"), "")

    @property
    def value_type(self) -> str:
        return self.answer.field(self.answer.value).type


def answer_vocabularies(p: NormalizeParams) -> dict[str, list[str]]:
    """The canonical words of each vocabulary answer field (what constrained decoding may emit)."""
    vocab = build_vocab(p)
    out = {k.name: list(k.words) for k in vocab.keys if k.kind in ("vocabulary", "code")}
    if vocab.unit_field is not None:
        out[vocab.unit_field] = sorted({u for u, _ in vocab.unit_by_variant.values()})
    return out


def key_units(p: NormalizeParams) -> dict[str, str]:
    """Each word of the unit's ``of`` key field -> its canonical unit (an answer's unit is its key word's)."""
    vocab = build_vocab(p)
    return dict(vocab.key(vocab.unit_of).word_unit) if vocab.unit_of else {}


def _compile_key(name: str, decl: Any, units: set[str]) -> KeyNorm:
    at = f"normalize.keys.{name}"
    if not isinstance(decl, dict) or decl.get("kind") not in KEY_KINDS:
        raise bad_param(
            f"{at}.kind" if isinstance(decl, dict) else at,
            f"{at} must be a mapping with kind one of {list(KEY_KINDS)}",
        )
    kind = decl["kind"]
    allowed = {
        "vocabulary": {"kind", "words", "strip_value_affixes"},
        "code": {"kind", "codes", "prefixes", "format"},
        "date": {"kind"},
        "text": {"kind"},
    }[kind]
    if set(decl) != allowed:
        raise bad_param(
            stray_key(at, decl, allowed), f"{at} (kind {kind}) must have exactly the keys {sorted(allowed)}"
        )
    if kind == "vocabulary":
        by_alias: dict[str, str] = {}
        word_unit: dict[str, str] = {}
        if not isinstance(decl["words"], dict) or not decl["words"]:
            raise bad_param(f"{at}.words", f"{at}.words must map each canonical word to its aliases")
        for word, spec in decl["words"].items():
            word = str(word)
            if isinstance(spec, dict):
                if set(spec) - {"labels", "unit"} or "labels" not in spec:
                    raise bad_param(
                        f"{at}.words.{word}",
                        f"{at}.words.{word} must be a list of aliases or {{labels, unit}}",
                    )
                aliases = spec["labels"]
                if "unit" in spec:
                    if spec["unit"] not in units:
                        raise bad_param(
                            f"{at}.words.{word}",
                            f"{at}.words.{word} has unit {spec['unit']!r}, which no unit variant maps to",
                        )
                    word_unit[word] = str(spec["unit"])
            else:
                aliases = spec
            for alias in [word, *(aliases or [])]:
                if by_alias.setdefault(label_key(str(alias)), word) != word:
                    raise bad_param(
                        f"{at}.words",
                        f"alias {alias!r} names both {by_alias[label_key(str(alias))]!r} and {word!r}",
                    )
        return KeyNorm(
            name,
            kind,
            tuple(str(w) for w in decl["words"]),
            by_alias,
            word_unit,
            bool(decl["strip_value_affixes"]),
        )
    if kind == "code":
        if "{n}" not in str(decl["format"]):
            raise bad_param(f"{at}.format", f"{at}.format must contain {{n}} (the code's number)")
        prefixes = "|".join(re.escape(label_key(x)) for x in sorted(decl["prefixes"], key=len, reverse=True))
        code_re = re.compile(rf"(?:{prefixes})?\s*[-_.#]?\s*0*(\d+)" if prefixes else r"0*(\d+)")
        return KeyNorm(
            name, kind, tuple(str(c) for c in decl["codes"]), code_re=code_re, code_format=str(decl["format"])
        )
    return KeyNorm(name, kind)


def build_vocab(p: NormalizeParams) -> Vocab:
    """Compile the params vocabulary for the declared answer; contradictions raise ClapError naming params.yaml."""
    if p.answer is None:
        raise bad_param(
            "task", "normalize params carry no answer declaration: load them with normalize_params()"
        )
    answer = p.answer
    units = {label_key(str(k)): (str(v[0]), float(v[1])) for k, v in p.units.items()}
    if not isinstance(p.keys, dict) or set(p.keys) != set(answer.keys):
        raise bad_param(
            "normalize.keys",
            f"normalize.keys must declare a normalizer for exactly the answer's key fields {list(answer.keys)} (has {sorted(p.keys or [])})",
        )
    keys = tuple(_compile_key(k, p.keys[k], {u for u, _ in units.values()}) for k in answer.keys)
    for k in keys:
        if KEY_KINDS[k.kind] != answer.field(k.name).type:
            raise bad_param(
                f"normalize.keys.{k.name}",
                f"normalize.keys.{k.name} is a {k.kind} normalizer but task.answer.{k.name} has type {answer.field(k.name).type}",
            )
    if p.evidence not in EVIDENCE_MODES:
        raise bad_param("normalize.evidence", f"normalize.evidence must be one of {list(EVIDENCE_MODES)}")
    unit_alt = _unit_alternation(units)
    vocab = Vocab(
        answer=answer,
        keys=keys,
        unit_by_variant=units,
        date_formats=tuple(p.date_formats),
        evidence=p.evidence,
        affix_prefix=re.compile(
            rf"^(?:[(\[]?\s*{_NUM}\s*(?:{unit_alt})?\s*[)\]]?\s*[:=|]?\s*)+", re.IGNORECASE
        ),
        affix_suffix=re.compile(
            rf"(?:\s*[:=|]?\s*[(\[]?\s*{_NUM}\s*(?:{unit_alt})?\s*[)\]]?)+$", re.IGNORECASE
        ),
        quote_number=re.compile(
            rf"(?<![\w.,\-])(-?)(\d+(?:[.,]\d+)*)(?:\s*\(?\s*({unit_alt}))?", re.IGNORECASE
        ),
        decimals=int(p.value_decimals),
        rel_tol=float(p.value_rel_tol),
        abs_tol=float(p.value_abs_tol),
    )
    if vocab.unit_of and not vocab.key(vocab.unit_of).word_unit:
        raise bad_param(
            f"normalize.keys.{vocab.unit_of}",
            f"task.answer's unit is decided by {vocab.unit_of!r}, but normalize.keys.{vocab.unit_of} gives its words no unit",
        )
    return vocab


_NUM = r"[-+]?\d+(?:[.,]\d+)*"


def _unit_alternation(units: Mapping[str, tuple[str, float]]) -> str:
    """Regex alternation of unit variants; word units must end at a word boundary ("s" != "Scrap")."""
    parts = [
        re.escape(u) + (r"\b" if u[-1].isalnum() else "") for u in sorted(units, key=len, reverse=True) if u
    ]
    return "|".join(parts) or r"(?!)"


# --------------------------------------------------------------------------- text

# Look-alikes seen in exports that NFKC leaves alone: Cyrillic/Greek letters that render as
# Latin ones, hyphen and minus look-alikes (the en dash is typed as a minus; the em dash is
# prose punctuation and stays), typographic quotes. Zero-width characters are removed.
CONFUSABLES: dict[str, str | None] = {
    **dict(zip("АВЕКМНОРСТХІЈЅ", "ABEKMHOPCTXIJS")),
    **dict(zip("аеорсухіјѕԁһ", "aeopcyxijsdh")),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧο", "ABEZHIKMNOPTYXo")),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2212\ufe63", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033", '"'),
    **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff\u00ad", None),
}
_CONFUSABLE_TABLE = str.maketrans(CONFUSABLES)


def clean_text(text: str) -> str:
    """NFKC + :data:`CONFUSABLES` + whitespace collapsed to single spaces, stripped.

    Idempotent: cleaning a cleaned string returns it unchanged (the two steps are repeated
    until nothing changes, since removing a zero-width character can make a new NFKC pair).

    Args:
        text: any text (NBSP, fullwidth digits, Cyrillic look-alikes, en-dash minus...).

    Returns:
        The cleaned text.
    """
    for _ in range(8):  # a fixed point is reached in one or two rounds; the bound only guards
        prev, text = text, unicodedata.normalize("NFKC", text.translate(_CONFUSABLE_TABLE))
        if text == prev:
            break
    return " ".join(text.split())


def label_key(text: str) -> str:
    """Lookup form of a label: cleaned, case-folded, ``-``/``_``/``/`` as spaces, ``%`` its own word."""
    key = clean_text(text).casefold()
    key = re.sub(r"[-_/]+", " ", key).replace("%", " % ")
    return " ".join(key.split()).strip(" :.")


def input_hash(question: str) -> str:
    """sha256 of the normalized question (cleaned, case-folded): the overlap key."""
    return hashlib.sha256(clean_text(question).casefold().encode("utf-8")).hexdigest()


def is_missing(value: Any) -> bool:
    """None, NaN or blank text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return isinstance(value, str) and not value.strip()


# --------------------------------------------------------------------------- fields


def strip_value_affixes(label: str, vocab: Vocab) -> str:
    """Remove value-bearing numbers (with their unit) before/after a metric label.

    "98.2% First Pass Yield" -> "First Pass Yield"; "12 Scrap pcs" -> "Scrap pcs";
    "Downtime: 45 min" -> "Downtime". A label without numbers is returned cleaned only.
    """
    text = clean_text(label)
    text = vocab.affix_prefix.sub("", text)
    return vocab.affix_suffix.sub("", text).strip()


def canonical_unit(unit: str, vocab: Vocab) -> tuple[str, float] | None:
    """(canonical unit, factor) of a unit variant (canonical = raw x factor), None if unknown."""
    return vocab.unit_by_variant.get(label_key(unit))


def to_canonical(value: float, unit: str, vocab: Vocab) -> tuple[float, str]:
    """Convert ``value`` in unit variant ``unit`` to (value, canonical unit); raises on unknown units."""
    found = canonical_unit(unit, vocab)
    if found is None:
        raise ClapError(f"unknown unit {unit!r}", column="unit_raw", rule="unknown_unit")
    canon, factor = found
    return round(value * factor, vocab.decimals), canon


def from_canonical(value: float, unit: str, vocab: Vocab) -> float:
    """Inverse of :func:`to_canonical`: a canonical value expressed in unit variant ``unit``."""
    found = canonical_unit(unit, vocab)
    if found is None:
        raise ClapError(f"unknown unit {unit!r}", column="unit_raw", rule="unknown_unit")
    return value / found[1]


def canonical_key(name: str, text: Any, vocab: Vocab) -> str | None:
    """The canonical form of a raw key field value under its declared normalizer; None if unreadable.

    vocabulary: the word an alias names (after stripping value-bearing affixes when declared);
    code: ``format`` with the number after an optional prefix word ("Line 03", "L-3" -> ``L3``),
    if it is one of ``codes``; date: ISO (:func:`parse_date`); text: cleaned, None when empty.
    """
    key, raw = vocab.key(name), _text(text)
    if key.kind == "vocabulary":
        label = strip_value_affixes(raw, vocab) if key.strip_affixes else raw
        return key.by_alias.get(label_key(label))
    if key.kind == "code":
        m = key.code_re.fullmatch(label_key(raw)) if key.code_re else None
        code = key.code_format.format(n=int(m.group(1))) if m else None
        return code if code in key.words else None
    if key.kind == "date":
        return parse_date(raw, vocab)
    return clean_text(raw) or None


def parse_date(text: str, vocab: Vocab) -> str | None:
    """ISO date (``YYYY-MM-DD``) of a timestamp in any configured format; None if none matches.

    The date is the one written (plant-local wall clock): an offset is not converted to
    UTC, since a shift date is a local date.
    """
    return _parse_cleaned_date(clean_text(text), vocab.date_formats)


@functools.lru_cache(maxsize=65536)
def _parse_cleaned_date(cleaned: str, formats: tuple[str, ...]) -> str | None:
    for fmt in formats:
        try:
            return dt.datetime.strptime(cleaned, fmt).date().isoformat()
        except ValueError:
            continue
    return None


# strptime directives that read digits: a format with one of them never matches a digit-free string
_NUMERIC_DIRECTIVE = re.compile(r"%[dmyYHIMSfjUWwuVGz]")


def dates_in(text: str, vocab: Vocab, max_words: int = 4) -> list[str]:
    """ISO dates written anywhere in ``text`` in a configured format, in order of appearance.

    Every run of up to ``max_words`` whitespace-separated words (trailing ``,.;:)`` removed)
    is tried with :func:`parse_date`; a shorter run that parses is not reported again inside
    a longer one starting at the same word. Memoized on (text, formats): retrieval hands the
    same documents to many requests and to every model.
    """
    return list(_dates_in(text, vocab.date_formats, max_words))


@functools.lru_cache(maxsize=4096)
def _dates_in(text: str, formats: tuple[str, ...], max_words: int) -> tuple[str, ...]:
    words = clean_text(text).split()
    # when every format reads a digit (%d, %Y, ...), a run without a decimal digit (of any script, as
    # strptime's \d) cannot parse: skipping it is exact, and it is most runs of prose
    digits_needed = all(_NUMERIC_DIRECTIVE.search(f) for f in formats)
    has_digit = [any(c.isdecimal() for c in w) for w in words]
    found: list[str] = []
    for i in range(len(words)):
        for j in range(min(len(words), i + max_words), i, -1):
            if digits_needed and not any(has_digit[i:j]):
                break  # the shorter runs from word i are digit-free too
            run = clean_text(" ".join(words[i:j]).rstrip(",.;:)").lstrip("("))
            iso = _parse_cleaned_date(run, formats)
            if iso is not None:
                found.append(iso)
                break
    return tuple(dict.fromkeys(found))


def decimal_readings(token: str) -> list[float]:
    """Readings of a number token, the decimal-separator reading first.

    One separator (``,`` or ``.``) is a decimal separator ("98,2" -> 98.2); when it is
    followed by exactly three digits (and the integer part has no leading zero) the
    thousands reading ("1,234" -> 1234) is added.
    Mixed separators read the last as decimal ("1.234,5" -> 1234.5). Returns [] if the
    token is not a number.
    """
    token = clean_text(token)
    m = re.fullmatch(r"([-+]?)(\d+(?:[.,]\d+)*)", token)
    if not m:
        return []
    sign = -1.0 if m.group(1) == "-" else 1.0
    parts = re.split(r"[.,]", m.group(2))
    seps = re.findall(r"[.,]", m.group(2))
    if not seps:
        out = [float(parts[0])]
    elif len(seps) == 1:
        grouped = len(parts[1]) == 3 and not parts[0].startswith("0")
        out = [float(f"{parts[0]}.{parts[1]}")] + ([float(parts[0] + parts[1])] if grouped else [])
    elif len(set(seps[:-1])) == 1 and seps[-1] != seps[0] and all(len(x) == 3 for x in parts[1:-1]):
        out = [float("".join(parts[:-1]) + "." + parts[-1])]
    elif len(set(seps)) == 1 and all(len(x) == 3 for x in parts[1:]):
        out = [float("".join(parts))]
    else:
        out = []
    return [sign * v for v in out]


def parse_value(text: Any) -> float | None:
    """A gold value (number, or text with a decimal comma) as a finite float; None if not one number."""
    if isinstance(text, bool) or is_missing(text):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    readings = decimal_readings(str(text))
    return readings[0] if readings else None


def value_equal(a: float, b: float, vocab: Vocab) -> bool:
    """Equal within ``max(abs_tol, rel_tol * |b|)`` (params)."""
    return abs(a - b) <= max(vocab.abs_tol, vocab.rel_tol * abs(b))


# --------------------------------------------------------------------------- evidence


def quote_carries_value(quote: str, value: float, raw_value: float | None, vocab: Vocab) -> bool:
    """True when a number in ``quote`` equals the gold value in the quote's own unit.

    A number followed by a unit variant ("1,5 h", "98,2 %") is converted to canonical and
    compared with ``value``; a bare number is compared with the canonical value and with
    the value as the gold answer wrote it (``raw_value``, e.g. a ratio). Dates and
    identifiers ("L3", "14.03.2026") carry no number.
    """
    for m in vocab.quote_number.finditer(clean_text(quote)):
        unit = m.group(3)
        for reading in decimal_readings(m.group(1) + m.group(2)):
            if unit is not None:
                if value_equal(to_canonical(reading, unit, vocab)[0], value, vocab):
                    return True
            elif value_equal(reading, value, vocab) or (
                raw_value is not None and value_equal(reading, raw_value, vocab)
            ):
                return True
    return False


def carries_value(quote: str, value: Any, raw_value: float | None, vocab: Vocab) -> bool:
    """The quote carries the gold value: a number value as :func:`quote_carries_value` reads it, a
    text value as a case-insensitive substring of the cleaned quote."""
    if vocab.value_type == "number":
        return quote_carries_value(quote, float(value), raw_value, vocab)
    needle = clean_text(str(value)).casefold().rstrip(".!?;:").strip()  # a quote drops its final punctuation
    return bool(needle) and needle in clean_text(quote).casefold()


def _value_text(value: Any, vocab: Vocab) -> str:
    return f"{value:g}" if vocab.value_type == "number" else repr(value)


def evidence_status(
    quote: Any, body: str, value: Any, raw_value: float | None, vocab: Vocab
) -> tuple[str, str]:
    """Judge one evidence quote against its cited document's body.

    Args:
        quote: the raw quote.
        body: the raw body of the cited document.
        value: the gold value (a number in canonical unit, or the cleaned text value).
        raw_value: a number value as written (its raw unit), or None.
        vocab: compiled params.

    Returns:
        (status, detail): status ``ok`` (verbatim), ``repaired`` (equal only after
        :func:`clean_text`), ``evidence_not_verbatim`` or ``evidence_missing_value``.
    """
    if is_missing(quote):
        return "evidence_missing_value", "evidence quote is empty"
    quote = str(quote)
    clean_quote, clean_body = clean_text(quote), clean_text(body)
    if not clean_quote or clean_quote not in clean_body:
        return (
            "evidence_not_verbatim",
            f"quote {quote[:80]!r} is not in the cited document even after Unicode/whitespace cleaning",
        )
    if not carries_value(clean_quote, value, raw_value, vocab):
        return (
            "evidence_missing_value",
            f"quote {clean_quote[:80]!r} does not carry the value {_value_text(value, vocab)}",
        )
    if quote.strip() in body:
        return "ok", ""
    return "repaired", f"quote matched the document only after Unicode/whitespace cleaning: {quote[:80]!r}"


def locate_evidence(
    ctx: list[str], kb_raw: Mapping[str, tuple[str, str]], value: Any, raw_value: float | None, vocab: Vocab
) -> tuple[str, str, int]:
    """The first sentence of the context (documents in order) that carries the value.

    The sentences are the quotable ones of :func:`clap.task.prompt.context_sentences` (what
    constrained decoding lets a model quote), of the cleaned bodies.

    Returns:
        (doc_id, quote, number of context documents with such a sentence: > 1 is ambiguous).

    Raises:
        ClapError: ``evidence_not_found`` when no sentence of the context carries it.
    """
    found = []
    for doc in ctx:
        body = clean_text(kb_raw[doc][1])
        quote = next(
            (q for q in context_sentences([(doc, body)]) if carries_value(q, value, raw_value, vocab)), None
        )
        if quote is not None:
            found.append((doc, quote))
    if not found:
        raise ClapError(
            f"no sentence of the context carries the value {_value_text(value, vocab)}",
            column="evidence",
            rule="evidence_not_found",
        )
    return found[0][0], found[0][1], len(found)


# --------------------------------------------------------------------------- rows

REJECT_COLUMNS = ["artifact", "item_id", "rule", "action", "detail"]
ITEM_ARTIFACTS = ("sft", "grpo", "eval", "replay")


def _unit_cols(vocab: Vocab) -> list[str]:
    return [vocab.unit_field] if vocab.unit_field else []


def record_columns(vocab: Vocab) -> list[str]:
    """Normalized records: one canonical fact each (key fields, value, unit by their answer names)."""
    return [
        "record_id",
        "source_system",
        *vocab.answer.keys,
        "value",
        *_unit_cols(vocab),
        "text",
        "source_file",
        "source_line",
    ]


def kb_columns(vocab: Vocab) -> list[str]:
    """Normalized documents, with the key fields of the record they describe (null if none)."""
    return ["doc_id", "system", "record_ref", "title", "body", *vocab.answer.keys]


def item_columns(vocab: Vocab) -> list[str]:
    """Normalized question items: the canonical gold answer (every answer field) and where it came from."""
    return [
        "item_id", "split", "question", "question_type", "context_doc_ids", *vocab.answer.keys, "value", *_unit_cols(vocab),
        "evidence", "evidence_doc_id", "source_system", "input_hash", "source_file", "source_line",
    ]  # fmt: skip


def _need(value: Any, rule: str, column: str, raw: Any) -> Any:
    """Return ``value``, or raise the row-level rejection ``rule`` naming the raw input."""
    if value is None:
        raise ClapError(f"cannot read {raw!r}", column=column, rule=rule)
    return value


def _text(value: Any) -> str:
    return "" if is_missing(value) else str(value)


def _key_rule(key: KeyNorm) -> str:
    return {"date": "unparseable_", "text": "empty_"}.get(key.kind, "unknown_") + key.name


def parse_gold_value(raw: Any, vocab: Vocab) -> Any:
    """A gold or record value as read: a float for a number value, cleaned text for a text value."""
    if vocab.value_type == "number":
        return parse_value(raw)
    return clean_text(_text(raw)) or None


def canonical_facts(raw: Mapping[str, Any], value: Any, vocab: Vocab) -> dict[str, Any]:
    """Canonical key fields, value and unit of one record or gold answer.

    Args:
        raw: a row with ``<key>_raw`` for every key field and ``unit_raw`` when the answer has a unit.
        value: the value as read (:func:`parse_gold_value`; a number in ``unit_raw``).
        vocab: compiled params.

    Raises:
        ClapError: with the row-level rule (``unknown_<key>`` for a vocabulary or code key,
            ``unparseable_<key>`` for a date, ``empty_<key>`` for text, ``unknown_unit``,
            ``unit_mismatch``: the unit does not fit the word of the key that decides it) and the column.
    """
    facts = {
        k.name: _need(
            canonical_key(k.name, raw[f"{k.name}_raw"], vocab),
            _key_rule(k),
            f"{k.name}_raw",
            raw[f"{k.name}_raw"],
        )
        for k in vocab.keys
    }
    facts["value"] = value
    if vocab.unit_field:
        unit_raw = _text(raw["unit_raw"])
        canon_unit = _need(canonical_unit(unit_raw, vocab), "unknown_unit", "unit_raw", raw["unit_raw"])[0]
        if vocab.unit_of:
            want = vocab.key(vocab.unit_of).word_unit.get(facts[vocab.unit_of])
            if canon_unit != want:
                raise ClapError(
                    f"unit {unit_raw!r} ({canon_unit}) does not fit {vocab.unit_of} {facts[vocab.unit_of]} ({want})",
                    column="unit_raw",
                    rule="unit_mismatch",
                )
        if vocab.value_type == "number":
            facts["value"] = to_canonical(value, unit_raw, vocab)[0]
        facts[vocab.unit_field] = canon_unit
    return facts


def _reject(artifact: str, item_id: Any, rule: str, action: str, detail: str) -> dict[str, Any]:
    return {"artifact": artifact, "item_id": _text(item_id), "rule": rule, "action": action, "detail": detail}


def _reject_from(artifact: str, item_id: Any, err: ClapError) -> dict[str, Any]:
    return _reject(
        artifact, item_id, err.rule or "invalid", "rejected", f"column {err.column}: {err.args[0]}"
    )


def normalize_records(records: pd.DataFrame, vocab: Vocab) -> tuple[pd.DataFrame, list[dict]]:
    """Canonicalize source-system records; unreadable rows become rejects (artifact ``records``)."""
    rows, rejects = [], []
    for raw in records.to_dict("records"):
        try:
            facts = canonical_facts(
                raw,
                _need(parse_gold_value(raw["value"], vocab), "unparseable_value", "value", raw["value"]),
                vocab,
            )
        except ClapError as e:
            rejects.append(_reject_from("records", raw["record_id"], e))
            continue
        rows.append({**raw, **facts, "text": clean_text(_text(raw["text"]))})
    return _frame(rows, record_columns(vocab), vocab), rejects


def normalize_item(
    raw: Mapping[str, Any], kb_raw: Mapping[str, tuple[str, str]], vocab: Vocab
) -> tuple[dict, str, int]:
    """Normalize one question-log item and verify (or, with ``evidence: locate``, find) its evidence.

    Args:
        raw: an asset item row (contract columns).
        kb_raw: doc_id -> (system, raw body) of the knowledge base.
        vocab: compiled params.

    Returns:
        (normalized row, repair detail or "" when the evidence was verbatim, number of context
        documents that carry the value when the evidence was located, else 0).

    Raises:
        ClapError: a row-level rejection (rule names why).
    """
    value_raw = _need(
        parse_gold_value(raw["value_raw"], vocab), "unparseable_value", "value_raw", raw["value_raw"]
    )
    facts = canonical_facts(raw, value_raw, vocab)
    number_raw = value_raw if vocab.value_type == "number" else None
    ctx = parse_doc_ids(raw["context_doc_ids"])
    unknown = [d for d in ctx if d not in kb_raw]
    if unknown:
        raise ClapError(
            f"context cites unknown documents {unknown}", column="context_doc_ids", rule="context_doc_unknown"
        )
    located = 0
    if vocab.evidence == "locate" and is_missing(raw["evidence"]) and is_missing(raw["evidence_doc_id"]):
        doc_id, quote, located = locate_evidence(ctx, kb_raw, facts["value"], number_raw, vocab)
        status, detail = "ok", ""
    else:
        doc_id, quote = _text(raw["evidence_doc_id"]).strip(), raw["evidence"]
        status, detail = evidence_status(
            quote,
            _need(kb_raw.get(doc_id), "evidence_doc_unknown", "evidence_doc_id", raw["evidence_doc_id"])[1],
            facts["value"],
            number_raw,
            vocab,
        )
    if status not in ("ok", "repaired"):
        raise ClapError(detail, column="evidence", rule=status)
    question = clean_text(_text(raw["question"]))
    _need(question or None, "empty_question", "question", raw["question"])
    row = {**raw, **facts, "question": question, "context_doc_ids": json.dumps(ctx), "evidence": clean_text(str(quote)),
           "evidence_doc_id": doc_id, "source_system": kb_raw[doc_id][0], "input_hash": input_hash(question), "question_type": clean_text(_text(raw["question_type"]))}  # fmt: skip
    return row, detail if status == "repaired" else "", located


def normalize_items(
    items: pd.DataFrame, artifact: str, kb_raw: Mapping[str, tuple[str, str]], vocab: Vocab
) -> tuple[pd.DataFrame, list[dict], dict[str, int]]:
    """Normalize every item of one question artifact; rejected and repaired rows are reported.

    Returns:
        (items, rejects, counts ``evidence_located`` and ``evidence_located_ambiguous``: located quotes,
        and those whose value more than one context document carries; the first in context order is taken).
    """
    rows, rejects = [], []
    counts = {"evidence_located": 0, "evidence_located_ambiguous": 0}
    for raw in items.to_dict("records"):
        try:
            row, repair, located = normalize_item(raw, kb_raw, vocab)
        except ClapError as e:
            rejects.append(_reject_from(artifact, raw["item_id"], e))
            continue
        if repair:
            rejects.append(_reject(artifact, raw["item_id"], "evidence_not_verbatim", "repaired", repair))
        counts["evidence_located"] += located > 0
        counts["evidence_located_ambiguous"] += located > 1
        rows.append(row)
    return _frame(rows, item_columns(vocab), vocab), rejects, counts


def _frame(rows: list[dict], columns: list[str], vocab: Vocab) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    if "value" in df:
        df["value"] = df["value"].astype("float64" if vocab.value_type == "number" else "str")
    if "source_line" in df:
        df["source_line"] = df["source_line"].astype("int64")
    return df


# --------------------------------------------------------------------------- dedup and overlap


def _drop_marked(
    df: pd.DataFrame, dup: pd.Series, artifact: str, id_col: str, rule: Any, detail: Any
) -> tuple[pd.DataFrame, list[dict]]:
    """Drop rows where ``dup``; ``rule``/``detail`` are strings or per-row Series."""
    gone = df[dup]
    rules = rule[dup] if isinstance(rule, pd.Series) else pd.Series(rule, index=gone.index)
    details = detail[dup] if isinstance(detail, pd.Series) else pd.Series(detail, index=gone.index)
    rejects = [_reject(artifact, i, r, "deduplicated", d) for i, r, d in zip(gone[id_col], rules, details)]
    return df[~dup].reset_index(drop=True), rejects


def dedup_records(
    records: pd.DataFrame, documented: Iterable[str], priority: list[str], keys: Iterable[str]
) -> tuple[pd.DataFrame, list[dict]]:
    """Keep one record per fact: the same key fields (``keys``) and value.

    The kept copy is one a KB document describes (``documented`` record IDs: a synced copy
    in another system has no document of its own), then the one from the highest-priority
    system (params ``duplicate_system_priority``), then the earliest source line. A dropped
    copy from the kept copy's system is ``duplicate_within_system``, else
    ``duplicate_across_systems``.
    """
    rank = {s: i for i, s in enumerate(priority)}
    order = records.assign(
        _doc=~records["record_id"].isin(set(documented)),
        _rank=records["source_system"].map(lambda s: rank.get(s, len(rank))),
    )
    order = order.sort_values(
        ["_doc", "_rank", "source_file", "source_line", "record_id"], kind="stable"
    ).drop(columns=["_doc", "_rank"])
    key = [*keys, "value"]
    kept_system = order.groupby(key, sort=False)["source_system"].transform("first")
    kept_id = order.groupby(key, sort=False)["record_id"].transform("first")
    rule = (order["source_system"] == kept_system).map(
        {True: "duplicate_within_system", False: "duplicate_across_systems"}
    )
    kept, rejects = _drop_marked(
        order, order.duplicated(key), "records", "record_id", rule, f"same {'/'.join(key)} as " + kept_id
    )
    return kept.sort_values(["source_file", "source_line", "record_id"], kind="stable").reset_index(
        drop=True
    ), rejects


def dedup_items(items: pd.DataFrame, artifact: str) -> tuple[pd.DataFrame, list[dict]]:
    """Within one split keep the first (by source line) of items sharing an item_id, then an input hash."""
    df = items.sort_values(["source_line", "item_id"], kind="stable").reset_index(drop=True)
    rejects: list[dict] = []
    for col, rule in (("item_id", "duplicate_item_id"), ("input_hash", "duplicate_input")):
        first = df.groupby(col, sort=False)["item_id"].transform("first")
        df, found = _drop_marked(
            df, df.duplicated(col), artifact, "item_id", rule, f"same {col} as item " + first
        )
        rejects += found
    return df, rejects


def remove_overlap(
    items: pd.DataFrame, held: pd.DataFrame, artifact: str, held_name: str
) -> tuple[pd.DataFrame, list[dict]]:
    """Drop items of ``items`` whose item_id (``overlap_id``) or input hash (``overlap_text``) occurs in ``held``.

    Held-out data wins: the copy in the training (or lower-priority) split is the one removed.
    """
    by_id = items["item_id"].isin(set(held["item_id"]))
    by_text = ~by_id & items["input_hash"].isin(set(held["input_hash"]))
    rule = by_id.map({True: "overlap_id", False: "overlap_text"})
    detail = rule.map(
        {
            "overlap_id": f"item_id also in {held_name}",
            "overlap_text": f"same normalized question as an item in {held_name}",
        }
    )
    return _drop_marked(items, by_id | by_text, artifact, "item_id", rule, detail)


# --------------------------------------------------------------------------- knowledge base and batch


def normalize_kb(
    kb: pd.DataFrame, records: pd.DataFrame, vocab: Vocab
) -> tuple[pd.DataFrame, list[dict], dict[str, tuple[str, str]]]:
    """Clean titles/bodies, keep the first row of a repeated doc_id, join the key fields from ``record_ref``.

    A document whose body is empty after cleaning is rejected (``empty_body``): it can be
    no one's evidence or context.

    Args:
        kb: asset knowledge base.
        records: normalized records before deduplication (a deduplicated record still
            states the fact its document describes).

    Returns:
        (normalized kb, rejects, doc_id -> (system, raw body) of every kept document).
    """
    df = kb.sort_values(["source_line", "doc_id"], kind="stable").reset_index(drop=True)
    df = df.assign(
        raw_body=df["body"].map(_text),
        title=df["title"].map(lambda t: clean_text(_text(t))),
        body=df["body"].map(lambda t: clean_text(_text(t))),
    )
    empty = df["body"] == ""
    rejects = [
        _reject("kb", d, "empty_body", "rejected", "column body: empty after Unicode/whitespace cleaning")
        for d in df.loc[empty, "doc_id"]
    ]
    df, dups = _drop_marked(
        df[~empty],
        df[~empty].duplicated("doc_id"),
        "kb",
        "doc_id",
        "duplicate_doc_id",
        "doc_id already used by an earlier document",
    )
    facts = records.drop_duplicates("record_id").set_index("record_id")[list(vocab.answer.keys)]
    out = df.join(facts, on="record_ref")
    raw = {d: (s, b) for d, s, b in out[["doc_id", "system", "raw_body"]].itertuples(index=False)}
    return out[kb_columns(vocab)].reset_index(drop=True), rejects + dups, raw


def load_assets(folder: Path, answer: AnswerSchema) -> dict[str, pd.DataFrame]:
    """Read a batch's asset parquet files; a missing file or column raises ClapError naming it."""
    cols = asset_columns(answer)
    frames = {}
    for name, columns in {
        "records": cols["records"],
        "kb": cols["kb"],
        **dict.fromkeys(ITEM_ARTIFACTS, cols["items"]),
    }.items():
        path = Path(folder) / f"{name}.parquet"
        df = io.read_parquet(path)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ClapError(
                f"asset lacks columns {missing} (see docs/data-contract.md)",
                file=path,
                column=missing[0],
                rule="missing_column",
            )
        frames[name] = df
    return frames


@dataclasses.dataclass(frozen=True)
class NormalizeResult:
    """Output of :func:`normalize_batch`: frames by artifact name, the rejects frame, flat metrics."""

    frames: dict[str, pd.DataFrame]
    rejects: pd.DataFrame
    metrics: dict[str, int]


def normalize_batch(assets: Mapping[str, pd.DataFrame], p: NormalizeParams) -> NormalizeResult:
    """Normalize one batch's assets (``records, kb, sft, grpo, eval, replay``).

    Order: canonicalize and verify every row, deduplicate within each artifact, then
    remove overlap: eval and replay items leave train (sft/grpo); eval items leave replay.
    """
    vocab = build_vocab(p)
    records, rejects = normalize_records(assets["records"], vocab)
    kb, found, kb_raw = normalize_kb(assets["kb"], records, vocab)
    rejects += found
    records, found = dedup_records(
        records, kb["record_ref"].dropna(), list(p.duplicate_system_priority), vocab.answer.keys
    )
    rejects += found
    items, located = {}, {}
    for name in ITEM_ARTIFACTS:
        df, found, counts = normalize_items(assets[name], name, kb_raw, vocab)
        items[name], dups = dedup_items(df, name)
        rejects += found + dups
        located.update({f"{name}_{k}": v for k, v in counts.items()})
    for name, held in (
        ("sft", "eval"),
        ("sft", "replay"),
        ("grpo", "eval"),
        ("grpo", "replay"),
        ("replay", "eval"),
    ):
        items[name], found = remove_overlap(items[name], items[held], name, held)
        rejects += found
    frames = {"records": records, "kb": kb, **items}
    rej = pd.DataFrame(rejects, columns=REJECT_COLUMNS)
    metrics = {**batch_metrics(assets, frames, rej), **canonicalization_counts(assets, vocab)}
    if vocab.evidence == "locate":
        metrics.update(located)
    return NormalizeResult(frames, rej, metrics)


def _is_lookalike(text: str) -> bool:
    """Text that NFKC or the confusables map changes, beyond whitespace runs (NBSP counts)."""
    return text.translate(_CONFUSABLE_TABLE) != text or unicodedata.normalize("NFKC", text) != text


def canonicalization_counts(assets: Mapping[str, pd.DataFrame], vocab: Vocab) -> dict[str, int]:
    """Rows (records, sft, eval, replay) whose raw spelling normalize changed, per kind of change.

    ``fixed_numeric_prefix`` (a value stripped from a vocabulary key label, for the keys declared
    with ``strip_value_affixes``), ``fixed_unit_variant`` (a non-canonical unit),
    ``fixed_trailing_whitespace`` and ``fixed_unicode_lookalike`` (over the raw key fields, the
    unit and the question); comparable with the demo generator's MANIFEST noise counts.
    """
    counts = dict.fromkeys(
        (
            "fixed_numeric_prefix",
            "fixed_unit_variant",
            "fixed_trailing_whitespace",
            "fixed_unicode_lookalike",
        ),
        0,
    )
    stripped = [k.name for k in vocab.keys if k.strip_affixes]
    raw_fields = [f"{k}_raw" for k in vocab.answer.keys] + (["unit_raw"] if vocab.unit_field else [])
    for name in ("records", "sft", "eval", "replay"):
        for raw in assets[name].to_dict("records"):
            fields = {k: _text(raw.get(k)) for k in (*raw_fields, "question")}
            labels = [fields[f"{k}_raw"] for k in stripped]
            counts["fixed_numeric_prefix"] += any(
                label_key(strip_value_affixes(x, vocab)) != label_key(x) for x in labels
            )
            if vocab.unit_field:
                unit = canonical_unit(fields["unit_raw"], vocab)
                counts["fixed_unit_variant"] += unit is not None and fields["unit_raw"].strip() != unit[0]
            counts["fixed_trailing_whitespace"] += any(v != v.strip(" \t\r\n") for v in fields.values())
            counts["fixed_unicode_lookalike"] += any(_is_lookalike(v) for v in fields.values())
    return counts


def batch_metrics(
    assets: Mapping[str, pd.DataFrame], frames: Mapping[str, pd.DataFrame], rejects: pd.DataFrame
) -> dict[str, int]:
    """Flat counts: rows in/out per artifact, and rows per (artifact, action, rule) and per action."""
    out: dict[str, int] = {}
    for name, df in frames.items():
        out[f"{name}_rows_in"] = int(len(assets[name]))
        out[f"{name}_rows_out"] = int(len(df))
    for (artifact, action, rule), n in rejects.groupby(["artifact", "action", "rule"]).size().items():
        out[f"{artifact}_{action}_{rule}"] = int(n)
    for action in ("rejected", "repaired", "deduplicated"):
        out[f"total_{action}"] = int((rejects["action"] == action).sum())
    return out
