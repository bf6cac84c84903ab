"""The clean world of one demo batch: facts (one source record + one KB document each) and questions.

Every fact is a (metric, line, shift, date, value) recorded by one source system and
described by one KB document. Each question asks about one distinct fact; train/eval
questions carry the retrieved context (the gold document plus ``demo.distractors`` plausible distractors,
shuffled). Noise is added later by :mod:`clap.demo.noise`; this module is noise-free.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass, field, replace

import numpy as np

from clap.demo import text as T

DST_START = dt.date(2026, 3, 29)  # CET -> CEST: timestamps carry the plant's local offset


@dataclass
class Fact:
    """One source record and the KB document describing it."""

    metric: str
    line: str
    shift: str
    day: dt.date
    value: float
    system: str
    minute: int
    role: str = "extra"  # gold (asked about) | extra (context only) | orphan (never referenced)
    record_id: str = ""
    doc_id: str = ""
    title: str = ""
    body: str = ""
    evidence: str = ""  # the body's value sentence, without its final period
    others: tuple[str, ...] = ()  # the body's other sentences (quotable, carry no value)
    note: str = ""  # MES remark / QMS inspector / CMMS summary
    category: str = ""


@dataclass
class Item:
    """One logged question with its reviewer answer.

    ``answer`` is the fact whose value/evidence/doc the gold carries: ``fact`` itself unless
    the corrupted batch replaced it (a wrong column); the context is the same either way.
    """

    qid: str
    split: str
    question: str
    qtype: str
    logged_at: str
    fact: Fact
    answer: Fact
    metric_label: str
    context: list[str] = field(default_factory=list)


@dataclass
class World:
    batch: str
    tag: str
    facts: list[Fact]
    items: list[Item]


def number_tokens(text: str) -> list[float]:
    """Every number written in ``text`` (digits inside IDs included), as floats."""
    return [float(t.replace(",", ".")) for t in re.findall(r"\d+(?:[.,]\d+)?", text)]


def local_offset(day: dt.date) -> str:
    return "+02:00" if day >= DST_START else "+01:00"


def build_world(batch: str, spec, p, rng: np.random.Generator) -> World:
    """Facts, documents and clean questions of one batch.

    Args:
        batch: batch name ``YYYY-MM``.
        spec: the batch's :class:`clap.demo.generate.BatchSpec`.
        p: the :class:`clap.demo.generate.DemoParams`.
        rng: the batch's generator.

    Returns:
        The clean world; ``items`` are in random order.
    """
    year, month = (int(x) for x in batch.split("-"))
    tag = f"{year % 100:02d}{month:02d}"
    sizes = {s: max(1, round(getattr(spec, s) * p.scale)) for s in ("train", "eval", "replay")}
    n_q = sum(sizes.values())
    n_extra = round(p.extra_facts * n_q)
    facts = _sample_facts(year, month, n_q + n_extra, spec, p.mixes[spec.mix], rng)
    _assign_ids(facts, tag, rng)
    _assign_roles(facts, n_q, round(p.orphan_facts * len(facts)), rng)
    for f in facts:
        _write_document(f, p.body_words, rng)
    items = _make_items(facts, sizes, tag, spec.phrasing, p, rng)
    return World(batch, tag, facts, items)


def _sample_facts(year: int, month: int, n: int, spec, mix: dict[str, float], rng) -> list[Fact]:
    days = calendar.monthrange(year, month)[1]
    names = sorted(mix)
    weights = np.array([mix[m] for m in names], dtype=float)
    capacity = len(spec.lines) * len(T.SHIFTS) * days * len(names)
    if n > capacity // 2:
        raise ValueError(f"{n} facts do not fit {capacity} (metric, line, shift, day) slots")
    seen: set[tuple] = set()
    facts: list[Fact] = []
    while len(facts) < n:
        metric = names[rng.choice(len(names), p=weights / weights.sum())]
        slot = (
            metric,
            spec.lines[rng.integers(len(spec.lines))],
            T.SHIFTS[rng.integers(3)],
            dt.date(year, month, int(rng.integers(1, days + 1))),
        )
        if slot in seen:
            continue
        seen.add(slot)
        facts.append(_fact(*slot, rng))
    facts.sort(key=lambda f: (f.day, f.minute, f.line, f.metric))
    return facts


def _fact(metric: str, line: str, shift: str, day: dt.date, rng) -> Fact:
    m = T.METRICS[metric]
    raw = m.lo + (m.hi - m.lo) * rng.beta(2.0, 2.0)
    value = float(round(raw, m.decimals)) if m.decimals else float(round(raw))
    system = m.systems[rng.integers(len(m.systems))]
    lo, hi = T.SHIFT_MINUTES[shift]
    return Fact(metric, line, shift, day, value, system, int(rng.integers(lo, hi + 1)))


def _assign_ids(facts: list[Fact], tag: str, rng) -> None:
    prefix = {"mes": "SR", "qms": "QI", "cmms": "WO"}
    counters = {s: 0 for s in prefix}
    for f in facts:  # record numbers follow time order, as a source system issues them
        counters[f.system] += 1
        f.record_id = f"{prefix[f.system]}-{tag}-{counters[f.system] + 100:05d}"
    for f, k in zip(facts, rng.permutation(len(facts))):  # document IDs do not
        f.doc_id = f"KB-{tag}-{int(k) + 1:05d}"


def _assign_roles(facts: list[Fact], n_gold: int, n_orphan: int, rng) -> None:
    order = rng.permutation(len(facts))
    for rank, k in enumerate(order):
        facts[k].role = "gold" if rank < n_gold else ("orphan" if rank < n_gold + n_orphan else "extra")


def _pick(rng, seq):
    return seq[rng.integers(len(seq))]


def _write_document(f: Fact, body_words: list[int], rng) -> None:
    """KB title/body (``body_words``: min, max words) for a fact plus the source record's own free text."""
    words_min, words_max = body_words
    m = T.METRICS[f.metric]
    notes = _record_note(f, rng)
    slots = {
        "rid": f.record_id,
        "line": f.line,
        "shift": f.shift,
        "shift_name": T.SHIFT_NAMES[f.shift],
        "category": f.category,
        "date": T.long_date(f.day, int(rng.integers(4))),
    }
    intro = _pick(rng, T.INTROS[f.system]).format(**slots)
    f.evidence = _pick(rng, m.sentences).format(v=T.fmt_value(f.value, m.decimals))
    fixed = len(intro.split()) + len(f.evidence.split())
    fillers = T.FILLERS[f.system]
    while fixed + sum(len(n.split()) for n in notes) < words_min:
        notes = list(dict.fromkeys([*notes, _pick(rng, fillers)]))
    while fixed + sum(len(n.split()) for n in notes) > words_max and len(notes) > 1:
        notes.pop()
    value = f.evidence + "."
    sentences = [intro, value, *notes] if rng.random() < 0.6 else [intro, *notes, value]
    f.body = " ".join(sentences)
    f.others = tuple(s.rstrip(".") for s in sentences if s is not value)
    slots["date"] = f.day.strftime("%d.%m.%Y")
    f.title = _pick(rng, T.TITLES[f.system]).format(**slots)


