"""Vocabulary and templates of the demo generator: metric facts, KB prose, question phrasings.

Pure data plus tiny render helpers. Several templates per source system keep the KB text
from being trivially regular; every template states line, shift, date and exactly one
metric value, and the value sentence (the evidence) carries that value.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One KPI: canonical unit, display decimals, value range and where it is recorded."""

    name: str
    unit: str
    decimals: int
    lo: float
    hi: float
    systems: tuple[str, ...]
    labels: tuple[str, ...]  # label variants as source systems and reviewers write them
    unit_variants: tuple[str, ...]  # non-canonical spellings of ``unit`` (docs/data-contract.md)
    asked: tuple[str, ...]  # how people name the metric in questions
    sentences: tuple[str, ...]  # KB value sentences; ``{v}`` is the formatted value


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "first_pass_yield",
            "%",
            1,
            86.0,
            99.6,
            ("mes", "qms"),
            ("First Pass Yield", "FPY", "first-pass yield"),
            ("pct", "percent", "ratio"),
            ("first pass yield", "FPY", "first-pass yield", "yield at first pass"),
            ("First pass yield was {v} %", "FPY came in at {v}%", "The first pass yield reached {v} percent"),
        ),
        Metric(
            "scrap_count",
            "pcs",
            0,
            1,
            60,
            ("mes",),
            ("Scrap", "Scrap pcs", "scrap qty"),
            ("Stk", "pieces"),
            ("scrap count", "number of scrapped parts", "scrap quantity", "scrap in pieces"),
            (
                "{v} pcs were scrapped",
                "Scrap count for the shift was {v} pieces",
                "The crew scrapped {v} parts",
            ),
        ),
        Metric(
            "scrap_rate",
            "%",
            1,
            0.3,
            6.5,
            ("mes",),
            ("Scrap Rate", "scrap %"),
            ("pct", "percent", "ratio"),
            ("scrap rate", "scrap %", "scrap percentage"),
            ("Scrap rate was {v} %", "The scrap rate stood at {v}%", "Scrap reached {v} percent of output"),
        ),
        Metric(
            "oee",
            "%",
            1,
            52.0,
            91.5,
            ("mes",),
            ("OEE", "Overall Equipment Effectiveness"),
            ("pct", "percent", "ratio"),
            ("OEE", "overall equipment effectiveness", "OEE figure"),
            (
                "OEE was {v} %",
                "Overall equipment effectiveness reached {v}%",
                "The line ran at an OEE of {v} percent",
            ),
        ),
        Metric(
            "downtime",
            "min",
            0,
            5,
            180,
            ("cmms",),
            ("Downtime", "unplanned downtime", "DT min"),
            ("minutes", "h"),
            ("downtime", "unplanned downtime", "downtime in minutes", "stoppage time"),
            (
                "Unplanned downtime was {v} minutes",
                "The line stood still for {v} min",
                "Total downtime booked: {v} min",
            ),
        ),
        Metric(
            "cycle_time",
            "s",
            1,
            18.0,
            96.0,
            ("mes",),
            ("Cycle Time", "avg cycle time", "CT"),
            ("sec",),
            ("cycle time", "average cycle time", "avg. cycle time", "CT"),
            (
                "Average cycle time was {v} s",
                "Cycle time averaged {v} seconds",
                "The mean cycle time came to {v} s per part",
            ),
        ),
        Metric(
            "defect_rate",
            "ppm",
            0,
            40,
            2400,
            ("qms",),
            ("Defect Rate", "defects ppm"),
            (),
            ("defect rate", "defect rate in ppm", "ppm defect rate", "defects per million"),
            ("Defect rate was {v} ppm", "The measured defect rate came to {v} ppm", "Defects ran at {v} ppm"),
        ),
    )
}

