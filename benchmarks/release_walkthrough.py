"""README's release walkthrough, run for real on the demo's adapters.

keys → approve → release → serve (real HTTP requests answered by the released adapter) → gate a
second batch against it → release it when the gate allows it → rollback (``git revert`` of the last
release's pointer commit) → registry check, on the
real SmolLM2 adapters the demo trains, in a scratch clone (``benchmarks/closed_loop.py``'s: origin
removed, the project's DVC cache shared with ``cache.type reflink,copy``) with keys generated there
at run time and deleted with it. Only the report is written into the project.

The keys are docs/release.md's team of several: alice and bob pinned outside the clone
(``$CLAP_TRUST_ROOT``), carol added by both (``clap trust add``), every release approved by two of
them; mallory's key is committed to ``releases/trusted_keys/`` and never trusted.

``--first`` (default 2026-01, which ``make demo`` computed) is gated against the base model and
released. ``--second`` (default 2026-02) is gated against it in production (its ``eval`` depends on
``releases/production.json``): when the gate allows it, it is released and the rollback restores
the first's adapter; when not, its approval is refused (``not_releasable``), the incumbent stays,
and the rollback goes back to nothing released. Every step is the gate's own decision under the
project's params; nothing is forced.

Checked, and the script exits 1 when any check fails:

- after each release (and after a rollback to a release), ``clap serve`` starts, ``/health``
  names the batch and adapter sha256 the pointer names, and ``--questions`` replay questions of
  the served batch are answered over HTTP: valid answers, each response naming that adapter, and
  the served output compared with what replay's condition B (adapter + RAG, the same chain)
  answered offline for the same question;
- a rollback to a release deletes that release's adapter folder first, so its bytes come back
  from the DVC cache: sha256 at its release and after must be equal; a rollback to nothing
  released leaves a pointer without a batch, and ``clap serve`` refuses (``nothing_released``);
- each release's handoff: the model card passes ``clap.release.handoff.validate_card``, the
  manifest ``validate_manifest``, the cost report has every stage with a wall time and the
  train estimate, and the standard ``model_signing verify`` CLI accepts the adapter folder;
- before each release, a release with one approval and an approval by mallory's key are
  refused (exit status 2, rules ``approvals_required`` and ``untrusted_key``);
- ``clap registry-check`` accepts the whole history.

    python benchmarks/release_walkthrough.py [--project .] [--out benchmarks/results/release_walkthrough.md]
        [--first 2026-01] [--second 2026-02] [--questions 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from closed_loop import (  # noqa: E402
    ROOT,
    LoopError,
    Runner,
    _display,
    _dvc,
    add_set_argument,
    commit_all,
    git,
    machine,
    parse_sets,
    read_json,
    scratch_clone,
    set_params,
    sha256_file,
)

from clap import io  # noqa: E402
from clap.model.base import ADAPTER_FILE  # noqa: E402
from clap.release.approval import RELEASABLE  # noqa: E402
from clap.release.handoff import CARD, COST, MANIFEST, validate_card, validate_manifest  # noqa: E402
from clap.release.trust import ROOT_ENV  # noqa: E402

# docs/release.md's team of several: alice and bob pinned outside the repository, carol added by both
PINNED, ADDED = ("alice", "bob"), "carol"
# who approves each release (two distinct approvers: params release.approvals_required)
APPROVERS = (("alice", "bob"), ("alice", "carol"))
INTRUDER = "mallory"  # a committer's own key: committed, never trusted
SIGNING_KEY = "keys/model-signing.key"  # `clap signing-keygen`'s default
CLAP = [sys.executable, "-m", "clap.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 600) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def serve_and_ask(run: Runner, scratch: Path, questions: int, label: str, log) -> dict[str, Any]:
    """``clap serve`` as its own process; /health, then replay questions of the served batch over HTTP."""
    pointer = read_json(scratch / "releases" / "production.json")
    batch, sha = pointer["batch"], pointer["adapter_sha256"]
    cases = io.read_parquet(scratch / "data" / "replay" / batch / "cases.parquet")
    offline = cases[cases["condition"] == "B"].sort_values("position").head(questions)
    asked = io.read_parquet(scratch / "data" / "admitted" / batch / "replay.parquet").set_index("item_id")
    port = free_port()
    argv = [*CLAP, "serve", "--port", str(port)]
    shown = " ".join(_display(a) for a in argv) + " &"
    log(f"$ {shown}")
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=scratch, env=run.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        health = None
        while health is None:
            if proc.poll() is not None:
                raise LoopError(f"clap serve exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
            if time.perf_counter() - start > 600:
                raise LoopError("clap serve did not answer /health within 600 s")
            try:
                health = http("GET", base_url + "/health", timeout=5)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        ready_s = round(time.perf_counter() - start, 2)
        run.commands.append(
            {
                "command": shown,
                "rc": None,
                "wall_s": ready_s,
                "what": f"serve {batch} (until /health answers)",
            }
        )
        answers = []
        for _, case in offline.iterrows():
            question = str(asked.loc[case["item_id"], "question"])
            t0 = time.perf_counter()
            got = http("POST", base_url + "/answer", {"question": question})
            answers.append(
                {
                    "item_id": case["item_id"],
                    "question": question,
                    "gold_value": case["gold_value"],
                    "served_output": got["output"],
                    "served_answer": got["answer"],
                    "valid": got["valid"],
                    "batch": got["batch"],
                    "adapter_sha256": got["adapter_sha256"],
                    "replay_B_output": case["output"],
                    "same_as_replay": got["output"] == case["output"],
                    "replay_B_pass": bool(case["pass"]),
                    "http_wall_s": round(time.perf_counter() - t0, 2),
                }
            )
        run.commands.append(
            {
                "command": f"curl -s -X POST localhost:{port}/answer -d '{{\"question\": ...}}'  # x{len(answers)}",
                "rc": 0,
                "wall_s": round(sum(a["http_wall_s"] for a in answers), 2),
                "what": f"ask {len(answers)} replay questions of {batch}",
            }
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    problems = []
    if health.get("batch") != batch or health.get("adapter_sha256") != sha:
        problems.append(
            f"/health serves {health.get('batch')} {health.get('adapter_sha256')}, the pointer {batch} {sha}"
        )
    for a in answers:
        if a["batch"] != batch or a["adapter_sha256"] != sha:
            problems.append(
                f"{a['item_id']} answered by {a['batch']} {a['adapter_sha256']}, not {batch} {sha}"
            )
        if not a["valid"]:
            problems.append(f"{a['item_id']}: invalid answer {a['served_output']!r}")
    out = {
        "label": label,
        "batch": batch,
        "adapter_sha256": sha,
        "health": health,
        "ready_s": ready_s,
        "answers": answers,
        "same_as_replay": sum(a["same_as_replay"] for a in answers),
        "problems": problems,
    }
    log(
        f"serve {batch}: ready in {ready_s} s, {out['same_as_replay']}/{len(answers)} answers as in replay, problems: {problems}"
    )
    return out


def check_handoff(run: Runner, scratch: Path, batch: str) -> dict[str, Any]:
    """The release's handoff bundle: card, manifest, cost report, and the OpenSSF signature by the standard CLI."""
    folder = scratch / "releases" / "handoff" / batch
    card = (folder / CARD).read_text(encoding="utf-8")
    manifest = read_json(folder / MANIFEST)
    cost = read_json(folder / COST)
    problems = [f"model card: {p}" for p in validate_card(card)]
    problems += [f"manifest: {p}" for p in validate_manifest(manifest)]
    stages = cost.get("stages") or {}
    if not stages:
        problems.append("cost report lists no stage")
    problems += [f"cost: stage {s} has no wall time" for s, v in stages.items() if v.get("wall_s") is None]
    if cost.get("status") != "within":
        problems.append(
            f"cost report status {cost.get('status')!r} (budget {cost.get('budget_cpu_hours')} CPU h)"
        )
    train = stages.get("train") or {}
    if train.get("estimate_s") is None:
        problems.append("cost: the train stage has no pre-training estimate")
    signer = Path(sys.executable).parent / "model_signing"
    verify = run(
        [str(signer) if signer.exists() else "model_signing", "verify", "key", f"models/adapters/{batch}"]
        + ["--signature", f"releases/handoff/{batch}/model.sig"]
        + ["--public_key", f"releases/handoff/{batch}/model_signing.pub"],
        f"standard OpenSSF verifier on {batch}",
        ok=(0, 1),
    )
    if verify.returncode != 0:
        problems.append(f"model_signing verify failed: {(verify.stdout + verify.stderr)[-500:]}")
    return {
        "batch": batch,
        "files": sorted(p.name for p in folder.iterdir()),
        "card_lines": len(card.splitlines()),
        "manifest_git_commit": manifest.get("git_commit"),
        "cost_cpu_hours": cost.get("cpu_hours"),
        "cost_status": cost.get("status"),
        "train_estimate_s": train.get("estimate_s"),
        "train_wall_s": train.get("wall_s"),
        "model_signing_verify": (verify.stdout + verify.stderr).strip().splitlines()[-1:],
        "problems": problems,
    }


