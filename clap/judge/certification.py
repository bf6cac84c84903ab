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

The record (``calibrate.record``, committed) binds what the controls ran on, and :func:`status` (what
the gate, the summary, the handoff and ``clap release`` read) checks each binding against the project
folder of the params file (a profile runs in its own folder, with its own ``models/``, ``records/``,
``data/`` and ``dvc.yaml``), reporting every mismatch in this order:

1. the base: ``base_sha256``, the weights' sha256 (:func:`clap.model.base.base_sha256`), against
   ``models/base`` where it is checked out and against ``records/base.json`` (``weights_sha256``, which
   the base stage writes); ``base_source_sha256``, the GGUF/package file it was exported from, against
   that record's ``source_sha256``. With neither ``models/base`` nor the record the base cannot be
   verified, and the scenario is uncertified;
2. the control batches' data: ``raw_sha256``, each ``data/raw/<b>`` folder (committed: always checked),
   and ``data_sha256``, each ``data/admitted/<b>`` (checked where it exists locally);
3. the params that decide a batch's train -> eval -> gate (:data:`BOUND_SECTIONS`: sections and dotted
   keys, hashed as parsed values, so a comment edit does not unbind it), one hash per key so a change
   is named;
4. the code that decides: ``code_md5``, every file of the ``clap/``, ``stages/`` and ``schemas/`` deps
   that ``dvc.yaml`` lists for :data:`DECIDING_STAGES`, hashed as DVC 3 does (md5 of the bytes; a
   folder dep is its files, bytecode excluded as ``.dvcignore`` excludes it). ``admit`` is among them:
   its checks decide whether a batch is trained at all, and they re-run on the negative controls'
   faulted data. ``base`` is not: the weights it writes are bound by their own hash. ``assetize`` and
   ``normalize`` only shape the data (bound by its hashes); ``grpo``, ``replay`` and ``warm_start`` are
   not run by the controls (as ``chain.retrieval`` is not bound).

A record written before a binding existed (no ``code_md5`` or ``raw_sha256``) is uncertified: nothing
shows the code and data it ran on are today's (its commit may have had uncommitted edits), so it must be
re-certified. :func:`rebind` binds only params keys: when a key clap binds and the record does not has
the value the record's commit had (the runs used it), and it refuses a record lacking the newer bindings.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from clap import io
from clap.errors import ClapError
from clap.params import load, parse_yaml

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
# the stages whose code decides a batch (module doc: why admit is one and base is not)
DECIDING_STAGES = ("admit", "train", "eval", "gate")
CODE_ROOTS = ("clap", "stages", "schemas")  # a dvc.yaml dep under these folders is code
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
    """sha256 over a batch folder's files (names and bytes)."""
    return io.sha256_dir(admitted_dir)


def params_key_sha256(params_path: Path | str, keys: Sequence[str] = BOUND_SECTIONS) -> dict[str, str]:
    """sha256 of each bound key's parsed value: a changed key is named, not only detected."""
    data = load(params_path)
    return {
        key: io.sha256_bytes(
            json.dumps(bound_value(data, key, params_path), sort_keys=True, default=str).encode()
        )
        for key in keys
    }


def is_code(dep: str) -> bool:
    """Whether a dvc.yaml dep is code (under clap/, stages/ or schemas/, also as ``../../clap/...``)."""
    if "${" in dep:
        return False
    parts = [p for p in PurePosixPath(posixpath.normpath(dep)).parts if p != ".."]
    return bool(parts) and parts[0] in CODE_ROOTS


def code_deps(project: Path | str, stages: Sequence[str] = DECIDING_STAGES) -> list[str]:
    """The code deps (as written in ``project/dvc.yaml``) of ``stages``, sorted and unique."""
    path = Path(project) / "dvc.yaml"
    if not path.exists():
        raise ClapError("no dvc.yaml: the deciding code cannot be found", file=path, rule="missing_dvc_yaml")
    spec = parse_yaml(path.read_text(encoding="utf-8")).get("stages", {})
    deps = {d for s in stages if s in spec for d in spec[s].get("do", spec[s]).get("deps", [])}
    return sorted(d for d in deps if is_code(d))


