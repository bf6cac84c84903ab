"""Start-up of each stage script: the seconds ``python stages/<stage>.py`` takes to import its modules.

``dvc repro`` starts one process per stage and batch (~19 in the demo), and each pays its imports before
it does anything. A stage script run with no arguments imports everything its module level imports, then
prints its usage and exits 2: that wall time is the start-up cost this measures, for a revision before
(default ``main``, checked out in a scratch git worktree) and for this working tree, the runs of the two
interleaved stage by stage so the machine's load falls on both alike; each figure is the median of
``--runs`` runs. It also lists the heavy packages (torch, transformers, trl, peft, datasets, accelerate)
the module level imports (``python -X importtime``). What a stage imports inside ``run`` when it trains
or generates is not start-up and is not measured here.

    python benchmarks/stage_startup.py [--before REV] [--runs N]

Writes benchmarks/results/stage_startup.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("assetize", "normalize", "admit", "base", "train", "grpo", "eval", "replay", "gate", "summary")
HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "accelerate")


def one_run(tree: Path, stage: str) -> tuple[float, list[str]]:
    """Wall seconds of ``python -X importtime stages/<stage>.py`` in ``tree`` and the heavy packages it imported."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", f"stages/{stage}.py"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode != 2 or "usage:" not in done.stderr:
        raise RuntimeError(f"stages/{stage}.py in {tree} did not stop at its usage: {done.stderr[-2000:]}")
    imported = {
        line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    return wall, [h for h in HEAVY if h in imported]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main", help="git revision measured as 'before' (default: main)")
    ap.add_argument("--runs", type=int, default=5, help="runs per stage and tree (the median is reported)")
    args = ap.parse_args()
    before_rev = subprocess.run(
        ["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    after_rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="clap-startup-") as scratch:
        old = Path(scratch) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(old), before_rev],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            rows = {}
            for stage in STAGES:
                walls: dict[str, list[float]] = {"before": [], "after": []}
                heavy: dict[str, list[str]] = {}
                for _ in range(args.runs):
                    for name, tree in (("before", old), ("after", ROOT)):
                        wall, heavy[name] = one_run(tree, stage)
                        walls[name].append(wall)
                b, a = statistics.median(walls["before"]), statistics.median(walls["after"])
                rows[stage] = {
                    "before_s": round(b, 3),
                    "after_s": round(a, 3),
                    "ratio": round(a / b, 3),
                    "before_heavy": heavy["before"],
                    "after_heavy": heavy["after"],
                    "before_runs_s": [round(w, 3) for w in walls["before"]],
                    "after_runs_s": [round(w, 3) for w in walls["after"]],
                }
                print(
                    f"{stage:9s} {b:6.2f} s -> {a:6.2f} s  (x{a / b:.2f})  {heavy['before']} -> {heavy['after']}"
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    result = {
        "what": "wall seconds of `python -X importtime stages/<stage>.py` with no arguments (module-level imports, "
        "then the usage error), median of the runs, before and after interleaved",
        "before": before_rev,
        "after": after_rev,
        "runs": args.runs,
        "cpu_model": cpu_model(),
        "machine": machine(),
        "python": sys.version.split()[0],
        "stages": rows,
        "total_before_s": round(sum(r["before_s"] for r in rows.values()), 3),
        "total_after_s": round(sum(r["after_s"] for r in rows.values()), 3),
    }
    out = ROOT / "benchmarks" / "results"
    (out / "stage_startup.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Stage start-up (benchmarks/stage_startup.py)",
        "",
        f"{result['what']}; {args.runs} runs each; before {before_rev}, after {after_rev}; {result['machine']}.",
        "",
        "| stage | before (s) | after (s) | after/before | heavy imports before | after |",
        "|---|---:|---:|---:|---|---|",
        *(
            f"| {s} | {r['before_s']:.2f} | {r['after_s']:.2f} | {r['ratio']:.2f} | "
            f"{', '.join(r['before_heavy']) or '-'} | {', '.join(r['after_heavy']) or '-'} |"
            for s, r in rows.items()
        ),
        "",
        "train and grpo imported transformers' trainer (torch, peft, accelerate) at module level through the "
        "TrainerCallback classes of clap/train/diagnosis.py and grpo_diagnosis.py; they now live in "
        "clap/train/callbacks.py, imported only when a run trains. A batch that is not admitted (train) or "
        "whose probe is not run (grpo, params grpo.enabled) no longer loads torch at all; one that trains "
        "pays the same imports later, inside run. The other stages already imported torch lazily: their module "
        "level did not change, and their before/after differences are this shared machine's noise.",
        "",
    ]
    (out / "stage_startup.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
