"""TAT-QA learning curve: how many training items a 135M model needs before the gate can see it learn.

``run`` admits the profile's clean report groups with the profile's own stage scripts, at sizes that keep
every item of a batch (``prepare``), pools their training items (D_sft and probe: one random partition
of each batch's train split) and their held-out eval items (table-disjoint from every training item by
the profile's split), then for each point n trains the real train stage's code on the first n items of a
seeded permutation of the training pool (nested sets: each point adds items), evaluates it on the same
``--heldout`` items as the base, and decides with the real gate's quality rule against the base. The
detector runs as in the train stage, with the next n / batch_size items of that permutation as its probe
(one per step, exchangeable with the training items). Every finished point is appended to
``WORK/points.jsonl`` (a crash keeps what ran); ``report`` writes
``benchmarks/results/tatqa_learning_curve.{json,md}``.

usage: python benchmarks/tatqa_learning_curve.py run WORK [--points 32 64 128] [--heldout 120] [--set KEY=VALUE]
       python benchmarks/tatqa_learning_curve.py report WORK [WORK ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model, machine  # noqa: E402

PROFILE = ROOT / "profiles" / "tatqa"
RESULTS = ROOT / "benchmarks" / "results"
BATCHES = ("reports-a", "reports-b")
SEED = 20260401  # the permutation of the training pool and the draw of the held-out items


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for key in path:
        tree = tree[key]
    if last not in tree:
        raise SystemExit(f"--set {dotted}: no such key in the profile's params")
    tree[last] = value


def prepare(work: Path, overrides: list[str]) -> tuple[Path, list[Path]]:
    """A scratch project (the profile's params with ``overrides``) and each batch admitted there whole:
    D_sft + probe = the batch's train split, eval = its eval split."""
    from clap import io
    from clap import params as cparams

    params = cparams.load(PROFILE / "params.yaml")  # the override merged onto the root's: a whole params file
    for item in overrides:
        key, value = item.split("=", 1)
        _set(params, key, yaml.safe_load(value))
    dirs = []
    for b in BATCHES:
        project = work / "prep" / b
        (project / "data").mkdir(parents=True, exist_ok=True)
        raw = project / "data" / "raw"
        if not raw.exists():
            raw.symlink_to(PROFILE / "data" / "raw")
        steps = [("assetize", f"data/raw/{b}", f"data/assets/{b}"),
                 ("normalize", f"data/assets/{b}", f"data/normalized/{b}"),
                 ("admit", f"data/normalized/{b}", f"data/admitted/{b}")]  # fmt: skip
        for name, src, out in steps:
            if (
                name == "admit"
            ):  # every normalized item: D_sft + probe = the train split, eval = the eval split
                pool = {k: len(io.read_parquet(project / src / f"{k}.parquet")) for k in ("sft", "eval")}
                params["sizes"].update(sft=pool["sft"] - params["sizes"]["probe"], eval=pool["eval"])
            (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            if not (project / out).exists():
                cmd = [sys.executable, str(ROOT / "stages" / f"{name}.py"), src, out, f"{name}.json"]
                subprocess.run(cmd, cwd=project, check=True)
        dirs.append(project / "data" / "admitted" / b)
    return work / "prep" / BATCHES[0] / "params.yaml", dirs


def pools(dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(training pool, held-out pool, knowledge base) over the batches."""
    from clap import io

    def cat(name: str) -> pd.DataFrame:
        return pd.concat([io.read_parquet(d / f"{name}.parquet") for d in dirs], ignore_index=True)

    train = pd.concat([cat("sft"), cat("probe")], ignore_index=True)
    return train, cat("eval"), cat("kb").drop_duplicates("doc_id", ignore_index=True)


def quality_numbers(scored: pd.DataFrame, role: str) -> dict[str, float]:
    rows = scored[scored["model"] == role]
    out = {"pass": float(rows["pass"].mean()), "n": len(rows)}
    for k in ("em", "f1"):
        if k in rows:
            out[k] = float(rows[k].mean())
    for k in ("hallucination", "wrong_fact"):
        out[k] = float(rows[k].mean())
    return out


def run(args: argparse.Namespace) -> None:
    from clap import io
    from clap.chain.grounding import answer_space
    from clap.judge import calibrate as cal
    from clap.judge.evaluation import ModelSpec, evaluate
    from clap.train.sft import train_batch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    params_path, dirs = prepare(work, args.set)
    _, lp = cal.load_params(params_path)
    train_pool, held_pool, kb = pools(dirs)
    rng = np.random.default_rng(SEED)
    order = train_pool.iloc[rng.permutation(len(train_pool))].reset_index(drop=True)
    held = held_pool.iloc[rng.permutation(len(held_pool))[: args.heldout]].reset_index(drop=True)
    base_dir = PROFILE / "models" / "base"
    space = answer_space(lp.normalize, lp.scoring.answer)
    out = work / "points.jsonl"
    done = {json.loads(line)["n_train"] for line in out.read_text().splitlines()} if out.exists() else set()
    t0 = time.perf_counter()
    base_eval = evaluate([ModelSpec("base", None, "", "")], base_dir, held, kb, lp.eval, lp.scoring, space)
    base_s = time.perf_counter() - t0
    for n in args.points:
        if n in done:
            continue
        if n > len(order):
            raise SystemExit(f"point {n}: the training pool holds {len(order)} items")
        steps = -(-n // lp.train.batch_size)
        data = work / f"n{n}" / "data"
        data.mkdir(parents=True, exist_ok=True)
        io.write_parquet(data / "sft.parquet", order.iloc[:n].reset_index(drop=True))
        io.write_parquet(data / "probe.parquet", order.iloc[n : n + steps].reset_index(drop=True))
        io.write_parquet(data / "kb.parquet", kb)
        io.write_json(data / "admission.json", {"verdict": True})
        tp = dataclasses.replace(lp.train, checkpoint_root=str(work / f"n{n}" / "checkpoints"))
        t1 = time.perf_counter()
        result = train_batch(
            data,
            base_dir,
            work / f"n{n}" / "adapter",
            tp,
            lp.detector,
            answer=lp.scoring.answer,
            bp=lp.budget,
        )
        train_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        gate = cal.gate_run(
            base_eval,
            cal.candidate_spec(work / f"n{n}" / "adapter"),
            base_dir,
            held,
            kb,
            result.record,
            True,
            lp,
        )
        eval_s = time.perf_counter() - t2
        cand_scored = gate_scored(gate)
        quality = next(c for c in gate.checks if c.name == "quality")
        rec = result.record
        point = {
            "n_train": n,
            "n_heldout": len(held),
            "train_pool": len(order),
            "probe_items": int(min(steps, len(order) - n)),
            "base": quality_numbers(base_eval[0], "base"),
            "candidate": cand_scored,
            **{
                k: gate.numbers.get(k)
                for k in ("b", "c", "pvalue", "delta", "lcb", "rule_power_at_delta_star")
            },
            "learned": quality.cap == "promote",
            "quality_detail": quality.detail,
            "decision": gate.decision,
            "rule": gate.rule,
            **{
                k: rec.get(k)
                for k in (
                    "steps",
                    "train_loss_start",
                    "train_loss_end",
                    "probe_loss_start",
                    "probe_loss_end",
                    "detector_checks",
                    "detector_alarm_step",
                    "detector_max_log_e",
                    "detector_seconds",
                    "rows_dropped",
                )
            },  # fmt: skip
            "train_s": round(train_s, 1),
            "eval_s": round(eval_s, 1),
            "base_eval_s": round(base_s, 1),
            "machine": machine(),
            "overrides": args.set,
            "commit": _commit(),
        }
        with out.open("a") as f:
            f.write(json.dumps(point) + "\n")
        print(json.dumps(point), flush=True)
        shutil.rmtree(work / f"n{n}" / "checkpoints", ignore_errors=True)
        gc.collect()


def gate_scored(gate: Any) -> dict[str, float]:
    """The candidate's held-out numbers: pass and risk rates, and TAT-QA EM/F1 over all items."""
    out = {k: gate.numbers.get(f"candidate_{k}") for k in ("pass_rate",)}
    out |= {k: gate.numbers.get(k) for k in ("hallucination_rate", "wrong_fact_rate")}
    every = next((m for m in gate.answer_metric if m["slice"] == "all"), {})
    return out | {m: every.get(f"candidate_{m}") for m in ("em", "f1")}


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip()


def _lever(override: str) -> str:
    """An override as the table shows it: ``key=value``, ``task.answer: value first``, or
    ``context: N docs (+ cue)``."""
    key, value = override.split("=", 1)
    if key == "task.answer" and value.lstrip("{ ").startswith("value"):
        return f"{key}: value first"
    if key == "task.context":
        spec = yaml.safe_load(value)
        return f"context: {spec['docs']} docs" + (" + unit cue" if spec.get("cues") else "")
    return override


def _detector(p: dict[str, Any]) -> str:
    """``max log E (checks)``, ``alarm at step s`` when it alarmed, ``off`` when the run had no checks."""
    if not p.get("detector_checks"):
        return "off"
    alarm = p.get("detector_alarm_step")
    tail = f", alarm at step {alarm}" if isinstance(alarm, int) and alarm > 0 else ""
    return f"{p['detector_max_log_e']:.2f} ({p['detector_checks']} checks{tail})"


def report(args: argparse.Namespace) -> None:
    """``benchmarks/results/tatqa_learning_curve.{json,md}`` from the points of every ``WORK`` folder."""
    points = [
        json.loads(line) for w in args.work for line in (Path(w) / "points.jsonl").read_text().splitlines()
    ]
    points.sort(key=lambda p: (p["overrides"] != [], str(p["overrides"]), p["n_train"]))
    head = {
        "commit": sorted({p.get("commit", args.commit) for p in points}),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": cpu_model(),
        "command": "python benchmarks/tatqa_learning_curve.py run WORK [--points ...] [--set ...]; ... report WORK...",
    }
    (RESULTS / "tatqa_learning_curve.json").write_text(
        json.dumps({**head, "points": points}, indent=1) + "\n"
    )
    p0 = points[0]
    lines = [
        "# TAT-QA learning curve (issue 37)",
        "",
        f"Commits {', '.join(head['commit'])}; reported {head['date']}; 2 cores, the machine of each point in its row; "
        f"`{head['command']}`.",
        "",
        f"Training items: the first n of one seeded permutation of the train splits of {', '.join(BATCHES)} "
        "(nested: each point adds items), one epoch, the profile's params otherwise; held-out: "
        f"{p0['n_heldout']} items of their eval splits (tables no training item comes from), the same for "
        "every point and for the base. The quality rule is the gate's own (one-sided exact McNemar p < alpha, "
        f"gain >= delta*, lower bound >= lcb_floor); its power at a true gain of delta* at this N: "
        f"{p0['rule_power_at_delta_star']:.2f}. Wall times ran beside other work on the machine "
        "(the load is in each point's `machine`); compare them within a row, not across sessions. Every point so far "
        "pooled the three-group derivation's reports-a and reports-b (before commit c751fa9 re-derived two larger "
        "groups); the points of commit aad7a43 ran on its tree before it was committed, the context knob then named "
        "`task.context_docs`.",
        "",
        "| levers | training items (of pool) | steps | base EM / F1 / pass | candidate EM / F1 / pass | wrong fact "
        "| b / c | p | quality rule | detector max log E (checks) | train s | eval s | machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        b, c = p["base"], p["candidate"]
        lever = "; ".join(_lever(o) for o in p["overrides"]) or "profile defaults"
        lines.append(
            f"| {lever} | {p['n_train']} ({p.get('train_pool', 'n/a')}) | {p['steps']} | {b['em']:.3f} / {b['f1']:.3f} / {b['pass']:.3f} | "
            f"{c['em']:.3f} / {c['f1']:.3f} / {c['pass_rate']:.3f} | {c['wrong_fact_rate']:.2f} | {p['b']} / {p['c']} | "
            f"{p['pvalue']:.3g} | {'passed' if p['learned'] else 'failed'} | {_detector(p)} | "
            f"{p['train_s']:.0f} | {p['eval_s']:.0f} | {p['machine'].split(',')[0]} |"
        )
    (RESULTS / "tatqa_learning_curve.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("work")
    r.add_argument("--points", type=int, nargs="+", default=[32, 64, 128])
    r.add_argument("--heldout", type=int, default=120)
    r.add_argument("--set", action="append", default=[], help="a profile param, dotted (e.g. train.lr=5e-4)")
    rep = sub.add_parser("report")
    rep.add_argument("work", nargs="+")
    rep.add_argument("--commit", default="fc491c3", help="the commit points that record none ran on")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    main()
