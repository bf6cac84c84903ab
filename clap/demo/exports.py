"""The demo company's export layout: the five files its systems write, and how.

The generator's own description of what it writes, so it needs nothing of the product; the
pipeline reads the same files through its data contract (:mod:`clap.data.assetize`), and a test
checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

MES, QMS, CMMS, KB, QLOG = (
    "mes_shift_reports.csv",
    "quality_inspections.jsonl",
    "maintenance_tickets.csv",
    "kb_documents.jsonl",
    "question_log.jsonl",
)
SPLITS = ("train", "eval", "replay")  # the question log's split labels


@dataclass(frozen=True)
class Export:
    """One export file: its format, the system that writes it, and (CSV) header and delimiter."""

    kind: str  # csv | jsonl
    system: str  # mes | qms | cmms | kb | question_log
    columns: tuple[str, ...] = ()
    delimiter: str = ""


EXPORTS: dict[str, Export] = {
    MES: Export(
        "csv", "mes", ("report_id", "shift_date", "line", "shift", "kpi", "value", "uom", "remark"), ";"
    ),
    QMS: Export("jsonl", "qms"),
    CMMS: Export(
        "csv", "cmms", ("ticket_id", "opened", "line", "shift", "category", "downtime_min", "summary"), ","
    ),
    KB: Export("jsonl", "kb"),
    QLOG: Export("jsonl", "question_log"),
}
