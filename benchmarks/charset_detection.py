"""Choosing a raw file's encoding: the evidence rule (clap/data/decoding.py) vs "first declared that
decodes" (the old assetize rule) vs charset-normalizer, unrestricted and restricted to the declared
encodings.

Cases: every raw file of the committed demo batches (2026-04's CMMS export is cp1252, the rest
UTF-8), and "mixed" variants of three 2026-01 exports where two ASCII lines got a word typed in
cp1252 (a UTF-8 file with a few bad bytes, the measured problem). Per case and method:
the encoding chosen, how many lines of text differ from the truth, which lines were reported bad,
and the time. charset-normalizer is not a clap dependency (requests installs it); this script is
the only place that imports it.

    .venv/bin/python benchmarks/charset_detection.py [--out benchmarks/results/charset_detection.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import charset_normalizer

from clap import io
from clap.data.decoding import decode_file
from clap.errors import ClapError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import machine  # noqa: E402

DECLARED = ["utf-8-sig", "cp1252"]  # the demo sources' encodings (params assetize.sources.*.encodings)
# UTF-8 exports given two cp1252 lines: the first two decode as cp1252 as a whole, the MES one does not
MIXED = ("2026-01/maintenance_tickets.csv", "2026-01/kb_documents.jsonl", "2026-01/mes_shift_reports.csv")


def _cases() -> dict[str, tuple[bytes, list[str]]]:
    """name -> (bytes, the true text per line)."""
    cases = {}
    for path in sorted((ROOT / "data/raw").glob("*/*")):
        if path.suffix not in (".csv", ".jsonl"):
            continue
        data = path.read_bytes()
        truth = (
            "cp1252" if path.parent.name == "2026-04" and path.name == "maintenance_tickets.csv" else "utf-8"
        )
        cases[f"{path.parent.name}/{path.name}"] = (data, data.decode(truth).split("\n"))
    for name in MIXED:
        src = (ROOT / "data/raw" / name).read_bytes().decode("utf-8").split("\n")
        # two ASCII lines get a word typed in a cp1252 tool; every other line stays UTF-8
        chosen = [k for k, line in enumerate(src) if k and line.isascii() and " the " in line][:2]
        truth = [
            line.replace(" the ", " the geprüfte ", 1) if k in chosen else line for k, line in enumerate(src)
        ]
        mixed = b"\n".join(line.encode("cp1252" if k in chosen else "utf-8") for k, line in enumerate(truth))
        cases[f"{name}+2 cp1252 lines"] = (mixed, truth)
    return cases


def _score(text: str | None, truth: list[str]) -> int | None:
    if text is None:
        return None
    lines = text.split("\n")
    return sum(a != b for a, b in zip(lines, truth)) + abs(len(lines) - len(truth))


def _first_that_decodes(data: bytes) -> tuple[str | None, str | None, list[int]]:
    for enc in DECLARED:
        try:
            return enc, data.decode(enc), []
        except UnicodeDecodeError:
            continue
    return None, None, []


def _evidence(data: bytes) -> tuple[str | None, str | None, list[int]]:
    try:
        d = decode_file(data, DECLARED, "f", max_bad_line_share=0.5)
    except ClapError as e:
        return f"error: {e}", None, []
    return d.encoding, d.text, sorted(d.bad_lines)


def _normalizer(isolation: list[str] | None):
    def run(data: bytes) -> tuple[str | None, str | None, list[int]]:
        best = charset_normalizer.from_bytes(data, cp_isolation=isolation).best()
        return (best.encoding, str(best), []) if best is not None else (None, None, [])

    return run


METHODS = {
    "first_that_decodes": _first_that_decodes,
    "evidence_rule": _evidence,
    "charset_normalizer": _normalizer(None),
    "charset_normalizer_declared": _normalizer(["utf_8", "cp1252"]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/charset_detection.json")
    a = ap.parse_args()
    rows = []
    for name, (data, truth) in _cases().items():
        for method, fn in METHODS.items():
            t0 = time.perf_counter()
            enc, text, bad = fn(data)
            ms = (time.perf_counter() - t0) * 1000
            wrong = _score(text, truth)
            # a reported bad line is known, not silently wrong: count only the unreported ones
            silent = (
                None
                if wrong is None
                else sum(
                    1 for k, (x, y) in enumerate(zip(text.split("\n"), truth), 1) if x != y and k not in bad
                )
            )
            rows.append(
                {
                    "case": name,
                    "method": method,
                    "encoding": enc,
                    "lines_differing": wrong,
                    "lines_silently_wrong": silent,
                    "bad_lines": bad,
                    "ms": round(ms, 2),
                }
            )
    summary = {
        method: {
            "cases": sum(r["method"] == method for r in rows),
            "silently_wrong_cases": sum(
                r["method"] == method and bool(r["lines_silently_wrong"]) for r in rows
            ),
            "no_answer_cases": sum(r["method"] == method and r["lines_differing"] is None for r in rows),
            "total_ms": round(sum(r["ms"] for r in rows if r["method"] == method), 1),
        }
        for method in METHODS
    }
    result = {
        "declared": DECLARED,
        "charset_normalizer": charset_normalizer.__version__,
        "summary": summary,
        "rows": rows,
        "machine": machine(),
    }
    io.write_json(a.out, result)
    for method, s in summary.items():
        print(
            f"{method:28s} silently wrong in {s['silently_wrong_cases']}/{s['cases']} files, "
            f"no answer in {s['no_answer_cases']}, {s['total_ms']:.0f} ms"
        )
    for r in (
        r for r in rows if r["case"].endswith("lines") or r["case"] == "2026-04/maintenance_tickets.csv"
    ):
        print(
            f"  {r['case']:48s} {r['method']:28s} {str(r['encoding'])[:40]:40s} "
            f"differ={r['lines_differing']} silent={r['lines_silently_wrong']} bad={r['bad_lines']}"
        )


if __name__ == "__main__":
    main()