def approve(run: Runner, batch: str, who: str, var: str, ok: tuple[int, ...] = (0,)):
    """``clap approve <batch> --key keys/<who>.key``, shown as the README's ``<var>=$(...)``."""
    argv = [*CLAP, "approve", batch, "--key", f"keys/{who}.key"]
    return run(
        argv, f"{who} approves {batch}", ok=ok, shown=f"{var}=$(clap approve {batch} --key keys/{who}.key)"
    )


def release(run: Runner, batch: str, tokens: dict[str, str], what: str, ok: tuple[int, ...] = (0,)):
    """``clap release <batch> --token "$T1" ...`` with the named tokens."""
    argv = [*CLAP, "release", batch]
    for token in tokens.values():
        argv += ["--token", token]
    shown = f"clap release {batch} " + " ".join(f'--token "${v}"' for v in tokens)
    return run(
        argv + ["--signing-key", SIGNING_KEY], what, ok=ok, shown=f"{shown} --signing-key {SIGNING_KEY}"
    )


def trust_ceremony(run: Runner) -> dict[str, Any]:
    """Keys: two pinned approvers, a third added by both, and an intruder's key that counts for nothing."""
    fingerprints = {}
    for name in (*PINNED, ADDED, INTRUDER):
        out = run([*CLAP, "keygen", "--name", name], f"{name}'s key pair").stdout
        fingerprints[name] = re.search(r"fingerprint: ([0-9a-f]{64})", out).group(1)
        if name == PINNED[-1]:
            git(run, "add", "releases/trusted_keys", what="commit the pinned approvers' public keys")
            git(run, "commit", "-q", "-m", "alice's and bob's keys", what="commit")
            # pinned outside the scratch clone, as CI pins its approvers' fingerprints
            run.env[ROOT_ENV] = ",".join(fingerprints[n] for n in PINNED)
            run.commands.append(
                {
                    "command": f"export {ROOT_ENV}=<alice>,<bob>",
                    "rc": 0,
                    "wall_s": 0.0,
                    "what": "pin the root of trust",
                }
            )
        elif name in (ADDED, INTRUDER):
            git(run, "add", f"releases/trusted_keys/{name}.pub", what=f"commit {name}'s public key")
            git(run, "commit", "-q", "-m", f"{name}'s key", what="commit")
    first = run(
        [*CLAP, "trust", "add", ADDED, "--key", f"keys/{PINNED[0]}.key"], f"{PINNED[0]} signs: add {ADDED}"
    )
    second = run(
        [*CLAP, "trust", "add", ADDED, "--key", f"keys/{PINNED[1]}.key"], f"{PINNED[1]} signs: add {ADDED}"
    )
    return {
        "pinned": list(PINNED),
        "added": ADDED,
        "trust_add_outputs": [first.stdout.strip(), second.stdout.strip()],
        "intruder": INTRUDER,
    }


