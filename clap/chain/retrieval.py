"""BM25 retrieval over a batch's knowledge base (``kb.parquet``), built once per KB.

Questions and KB prose name the same fact differently: "line 5" / "L5", "the late shift" /
"shift B", "27.01." / "January 27, 2026", "stoppage time" / "stood still". Plain word
tokens cannot match those, so every text is *analyzed* into three kinds of terms:

- words: case-folded letter/digit runs of two or more characters, stopwords removed, taken
  only from the text no entity or concept matched (so "late" in "the late shift" counts
  once, as ``shift=b``);
- entities: the key fields params ``chain.retrieval.entities`` declares (the demo: a production
  line ``line=l5``, a shift ``shift=b``, a month-day ``date=01-27`` and its ``year=2026``), found
  in the text; a document also gets them from its own key columns, which normalize derived from its
  source record, so a document whose prose says "Thursday 22 January" still matches "22.01.";
- concepts: every phrase of the params lexicon (``chain.retrieval.concepts``, e.g.
  ``downtime: [downtime, stoppage, stood still]``) becomes one ``concept=<name>`` term.

A question lists its entity terms ``entity_weight`` times (bm25s adds a repeated query
term's score once per repeat): the entities pin a fact down (in the demo: line, shift and day),
the other words then choose among the few documents that share them. The BM25 scoring is ``bm25s``
(lucene variant, index built once per knowledge base). Ranking is by score, ties by KB row
order (a stable sort, so retrieval is deterministic), and a document that shares no term
with the question is never returned. No stemmer is used: the lexicon covers the variants that matter
("scrapped" -> scrap) without adding a dependency.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from clap.errors import ClapError
from clap.params import bad_param, check_keys, stray_key

MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_MONTH_RE = "|".join(f"{m[:3]}(?:{m[3:]})?" if len(m) > 3 else m for m in MONTHS)  # "jan" or "january"
_ORD = r"(?:st|nd|rd|th)?"
# (pattern, group order): the groups give (year?, month, day) in the order listed.
_DATE_PATTERNS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), "ymd"),
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"), "mdy"),  # US order (the CMMS export)
    (re.compile(r"(?<![\d.])(\d{1,2})\.(\d{1,2})\.(\d{4})?"), "dmy"),
    (re.compile(rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?({_MONTH_RE})\.?(?:,?\s+(\d{{4}}))?\b"), "dMy"),
    (re.compile(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}}){_ORD}\b(?:,?\s+(\d{{4}}))?"), "Mdy"),
)
_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script
STOPWORD_SETS = ("en", "none")
ENTITY_KINDS = ("code", "anchored", "date")


@dataclasses.dataclass(frozen=True)
class EntityParams:
    """How one key field is written in questions and prose (params ``chain.retrieval.entities.<field>``).

    ``kind: code``: a letter and a number (``letter: l``: "L5", "L-5"), also after a prefix word
    (``prefixes: [line, ln]``: "line 5", "Line L5", "ln-05") -> ``<field>=l5``; a KB row's column
    "L5" gives the same term. ``kind: anchored``: an anchor word with a one-letter value ("shift B",
    "B shift", "shift (c)") or a prose word before it (``words: {B: [late]}``: "late shift") ->
    ``<field>=b``; the row's column "B" too. ``kind: date``: ISO, US, dotted and English-month
    dates -> ``<field>=MM-DD`` (+ ``year=YYYY`` when written); the row's ISO date too.
    """

    kind: str
    letter: str = ""
    prefixes: tuple[str, ...] = ()
    anchor: str = ""
    words: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)


def _entity_params(field: str, raw: Any) -> EntityParams:
    allowed = {"code": {"letter", "prefixes"}, "anchored": {"anchor", "words"}, "date": set()}
    kind = raw.get("kind") if isinstance(raw, dict) else None
    where = f"chain.retrieval.entities.{field}"
    if kind not in ENTITY_KINDS or set(raw) - {"kind"} != allowed[kind]:
        if kind in ENTITY_KINDS:
            key = stray_key(where, raw, {"kind"} | allowed[kind])
        else:
            key = f"{where}.kind" if isinstance(raw, dict) else where
        raise bad_param(
            key,
            f"{where}: kind one of {list(ENTITY_KINDS)} with exactly the keys code: letter, prefixes | "
            "anchored: anchor, words | date: none",
        )
    if kind == "code" and not (isinstance(raw["letter"], str) and len(raw["letter"]) == 1):
        raise bad_param(f"{where}.letter", f"{where}.letter must be one letter")
    if kind == "anchored" and not (isinstance(raw["anchor"], str) and raw["anchor"].strip()):
        raise bad_param(f"{where}.anchor", f"{where}.anchor must be a word")
    return EntityParams(
        kind,
        str(raw.get("letter", "")),
        tuple(str(w) for w in raw.get("prefixes", ())),
        str(raw.get("anchor", "")),
        {str(k): [str(w) for w in ws] for k, ws in raw.get("words", {}).items()},
    )


@dataclasses.dataclass(frozen=True)
class RetrievalParams:
    """Params ``chain.retrieval``: BM25 constants and the analyzer's domain lexicon."""

    k1: float
    b: float
    entity_weight: int
    stopwords: str
    concepts: dict[str, list[str]]
    entities: dict[str, Any]  # field -> EntityParams (a raw mapping from params is checked and converted)

    def __post_init__(self) -> None:
        if not isinstance(self.entities, dict):
            raise bad_param(
                "chain.retrieval.entities",
                "chain.retrieval.entities must map key fields to their declarations",
            )
        object.__setattr__(
            self,
            "entities",
            {
                str(f): e if isinstance(e, EntityParams) else _entity_params(str(f), e)
                for f, e in self.entities.items()
            },
        )
        check_keys(
            {
                "chain.retrieval.stopwords": self.stopwords in STOPWORD_SETS,
                "chain.retrieval.k1": self.k1 >= 0,
                "chain.retrieval.b": 0.0 <= self.b <= 1.0,
                "chain.retrieval.entity_weight": self.entity_weight >= 1,
            },
            f"chain.retrieval: stopwords one of {STOPWORD_SETS}, k1 >= 0, 0 <= b <= 1, entity_weight >= 1",
        )


