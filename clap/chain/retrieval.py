"""BM25 retrieval over a batch's knowledge base (``kb.parquet``), built once per KB.

Questions and KB prose name the same fact differently: "line 5" / "L5", "the late shift" /
"shift B", "27.01." / "January 27, 2026", "stoppage time" / "stood still". Plain word
tokens cannot match those, so every text is *analyzed* into three kinds of terms:

- words: case-folded letter/digit runs of two or more characters, stopwords removed, taken
  only from the text no entity or concept matched (so "late" in "the late shift" counts
  once, as ``shift=b``);
- entities: the production line (``line=l5``), shift (``shift=b``), month-day
  (``date=01-27``) and year (``year=2026``) found in the text; a document also gets them
  from its ``line``/``shift``/``date`` columns, which normalize derived from its source
  record, so a document whose prose says "Thursday 22 January" still matches "22.01.";
- concepts: every phrase of the params lexicon (``chain.retrieval.concepts``, e.g.
  ``downtime: [downtime, stoppage, stood still]``) becomes one ``concept=<name>`` term.

A question lists its entity terms ``entity_weight`` times (bm25s adds a repeated query
term's score once per repeat): line, shift and date pin a fact down, the metric words then
choose among the ~2 documents of that line, shift and day. The BM25 scoring is ``bm25s``
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
_LINE_PATTERNS = (
    re.compile(r"\b(?:line|ln)\s*[-#.]?\s*l?\s*0*(\d{1,2})\b"),  # "line 5", "Line L5", "ln-05"
    re.compile(r"\bl\s*-?\s*0*(\d{1,2})\b"),  # "L5", "L-5"
)
_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script
STOPWORD_SETS = ("en", "none")


@dataclasses.dataclass(frozen=True)
class RetrievalParams:
    """Params ``chain.retrieval``: BM25 constants and the analyzer's domain lexicon."""

    k1: float
    b: float
    entity_weight: int
    stopwords: str
    concepts: dict[str, list[str]]
    shift_words: dict[str, list[str]]

    def __post_init__(self) -> None:
        if (
            self.stopwords not in STOPWORD_SETS
            or self.k1 < 0
            or not 0.0 <= self.b <= 1.0
            or self.entity_weight < 1
        ):
            raise ClapError(
                f"chain.retrieval: stopwords one of {STOPWORD_SETS}, k1 >= 0, 0 <= b <= 1, entity_weight >= 1",
                file="params.yaml",
                column="chain.retrieval",
                rule="bad_params",
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
        self.shift_of = {_fold(w): s.lower() for s, ws in p.shift_words.items() for w in ws}
        self.shift_of.update({s.lower(): s.lower() for s in p.shift_words})
        letters = "".join(sorted(s.lower() for s in p.shift_words))
        words = "|".join(re.escape(w) for w in sorted(self.shift_of, key=len, reverse=True) if len(w) > 1)
        self.shift_patterns = (
            [
                re.compile(rf"\bshift\s*\(?\s*([{letters}])\b"),  # "shift B", "shift (c)"
                re.compile(rf"\b([{letters}])\s*-?\s*shift\b"),  # "B shift", "a-shift"
            ]
            if letters  # no shift words declared: a knowledge base without shifts
            else []
        ) + ([re.compile(rf"\b({words})\s+shift\b")] if words else [])  # "late shift"

    def scan(self, text: str) -> tuple[set[str], list[str], str]:
        """(entity terms, concept terms, the folded text with every matched span blanked out)."""
        folded = _fold(text)
        entities: set[str] = set()
        spans: list[tuple[int, int]] = []
        for make, patterns in ((_line_term, _LINE_PATTERNS), (self._shift_term, self.shift_patterns)):
            for rx in patterns:
                for m in rx.finditer(folded):
                    entities.add(make(m))
                    spans.append(m.span())
        for rx, order in _DATE_PATTERNS:
            for m in rx.finditer(folded):
                entities |= _date_terms(dict(zip(order, m.groups())))
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

    def _shift_term(self, m: re.Match) -> str:
        return f"shift={self.shift_of[m.group(1)]}"

    def entities(self, text: str) -> set[str]:
        """Entity terms (line, shift, month-day, year) written in ``text``."""
        return self.scan(text)[0]

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


def _line_term(m: re.Match) -> str:
    return f"line=l{int(m.group(1))}"


def _date_terms(parts: Mapping[str, str | None]) -> set[str]:
    """``date=MM-DD`` (+ ``year=YYYY``) from regex groups keyed y/m/d (M: a month name)."""
    month = (
        MONTHS.index(next(m for m in MONTHS if m.startswith(parts["M"][:3]))) + 1
        if parts.get("M")
        else int(parts["m"])
    )
    day, year = int(parts["d"]), parts.get("y")
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return set()
    return {f"date={month:02d}-{day:02d}"} | ({f"year={year}"} if year else set())


def metadata_entities(row: Mapping[str, Any]) -> set[str]:
    """Entity terms of a KB row's ``line``/``shift``/``date`` columns (missing ones skipped: a knowledge
    base whose declared answer has other key fields carries none of them)."""
    out: set[str] = set()
    line, shift, date = (row.get(k) for k in ("line", "shift", "date"))
    if isinstance(line, str) and re.fullmatch(r"L\d+", line):
        out.add(f"line=l{int(line[1:])}")
    if isinstance(shift, str) and shift.strip():
        out.add(f"shift={shift.strip().lower()}")
    if isinstance(date, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        out |= {f"date={date[5:]}", f"year={date[:4]}"}
    return out


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
            columns normalize joined, of which ``line``, ``shift``, ``date`` give entity terms);
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
            corpus = [self.analyzer.terms(f"{r['title']}. {r['body']}", metadata_entities(r)) for r in rows]
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