def _dvc_ignored(rel: PurePosixPath) -> bool:
    return "__pycache__" in rel.parts or rel.suffix == ".pyc"  # the project's .dvcignore


def code_md5(project: Path | str, deps: Sequence[str], *, strict: bool = True) -> dict[str, str]:
    """``{file: md5}`` over the code ``deps`` (relative to ``project``): a file dep's md5 is the one
    dvc.lock records for it; a folder dep contributes each of its files (its ``.dir`` listing's entries).
    A missing dep is an error when ``strict``, else left out (it reads as removed)."""
    out: dict[str, str] = {}
    for dep in deps:
        path = Path(project) / dep
        if path.is_file():
            out[dep] = io.md5_file(path)
        elif path.is_dir():
            for f in sorted(path.rglob("*")):
                rel = PurePosixPath(f.relative_to(path).as_posix())
                if f.is_file() and not _dvc_ignored(rel):
                    out[f"{dep}/{rel}"] = io.md5_file(f)
        elif strict:
            raise ClapError("a code dep of a deciding stage is missing", file=path, rule="missing_dep")
    return out


def base_sha256(base_dir: Path | str) -> str:
    """The weights hash of an exported base folder, as :func:`clap.model.base.base_sha256` computes it
    (one safetensors file's sha256, or of the sorted name/sha256 lines of several shards; a test holds
    the two equal): the gate imports no model code (tests/test_layout.py)."""
    files = sorted(p for p in Path(base_dir).iterdir() if p.name.endswith(".safetensors"))
    if not files:
        raise ClapError(
            "no safetensors weights in the base folder (run the base stage)",
            file=base_dir,
            rule="missing_base",
        )
    if len(files) == 1:
        return io.sha256_file(files[0])
    return io.sha256_bytes("".join(f"{p.name}\t{io.sha256_file(p)}\n" for p in files).encode())


