"""Derive the TAT-QA profile's raw batches from the TAT-QA development split (stdlib only, deterministic).

    python profiles/tatqa/derive_batches.py SOURCE.json OUT_RAW [--manifest PATH] [--table]

SOURCE is TAT-QA's ``tatqa_dataset_dev.json`` (checked against its sha256; a copy is committed as
``profiles/tatqa/source/tatqa_dataset_dev.json``). Writes, in TAT-QA's own unchanged schema (a list of
contexts), one ``reports.json`` per batch folder under OUT_RAW:

- ``reports-a``, ``reports-b``: a partition of the source contexts into two disjoint groups of about
  equal size, in source order. Contexts that look cut from one report (``linked_groups``: the same
  table uid, an identical paragraph text, or two or more identical distinctive numbers in their
  tables) always land in the same group.
- ``reports-b-wrongcell``: a copy of ``reports-b`` in which every TRAINING single span (``split_of``;
  answer_type ``span``, any answer_from) that is a whole data-row cell answers with the cell of the same
  column in another data row (``wrong_cell``), one that is a number printed in a paragraph with another
  number of that paragraph (``wrong_number``), and any other with another question's single span of the
  same context (``wrong_span``): still verbatim in the report, but the wrong fact. Nothing else changes.

What was corrupted (question uid, old and new answer, the cells) goes to ``--manifest`` (default
``profiles/tatqa/corruption_manifest.json``). ``--table`` prints the per-batch counts (the table in
profiles/tatqa/README.md). Same source, same bytes.

TAT-QA: Zhu et al., ACL 2021, github.com/NExTplusplus/TAT-QA (commit 870accc), licensed under
Creative Commons Attribution 4.0 International (CC BY 4.0); see profiles/tatqa/LICENSE-DATA.md.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

SOURCE_SHA256 = "8da095a819af6db3c14877c6df2d4d29960e41d1a63dd1fa853507bd2a616af5"
SEED = 20260305
SHARES = {"train": 0.50, "eval": 0.35, "replay": 0.15}
SPLITS = ("train", "eval", "replay")
GROUPS = ("reports-a", "reports-b")
WRONGCELL = "reports-b-wrongcell"
WRONGCELL_FROM = "reports-b"
BATCH_FILE = "reports.json"
ANSWER_TYPES = ("span", "multi-span", "arithmetic", "count")
ANSWER_FROMS = ("table", "table-text", "text")
ATTRIBUTION = (
    "Derived from TAT-QA (Zhu et al., 'TAT-QA: A Question Answering Benchmark on a Hybrid of Tabular and "
    "Textual Content in Finance', ACL 2021), github.com/NExTplusplus/TAT-QA, dataset_raw/ at commit 870accc; "
    "licensed under Creative Commons Attribution 4.0 International (CC BY 4.0), "
    "https://creativecommons.org/licenses/by/4.0/"
)

# a number as reports print it: sign, currency, parentheses, thousands separators, decimals, percent
_NUMBER = re.compile(r"^\(?[-–—]?\s*[$€£¥]?\s*\(?[-–—]?\d+(,\d{3})*(\.\d+)?\s*%?\)?\s*%?$")
_YEAR = re.compile(r"^(19|20)\d\d$")
# numbers distinctive enough that two tables sharing two of them come from one report
_DISTINCTIVE = re.compile(r"^-?\d{4,}(\.\d+)?$|^-?\d+\.\d+$")
MIN_SHARED_NUMBERS = 2
# dates of 52/53-week fiscal calendars (not a month's last day, not January 1): two shared, one company
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DATE = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+(\d{1,2}),?\s+((?:19|20)\d\d)\b")
_MONTH_END = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 28 and 29 both count as an end
MIN_SHARED_DATES = 2


def split_of(table_uid: str, seed: int = SEED, shares: dict[str, float] = SHARES) -> str:
    """The split of every question of the context with this table uid (the pipeline's rule, verbatim)."""
    u = int.from_bytes(hashlib.sha256(f"{seed}:{table_uid}".encode()).digest()[:8], "big") / 2**64
    return "train" if u < shares["train"] else "eval" if u < shares["train"] + shares["eval"] else "replay"


# --- which contexts come from one report -------------------------------------------------------------


def _distinctive_numbers(table: list[list[str]]) -> set[str]:
    out = set()
    for row in table:
        for cell in row:
            x = re.sub(r"[\s$€£¥,()%]", "", cell)
            if _DISTINCTIVE.match(x) and len(x.replace(".", "").lstrip("-")) >= 4 and not _YEAR.match(x):
                out.add(x)
    return out


def _fiscal_dates(context: dict) -> set[str]:
    text = " ".join(
        [*(x for row in context["table"]["table"] for x in row), *(p["text"] for p in context["paragraphs"])]
    )
    out = set()
    for m in _DATE.finditer(text):
        month, day = _MONTHS.index(m.group(1)), int(m.group(2))
        if day < _MONTH_END[month] - (month == 1) and (month, day) != (0, 1):
            out.add(f"{m.group(1)} {day}, {m.group(3)}")
    return out


def links(contexts: list[dict]) -> list[tuple[int, int, str]]:
    """Pairs of contexts (source indices i < j) that look cut from one report (or from two years' reports
    of one company), with the reason: the same table uid; an identical paragraph text (after stripping);
    at least MIN_SHARED_NUMBERS identical distinctive numbers in their tables (4+ digits or with decimals,
    not a year; signs, currency and separators ignored): shared facts; at least MIN_SHARED_DATES identical
    fiscal-calendar dates (``_fiscal_dates``): one company. Generic headings ("Revenue") and common
    52/53-week calendars link unrelated reports too: harmless for grouping."""
    out: list[tuple[int, int, str]] = []
    seen: dict[tuple[str, str], int] = {}
    for j, c in enumerate(contexts):
        keys = [("table uid", c["table"]["uid"])] + [
            ("paragraph", p["text"].strip()) for p in c["paragraphs"]
        ]
        for key in dict.fromkeys(keys):
            i = seen.setdefault(key, j)
            if i != j:
                out.append((i, j, f"{key[0]}: {key[1][:80]}"))
    numbers = [_distinctive_numbers(c["table"]["table"]) for c in contexts]
    for i in range(len(contexts)):
        for j in range(i + 1, len(contexts)):
            shared = numbers[i] & numbers[j]
            if len(shared) >= MIN_SHARED_NUMBERS:
                out.append((i, j, f"table numbers: {', '.join(sorted(shared))}"))
    dates = [_fiscal_dates(c) for c in contexts]
    for i in range(len(contexts)):
        for j in range(i + 1, len(contexts)):
            shared = dates[i] & dates[j]
            if len(shared) >= MIN_SHARED_DATES:
                out.append((i, j, f"fiscal dates: {', '.join(sorted(shared))}"))
    return sorted(out)


def linked_groups(contexts: list[dict]) -> list[list[int]]:
    """Connected components of ``links`` (sorted source indices), ordered by their first context."""
    parent = list(range(len(contexts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j, _ in links(contexts):
        a, b = root(i), root(j)
        parent[max(a, b)] = min(a, b)
    comps: dict[int, list[int]] = {}
    for i in range(len(contexts)):
        comps.setdefault(root(i), []).append(i)
    return sorted(comps.values())


def partition(contexts: list[dict], names: tuple[str, ...] = GROUPS) -> dict[str, list[int]]:
    """Source indices per group: linked groups taken whole in source order (of their first context), each
    group filled until it reaches its share of the contexts (cumulative round(n*k/len(names)))."""
    n, out = len(contexts), {name: [] for name in names}
    k, done = 0, 0
    for comp in linked_groups(contexts):
        out[names[k]].extend(comp)
        done += len(comp)
        while k < len(names) - 1 and done >= round(n * (k + 1) / len(names)):
            k += 1
    return {name: sorted(ix) for name, ix in out.items()}


# --- the wrong-cell corruption -----------------------------------------------------------------------


def is_number(cell: str) -> bool:
    """A number as printed in a report (``$1,496.5``, ``(2,345)``, ``12.5%``), a bare year excluded."""
    x = cell.strip()
    return bool(_NUMBER.match(x)) and not _YEAR.match(x)


def header_rows(table: list[list[str]]) -> int:
    """How many leading rows are headers: those before the first row with a number in a value column
    (any column but the first). Section labels right under the header ("Revenue:", empty values)
    count as header too; they hold no value to swap."""
    for r, row in enumerate(table):
        if any(is_number(x) for x in row[1:]):
            return r
    return len(table)


def locate_cell(table: list[list[str]], answer: str) -> tuple[int, int] | None:
    """The first data-row cell (row-major) equal to ``answer`` after whitespace stripping, or None."""
    a = answer.strip()
    for r in range(header_rows(table), len(table)):
        for k, cell in enumerate(table[r]):
            if cell.strip() == a:
                return r, k
    return None


def wrong_cell(table: list[list[str]], r: int, k: int) -> tuple[int, str] | None:
    """(row, stripped text) of the cell in column ``k`` of the next data row after ``r`` (wrapping around)
    whose value is non-empty (has a letter or digit, so not a bare dash) and differs from cell (r, k):
    neither contains the other ("2027" -> "2027 or indefinite" would be half right)."""
    h, old = header_rows(table), table[r][k].strip()
    data = list(range(h, len(table)))
    pos = data.index(r)
    for r2 in data[pos + 1 :] + data[:pos]:
        cell = table[r2][k].strip() if k < len(table[r2]) else ""
        if re.search(r"\w", cell) and old not in cell and cell not in old:
            return r2, cell
    return None


def corruptible(question: dict) -> bool:
    """A single span: the kind the wrong-cell copy corrupts (answers that are lists or computed are not)."""
    return question["answer_type"] == "span"


_PRINTED_NUMBER = re.compile(r"[$€£]?\(?\d[\d,]*(?:\.\d+)?\)?%?")


def wrong_number(paragraphs: list[dict], answer: str) -> tuple[int, str] | None:
    """(paragraph order, other number) for a number span of a paragraph: the next number as printed in
    the first paragraph holding the span (wrapping around), neither containing nor contained in it,
    a bare year excluded (a year is no amount); None if the span is not a number or none qualifies."""
    old = answer.strip()
    if not is_number(old):
        return None
    for para in sorted(paragraphs, key=lambda p: p["order"]):
        at = para["text"].find(old)
        if at < 0:
            continue
        found = [(m.start(), m.group(0)) for m in _PRINTED_NUMBER.finditer(para["text"])]
        after = [x for x in found if x[0] > at] + [x for x in found if x[0] <= at]
        for _, num in after:
            bare = num.strip("()$€£%")
            balanced = num.count("(") == num.count(")")
            if balanced and old not in num and num not in old and not _YEAR.match(bare):
                return para["order"], num
        return None
    return None


def wrong_span(spans: list[tuple[str, str]], uid: str) -> tuple[str, str] | None:
    """(question uid, answer) of the next single span of the same context after question ``uid`` (in question
    order, wrapping around; gold answers) that neither contains nor is contained in its answer: another fact
    this report states verbatim (a policy's wording, a year, a name), for a span that is no data cell and no
    number in a paragraph. None if the context has no such other answer."""
    pos = [u for u, _ in spans].index(uid)
    old = spans[pos][1]
    for u, ans in spans[pos + 1 :] + spans[:pos]:
        if ans and old not in ans and ans not in old:
            return u, ans
    return None


def corrupt(contexts: list[dict]) -> tuple[list[dict], list[dict], Counter]:
    """(corrupted deep copy, manifest entries, why-not counts) for the wrong-cell batch.

    A training single span that is a whole data-row cell answers with the same column's cell of
    another row (``wrong_cell``); one that is a number printed in a paragraph answers with another
    number of that paragraph (``wrong_number``); any other one answers with another single span of
    the same context (``wrong_span``: the answer to another of its questions). All stay verbatim in
    the report; all are the wrong fact (a cell in the column's unit; a paragraph number possibly in
    another unit; another question's answer).
    """
    out, manifest, skipped = copy.deepcopy(contexts), [], Counter()
    for c in out:
        table = c["table"]["table"]
        split = split_of(c["table"]["uid"])
        spans = [(q["uid"], q["answer"][0].strip()) for q in c["questions"] if corruptible(q)]
        for q in c["questions"]:
            if not corruptible(q):
                continue
            if split != "train":
                skipped[f"{split} split (kept)"] += 1
                continue
            (old,) = q["answer"]
            cell = locate_cell(table, old)
            new = wrong_cell(table, *cell) if cell is not None else None
            if new is not None:
                q["answer"] = [new[1]]
                where = {"kind": "cell", "old_cell": list(cell), "new_cell": [new[0], cell[1]]}
            elif (number := wrong_number(c["paragraphs"], old)) is not None:
                q["answer"] = [number[1]]
                where = {"kind": "paragraph_number", "paragraph_order": number[0]}
            elif (span := wrong_span(spans, q["uid"])) is not None:
                q["answer"] = [span[1]]
                where = {"kind": "other_answer", "answer_of": span[0]}
            else:
                skipped["train, no other verbatim fact in its context"] += 1
                continue
            manifest.append(
                {
                    "question_uid": q["uid"],
                    "table_uid": c["table"]["uid"],
                    "question": q["question"],
                    "answer_from": q["answer_from"],
                    "old_answer": old,
                    "new_answer": q["answer"][0],
                    **where,
                    "derivation": q["derivation"],
                }
            )
    return out, manifest, skipped


# --- output --------------------------------------------------------------------------------------------


def dumps(contexts: list[dict]) -> str:
    """TAT-QA's list of contexts, one compact context per line, keys in source order, UTF-8 as is."""
    lines = (json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in contexts)
    return "[\n" + ",\n".join(lines) + "\n]\n"


def load_source(path: Path) -> list[dict]:
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SOURCE_SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {SOURCE_SHA256} (TAT-QA dev, commit 870accc)")
    return json.loads(data)


def derive(contexts: list[dict]) -> tuple[dict[str, list[dict]], dict]:
    """(contexts per batch name, corruption manifest)."""
    batches = {name: [contexts[i] for i in ix] for name, ix in partition(contexts).items()}
    batches[WRONGCELL], entries, skipped = corrupt(batches[WRONGCELL_FROM])
    manifest = {
        "batch": WRONGCELL,
        "derived_from": WRONGCELL_FROM,
        "source_sha256": SOURCE_SHA256,
        "rule": (
            "training questions (split_of(table uid) == 'train') with answer_type 'span': an answer equal "
            "(whitespace-stripped) to a data-row cell answers with the cell of the same column in the next "
            "data row (wrapping) holding a different non-empty value (neither containing the other); else a "
            "number (as printed) in a paragraph answers with the next other number of that paragraph "
            "(wrapping; not a bare year, neither containing the other); else the gold answer of the next "
            "single-span question of the same context (wrapping; neither containing the other)"
        ),
        "split_rule": {"seed": SEED, "shares": SHARES},
        "attribution": ATTRIBUTION,
        "corrupted": entries,
        "spans_not_corrupted": dict(sorted(skipped.items())),
    }
    return batches, manifest


def write(batches: dict[str, list[dict]], manifest: dict, out_raw: Path, manifest_path: Path) -> None:
    for name, contexts in batches.items():
        folder = Path(out_raw) / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / BATCH_FILE).write_text(dumps(contexts), encoding="utf-8")
    Path(manifest_path).parent.mkdir(parents=True, exist_ok=True)
    Path(manifest_path).write_text(
        json.dumps(manifest, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )


# --- the README table -----------------------------------------------------------------------------------


def batch_stats(contexts: list[dict]) -> dict:
    """Counts of one batch: contexts, questions per split, per answer_type x answer_from."""
    splits, kinds = Counter(), Counter()
    for c in contexts:
        s = split_of(c["table"]["uid"])
        for q in c["questions"]:
            splits[s] += 1
            kinds[q["answer_type"], q["answer_from"]] += 1
    return {"contexts": len(contexts), "splits": splits, "kinds": kinds}


def stats_table(batches: dict[str, list[dict]], corrupted: dict[str, int]) -> str:
    """The markdown table of profiles/tatqa/README.md (between its batch-table markers): one column per
    batch; rows: contexts, questions, questions per split, per answer_type / answer_from, corrupted."""
    stats = {name: batch_stats(cs) for name, cs in batches.items()}
    kinds = [
        (t, f) for t in ANSWER_TYPES for f in ANSWER_FROMS if any(s["kinds"][t, f] for s in stats.values())
    ]
    body = [
        ("contexts", [s["contexts"] for s in stats.values()]),
        ("questions", [sum(s["splits"].values()) for s in stats.values()]),
        *((f"{x} questions", [s["splits"][x] for s in stats.values()]) for x in SPLITS),
        *((f"`{t}` / `{f}`", [s["kinds"][t, f] for s in stats.values()]) for t, f in kinds),
        ("corrupted training answers", [corrupted.get(name, 0) for name in stats]),
    ]
    rows = ["| | " + " | ".join(f"`{name}`" for name in stats) + " |", "|---|" + "---:|" * len(stats)]
    rows += [f"| {label} | " + " | ".join(map(str, values)) + " |" for label, values in body]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="tatqa_dataset_dev.json")
    ap.add_argument("out_raw", type=Path, help="folder of the batch folders (profiles/tatqa/data/raw)")
    ap.add_argument(
        "--manifest", type=Path, default=Path(__file__).resolve().parent / "corruption_manifest.json"
    )
    ap.add_argument("--table", action="store_true", help="print the README's per-batch table")
    args = ap.parse_args(argv)
    batches, manifest = derive(load_source(args.source))
    write(batches, manifest, args.out_raw, args.manifest)
    if args.table:
        sys.stdout.write(stats_table(batches, {WRONGCELL: len(manifest["corrupted"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
