"""The closed loop, batch after batch, as a user lives it, in a scratch clone (issue 16 §2).

For each batch in time order: ``dvc repro`` its chain (eval compares the candidate with the
adapter in production, when there is one), commit, read the gate's decision; when it is
promote or canary, ``clap approve`` it with a throwaway key and ``clap release`` it, so the
next batch's candidate is evaluated and replayed against that incumbent. At the end, when the
last batch is in production, its gate is asked again (eval judges the production adapter on the
batch's items); a ``production_decision: rollback`` is acted on with ``clap rollback --batch``,
otherwise the rollback is by hand (``clap rollback``). Either must restore the previous release's
adapter byte for byte (sha256 of ``adapter_model.safetensors``), after its folder was deleted
from the workspace so the bytes come back from the DVC cache. ``--force-release BATCH`` puts a
batch the gate refused in production (an incident to recover from), marked FORCED.

Everything runs in a ``git clone`` of the project's HEAD in a temporary folder: its origin
remote is removed (nothing can be pushed), its DVC cache is the project's (``cache.dir`` in
``.dvc/config.local``, ``cache.type reflink,copy``: stages the project already ran are
checked out, never recomputed, and nothing in the clone links into the cache), and the
approver key and the model-signing key are generated there, the approver trusted there only.
The project's own ``releases/`` is never touched; only the report is written into the project::

    python benchmarks/closed_loop.py [--project .] [--batches 2026-01 2026-02 2026-05 2026-06]
        [--out benchmarks/results/closed_loop.md] [--set gate.delta_star=0.05 ...] [--keep]
        [--force-release [BATCH ...]]

The report (markdown, and ``.json`` next to it) is CLAP's table for the project: per batch
the baseline (base, or the incumbent batch), pass rates, the offline delta, McNemar b/c and
p, the decision and its rule, the chain delta (replay B - A value accuracy), whether it was
released and its adapter's sha256; the means over batches, the regressed batches flagged,
the rollback check, the machine, the commit, the wall times and every command run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io as stdio
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's clap, not another one's editable install

from clap.model.base import ADAPTER_FILE  # noqa: E402
from clap.release.approval import RELEASABLE  # noqa: E402
from clap.release.trust import ROOT_ENV  # noqa: E402

# Two clean months, the shifted one, a clean one after it (docs/release.md, "Closed loop").
DEFAULT_BATCHES = ("2026-01", "2026-02", "2026-05", "2026-06")
APPROVER = "closed-loop"  # releases/trusted_keys/closed-loop.pub, in the scratch clone only
# keys/closed-loop-signer.key: the EC P-256 key that signs each released adapter (model-signing)
SIGNER = "closed-loop-signer"

# Keys the report cannot do without (clap/judge/gating.py flat_metrics + quality_numbers,
# clap/judge/replay.py _deltas). The quality keys exist when the gate evaluated a candidate,
# the chain delta when the replay ran an adapter; a record without them fails loudly.
GATE_KEYS = ("decision", "rule", "baseline")
QUALITY_KEYS = ("b", "c", "pvalue", "delta")
CHAIN_KEY = "adapter_contribution_value"
# Rules of a hold/reject that mean "worse than the baseline", not "not better enough".
REGRESSION_RULES = frozenset(
    {"regressed_rate", "chain_value", "chain_core_fields", "chain_answer_evidence", "chain_value_floor"}
)
FORCED_RULE = "forced_by_closed_loop"


class LoopError(RuntimeError):
    """A step of the loop failed; the message says which and why."""


@dataclass
class Runner:
    """Runs commands in the scratch clone and records each one (display form, exit status, wall time)."""

    cwd: Path
    env: dict[str, str]
    log: Any = print
    commands: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self,
        argv: list[str],
        what: str,
        *,
        ok: tuple[int, ...] = (0,),
        stdin: str | None = None,
        shown: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``argv``; ``shown`` is how the record shows it (e.g. ``"$T1"`` for a secret token)."""
        shown = shown or shlex.join(_display(a) for a in argv)
        self.log(f"$ {shown}")
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, input=stdin)
        wall = round(time.perf_counter() - start, 2)
        self.commands.append({"command": shown, "rc": proc.returncode, "wall_s": wall, "what": what})
        if proc.returncode not in ok:
            raise LoopError(
                f"{what}: `{shown}` exited {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}"
                f"\n--- stderr (tail)\n{proc.stderr[-3000:]}"
            )
        return proc