def _base_record(project: Path) -> dict[str, Any] | None:
    path = project / "records" / "base.json"
    return io.read_json(path) if path.exists() else None


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
    """The committed certification record (see the module doc for what binds it).

    ``base_dir`` is the base the controls ran on; the raw batches, ``records/base.json`` and
    ``dvc.yaml`` are read from the params file's folder.
    """
    v, failed = verdict(rows)
    project = Path(params_path).parent
    weights = base_sha256(base_dir)
    exported = _base_record(project) or {}
    return {
        "verdict": v,
        "failed": failed,
        "commit": commit,
        "date": date,
        "machine": machine,
        "params_sha256": params_sha256(params_path),
        "params_key_sha256": params_key_sha256(params_path),
        "bound_sections": list(BOUND_SECTIONS),
        "base_sha256": weights,
        # the package/GGUF file the base was exported from, when the project's base record is of these weights
        "base_source_sha256": exported.get("source_sha256", "")
        if exported.get("weights_sha256") == weights
        else "",
        "data_sha256": {b: data_sha256(d) for b, d in admitted.items()},
        "raw_sha256": {b: _raw_sha256(project, b) for b in admitted},
        "deciding_stages": list(DECIDING_STAGES),
        "code_md5": code_md5(project, code_deps(project)),
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


def _raw_sha256(project: Path, batch: str) -> str:
    raw = project / "data" / "raw" / batch
    if not raw.is_dir():
        raise ClapError("a control batch has no raw folder", file=raw, rule="missing_raw_batch")
    return data_sha256(raw)


def _short(sha: str) -> str:
    return f"{sha[:12]}…" if sha else "none"


def base_changes(rec: Mapping[str, Any], project: Path) -> list[str]:
    """What differs between the record's base and the project's (``[]``: the same base)."""
    want, where = rec.get("base_sha256", ""), project / "models" / "base"
    exported = _base_record(project)
    try:
        current: str | None = base_sha256(where) if where.is_dir() else None
    except ClapError:  # a folder without weights (not checked out): the base record still tells
        current = None
    if current is None and exported is None:
        return [f"cannot verify the base: neither {where} nor {project / 'records' / 'base.json'} exists"]
    seen = {current: "models/base"} if current is not None else {}
    if exported is not None:
        seen.setdefault(exported.get("weights_sha256", ""), "records/base.json")
    out = [f"weights sha256 {_short(want)}→{_short(sha)} ({src})" for sha, src in seen.items() if sha != want]
    source = rec.get("base_source_sha256", "")
    if source and exported is not None and exported.get("source_sha256", "") != source:
        out.append(
            f"source sha256 {_short(source)}→{_short(exported.get('source_sha256', ''))} (records/base.json)"
        )
    return out


def data_changes(rec: Mapping[str, Any], project: Path) -> list[str]:
    """Each control batch whose raw folder (always) or admitted folder (where present) differs."""
    out = []
    for kind, key in (("raw", "raw_sha256"), ("admitted", "data_sha256")):
        for b, want in rec.get(key, {}).items():
            d = project / "data" / kind / b
            if not d.is_dir():
                out += [f"batch {b}: data/raw/{b} is missing"] if kind == "raw" else []
            elif (now := data_sha256(d)) != want:
                out.append(f"batch {b}: data/{kind}/{b} sha256 {_short(want)}→{_short(now)}")
    return out


def params_changes(rec: Mapping[str, Any], params_path: Path | str) -> list[str]:
    """The bound keys whose value changed (one entry for a record that keeps a single params hash)."""
    bound = list(rec.get("bound_sections", []))
    per_key = rec.get("params_key_sha256")
    if per_key is None:
        same = rec.get("params_sha256") == params_sha256(params_path, bound)
        return (
            [] if same else ["the bound values (the record keeps one hash: run `clap certify` to name them)"]
        )
    now = params_key_sha256(params_path, bound)
    return [k for k in bound if per_key.get(k) != now[k]]


def code_changes(rec: Mapping[str, Any], project: Path) -> list[str]:
    """The deciding code's files that changed, were added or were removed since the record."""
    try:
        now = code_md5(project, code_deps(project, rec.get("deciding_stages", DECIDING_STAGES)), strict=False)
    except ClapError as e:
        return [f"cannot verify the code: {e}"]
    then = rec["code_md5"]
    changed = [f for f in sorted(then.keys() | now.keys()) if then.get(f) != now.get(f)]
    return [f if f in then and f in now else f"{f} ({'added' if f in now else 'removed'})" for f in changed]


def _mismatches(rec: Mapping[str, Any], params_path: Path | str) -> list[tuple[str, list[str]]]:
    """(what, its changes) for each binding that does not hold, in the order of :func:`status`'s report."""
    project = Path(params_path).parent
    checks: list[tuple[str, list[str]]] = [
        ("base", base_changes(rec, project)),
        ("data", data_changes(rec, project)),
        ("params", params_changes(rec, params_path)),
        ("code", code_changes(rec, project) if "code_md5" in rec else []),
    ]
    return [(what, found) for what, found in checks if found]


def missing_bindings(rec: Mapping[str, Any]) -> list[str]:
    """The bindings a record written by an older clap lacks (it must be re-certified)."""
    return [
        what for what, key in (("the code", "code_md5"), ("the raw data", "raw_sha256")) if key not in rec
    ]


def status(params_path: Path | str, record_path: Path | str) -> dict[str, Any]:
    """Whether decisions made under ``params_path`` are made in a certified scenario, and why not.

    Returns:
        ``certified`` (bool), ``status`` (``certified`` | ``uncertified``), ``reason`` (one line: the first
        mismatch, the others named after it), ``changed`` (every mismatch, in the order base, data,
        params, code, then the bindings the record lacks), ``record`` (its path), ``commit`` and ``date``
        of the record ("" without one).
    """
    record_path = Path(record_path)
    out = {"certified": False, "status": "uncertified", "record": str(record_path), "commit": "", "date": ""}
    if not record_path.exists():
        return {
            **out,
            "changed": [],
            "reason": f"no certification record at {record_path} (run `clap certify`)",
        }
    rec = io.read_json(record_path)
    out.update(commit=rec.get("commit", ""), date=rec.get("date", ""))
    since = f"since commit {out['commit'][:7]}"
    found = _mismatches(rec, params_path)
    lacks = missing_bindings(rec)
    changed = [f"{what}: {('; ' if what in ('base', 'data') else ', ').join(items)}" for what, items in found]
    changed += [f"{what}: not bound by the record" for what in lacks]
    if found:
        (what, items), rest = found[0], [w for w, _ in found[1:]] + [w.split()[-1] for w in lacks]
        also = f"; also changed: {', '.join(rest)}" if rest else ""
        detail = f" ({'; '.join(items)})" if what in ("base", "data") else f": {', '.join(items)}"
        reason = f"uncertified: {what} changed {since}{detail}{also}; run `clap certify`"
        return {**out, "changed": changed, "reason": reason}
    if lacks:
        reason = (
            f"uncertified: the record of commit {out['commit'][:7]} does not bind {' or '.join(lacks)} its "
            "controls ran on (written by an older clap); run `clap certify` to re-certify"
        )
        return {**out, "changed": changed, "reason": reason}
    bound = list(rec.get("bound_sections", []))
    unbound = [k for k in BOUND_SECTIONS if k not in bound]
    if unbound:
        return {
            **out,
            "changed": [f"params: {k} not bound by the record" for k in unbound],
            "reason": f"the record of commit {out['commit']} does not bind {unbound} (run `clap certify "
            "--rebind` to bind them if they are unchanged since that commit, else re-certify)",
        }
    if rec.get("verdict") != CERTIFIED:
        reason = "; ".join(rec.get("failed", [])) or "the record's verdict is not certified"
        return {**out, "changed": [], "reason": reason}
    return {
        **out,
        "changed": [],
        "certified": True,
        "status": CERTIFIED,
        "reason": f"certified at commit {out['commit']}",
    }


def rebind(record_path: Path | str, params_path: Path | str, read_then: Reader, date: str) -> dict[str, Any]:
    """The record at ``record_path`` bound to the keys of :data:`BOUND_SECTIONS` it does not bind yet.

    Its runs used those keys' values at its commit (``read_then`` reads a params file there, e.g.
    ``git show <commit>:<file>``); when they are today's values and the keys it binds still hash to its
    params hash, the record describes today's params: it gets the new keys, the new hashes and a
    ``rebound`` entry saying what was checked against which commit. Its verdict and runs are unchanged.
    Only params keys are rebound: base, data and code are checked by :func:`status` as they are.

    Raises:
        ClapError: the record lacks the code or raw-data binding (rule ``recertify``: nothing shows the
            code and data at its commit were what ran); its params changed, or an added key's value
            differs from its commit's (rule ``params_changed``: re-certify).
    """
    rec = io.read_json(record_path)
    lacks = missing_bindings(rec)
    if lacks:
        raise ClapError(
            f"the record of commit {rec['commit']} does not bind {' or '.join(lacks)}: rebinding cannot show "
            "they are what its controls ran on (run `clap certify`)",
            file=record_path,
            rule="recertify",
        )
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
        "params_key_sha256": params_key_sha256(params_path, keys),
        "bound_sections": keys,
        "rebound": {"keys": added, "checked_at_commit": rec["commit"], "date": date},
    }


def status_line(s: Mapping[str, Any]) -> str:
    """One sentence for reports: the scenario's certification status and why."""
    if s["certified"]:
        return f"Scenario **certified** (record `{s['record']}`, commit {s['commit']}, {s['date']})."
    return f"Scenario **UNCERTIFIED**: {s['reason'].removeprefix('uncertified: ')}. A decision here is not evidence that the loop works on it."