SHIFTS = ("A", "B", "C")
SHIFT_NAMES = {"A": "early", "B": "late", "C": "night"}
# First and last minute of day at which a shift's records are written; C stays before
# midnight so that every record of a shift carries the shift's own date.
SHIFT_MINUTES = {"A": (6 * 60, 14 * 60 - 1), "B": (14 * 60, 22 * 60 - 1), "C": (22 * 60, 24 * 60 - 1)}
MONTHS = (
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

# --- KB prose --------------------------------------------------------------------------
INTROS = {
    "mes": (
        "Shift report {rid} for line {line}, shift {shift}, {date}.",
        "{date}, line {line}, {shift_name} shift ({shift}).",
        "Summary of the {shift_name} shift on line {line}, {date}.",
        "Line {line} shift {shift} closing report from {date}.",
    ),
    "qms": (
        "Inspection {rid} on line {line}, shift {shift}, {date}.",
        "Quality check at line {line} during the {shift_name} shift on {date}.",
        "Final inspection record {rid}: line {line}, shift {shift}, {date}.",
        "Audit sample from line {line}, {shift_name} shift ({shift}), taken {date}.",
    ),
    "cmms": (
        "Maintenance ticket {rid} ({category}) on line {line}, shift {shift}, {date}.",
        "Work order {rid}: {category} issue on line {line} during the {shift_name} shift, {date}.",
        "{category} breakdown on line {line}, shift {shift}, {date}, logged as ticket {rid}.",
    ),
}
TITLES = {
    "mes": ("Shift report {line}/{shift} {date}", "MES report {rid}", "{line} {shift_name} shift {date}"),
    "qms": ("Inspection {rid}", "Quality record {line}/{shift} {date}", "QMS {rid} {line}"),
    "cmms": ("Ticket {rid}", "Work order {rid} {line}", "{category} {line}/{shift} {date}"),
}
MES_REMARKS = (
    "Material change at mid-shift caused two trial runs.",
    "No special events were reported by the shift lead.",
    "A new operator was trained at station 3.",
    "Tool wear on press 2 is being monitored closely.",
    "Changeover to the next variant took longer than planned.",
    "Short stops at the labeller, cleared by the operator.",
    "Staffing was one person short for the first hours.",
    "Raw material lot was switched after the first break.",
    "Preventive maintenance of the gripper is due next week.",
    "Quality hold on two pallets was released later.",
)
QMS_NOTES = (
    "Sample size followed the standard inspection plan.",
    "Most rejects showed surface scratches near the edge.",
    "Gauge calibration had been checked before the run.",
    "Findings were shared with the line lead right away.",
    "Burrs on the flange were the main defect pattern.",
    "The control chart stayed within its limits.",
    "A retest of the first rejects confirmed the result.",
    "Visual inspection was done under the new lighting.",
)
# (category, cause, possible actions): one coherent maintenance event per ticket
CMMS_EVENTS = (
    (
        "Mechanical",
        "Conveyor belt slipped at the transfer station",
        ("Belt re-tensioned and tested, OK.", "Belt replaced by J. Müller, test run OK."),
    ),
    (
        "Hydraulics",
        "Hydraulic pressure dropped on press 2",
        (
            "Seal replaced by J. Müller; pressure back to 180 bar.",
            "Leaking hose swapped, pressure stable again.",
        ),
    ),
    (
        "Electrical",
        "Servo drive fault on the pick-and-place unit",
        ("Drive reset, parameters restored from backup.", "Encoder cable replaced – no further faults."),
    ),
    (
        "Electrical",
        "Sensor misalignment stopped the infeed",
        ("Bracket realigned – sensor reads stable again.", "Sensor swapped and taught in."),
    ),
    (
        "Mechanical",
        "Coolant pump overheated at 85 °C",
        ("Pump cleaned, filter changed… temperature normal.", "Pump replaced, coolant topped up."),
    ),
    (
        "Software/PLC",
        "PLC lost communication with the robot cell",
        ("Network switch rebooted, cell restarted.", "PLC program reloaded by F. Jäger."),
    ),
    (
        "Tooling",
        "Gripper finger broke during changeover",
        ("Spare finger fitted, gripper re-taught.", "New gripper set installed and tested."),
    ),
    (
        "Pneumatics",
        "Pneumatic valve leaked on the clamping unit",
        ("Valve swapped, no leaks found on retest.", "Fittings tightened, pressure holds at 6 bar."),
    ),
    (
        "Mechanical",
        "Bearing noise on the main spindle",
        ("Bearing greased; follow-up planned with Günther.", "Spindle bearing replaced."),
    ),
    (
        "Electrical",
        "Label printer jammed repeatedly",
        ("Printhead cleaned, roll re-threaded.", "Printer swapped with the spare unit."),
    ),
)
FILLERS = {  # extra sentences when a body is shorter than demo.body_words[0] words
    "mes": MES_REMARKS,
    "qms": QMS_NOTES,
    "cmms": (
        "Root cause analysis is still pending.",
        "The ticket was closed after a successful test run.",
        "Spare parts were taken from the line stock.",
        "The shift lead confirmed the restart.",
        "A follow-up inspection is planned for next week.",
    ),
}
INSPECTORS = ("K. Huber", "M. Schäfer", "A. Novak", "L. Berger", "S. Öztürk", "P. Lang", "R. Weiß")

# --- Questions -------------------------------------------------------------------------
QUESTION_TEMPLATES = {
    "standard": (
        ("direct", "What was the {metric} on {line}, {shift}, {date}?"),
        ("direct", "What was the {metric} for {line} in {shift} on {date}?"),
        ("direct", "What {metric} did {line} report for {shift} on {date}?"),
        ("terse", "{Metric} for {line} {shift} on {date}?"),
        ("terse", "{line} / {shift} / {date}: {metric}?"),
        ("conversational", "Can you tell me the {metric} of {line} during {shift} on {date}?"),
        ("conversational", "Do you know the {metric} {line} had in {shift} on {date}?"),
        ("conversational", "Quick one: {metric} on {line}, {shift}, {date}?"),
        ("request", "I need the {metric} for {line} ({shift}) on {date}."),
        ("request", "Please look up the {metric} of {line}, {shift}, {date}."),
        ("request", "Give me the {metric} for {shift} on {line}, {date}."),
    ),
    "shifted": (
        ("command", "Pull up {metric} — {line}, {shift}, {date}."),
        ("command", "Report {metric} for {line} {shift}, {date}."),
        ("shorthand", "{line} {shift} {date} {metric}"),
        ("shorthand", "{metric} {line}/{shift} {date} pls"),
        ("chatty", "Hey, what did {line} log as {metric} on {date}, {shift}?"),
        ("chatty", "Morning! Any idea what the {metric} was on {line} for {shift} on {date}?"),
        ("chatty", "Before the meeting: how did {line} do on {metric}, {shift}, {date}?"),
    ),
}


def fmt_value(value: float, decimals: int) -> str:
    """The value as KB prose writes it (decimal point, fixed decimals)."""
    return f"{value:.{decimals}f}"


def long_date(day: dt.date, style: int) -> str:
    """One of four human date renderings used in KB prose."""
    month = MONTHS[day.month - 1]
    return (
        f"{day.day} {month} {day.year}",
        f"{day.strftime('%A')} {day.day} {month} {day.year}",
        day.isoformat(),
        f"{month} {day.day}, {day.year}",
    )[style % 4]


def question_line(line: str, style: int) -> str:
    """How a person names a line in a question."""
    return (f"line {line}", line, f"Line {line[1:]}", f"line {line[1:]}")[style % 4]


def question_shift(shift: str, style: int) -> str:
    """How a person names a shift in a question."""
    name = SHIFT_NAMES[shift]
    return (f"shift {shift}", f"{shift} shift", f"the {name} shift", f"the {name} shift ({shift})")[style % 4]


def question_date(day: dt.date, style: int) -> str:
    """How a person names a day in a question (never the ambiguous dd/mm form)."""
    month = MONTHS[day.month - 1]
    return (
        day.isoformat(),
        f"{day.day} {month}",
        f"{month} {day.day}",
        f"{day.day:02d}.{day.month:02d}.",
        f"{day.day} {month[:3]} {day.year}",
        f"the {day.day}{_ordinal(day.day)} of {month}",
    )[style % 6]


def _ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