def _display(arg: str) -> str:
    """The command as a user types it: ``python``/``dvc`` instead of this interpreter's paths."""
    if arg == sys.executable:
        return "python"
    if arg == _dvc():
        return "dvc"
    if Path(arg).parent == Path(sys.executable).parent:
        return Path(arg).name  # another console script of this environment (model_signing)
    return arg


def _dvc() -> str:
    beside = Path(sys.executable).parent / "dvc"
    return str(beside) if beside.exists() else "dvc"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LoopError(f"expected {path} after the run, it is missing")
    return json.loads(path.read_text(encoding="utf-8"))


def require(record: dict[str, Any], keys: tuple[str, ...], path: Path) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise LoopError(f"{path} lacks {missing} (renamed? the closed-loop report needs them)")


# ------------------------------------------------------------------ params of the scratch clone


def _yaml():
    from ruamel.yaml import YAML  # DVC's YAML (1.2, round trip keeps the comments)

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    return y


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` (dotted key, YAML value) -> {key: value}."""
    from ruamel.yaml import YAML

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LoopError(f"--set {pair!r}: expected KEY=VALUE (e.g. gate.delta_star=0.05)")
        out[key] = YAML(typ="safe").load(value)
    return out


def set_params(path: Path, updates: dict[str, Any]) -> None:
    """Set dotted keys in a params file; every key must already exist (params.yaml has every knob)."""
    y = _yaml()
    data = y.load(path.read_text(encoding="utf-8"))
    for key, value in updates.items():
        node, parts = data, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict) or part not in node:
                raise LoopError(f"params key {key!r}: no {part!r} in {path.name}")
            node = node[part]
        if not isinstance(node, dict) or parts[-1] not in node:
            raise LoopError(f"params key {key!r} does not exist in {path.name} (typo?)")
        node[parts[-1]] = value
    buf = stdio.StringIO()
    y.dump(data, buf)
    path.write_text(buf.getvalue(), encoding="utf-8")


def project_batches(project: Path) -> list[str]:
    """The batches whose raw data the project has (data/raw/<batch>/)."""
    raw = project / "data" / "raw"
    return sorted(p.name for p in raw.iterdir() if p.is_dir()) if raw.is_dir() else []


# ------------------------------------------------------------------ the loop


def git(run: Runner, *args: str, what: str) -> str:
    return run(["git", *args], what).stdout


def commit_all(run: Runner, message: str) -> str | None:
    """``git add -A`` + commit when anything changed; the new commit (None when nothing changed)."""
    git(run, "add", "-A", what="stage the run's records")
    if not git(run, "status", "--porcelain", what="anything to commit?").strip():
        return None
    git(run, "commit", "-q", "-m", message, what="commit")
    return git(run, "rev-parse", "HEAD", what="commit id").strip()


def force_promote(scratch: Path, batch: str) -> None:
    """Mechanics-only (--force-release): write promote into the scratch clone's gate record and
    evidence bundle, consistently, so approve/release/rollback can be exercised on a model that
    never passes (the tiny test model). The report keeps the gate's own decision."""
    for rel in (Path("metrics/gate") / f"{batch}.json", Path("reports/gate") / batch / "evidence.json"):
        path = scratch / rel
        record = read_json(path)
        record.update(decision="promote", decision_code=3, rule=FORCED_RULE)
        # a releasable candidate replaces any incumbent: production follows the forced decision
        record.update(production_decision="promote", production_rule=FORCED_RULE)
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def batch_row(scratch: Path, batch: str) -> dict[str, Any]:
    """The report's numbers of one batch, read from its gate, replay, eval records and evidence."""
    gate_path = scratch / "metrics/gate" / f"{batch}.json"
    gate = read_json(gate_path)
    require(gate, GATE_KEYS, gate_path)
    evaluated = "check_candidate" not in gate  # the gate's `candidate` check exists only without one
    if evaluated:
        require(gate, QUALITY_KEYS, gate_path)
    replay_path = scratch / "metrics/replay" / f"{batch}.json"
    replay = read_json(replay_path)
    if replay.get("has_adapter", 1):
        require(replay, (CHAIN_KEY,), replay_path)
    evidence = read_json(scratch / "reports/gate" / batch / "evidence.json")
    baseline = gate["baseline"]
    if baseline == "incumbent":
        incumbent = evidence.get("incumbent") or {}
        if not incumbent.get("batch"):
            raise LoopError(
                f"gate {batch} compared against the incumbent but its evidence names no incumbent batch"
            )
        baseline_name, incumbent_sha = str(incumbent["batch"]), incumbent.get("adapter_sha256")
    else:
        baseline_name, incumbent_sha = "base", None
    evalm = read_json(scratch / "metrics/eval" / f"{batch}.json")
    start = read_json(scratch / "records/warm_start" / f"{batch}.json")  # what its adapter was trained from
    return {
        "batch": batch,
        "trained_from": start.get("from_batch") or "fresh",
        "trained_from_sha256": start.get("adapter_sha256") or None,
        "baseline": baseline,
        "baseline_batch": baseline_name,
        "baseline_reason": gate.get("baseline_reason"),
        "incumbent_sha256": incumbent_sha,
        "evaluated": evaluated,
        "n_items": gate.get("n_items"),
        "baseline_pass_rate": gate.get("baseline_pass_rate"),
        "candidate_pass_rate": gate.get("candidate_pass_rate"),
        "base_pass_rate": evalm.get("base_pass_rate"),
        "delta": gate.get("delta"),
        "b": gate.get("b"),
        "c": gate.get("c"),
        "pvalue": gate.get("pvalue"),
        "lcb": gate.get("lcb"),
        "power_at_delta_star": gate.get("rule_power_at_delta_star"),
        "decision": gate["decision"],
        "rule": gate["rule"],
        "offline_decision": gate.get("offline_decision"),
        "offline_rule": gate.get("offline_rule"),
        "chain_delta": replay.get(CHAIN_KEY),
        "A_value_accuracy": replay.get("A_value_accuracy"),
        "B_value_accuracy": replay.get("B_value_accuracy"),
        "candidate_sha256": evidence.get("adapter_sha256") or None,
    }


def scratch_clone(run: Runner, project: Path, scratch: Path, head: str, cache_dir: Path, name: str) -> None:
    """Clone ``project`` at ``head`` into ``scratch`` (branch ``name``; ``run`` works there afterwards): no
    origin remote (it can never be pushed), its own git identity, the project's DVC cache shared without links."""
    git(run, "clone", "-q", "--no-local", str(project), str(scratch), what="clone the project")
    run.cwd = scratch
    git(run, "checkout", "-q", "-B", name, head, what="check out the project's HEAD")
    git(run, "remote", "remove", "origin", what="no remote: the scratch clone is never pushed")
    git(run, "config", "user.name", f"clap {name}", what="scratch identity")
    git(run, "config", "user.email", f"{name}@localhost", what="scratch identity")
    run([_dvc(), "config", "--local", "cache.dir", str(cache_dir)], "share the project's DVC cache")
    run([_dvc(), "config", "--local", "cache.type", "reflink,copy"], "never link into the shared cache")


def run_loop(args: argparse.Namespace, log=print) -> dict[str, Any]:
    project = args.project.resolve()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if dirty:
        log(f"note: {project} has uncommitted changes; the scratch clone runs its HEAD {head[:12]}")
    cache = subprocess.run([_dvc(), "cache", "dir"], cwd=project, capture_output=True, text=True)
    cache_dir = (
        (project / cache.stdout.strip()).resolve()
        if cache.returncode == 0 and cache.stdout.strip()
        else project / ".dvc" / "cache"
    )
    tmp = Path(tempfile.mkdtemp(prefix="clap-closed-loop-"))
    scratch = tmp / "repo"
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(scratch),  # stages and `python -m clap.cli` import the clone's code
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    run = Runner(tmp, env, log)
    result: dict[str, Any] = {
        "project": str(project),
        "git_commit": head,
        "project_dirty": dirty,
        "scratch": str(scratch),
        "kept": bool(args.keep),
        "cache_dir": str(cache_dir),
        "batches": list(args.batches),
        "overrides": dict(args.overrides),
        "note": args.note or "",
        "force_release": args.force_release,
        "scope": args.scope,
        "machine": machine(),
        "rows": [],
    }
    start = time.perf_counter()
    try:
        scratch_clone(run, project, scratch, head, cache_dir, "closed-loop")
        if args.overrides:
            set_params(scratch / "params.yaml", args.overrides)
            commit_all(
                run,
                "closed loop: params overrides " + " ".join(f"{k}={v}" for k, v in args.overrides.items()),
            )
        checkout = run([_dvc(), "checkout"], "check out what the project already computed", ok=(0, 1, 255))
        result["checkout_rc"] = checkout.returncode
        keygen = run(
            [sys.executable, "-m", "clap.cli", "keygen", "--name", APPROVER], "throwaway approver key"
        )
        # pinned outside the scratch clone, as CI pins its approvers' fingerprints ($CLAP_TRUST_ROOT)
        run.env[ROOT_ENV] = re.search(r"fingerprint: ([0-9a-f]{64})", keygen.stdout).group(1)
        run(
            [sys.executable, "-m", "clap.cli", "signing-keygen", "--name", SIGNER],
            "throwaway model-signing key (EC P-256)",
        )
        git(run, "add", f"releases/trusted_keys/{APPROVER}.pub", what="trust the throwaway key")
        git(
            run,
            "commit",
            "-q",
            "-m",
            f"trust throwaway approver {APPROVER} (scratch clone only)",
            what="commit",
        )
        releases: list[dict[str, Any]] = []
        for i, batch in enumerate(args.batches):
            row = loop_batch(run, scratch, args, list(args.batches[: i + 1]), batch, log)
            if row["released"]:
                releases.append({"batch": batch, "sha256": row["released_sha256"]})
            result["rows"].append(row)
        result["releases"] = releases
        result["rollback"] = rollback(run, scratch, releases, args.batches[-1], log)
        check = run([sys.executable, "-m", "clap.cli", "registry-check"], "verify the whole release history")
        result["registry_check"] = check.stdout.strip().splitlines()
    finally:
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["commands"] = run.commands
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)  # the throwaway private key goes with it
        else:
            log(
                f"kept {tmp} (it holds the throwaway private keys keys/{APPROVER}.key and keys/{SIGNER}.key: "
                "delete it when done)"
            )
    return result


def loop_batch(
    run: Runner, scratch: Path, args: argparse.Namespace, seen: list[str], batch: str, log
) -> dict[str, Any]:
    """One batch: repro (against the current production adapter), commit, approve + release when allowed."""
    start = time.perf_counter()
    set_params(scratch / "params.yaml", {"batches": seen})
    target = [f"gate@{batch}"] if args.scope == "batch" else []
    proc = run([_dvc(), "repro", *target], f"reproduce batch {batch}")
    ran = [line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage '")]
    restored = [line.split("'")[1] for line in proc.stdout.splitlines() if "is cached - skipping run" in line]
    repro_s = round(time.perf_counter() - start, 1)
    commit_all(run, f"closed loop: batch {batch} reproduced and gated")
    row = batch_row(scratch, batch)
    row.update(stages_run=ran, stages_from_run_cache=restored, repro_s=repro_s, forced=False)
    releasable = row["decision"] in RELEASABLE
    adapter = scratch / "models" / "adapters" / batch / ADAPTER_FILE
    if not releasable and forced(args, batch) and adapter.is_file():
        force_promote(scratch, batch)
        commit_all(
            run, f"closed loop: FORCED promote of {batch} (gate said {row['decision']}; mechanics test only)"
        )
        row["forced"], releasable = True, True
    row.update(released=False, released_sha256=None, release_outcome="not releasable: the incumbent stays")
    if releasable:
        key = f"keys/{APPROVER}.key"
        token = run(
            [sys.executable, "-m", "clap.cli", "approve", batch, "--key", key], f"approve {batch}"
        ).stdout.strip()
        # a forced run exercises the mechanics on an uncertified scenario (docs/certification.md); say so
        override = (
            ["--uncertified", "closed-loop run with --force-release"]
            if args.force_release is not None
            else []
        )
        rel = run(
            [sys.executable, "-m", "clap.cli", "release", batch, "--token", "-"]
            + ["--signing-key", f"keys/{SIGNER}.key", *override],
            f"release {batch}",
            ok=(0, 3),
            stdin=token,
        )
        if rel.returncode == 3:
            row["release_outcome"] = "held by the cost check: " + rel.stdout.strip()
        else:
            pointer = read_json(scratch / "releases" / "production.json")
            on_disk = sha256_file(adapter)
            if pointer.get("batch") != batch or pointer.get("adapter_sha256") != on_disk:
                raise LoopError(
                    f"after releasing {batch} the pointer names {pointer.get('batch')} / "
                    f"{pointer.get('adapter_sha256')}, the adapter on disk is {on_disk}"
                )
            row.update(released=True, released_sha256=on_disk, release_outcome=rel.stdout.strip())
    row["wall_s"] = round(time.perf_counter() - start, 1)
    log(
        f"{batch}: baseline {row['baseline_batch']}, decision {row['decision']} ({row['rule']})"
        + (" FORCED" if row["forced"] else "")
        + f", released: {row['released']}, {row['wall_s']} s"
    )
    return row


def forced(args: argparse.Namespace, batch: str) -> bool:
    """Whether ``--force-release`` applies to ``batch`` (given without batches: to every batch)."""
    return args.force_release is not None and (not args.force_release or batch in args.force_release)


def regate(run: Runner, scratch: Path, batch: str, log) -> dict[str, Any]:
    """Ask the gate of ``batch`` again now that its own adapter is in production (eval depends on the
    pointer: the production adapter is judged on the batch's items); commit; its production decision."""
    run([_dvc(), "repro", f"gate@{batch}"], f"re-run gate {batch} with {batch} in production")
    commit_all(run, f"closed loop: batch {batch} gated again with {batch} in production")
    gate = read_json(scratch / "metrics/gate" / f"{batch}.json")
    out = {
        k: gate.get(k)
        for k in ("production_decision", "production_rule", "incumbent_decision", "incumbent_rule")
    }
    log(f"gate {batch} again: production {out['production_decision']} ({out['production_rule']})")
    return out


def rollback(run: Runner, scratch: Path, releases: list[dict[str, Any]], last: str, log) -> dict[str, Any]:
    """The rollback, after deleting the previous release's adapter folder; compare its sha256.

    When the last batch of the loop is the one in production, its gate is asked again first: a
    ``production_decision: rollback`` is acted on with ``clap rollback --batch <last>`` (the gate
    decides); otherwise the rollback is by hand (``clap rollback``), and the report says which.
    """
    if len(releases) < 2:
        return {
            "exercised": False,
            "reason": f"{len(releases)} release(s) in the loop: a rollback needs two",
        }
    current, previous = releases[-1], releases[-2]
    gate = regate(run, scratch, last, log) if current["batch"] == last else {}
    by_gate = gate.get("production_decision") == "rollback"
    folder = scratch / "models" / "adapters" / previous["batch"]
    shutil.rmtree(folder)  # the bytes must come back from the DVC cache, not the workspace
    argv, what = (
        (
            [sys.executable, "-m", "clap.cli", "rollback", "--batch", last],
            f"roll back on gate {last}'s decision",
        )
        if by_gate
        else ([sys.executable, "-m", "clap.cli", "rollback"], "roll back to the previous release by hand")
    )
    proc = run(argv, what)
    restored = sha256_file(folder / ADAPTER_FILE)
    pointer = read_json(scratch / "releases" / "production.json")
    out = {
        "exercised": True,
        "decided_by": f"gate {last}" if by_gate else "hand",
        "gate_again": gate,
        "from_batch": current["batch"],
        "from_sha256": current["sha256"],
        "to_batch": previous["batch"],
        "expected_sha256": previous["sha256"],
        "restored_sha256": restored,
        "pointer_batch": pointer.get("batch"),
        "pointer_sha256": pointer.get("adapter_sha256"),
        "equal": restored == previous["sha256"] == pointer.get("adapter_sha256")
        and pointer.get("batch") == previous["batch"],
        "output": proc.stdout.strip(),
    }
    log(f"rollback {out['from_batch']} -> {out['to_batch']}: restored bytes equal: {out['equal']}")
    return out


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    return {"cpu_model": model, "threads": os.cpu_count(), "python": platform.python_version()}


# ------------------------------------------------------------------ the report


def _f(x: Any, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _mean(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def regressions(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Batches worse than their baseline: offline delta < 0, chain delta < 0, or held/rejected on a regression rule."""
    out = []
    for r in rows:
        why = []
        if r["delta"] is not None and r["delta"] < 0:
            why.append(f"offline delta {r['delta']:+.3f} vs {r['baseline_batch']}")
        if r["chain_delta"] is not None and r["chain_delta"] < 0:
            why.append(f"chain delta {r['chain_delta']:+.3f} (B − A value accuracy)")
        if r["decision"] in ("hold", "reject") and r["rule"] in REGRESSION_RULES:
            why.append(f"{r['decision']} on rule {r['rule']}")
        if why:
            out.append({"batch": r["batch"], "why": "; ".join(why)})
    return out


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    return {
        "mean_offline_delta": _mean([r["delta"] for r in rows]),
        "mean_chain_delta": _mean([r["chain_delta"] for r in rows]),
        "regressed": regressions(rows),
    }


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# The closed loop, batch after batch",
        "",
        f"Project commit `{result['git_commit'][:12]}`"
        + (
            " (uncommitted changes in the project were not part of the run)"
            if result["project_dirty"]
            else ""
        )
        + f"; batches in time order: {', '.join(result['batches'])}; repro scope: `{result['scope']}`"
        + (f"; params overrides: `{result['overrides']}`" if result["overrides"] else "")
        + ".",
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['threads']} threads, "
        f"Python {result['machine']['python']}. Total wall time {result['wall_s']} s.",
        "",
        "Run in a scratch clone (never pushed, its own `releases/`), with a throwaway approver key "
        "generated and trusted there only. Each batch's candidate is gated against its baseline: the "
        "adapter in production at that point (`incumbent`) or the base model when nothing is released.",
    ]
    if result.get("note"):
        lines += ["", f"Why this run: {result['note']}"]
    if result["force_release"] is not None:
        lines += [
            "",
            "**`--force-release`: batches marked FORCED were not releasable by the gate; their gate record was "
            "rewritten to promote in the scratch clone to put them in production (approve/release as usual). Their "
            "decisions below are the gate's own.**",
        ]
    lines += [
        "",
        "| batch | trained from | baseline | pass rate base / baseline → candidate | offline Δ | McNemar b/c | p "
        "| power at δ* | decision (rule) | chain Δ value (A → B) | released | adapter sha256 | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        released = (
            ("yes (FORCED)" if r["forced"] else "yes")
            if r["released"]
            else ("held" if r["release_outcome"].startswith("held") else "no")
        )
        sha = (r["released_sha256"] or r["candidate_sha256"] or "")[:12]
        incumbent = f" (`{r['incumbent_sha256'][:12]}`)" if r["incumbent_sha256"] else ""
        lines.append(
            f"| {r['batch']} | {r['trained_from']} | {r['baseline_batch']}{incumbent} | {_f(r['base_pass_rate'], '.3f')} / "
            f"{_f(r['baseline_pass_rate'], '.3f')} → {_f(r['candidate_pass_rate'], '.3f')} | {_f(r['delta'], '+.3f')} | "
            f"{_f(r['b'], 'd')}/{_f(r['c'], 'd')} | {_f(r['pvalue'], '.4g')} | {_f(r['power_at_delta_star'], '.2f')} | "
            f"{r['decision']} (`{r['rule']}`) | "
            f"{_f(r['chain_delta'], '+.3f')} ({_f(r['A_value_accuracy'], '.3f')} → {_f(r['B_value_accuracy'], '.3f')}) | "
            f"{released} | `{sha}` | {r['wall_s']} |"
        )
    lines += [
        "",
        f"Mean over batches: offline Δ {_f(s['mean_offline_delta'], '+.3f')}, chain Δ {_f(s['mean_chain_delta'], '+.3f')} "
        "(each offline Δ is against that batch's own baseline).",
        "",
    ]
    if s["regressed"]:
        hidden = (s["mean_offline_delta"] or 0) > 0 or (s["mean_chain_delta"] or 0) > 0
        lines.append(
            "**Regressed batches**"
            + (" (under a positive mean)" if hidden else "")
            + ": "
            + "; ".join(f"**{g['batch']}**: {g['why']}" for g in s["regressed"])
        )
    else:
        lines.append(
            "Regressed batches: none (no negative offline or chain delta, no hold/reject on a regression rule)."
        )
    rb = result["rollback"]
    lines.append("")
    if rb["exercised"]:
        again = rb.get("gate_again") or {}
        if again:
            lines.append(
                f"Gate {result['batches'][-1]} asked again with its adapter in production: production decision "
                f"**{again['production_decision']}** (`{again['production_rule']}`; incumbent verdict "
                f"{again['incumbent_decision']} `{again['incumbent_rule']}`)."
            )
        by = rb.get("decided_by", "hand")
        how = (
            "by hand: `clap rollback`"
            if by == "hand"
            else f"on {by}'s `production_decision: rollback`: `clap rollback --batch`"
        )
        lines.append(
            f"Rollback ({how}): "
            f"{rb['from_batch']} (`{rb['from_sha256'][:12]}`) → {rb['to_batch']} (`{rb['restored_sha256'][:12]}`, "
            f"restored after deleting its folder): equal to the previous release byte for byte: "
            f"**{'yes' if rb['equal'] else 'NO'}**. `{rb['output']}`"
        )
    else:
        lines.append(f"Rollback: **could not be exercised**: {rb['reason']}.")
    lines += ["", "Why each decision:", ""]
    for r in result["rows"]:
        lines.append(
            f"- {r['batch']}: {r['decision']} (`{r['rule']}`; offline without the chain: {r['offline_decision']} "
            f"`{r['offline_rule']}`); baseline: {r['baseline_reason']}; stages run: {len(r['stages_run'])} "
            f"({r['repro_s']} s), from run-cache: {len(r['stages_from_run_cache'])}; release: {r['release_outcome']}"
        )
    lines += ["", "Commands (in the scratch clone):", "", "```"]
    lines += [f"{c['command']}    # {c['what']}, {c['wall_s']} s" for c in result["commands"]]
    lines += ["```", ""]
    return "\n".join(lines)


