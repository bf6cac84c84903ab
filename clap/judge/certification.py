"""Certification (TBDL): a scenario's decisions count only after its controls pass.

A scenario is a profile: its params, its base model and its clean batches. ``clap certify`` runs the
profile's controls through :func:`clap.judge.calibrate.calibrate` (the same runs ``clap calibrate`` makes):

- positive controls: clean training on each batch of ``calibrate.batches`` under each of
  ``calibrate.clean_seeds`` must pass the gate's own quality rule against the base (one-sided McNemar
  p < alpha, delta-hat >= delta*, LCB >= floor). A clean run that does not learn makes every "reject" of
  the scenario vacuous, so it fails the certification; it never passes it;
- negative controls: each of ``calibrate.faults`` (at least a wrong-answer fault and the omitted
  loss-masking trap, :data:`REQUIRED_FAULTS`) must not get a decision in ``calibrate.fail_on``; what
  caught it (admission, the detector, a gate rule) is recorded.

The record (``calibrate.record``, committed) is bound to the commit, the params sections that decide a
batch (:data:`BOUND_SECTIONS`, hashed as parsed values, so a comment edit does not unbind it), the base
weights and the admitted data of every control batch. :func:`status` is what the gate, the summary, the
handoff and ``clap release`` read: certified only when the record's verdict is ``certified`` and its
params hash is the current one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io
from clap.params import raw_section

CERTIFIED = "certified"
UNCERTIFIED = "UNCERTIFIED"
REQUIRED_FAULTS = ("relabel", "loss_on_prompt")  # a join on the wrong key; the omitted loss-masking trap
BOUND_SECTIONS = (
    "base",
    "task",
    "normalize",
    "admit",
    "sizes",
    "train",
    "detector",
    "eval",
    "scoring",
    "gate",
    "calibrate",
)


def params_sha256(params_path: Path | str) -> str:
    """sha256 of the bound sections' parsed values (key order and comments do not matter)."""
    values = {name: raw_section(name, params_path) for name in BOUND_SECTIONS}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def verdict(rows: Sequence[Mapping[str, Any]], clean: str = "clean") -> tuple[str, list[str]]:
    """(``certified`` | ``UNCERTIFIED``, the failed controls, each named with its reason)."""
    positive = [r for r in rows if r["fault"] == clean]
    negative = [r for r in rows if r["fault"] != clean]
    failed = [
        f"positive control {r['run']} did not learn: {r['quality_detail']}"
        for r in positive
        if not r["learned"]
    ]
    failed += [
        f"negative control {r['run']} was {r['decision']} ({r['rule']}): the fault would ship"
        for r in negative
        if r["released"]
    ]
    if not positive:
        failed.append("no positive control ran (calibrate.batches x calibrate.clean_seeds)")
    ran = {r["fault"] for r in negative}
    failed += [
        f"negative control {f} was not run (calibrate.faults)" for f in REQUIRED_FAULTS if f not in ran
    ]
    return (UNCERTIFIED if failed else CERTIFIED), failed


def caught_by(row: Mapping[str, Any]) -> str:
    """What stopped a negative control: admission, the detector, or the gate rule that decided it."""
    if not row["admitted"]:
        return "admission"
    if row.get("health") == "alarm":
        return "detector"
    return f"gate rule {row['rule']}"


def data_sha256(admitted_dir: Path | str) -> str:
    """sha256 over an admitted batch's files (names and bytes)."""
    return io.sha256_dir(admitted_dir)


def build_record(
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    *,
    params_path: Path | str,
    base_dir: Path | str,
    admitted: Mapping[str, Path],
    commit: str,
    machine: str,
    date: str,
) -> dict[str, Any]:
    """The committed certification record (see the module doc for what binds it)."""
    v, failed = verdict(rows)
    weights = Path(base_dir) / "model.safetensors"
    return {
        "verdict": v,
        "failed": failed,
        "commit": commit,
        "date": date,
        "machine": machine,
        "params_sha256": params_sha256(params_path),
        "bound_sections": list(BOUND_SECTIONS),
        "base_sha256": io.sha256_file(weights) if weights.exists() else io.sha256_dir(base_dir),
        "data_sha256": {b: data_sha256(d) for b, d in admitted.items()},
        "positive_controls": [
            {
                k: r[k]
                for k in (
                    "run",
                    "learned",
                    "b",
                    "c",
                    "pvalue",
                    "delta",
                    "n_items",
                    "rule_power_at_delta_star",
                )
            }
            for r in rows
            if r["fault"] == "clean"
        ],
        "negative_controls": [
            {"run": r["run"], "decision": r["decision"], "rule": r["rule"], "caught_by": caught_by(r)}
            for r in rows
            if r["fault"] != "clean"
        ],
        "summary": dict(summary),
    }


def status(params_path: Path | str, record_path: Path | str) -> dict[str, Any]:
    """Whether decisions made under ``params_path`` are made in a certified scenario, and why not.

    Returns:
        ``certified`` (bool), ``status`` (``certified`` | ``uncertified``), ``reason``, ``record`` (its
        path), ``commit`` and ``date`` of the record ("" without one).
    """
    record_path = Path(record_path)
    out = {"certified": False, "status": "uncertified", "record": str(record_path), "commit": "", "date": ""}
    if not record_path.exists():
        return {**out, "reason": f"no certification record at {record_path} (run `clap certify`)"}
    rec = io.read_json(record_path)
    out.update(commit=rec.get("commit", ""), date=rec.get("date", ""))
    if rec.get("params_sha256") != params_sha256(params_path):
        return {**out, "reason": f"the params changed since the certification of commit {out['commit']}"}
    if rec.get("verdict") != CERTIFIED:
        return {**out, "reason": "; ".join(rec.get("failed", [])) or "the record's verdict is not certified"}
    return {**out, "certified": True, "status": CERTIFIED, "reason": f"certified at commit {out['commit']}"}


def status_line(s: Mapping[str, Any]) -> str:
    """One sentence for reports: the scenario's certification status and why."""
    if s["certified"]:
        return f"Scenario **certified** (record `{s['record']}`, commit {s['commit']}, {s['date']})."
    return (
        f"Scenario **UNCERTIFIED**: {s['reason']}. A decision here is not evidence that the loop works on it."
    )
