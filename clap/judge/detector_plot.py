"""What the TBDL detector saw, for the gate report: the training curves as a small self-contained SVG.

The train stage writes per-step curves (``plots/train/<b>.csv``, :data:`clap.train.diagnosis.CURVE_COLUMNS`);
``dvc plots show`` draws them across batches and revisions (dvc.yaml, top-level ``plots``). The gate
report embeds one batch's picture for the reviewer (``reports/gate/<b>/detector.svg``): training loss and
clean-probe loss against step (a loss that falls while the probe does not is not learning), and the
detector's ``log E`` against its alarm threshold ``log(1/alpha)``, the alarm step marked. Hand-written
SVG polylines: no plotting dependency, byte-identical for the same rows.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from clap.errors import ClapError

SVG_NAME = "detector.svg"
WIDTH, PANEL_H, TOP, LEFT, RIGHT, BOTTOM = 640, 200, 34, 58, 150, 30
COLORS = {"loss": "#1f77b4", "probe_loss": "#ff7f0e", "log_e": "#6a3d9a", "log_threshold": "#d62728"}
LABELS = {
    "loss": "training loss",
    "probe_loss": "clean-probe loss",
    "log_e": "log E",
    "log_threshold": "log(1/\u03b1)",
}

Row = Mapping[str, float | None]


def _number(text: str) -> float | None:
    """A CSV cell as a float: None for an empty cell (no check at that step); 'nan'/'inf' as floats."""
    text = text.strip()
    return float(text) if text else None


def read_curves(path: Path | str) -> list[dict[str, float | None]]:
    """The rows of a training-curves CSV (a header alone: an untrained batch, no rows)."""
    path = Path(path)
    if not path.is_file():
        raise ClapError(f"{path}: no training curves (the train stage writes plots/train/<batch>.csv)")
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "step" not in reader.fieldnames:
            raise ClapError(f"{path}: not a training-curves CSV (no 'step' column): {reader.fieldnames}")
        try:
            return [{k: _number(v or "") for k, v in r.items()} for r in reader]
        except ValueError as e:
            raise ClapError(f"{path}: a cell is not a number: {e}") from e


DRAWN = ("step", "loss", "probe_loss", "log_e", "log_threshold")  # what the picture shows (no timings)


def curves_sha256(rows: Sequence[Row]) -> str:
    """sha256 of the drawn columns of the curves (the CSV's own bytes hold a timing: tokens_per_s, so a
    re-run's file hash differs while every drawn value is reproduced)."""
    drawn = [[r.get(k) for k in DRAWN] for r in rows]
    return hashlib.sha256(json.dumps(drawn, separators=(",", ":")).encode("utf-8")).hexdigest()


def _points(rows: Sequence[Row], column: str) -> list[tuple[float, float]]:
    """(step, value) of the finite values of ``column`` (steps without a check have none)."""
    out = []
    for r in rows:
        x, y = r.get("step"), r.get(column)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            out.append((x, y))
    return out


def threshold(rows: Sequence[Row]) -> float | None:
    """The detector's log(1/alpha) as the curves record it (None: no detector check)."""
    pts = _points(rows, "log_threshold")
    return pts[0][1] if pts else None


def crossing(rows: Sequence[Row]) -> tuple[float, float] | None:
    """(step, log E) of the first check at which log E reached the threshold (None: never)."""
    for r in rows:
        e, t = r.get("log_e"), r.get("log_threshold")
        if e is not None and t is not None and math.isfinite(e) and e >= t:
            return float(r["step"] or 0), e
    return None


def reading(rows: Sequence[Row], *, alarm_step: int, planned_steps: int) -> str:
    """One line for the report: where log E crossed log(1/alpha), or its maximum when it never did."""
    if not rows:
        return "not trained: no training curves, no detector picture."
    log_e, thr = _points(rows, "log_e"), threshold(rows)
    if not log_e or thr is None:
        return f"no detector check in this run ({len(rows)} steps logged; detector off or no probe items)."
    of = f" of {planned_steps}" if planned_steps > 0 else ""
    hit = crossing(rows)
    if alarm_step > 0 or hit:
        step = alarm_step if alarm_step > 0 else int(hit[0])  # the training record's alarm step decides
        value = next((y for x, y in log_e if int(x) == step), hit[1] if hit else float("nan"))
        return f"log E crossed log(1/\u03b1) = {thr:.2f} at step {step}{of} (log E {value:.2f}): the detector alarmed."
    x, y = max(log_e, key=lambda p: p[1])
    return f"log E never crossed log(1/\u03b1) = {thr:.2f}; max log E {y:.2f} at step {int(x)}{of}."


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if abs(v - round(v, 1)) < 1e-9 else f"{v:.2f}"


class _Panel:
    """One plot area: maps (step, value) into its box."""

    def __init__(self, top: float, x_range: tuple[float, float], values: Sequence[float]):
        lo, hi = min(values), max(values)
        pad = (hi - lo) * 0.08 or max(abs(hi), 1.0) * 0.1
        self.top, self.x0, self.x1, self.y0, self.y1 = top, *x_range, lo - pad, hi + pad
        self.w, self.h = WIDTH - LEFT - RIGHT, PANEL_H - TOP - BOTTOM

    def xy(self, x: float, y: float) -> tuple[float, float]:
        fx = (x - self.x0) / ((self.x1 - self.x0) or 1.0)
        fy = (y - self.y0) / ((self.y1 - self.y0) or 1.0)
        return LEFT + fx * self.w, self.top + TOP + (1 - fy) * self.h

    def frame(self, title: str, ticks_x: Sequence[float]) -> list[str]:
        left, top, bottom = LEFT, self.top + TOP, self.top + TOP + self.h
        out = [
            f'<text x="{left}" y="{self.top + 20}" font-size="13" font-weight="bold">{escape(title)}</text>',
            f'<rect x="{left}" y="{top}" width="{self.w}" height="{self.h}" fill="none" stroke="#999"/>',
        ]
        for v in (self.y0, (self.y0 + self.y1) / 2, self.y1):
            _, y = self.xy(self.x0, v)
            out.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{v:.2f}</text>'
            )
        for t in ticks_x:
            x, _ = self.xy(t, self.y0)
            out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#999"/>')
            out.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" font-size="10" text-anchor="middle">{_fmt(t)}</text>'
            )
        return out

    def polyline(self, series: str, pts: Sequence[tuple[float, float]], dash: str = "") -> str:
        coords = " ".join("{:.1f},{:.1f}".format(*self.xy(x, y)) for x, y in pts)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return (
            f'<polyline data-series="{series}" points="{coords}" fill="none" '
            f'stroke="{COLORS[series]}" stroke-width="1.8"{extra}/>'
        )

    def legend(self, entries: Sequence[tuple[str, str]]) -> list[str]:
        out, x = [], WIDTH - RIGHT + 12
        for i, (series, dash) in enumerate(entries):
            y = self.top + TOP + 10 + 16 * i
            d = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(
                f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{COLORS[series]}" stroke-width="2"{d}/>'
            )
            out.append(f'<text x="{x + 28}" y="{y + 4}" font-size="11">{escape(LABELS[series])}</text>')
        return out