def refusals(run: Runner, batch: str) -> list[dict[str, Any]]:
    """What must be refused on the way to releasing ``batch``: one approver alone; an intruder's key."""
    token = approve(run, batch, PINNED[0], "T1").stdout.strip()
    alone = release(run, batch, {"T1": token}, f"release {batch} with one approver (refused)", ok=(2,))
    intruder = approve(run, batch, INTRUDER, "TM", ok=(2,))
    return [
        {"attempt": what, "rule": rule, "rc": proc.returncode, "said": proc.stderr.strip()[-600:]}
        for what, rule, proc in (
            ("one approver", "approvals_required", alone),
            (f"{INTRUDER}'s committed key", "untrusted_key", intruder),
        )
    ]


def gate_and_release(
    run: Runner, scratch: Path, batch: str, approvers: tuple[str, str], log
) -> dict[str, Any]:
    """``dvc repro gate@<batch>``, commit, and approve (two approvers) + release when the gate allows it."""
    start = time.perf_counter()
    proc = run([_dvc(), "repro", f"gate@{batch}"], f"reproduce and gate {batch}")
    ran = [line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage '")]
    commit_all(run, f"gate {batch}")
    gate = read_json(scratch / "metrics" / "gate" / f"{batch}.json")
    row = {
        "batch": batch,
        "stages_run": ran,
        "repro_s": round(time.perf_counter() - start, 1),
        **{
            k: gate.get(k)
            for k in ("decision", "rule", "baseline", "baseline_reason", "b", "c", "delta", "pvalue")
        },
        **{k: gate.get(k) for k in ("baseline_pass_rate", "candidate_pass_rate", "production_decision")},
    }
    log(f"{batch}: {row['decision']} ({row['rule']}) against {row['baseline_reason']}")
    if row["decision"] not in RELEASABLE:  # the incumbent stays; an approval is refused
        proc = approve(run, batch, approvers[0], "T1", ok=(2,))
        said = proc.stderr.strip()[-600:]
        attempt = {"attempt": f"approve a {row['decision']} decision", "rule": "not_releasable", "said": said}
        return {
            **row,
            "released": False,
            "released_sha256": None,
            "refused": [{**attempt, "rc": proc.returncode}],
        }
    row["refused"] = refusals(run, batch)
    tokens = {f"T{i}": approve(run, batch, who, f"T{i}").stdout.strip() for i, who in enumerate(approvers, 1)}
    t0 = time.perf_counter()
    rel = release(run, batch, tokens, f"release {batch} ({' and '.join(approvers)} approved)")
    row["release_s"] = round(time.perf_counter() - t0, 2)
    pointer = read_json(scratch / "releases" / "production.json")
    on_disk = sha256_file(scratch / "models" / "adapters" / batch / ADAPTER_FILE)
    if pointer.get("batch") != batch or pointer.get("adapter_sha256") != on_disk:
        raise LoopError(
            f"after releasing {batch} the pointer names {pointer.get('batch')} {pointer.get('adapter_sha256')}"
        )
    row.update(released=True, released_sha256=on_disk, release_output=rel.stdout.strip().splitlines())
    return row


def roll_back(run: Runner, scratch: Path, released: list[dict[str, Any]]) -> dict[str, Any]:
    """The user's own rollback: ``git revert`` of the last release's pointer commit (it changes only
    ``releases/production.json``), then ``dvc checkout`` of the adapter rolled back to (its folder
    deleted first, so the bytes come back from the DVC cache; sha256 compared). With one release the
    revert leaves nothing released (accepted under ``release.rollback_to_base``; ``clap serve`` must
    then refuse: ``serve.unreleased: refuse``). ``clap registry-check`` runs after it (``main``)."""
    previous = released[-2] if len(released) > 1 else None
    if previous is not None:
        shutil.rmtree(scratch / "models" / "adapters" / previous["batch"])
    last = released[-1]["batch"]
    pointer_commit = git(
        run, "log", "-1", "--format=%H", f"--grep=^release {last}: ", "--", "releases/production.json",
        what="the last release's pointer commit",
    ).strip()  # fmt: skip
    t0 = time.perf_counter()
    proc = run(
        ["git", "revert", "--no-edit", pointer_commit], "roll back: revert the pointer commit", ok=(0, 1)
    )
    if previous is not None and not proc.returncode:
        run(
            [_dvc(), "checkout", f"models/adapters/{previous['batch']}"], "restore the adapter rolled back to"
        )
    wall = round(time.perf_counter() - t0, 2)
    pointer = read_json(scratch / "releases" / "production.json")
    out = {"wall_s": wall, "from_batch": last, "output": proc.stdout.strip(), "how": "git revert"}
    if proc.returncode:
        return {
            **out,
            "to_batch": "base",
            "serve_refused": "",
            "equal": False,
            "refused": proc.stderr.strip(),
        }
    if previous is None:
        serve = run([*CLAP, "serve", "--port", "8000"], "serve with nothing released (refused)", ok=(2,))
        said = serve.stderr.strip()
        return {
            **out,
            "to_batch": "base",
            "pointer_batch": pointer.get("batch"),
            "serve_refused": said.splitlines()[-1] if said else "",
            "equal": pointer.get("batch") is None and "rule nothing_released" in said,
        }
    restored = sha256_file(scratch / "models" / "adapters" / previous["batch"] / ADAPTER_FILE)
    return {
        **out,
        "to_batch": previous["batch"],
        "sha256_at_release": previous["released_sha256"],
        "sha256_restored": restored,
        "pointer_sha256": pointer.get("adapter_sha256"),
        "equal": restored == previous["released_sha256"] == pointer.get("adapter_sha256")
        and pointer.get("batch") == previous["batch"],
    }


def walkthrough(args: argparse.Namespace, log=print) -> dict[str, Any]:
    project = args.project.resolve()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True, check=True
    )
    head = head.stdout.strip()
    subject = subprocess.run(
        ["git", "log", "-1", "--format=%s", head], cwd=project, capture_output=True, text=True, check=True
    ).stdout.strip()
    cache = subprocess.run([_dvc(), "cache", "dir"], cwd=project, capture_output=True, text=True)
    cache_dir = (
        (project / cache.stdout.strip()).resolve() if cache.stdout.strip() else project / ".dvc" / "cache"
    )
    tmp = Path(tempfile.mkdtemp(prefix="clap-walkthrough-"))
    scratch = tmp / "repo"
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(scratch),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    run = Runner(tmp, env, log)
    result: dict[str, Any] = {
        "project": str(project),
        "git_commit": head,
        "commit_subject": subject,
        "cache_dir": str(cache_dir),
        "machine": machine(),
        "first": args.first,
        "second": args.second,
        "overrides": args.overrides,
        "serves": [],
        "handoffs": [],
        "releases": [],
    }
    start = time.perf_counter()
    try:
        scratch_clone(run, project, scratch, head, cache_dir, "walkthrough")
        run([_dvc(), "checkout"], "check out what the project already computed", ok=(0, 1, 255))
        batches = read_json_yaml_batches(scratch)
        wanted = sorted(set(batches) | {args.first, args.second})
        updates = {**({"batches": wanted} if wanted != batches else {}), **args.overrides}
        if updates:
            set_params(scratch / "params.yaml", updates)
            commit_all(run, "params: " + " ".join(f"{k}={v}" for k, v in updates.items()))
        result["trust"] = trust_ceremony(run)
        run([*CLAP, "signing-keygen"], "model-signing key (EC P-256)")
        for batch, approvers in zip((args.first, args.second), APPROVERS, strict=True):
            row = gate_and_release(run, scratch, batch, approvers, log)
            result["releases"].append(row)
            if not row["released"]:
                if batch == args.first:
                    raise LoopError(f"the gate did not allow {batch}: {row['decision']} ({row['rule']})")
                continue
            result["handoffs"].append(check_handoff(run, scratch, batch))
            result["serves"].append(
                serve_and_ask(run, scratch, args.questions, f"after releasing {batch}", log)
            )
        result["rollback"] = roll_back(run, scratch, [r for r in result["releases"] if r["released"]])
        if result["rollback"]["to_batch"] != "base":
            result["serves"].append(serve_and_ask(run, scratch, args.questions, "after the rollback", log))
        check = run([*CLAP, "registry-check"], "verify the whole release history")
        result["registry_check"] = check.stdout.strip().splitlines()
        tags = git(run, "tag", "--list", "clap-adapter*", what="the GTO tags")
        result["gto_tags"] = tags.split()
    finally:
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result["commands"] = run.commands
        if args.keep:
            log(f"kept {tmp} (it holds the private keys in keys/: delete it when done)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["problems"] = problems(result)
    return result


def read_json_yaml_batches(scratch: Path) -> list[str]:
    from clap import params

    return list(params.load(scratch / "params.yaml")["batches"])


def problems(result: dict[str, Any]) -> list[str]:
    out = [p for s in result["serves"] for p in s["problems"]]
    out += [f"{h['batch']}: {p}" for h in result["handoffs"] for p in h["problems"]]
    out += [
        f"{r['batch']}: {x['attempt']} was not refused with rule {x['rule']}: {x['said']}"
        for r in result["releases"]
        for x in r.get("refused", [])
        if f"rule {x['rule']}" not in x["said"]
    ]
    rb = result.get("rollback", {})
    if rb.get("refused"):
        out.append(f"the rollback was refused: {rb['refused']}")
    elif not rb.get("equal"):
        out.append(
            "the rollback did not restore the previous release byte for byte (or serve did not refuse)"
        )
    return out


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Release walkthrough on the demo's real adapters",
        "",
        f'Project commit `{result["git_commit"][:12]}` ("{result.get("commit_subject", "")}"); machine: {m["cpu_model"]}, {m["threads"]} threads, '
        f"Python {m['python']}; total wall time {result['wall_s']} s. Scratch clone, keys generated at run time "
        "and deleted with it (`benchmarks/release_walkthrough.py`)"
        + (f"; params set in the clone: `{result['overrides']}`" if result.get("overrides") else "")
        + ".",
        "",
        "| step | batch | decision (rule), baseline | b/c | Δ | adapter sha256 | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["releases"]:
        step, sha, wall = (
            "gate",
            "not releasable: the incumbent stays",
            f"{r['repro_s']} (repro: {len(r['stages_run'])} stages)",
        )
        if r["released"]:
            step, sha, wall = (
                "gate + release",
                f"`{r['released_sha256'][:16]}`",
                f"{wall} + {r['release_s']} (release)",
            )
        lines.append(
            f"| {step} | {r['batch']} | {r['decision']} (`{r['rule']}`), {r['baseline_reason']} | "
            f"{r['b']}/{r['c']} | {r['delta']:+.3f} | {sha} | {wall} |"
        )
    rb = result.get("rollback")
    if rb and rb["to_batch"] == "base":
        lines.append(
            f"| rollback (`git revert` of the pointer commit) | {rb['from_batch']} → nothing released | the pointer names no batch; `clap serve` refuses: "
            f"`{rb['serve_refused'][:160]}` | | | **{'as expected' if rb['equal'] else 'NOT AS EXPECTED'}** | {rb['wall_s']} |"
        )
    elif rb:
        lines.append(
            f"| rollback (`git revert` of the pointer commit) | {rb['from_batch']} → {rb['to_batch']} | restored by `dvc checkout` after deleting the folder "
            f"| | | `{rb['sha256_restored'][:16]}` (at release `{rb['sha256_at_release'][:16]}`): "
            f"**{'equal' if rb['equal'] else 'DIFFERENT'}** | {rb['wall_s']} |"
        )
    trust = result.get("trust") or {}
    if trust:
        lines += [
            "",
            f"Keys: {' and '.join(trust['pinned'])} pinned outside the clone (`${ROOT_ENV}`); {trust['added']} added "
            f"by both (`clap trust add`): {' / '.join(trust['trust_add_outputs'])}. "
            f"{trust['intruder']}'s key is committed to `releases/trusted_keys/` and never trusted.",
            "",
            "Refused (exit status 2, rule as shown):",
            "",
        ]
        lines += [
            f"- {r['batch']}, {x['attempt']}: `{x['said'].splitlines()[-1][:300] if x['said'] else ''}`"
            for r in result["releases"]
            for x in r.get("refused", [])
        ]
    lines += [
        "",
        "Served over HTTP (`clap serve`, one process per state; questions are the served batch's replay cases):",
        "",
    ]
    lines += [
        "| when | batch served | adapter sha256 | ready s | answers valid | same output as replay B "
        "| right (replay's scoring of that output) | s per answer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result["serves"]:
        n = len(s["answers"])
        per = sum(a["http_wall_s"] for a in s["answers"]) / n if n else 0
        lines.append(
            f"| {s['label']} | {s['batch']} | `{s['adapter_sha256'][:16]}` | {s['ready_s']} | "
            f"{sum(a['valid'] for a in s['answers'])}/{n} | {s['same_as_replay']}/{n} | "
            f"{sum(a['same_as_replay'] and a['replay_B_pass'] for a in s['answers'])}/{n} | {per:.2f} |"
        )
    lines += ["", "Handoff bundles:", ""]
    for h in result["handoffs"]:
        lines.append(
            f"- {h['batch']}: {', '.join(h['files'])}; card valid, manifest valid, cost report {h['cost_status']} "
            f"({h['cost_cpu_hours']} CPU h; train estimate {h['train_estimate_s']} s vs {h['train_wall_s']} s); `model_signing verify`: {' '.join(h['model_signing_verify'])}"
            if not h["problems"]
            else f"- {h['batch']}: PROBLEMS {h['problems']}"
        )
    lines += ["", f"`clap registry-check`: {' / '.join(result.get('registry_check', []))}", ""]
    lines += [f"GTO tags: {', '.join(result.get('gto_tags', []))}", ""]
    lines += ["Problems: " + ("none" if not result["problems"] else "; ".join(result["problems"])), ""]
    lines += ["Commands (in the scratch clone):", "", "```"]
    lines += [f"{c['command']}    # {c['what']}, {c['wall_s']} s" for c in result["commands"]]
    lines += ["```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", type=Path, default=ROOT)
    p.add_argument("--first", default="2026-01", help="batch released first (against the base model)")
    p.add_argument(
        "--second",
        default="2026-02",
        help="batch gated second, against the first in production; released when the gate allows it",
    )
    p.add_argument(
        "--questions", type=int, default=3, help="replay questions asked over HTTP per served state"
    )
    add_set_argument(p, "release.rollback_to_base=true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "release_walkthrough.md")
    p.add_argument("--keep", action="store_true", help="keep the scratch clone (and its private keys)")
    args = p.parse_args(argv)
    try:
        args.overrides = parse_sets(args.sets)
        result = walkthrough(args)
    except LoopError as e:
        print(f"walkthrough failed: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(result), encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    print(render(result))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