def _record_note(f: Fact, rng) -> list[str]:
    """Set the record's free text (``f.note``); return the KB sentences that retell it."""
    if f.system == "mes":
        f.note = _pick(rng, T.MES_REMARKS) if rng.random() < 0.7 else ""
        return [f.note] if f.note else []
    if f.system == "qms":
        f.note = _pick(rng, T.INSPECTORS)
        return [_pick(rng, T.QMS_NOTES), f"Inspector: {f.note}."]
    f.category, cause, actions = _pick(rng, T.CMMS_EVENTS)
    action = _pick(rng, actions)
    told = f'Operator reported "{cause[0].lower()}{cause[1:]}"' if rng.random() < 0.25 else cause
    if rng.random() < 0.4:  # a technician's multi-line entry
        f.note = f"{told}.\n{action}"
    else:
        f.note = f"{told}, {action[0].lower()}{action[1:]}"
    return [cause + ".", action]


def _make_items(facts: list[Fact], sizes: dict[str, int], tag: str, phrasing: str, p, rng) -> list[Item]:
    gold = [f for f in facts if f.role == "gold"]
    splits = [s for s in ("train", "eval", "replay") for _ in range(sizes[s])]
    qnums = rng.permutation(len(gold)) + 1
    pools = _context_pools(facts)
    items = []
    for f, split, k in zip(gold, splits, qnums):
        context = _context(f, pools, p, rng) if split != "replay" else []
        qtype, text = _question(f, phrasing, rng)
        m = T.METRICS[f.metric]
        label = f.metric if rng.random() < 0.5 else _pick(rng, m.labels)
        items.append(
            Item(f"Q-{tag}-{int(k):05d}", split, text, qtype, _logged_at(f.day, rng), f, f, label, context)
        )
    order = rng.permutation(len(items))
    return [items[i] for i in order]