def write_report(result: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(result), encoding="utf-8")
    out_json = out.with_suffix(".json")
    out_json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out_json


def add_set_argument(p: argparse.ArgumentParser, example: str) -> None:
    """``--set KEY=VALUE`` (repeatable): a params.yaml key set in the scratch clone (:func:`parse_sets`)."""
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a params.yaml key in the scratch clone (dotted, YAML value), e.g. {example}",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--project", type=Path, default=ROOT, help="project root (a git repository; its HEAD is cloned)"
    )
    p.add_argument(
        "--batches",
        nargs="+",
        metavar="BATCH",
        default=list(DEFAULT_BATCHES),
        help=f"batches in time order (default: {' '.join(DEFAULT_BATCHES)}); each needs data/raw/<batch>/",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="markdown report (default: <project>/benchmarks/results/closed_loop.md; .json beside it)",
    )
    add_set_argument(p, "gate.delta_star=0.05")
    p.add_argument(
        "--scope",
        choices=("batch", "all"),
        default="batch",
        help="batch: `dvc repro gate@<batch>` (earlier batches are not re-evaluated against each new incumbent); "
        "all: `dvc repro` of every batch seen so far and the summary (default: batch)",
    )
    p.add_argument(
        "--force-release",
        nargs="*",
        metavar="BATCH",
        help="release these batches (none named: every batch) even when the gate did not allow them, e.g. to put "
        "a bad adapter in production and let a later gate roll it back (rewrites their gate record in the scratch "
        "clone; marked FORCED in the report)",
    )
    p.add_argument(
        "--note", help="why this run (which batches, which params): printed at the top of the report"
    )
    p.add_argument(
        "--allow-no-rollback", action="store_true", help="exit 0 even when fewer than two releases happened"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the scratch clone (and its throwaway key) for inspection"
    )
    args = p.parse_args(argv)
    args.project = args.project.resolve()
    args.out = args.out or args.project / "benchmarks" / "results" / "closed_loop.md"
    known = project_batches(args.project)
    unknown = [b for b in args.batches if b not in known]
    if unknown:
        p.error(f"no data/raw/<batch>/ in {args.project} for {unknown} (known: {known})")
    if len(args.batches) < 2 or list(args.batches) != sorted(set(args.batches)):
        p.error(f"--batches must be at least two distinct batches in time order, got {args.batches}")
    try:
        args.overrides = parse_sets(args.sets)
    except LoopError as e:
        p.error(str(e))
    if "batches" in args.overrides:
        p.error("--set batches=...: the loop sets batches itself (use --batches)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run_loop(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    except LoopError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["summary"] = summarize(result)
    out_json = write_report(result, args.out)
    print(f"wrote {args.out} and {out_json}")
    if not result["rollback"]["exercised"]:
        print(f"rollback not exercised: {result['rollback']['reason']}", file=sys.stderr)
        return 0 if args.allow_no_rollback else 1
    if not result["rollback"]["equal"]:
        print("error: the rollback did not restore the previous adapter byte for byte", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
