"""README's release walkthrough, run for real on the demo's adapters (issue 18 §3).

approve → release → serve (real HTTP requests answered by the released adapter) → second
release → serve → rollback → serve → registry check, on the real SmolLM2 adapters the demo
trains, in a scratch clone (``benchmarks/closed_loop.py``'s: origin removed, the project's DVC
cache shared with ``cache.type reflink,copy``) with an approver key and a model-signing key
generated there at run time and deleted with it. Only the report is written into the project.

The demo world has one batch that beats the base model and is never beaten by a later one:
2026-01's adapter (the closed-loop report: 2026-02, 2026-05 and 2026-06 are each rejected
against it). So the walkthrough releases 2026-02 first (gated against the base model: nothing
is in production), then re-evaluates 2026-01 against that incumbent (its ``eval`` depends on
``releases/production.json``), releases it when the gate says so, and rolls back to 2026-02.
Every step is the gate's own decision under the project's params; nothing is forced.

Checked, and the script exits 1 when any check fails:

- after each release and after the rollback, ``clap serve`` starts, ``/health`` names the
  batch and adapter sha256 the pointer names, and ``--questions`` replay questions of the
  served batch are answered over HTTP: valid answers, each response naming that adapter,
  and the served output compared with what replay's condition B (adapter + RAG, the same
  chain) answered offline for the same question;
- the rollback deletes the second release's predecessor's adapter folder first, so its bytes
  come back from the DVC cache; sha256 before (at its release) and after must be equal;
- each release's handoff: the model card passes ``clap.release.handoff.validate_card``, the
  manifest ``validate_manifest``, the cost report has every stage with a wall time and the
  train estimate, and the standard ``model_signing verify`` CLI accepts the adapter folder;
- ``clap registry-check`` accepts the whole history.

    python benchmarks/release_walkthrough.py [--project .] [--out benchmarks/results/release_walkthrough.md]
        [--first 2026-02] [--second 2026-01] [--questions 3] [--keep]
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
    commit_all,
    git,
    machine,
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

APPROVER = "alice"
SIGNING_KEY = "keys/model-signing.key"  # `clap signing-keygen`'s default


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
    argv = [sys.executable, "-m", "clap.cli", "serve", "--port", str(port)]
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


def gate_and_release(run: Runner, scratch: Path, batch: str, log) -> dict[str, Any]:
    """``dvc repro gate@<batch>``, commit, and approve + release when the gate allows it."""
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
    if row["decision"] not in RELEASABLE:
        raise LoopError(
            f"the gate did not allow {batch}: {row['decision']} ({row['rule']}); nothing to release"
        )
    token = run(
        [sys.executable, "-m", "clap.cli", "approve", batch, "--key", f"keys/{APPROVER}.key"],
        f"approve {batch}",
    ).stdout.strip()
    t0 = time.perf_counter()
    rel = run(
        [sys.executable, "-m", "clap.cli", "release", batch, "--token", "-", "--signing-key", SIGNING_KEY],
        f"release {batch}",
        stdin=token,
    )
    row["release_s"] = round(time.perf_counter() - t0, 2)
    pointer = read_json(scratch / "releases" / "production.json")
    on_disk = sha256_file(scratch / "models" / "adapters" / batch / ADAPTER_FILE)
    if pointer.get("batch") != batch or pointer.get("adapter_sha256") != on_disk:
        raise LoopError(
            f"after releasing {batch} the pointer names {pointer.get('batch')} {pointer.get('adapter_sha256')}"
        )
    row.update(released_sha256=on_disk, release_output=rel.stdout.strip().splitlines())
    return row


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
        if wanted != batches:
            set_params(scratch / "params.yaml", {"batches": wanted})
            commit_all(run, f"batches: {wanted}")
        keygen = run([sys.executable, "-m", "clap.cli", "keygen", "--name", APPROVER], "approver key")
        # pinned outside the scratch clone, as CI pins its approvers' fingerprints ($CLAP_TRUST_ROOT)
        run.env[ROOT_ENV] = re.search(r"fingerprint: ([0-9a-f]{64})", keygen.stdout).group(1)
        git(run, "add", "releases/trusted_keys", what="trust the approver")
        git(run, "commit", "-q", "-m", f"trust {APPROVER}", what="commit")
        run([sys.executable, "-m", "clap.cli", "signing-keygen"], "model-signing key (EC P-256)")
        for batch in (args.first, args.second):
            row = gate_and_release(run, scratch, batch, log)
            result["releases"].append(row)
            result["handoffs"].append(check_handoff(run, scratch, batch))
            result["serves"].append(
                serve_and_ask(run, scratch, args.questions, f"after releasing {batch}", log)
            )
        previous = result["releases"][0]
        folder = scratch / "models" / "adapters" / previous["batch"]
        shutil.rmtree(folder)  # the bytes must come back from the DVC cache
        t0 = time.perf_counter()
        proc = run([sys.executable, "-m", "clap.cli", "rollback"], "roll back to the previous release")
        restored = sha256_file(folder / ADAPTER_FILE)
        pointer = read_json(scratch / "releases" / "production.json")
        result["rollback"] = {
            "wall_s": round(time.perf_counter() - t0, 2),
            "from_batch": args.second,
            "to_batch": previous["batch"],
            "sha256_at_release": previous["released_sha256"],
            "sha256_restored": restored,
            "pointer_sha256": pointer.get("adapter_sha256"),
            "equal": restored == previous["released_sha256"] == pointer.get("adapter_sha256")
            and pointer.get("batch") == previous["batch"],
            "output": proc.stdout.strip(),
        }
        result["serves"].append(serve_and_ask(run, scratch, args.questions, "after the rollback", log))
        check = run([sys.executable, "-m", "clap.cli", "registry-check"], "verify the whole release history")
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
    if not result.get("rollback", {}).get("equal"):
        out.append("the rollback did not restore the previous release byte for byte")
    return out


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Release walkthrough on the demo's real adapters",
        "",
        f'Project commit `{result["git_commit"][:12]}` ("{result.get("commit_subject", "")}"); machine: {m["cpu_model"]}, {m["threads"]} threads, '
        f"Python {m['python']}; total wall time {result['wall_s']} s. Scratch clone, keys generated at run time "
        "and deleted with it (`benchmarks/release_walkthrough.py`).",
        "",
        "| step | batch | decision (rule), baseline | b/c | Δ | adapter sha256 | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["releases"]:
        lines.append(
            f"| gate + release | {r['batch']} | {r['decision']} (`{r['rule']}`), {r['baseline_reason']} | "
            f"{r['b']}/{r['c']} | {r['delta']:+.3f} | `{r['released_sha256'][:16]}` | "
            f"{r['repro_s']} (repro: {len(r['stages_run'])} stages) + {r['release_s']} (release) |"
        )
    rb = result.get("rollback")
    if rb:
        lines.append(
            f"| rollback | {rb['from_batch']} → {rb['to_batch']} | restored from the DVC cache after deleting the folder "
            f"| | | `{rb['sha256_restored'][:16]}` (at release `{rb['sha256_at_release'][:16]}`): "
            f"**{'equal' if rb['equal'] else 'DIFFERENT'}** | {rb['wall_s']} |"
        )
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
    p.add_argument("--first", default="2026-02", help="batch released first (against the base model)")
    p.add_argument(
        "--second", default="2026-01", help="batch released second (against the first as incumbent)"
    )
    p.add_argument(
        "--questions", type=int, default=3, help="replay questions asked over HTTP per served state"
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "release_walkthrough.md")
    p.add_argument("--keep", action="store_true", help="keep the scratch clone (and its private keys)")
    args = p.parse_args(argv)
    try:
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