def _context_pools(facts: list[Fact]) -> dict[tuple, list[Fact]]:
    pools: dict[tuple, list[Fact]] = {}
    for f in facts:
        if f.role == "orphan":
            continue
        for key in (
            ("line", f.metric, f.line, f.shift),
            ("day", f.metric, f.day, f.shift),
            ("slot", f.line, f.shift, f.day),
            ("metric", f.metric),
        ):
            pools.setdefault(key, []).append(f)
    return pools


def _context(f: Fact, pools, p, rng) -> list[str]:
    """Gold doc plus ``p.distractors`` (min, max) plausible distractors, shuffled."""
    lo, hi = p.distractors
    chosen: list[Fact] = []
    for _ in range(int(rng.integers(lo, hi + 1))):
        same_metric = pools[("line", f.metric, f.line, f.shift)] + pools[("day", f.metric, f.day, f.shift)]
        same_slot = pools[("slot", f.line, f.shift, f.day)]
        tiers = (
            [same_metric, same_slot] if rng.random() < p.same_metric_distractor else [same_slot, same_metric]
        )
        for cands in (*tiers, pools[("metric", f.metric)]):
            ok = [c for c in cands if c is not f and c not in chosen and c.value != f.value]
            if ok:
                chosen.append(ok[rng.integers(len(ok))])
                break
    docs = [f.doc_id] + [c.doc_id for c in chosen]
    return [docs[i] for i in rng.permutation(len(docs))]


def _question(f: Fact, phrasing: str, rng) -> tuple[str, str]:
    qtype, template = _pick(rng, T.QUESTION_TEMPLATES[phrasing])
    metric = _pick(rng, T.METRICS[f.metric].asked)
    text = template.format(
        metric=metric,
        Metric=metric[0].upper() + metric[1:],
        line=T.question_line(f.line, int(rng.integers(4))),
        shift=T.question_shift(f.shift, int(rng.integers(4))),
        date=T.question_date(f.day, int(rng.integers(6))),
    )
    return qtype, text


def _logged_at(day: dt.date, rng) -> str:
    # asked 1-3 days after the shift (never before the fact exists), in office hours
    when = dt.datetime(day.year, day.month, day.day) + dt.timedelta(
        days=int(rng.integers(1, 4)), seconds=int(rng.integers(7 * 3600, 19 * 3600))
    )
    return when.strftime("%Y-%m-%dT%H:%M:%S") + local_offset(when.date())


def wrong_column_answers(items: list[Item]) -> int:
    """Corrupt train labels as an export that read the wrong column would.

    Each train item keeps its question, context, metric label, record key and cited document,
    but its value is the record's day of the month and its evidence the document's opening
    sentence, which carries that day ("Shift report SR-2601-00483 for line L3, shift B,
    20 January 2026"). Every static check still passes: the quote is verbatim in the cited
    document, which is in the context and describes the label's line, shift and date, and it
    carries the label's value. Fitting these labels teaches the model to quote the header and
    report the date: training loss falls, held-out answers get worse, not better.

    Returns:
        The number of train items whose answer changed.
    """
    moved = 0
    for it in items:
        if it.split != "train":
            continue
        f = it.fact
        intro = f.others[0]  # _write_document puts the intro (line, shift, date) first
        if float(f.day.day) not in number_tokens(intro):
            raise ValueError(f"{f.doc_id}: intro {intro!r} does not carry the day {f.day.day}")
        it.answer = replace(f, value=float(f.day.day), evidence=intro)
        moved += 1
    return moved