def detector_svg(rows: Sequence[Row], *, alarm_step: int, planned_steps: int, title: str = "") -> str:
    """The picture: training and clean-probe loss (top), log E against log(1/alpha) with the alarm
    step marked (bottom), both against step (the x axis runs to the planned steps, so a stopped run
    shows where it stopped). ``rows`` must hold at least one step."""
    if not rows:
        raise ClapError("no training curves to draw (an untrained batch has no detector picture)")
    steps = [r["step"] for r in rows if r.get("step") is not None] or [1.0]
    x_range = (min(1.0, *steps), float(max(planned_steps, *steps)))
    ticks = sorted({x_range[0], *(s for s in steps[-1:]), x_range[1]})
    loss, probe = _points(rows, "loss"), _points(rows, "probe_loss")
    log_e, thr = _points(rows, "log_e"), threshold(rows)
    height = 2 * PANEL_H + (24 if title else 0)
    head = 24 if title else 0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{LEFT}" y="18" font-size="14">{escape(title)}</text>')
    values = [y for _, y in loss + probe] or [0.0]
    top = _Panel(head, x_range, values)
    out += top.frame("Training loss vs clean-probe loss", ticks)
    out += [top.polyline("loss", loss)] if loss else []
    out += [top.polyline("probe_loss", probe)] if probe else []
    out += top.legend([("loss", ""), ("probe_loss", "")])
    if not log_e or thr is None:
        out.append(
            f'<text x="{LEFT}" y="{head + PANEL_H + TOP + 40}" font-size="12">no detector check in this run</text>'
        )
    else:
        bottom = _Panel(head + PANEL_H, x_range, [y for _, y in log_e] + [thr, 0.0])
        out += bottom.frame("TBDL detector: log E vs alarm threshold log(1/\u03b1)", ticks)
        (x0, y), (x1, _) = bottom.xy(x_range[0], thr), bottom.xy(x_range[1], thr)
        out.append(
            f'<line data-series="log_threshold" x1="{x0:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" '
            f'stroke="{COLORS["log_threshold"]}" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        out.append(bottom.polyline("log_e", log_e))
        out += bottom.legend([("log_e", ""), ("log_threshold", "6 4")])
        hit = crossing(rows)
        step = alarm_step if alarm_step > 0 else (int(hit[0]) if hit else -1)
        if step > 0:
            value = next((v for s, v in log_e if int(s) == step), thr)
            cx, cy = bottom.xy(step, value)
            _, y_top = bottom.xy(step, bottom.y1)
            _, y_bot = bottom.xy(step, bottom.y0)
            out += [
                f'<g data-series="alarm" data-step="{step}">',
                f'<line x1="{cx:.1f}" y1="{y_top:.1f}" x2="{cx:.1f}" y2="{y_bot:.1f}" stroke="{COLORS["log_threshold"]}" '
                'stroke-width="1" stroke-dasharray="2 3"/>',
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="none" stroke="{COLORS["log_threshold"]}" stroke-width="2"/>',
                f'<text x="{cx - 6:.1f}" y="{y_bot - 8:.1f}" font-size="11" text-anchor="end" '
                f'fill="{COLORS["log_threshold"]}">alarm at step {step}</text>',
                "</g>",
            ]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def evidence_section(rows: Sequence[Row], train: Mapping[str, Any], curves_sha256: str) -> dict[str, Any]:
    """The gate evidence's ``detector`` entry: the reading, the numbers behind it and the picture's name
    (empty when there are no curves: an untrained batch)."""
    alarm = int(train.get("detector_alarm_step", -1))
    planned = int(train.get("planned_steps", 0) or 0)
    log_e = _points(rows, "log_e")
    peak = max(log_e, key=lambda p: p[1]) if log_e else None
    return {
        "steps": len(rows),
        "planned_steps": planned,
        "alarm_step": alarm,
        "log_threshold": threshold(rows),
        "max_log_e": peak[1] if peak else None,
        "max_log_e_step": int(peak[0]) if peak else None,
        "reading": reading(rows, alarm_step=alarm, planned_steps=planned),
        "svg": SVG_NAME if rows else "",
        "curves_sha256": curves_sha256,
    }


def report_lines(evidence: Mapping[str, Any]) -> list[str]:
    """The report's detector paragraph (none for evidence written before it existed)."""
    d = evidence.get("detector")
    if not d:
        return []
    lines = ["", f"What the TBDL detector saw (`plots/train/{evidence['batch']}.csv`): {d['reading']}"]
    if d["svg"]:
        lines += ["", f"![detector]({d['svg']})"]
    return lines
