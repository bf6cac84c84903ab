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

The record (``calibrate.record``, committed) is bound to the commit, the params that decide a batch's
train -> eval -> gate (:data:`BOUND_SECTIONS`: sections and dotted keys, hashed as parsed values, so a
comment edit does not unbind it), the base weights and the admitted data of every control batch.
:func:`status` is what the gate, the summary, the handoff and ``clap release`` read: certified only when
the record's verdict is ``certified``, it binds every key of :data:`BOUND_SECTIONS` and its params hash
is the current one. A record written before a key was bound is bound to it by :func:`rebind` when that
key's value at the record's commit is today's (the runs used it), and re-certified otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import io
from clap.errors import ClapError
from clap.params import load

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
    # the chain keys eval's answers depend on (its budget, decoding, engine and precision); retrieval and
    # top_k decide only replay, which the controls do not run
    "chain.max_new_tokens",
    "chain.decoding",
    "chain.engine",
)
Reader = Callable[[Path], str]


def bound_value(data: Mapping[str, Any], key: str, params_path: Path | str) -> Any:
    """The parsed value of a section or dotted key of merged params ``data`` (error if absent)."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ClapError(
                f"params key {key!r} is missing", file=params_path, column=key, rule="missing_section"
            )
        node = node[part]
    return node


def params_sha256(params_path: Path | str, keys: Sequence[str] = BOUND_SECTIONS) -> str:
    """sha256 of the bound keys' parsed values (key order and comments do not matter)."""
    data = load(params_path)
    values = {key: bound_value(data, key, params_path) for key in keys}
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
    bound = list(rec.get("bound_sections", []))
    unbound = [k for k in BOUND_SECTIONS if k not in bound]
    if unbound:
        return {
            **out,
            "reason": f"the record of commit {out['commit']} does not bind {unbound} (run `clap certify "
            "--rebind` to bind them if they are unchanged since that commit, else re-certify)",
        }
    if rec.get("params_sha256") != params_sha256(params_path, bound):
        return {**out, "reason": f"the params changed since the certification of commit {out['commit']}"}
    if rec.get("verdict") != CERTIFIED:
        return {**out, "reason": "; ".join(rec.get("failed", [])) or "the record's verdict is not certified"}
    return {**out, "certified": True, "status": CERTIFIED, "reason": f"certified at commit {out['commit']}"}


def rebind(record_path: Path | str, params_path: Path | str, read_then: Reader, date: str) -> dict[str, Any]:
    """The record at ``record_path`` bound to the keys of :data:`BOUND_SECTIONS` it does not bind yet.

    Its runs used those keys' values at its commit (``read_then`` reads a params file there, e.g.
    ``git show <commit>:<file>``); when they are today's values and the keys it binds still hash to its
    params hash, the record describes today's params: it gets the new keys, the new hash and a
    ``rebound`` entry saying what was checked against which commit. Its verdict and runs are unchanged.

    Raises:
        ClapError: the record's params changed, or an added key's value differs from its commit's (rule
            ``params_changed``: re-certify).
    """
    rec = io.read_json(record_path)
    bound = list(rec["bound_sections"])
    added = [k for k in BOUND_SECTIONS if k not in bound]
    if rec["params_sha256"] != params_sha256(params_path, bound):
        raise ClapError(
            f"the params changed since the certification of commit {rec['commit']}: re-certify",
            file=params_path,
            rule="params_changed",
        )
    then, now = load(params_path, read=read_then), load(params_path)
    changed = [k for k in added if bound_value(then, k, params_path) != bound_value(now, k, params_path)]
    if changed:
        raise ClapError(
            f"{changed} differ from their values at commit {rec['commit']}, where the controls ran: re-certify",
            file=params_path,
            column=changed[0],
            rule="params_changed",
        )
    if not added:
        return rec
    keys = bound + added
    return {
        **rec,
        "params_sha256": params_sha256(params_path, keys),
        "bound_sections": keys,
        "rebound": {"keys": added, "checked_at_commit": rec["commit"], "date": date},
    }


def status_line(s: Mapping[str, Any]) -> str:
    """One sentence for reports: the scenario's certification status and why."""
    if s["certified"]:
        return f"Scenario **certified** (record `{s['record']}`, commit {s['commit']}, {s['date']})."
    return (
        f"Scenario **UNCERTIFIED**: {s['reason']}. A decision here is not evidence that the loop works on it."
    )