def _fold(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed (fullwidth digits and NBSP read as plain)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _phrase_re(phrases: Sequence[str]) -> re.Pattern:
    """One regex matching any phrase, longest first; spaces match whitespace or '-'.

    A phrase edge that is a word character must be a word boundary ("ct" is not in "defect"),
    a symbol edge needs none ("%" in "95.0%").
    """
    alts = []
    for phrase in sorted({_fold(p) for p in phrases if _fold(p)}, key=len, reverse=True):
        body = r"[\s\-]+".join(re.escape(w) for w in re.split(r"[\s\-]+", phrase))
        alts.append(
            ("(?<!\\w)" if phrase[0].isalnum() else "") + body + ("(?!\\w)" if phrase[-1].isalnum() else "")
        )
    return re.compile("|".join(alts))


class Analyzer:
    """Turns a text into BM25 terms (words, entities, concepts); compiled once from params."""

    def __init__(self, p: RetrievalParams):
        from bm25s.stopwords import STOPWORDS_EN

        self.stopwords = frozenset(STOPWORDS_EN) if p.stopwords == "en" else frozenset()
        self.concepts = [
            (name, _phrase_re(phrases)) for name, phrases in sorted(p.concepts.items()) if phrases
        ]
        self.entity_fields = dict(p.entities)
        # (field, pattern, term of a match) per declared code and anchored field; dates are scanned apart
        self.patterns: list[tuple[re.Pattern, Any]] = []
        self.date_fields = [f for f, e in p.entities.items() if e.kind == "date"]
        for field, e in p.entities.items():
            if e.kind == "code":
                self.patterns += _code_patterns(field, e)
            elif e.kind == "anchored":
                self.patterns += _anchored_patterns(field, e)

    def scan(self, text: str) -> tuple[set[str], list[str], str]:
        """(entity terms, concept terms, the folded text with every matched span blanked out)."""
        folded = _fold(text)
        entities: set[str] = set()
        spans: list[tuple[int, int]] = []
        for rx, make in self.patterns:
            for m in rx.finditer(folded):
                entities.add(make(m))
                spans.append(m.span())
        for field in self.date_fields:
            for rx, order in _DATE_PATTERNS:
                for m in rx.finditer(folded):
                    entities |= _date_terms(field, dict(zip(order, m.groups())))
                    spans.append(m.span())
        concepts = []
        for name, rx in self.concepts:
            for m in rx.finditer(folded):
                concepts.append(f"concept={name}")
                spans.append(m.span())
        chars = list(folded)
        for a, b in spans:
            chars[a:b] = " " * (b - a)
        return entities, concepts, "".join(chars)

    def entities(self, text: str) -> set[str]:
        """Entity terms (the declared key fields, a date's year) written in ``text``."""
        return self.scan(text)[0]

    def metadata(self, row: Mapping[str, Any]) -> set[str]:
        """Entity terms of a KB row's own columns of the declared fields (a missing or malformed one is
        skipped: a document need not carry every key)."""
        out: set[str] = set()
        for field, e in self.entity_fields.items():
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                continue
            value = value.strip()
            if e.kind == "code" and re.fullmatch(rf"{re.escape(e.letter)}\d+", value, re.IGNORECASE):
                out.add(f"{field}={e.letter.lower()}{int(value[1:])}")
            elif e.kind == "anchored":
                out.add(f"{field}={value.lower()}")
            elif e.kind == "date" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
                out |= {f"{field}={value[5:]}", f"year={value[:4]}"}
        return out

    def terms(self, text: str, extra: set[str] = frozenset(), entity_repeat: int = 1) -> list[str]:
        """BM25 terms of ``text``: words outside entity/concept spans, entities (plus ``extra``), concepts.

        Args:
            text: a question or a document's text.
            extra: more entity terms (a document's metadata).
            entity_repeat: how often each entity term is listed (a query-side boost: bm25s
                sums a repeated query term's score once per repetition).
        """
        entities, concepts, rest = self.scan(text)
        words = [w for w in _WORD.findall(rest) if len(w) > 1 and w not in self.stopwords]
        return words + sorted(entities | set(extra)) * entity_repeat + concepts


def _code_patterns(field: str, e: EntityParams) -> list[tuple[re.Pattern, Any]]:
    letter = re.escape(e.letter.casefold())

    def term(m: re.Match) -> str:
        return f"{field}={e.letter.lower()}{int(m.group(1))}"

    out = []
    if e.prefixes:
        words = "|".join(re.escape(_fold(w)) for w in e.prefixes)
        out.append(
            (re.compile(rf"\b(?:{words})\s*[-#.]?\s*{letter}?\s*0*(\d{{1,2}})\b"), term)
        )  # "line 5", "Line L5"
    out.append((re.compile(rf"\b{letter}\s*-?\s*0*(\d{{1,2}})\b"), term))  # "L5", "L-5"
    return out


def _anchored_patterns(field: str, e: EntityParams) -> list[tuple[re.Pattern, Any]]:
    value_of = {_fold(w): v.lower() for v, ws in e.words.items() for w in ws}
    value_of.update({v.lower(): v.lower() for v in e.words})
    anchor = re.escape(_fold(e.anchor))
    letters = "".join(sorted(v.lower() for v in e.words if len(v) == 1))
    words = "|".join(re.escape(w) for w in sorted(value_of, key=len, reverse=True) if len(w) > 1)

    def term(m: re.Match) -> str:
        return f"{field}={value_of[m.group(1)]}"

    out = []
    if letters:
        out.append((re.compile(rf"\b{anchor}\s*\(?\s*([{letters}])\b"), term))  # "shift B", "shift (c)"
        out.append((re.compile(rf"\b([{letters}])\s*-?\s*{anchor}\b"), term))  # "B shift", "a-shift"
    if words:
        out.append((re.compile(rf"\b({words})\s+{anchor}\b"), term))  # "late shift"
    return out


def _date_terms(field: str, parts: Mapping[str, str | None]) -> set[str]:
    """``<field>=MM-DD`` (+ ``year=YYYY``) from regex groups keyed y/m/d (M: a month name)."""
    month = (
        MONTHS.index(next(m for m in MONTHS if m.startswith(parts["M"][:3]))) + 1
        if parts.get("M")
        else int(parts["m"])
    )
    day, year = int(parts["d"]), parts.get("y")
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return set()
    return {f"{field}={month:02d}-{day:02d}"} | ({f"year={year}"} if year else set())


@dataclasses.dataclass(frozen=True)
class Hit:
    """One retrieved document."""

    doc_id: str
    text: str
    score: float


class KBIndex:
    """A BM25 index of one knowledge base (title + body + metadata entities per document).

    Args:
        kb: the admitted ``kb.parquet`` frame (``doc_id``, ``title``, ``body``, and the key
            columns normalize joined, of which the declared entity fields give entity terms);
            ``doc_id`` must be unique.
        p: retrieval params.
    """

    def __init__(self, kb: pd.DataFrame, p: RetrievalParams):
        import bm25s

        missing = sorted({"doc_id", "title", "body"} - set(kb.columns))
        if missing:
            raise ClapError(
                f"knowledge base lacks columns {missing}", column=missing[0], rule="missing_column"
            )
        if kb["doc_id"].duplicated().any():
            raise ClapError(
                f"knowledge base repeats doc_id {kb['doc_id'][kb['doc_id'].duplicated()].iloc[0]!r}",
                column="doc_id",
                rule="duplicate_doc_id",
            )
        self.analyzer = Analyzer(p)
        rows = kb.to_dict("records")
        self.doc_ids = [str(r["doc_id"]) for r in rows]
        self.bodies = [str(r["body"]) for r in rows]
        self.entity_weight = p.entity_weight
        self.retriever = bm25s.BM25(k1=p.k1, b=p.b, method="lucene") if rows else None
        if self.retriever is not None:
            corpus = [
                self.analyzer.terms(f"{r['title']}. {r['body']}", self.analyzer.metadata(r)) for r in rows
            ]
            self.retriever.index(corpus, show_progress=False)

    def __len__(self) -> int:
        return len(self.doc_ids)

    def search(self, question: str, k: int) -> list[Hit]:
        """The top ``k`` documents for ``question`` (score > 0 only), best first, ties by KB order."""
        if self.retriever is None or k <= 0:
            return []
        terms = self.analyzer.terms(question, entity_repeat=self.entity_weight)
        if not terms:
            return []
        scores = np.asarray(self.retriever.get_scores(terms), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")[:k]
        return [Hit(self.doc_ids[i], self.bodies[i], float(scores[i])) for i in order if scores[i] > 0]
