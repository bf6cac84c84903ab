"""GRPO probe rollouts: clap's batched generator (``grpo.rollouts: clap``) against TRL's ``model.generate``
(``rollouts: trl``), side by side in one process.

Runs :func:`clap.train.grpo.run_probe` (the stage's code) with the committed ``grpo`` params, once per
path and repeat, in alternating order (trl clap, clap trl, ...) so load drift and a process's first,
slower run hit both. It reads a finished
pipeline's outputs (``--root``: data/admitted/<b>, metrics/admit/<b>.json, models/base,
models/adapters/<b>; read only) and times the whole probe and its generation (``GRPOTrainer._generate``,
which calls the rollout function on clap's path). The draws differ between the paths (clap seeds its
own generator per step), so only distributions can agree: the record keeps each run's mean reward,
completion length and KL peak next to the times. Result: medians per path and their ratios.

    nice -n 10 .venv/bin/python benchmarks/grpo_rollouts.py --root /path/to/finished/checkout \
        [--batch 2026-01] [--repeats 3] [--out benchmarks/results/grpo_rollouts.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks.machine import cpu_model, machine  # noqa: E402
from clap import params  # noqa: E402
from clap.task.scoring import scoring_params  # noqa: E402
from clap.train.grpo import run_probe  # noqa: E402
from clap.train.grpo_policy import GrpoParams  # noqa: E402
from clap.train.sft import TrainParams  # noqa: E402


def timed_generation() -> list[float]:
    """Wrap TRL's ``GRPOTrainer._generate`` (both paths pass through it); the list of its call seconds."""
    from trl import GRPOTrainer

    seconds: list[float] = []
    inner = GRPOTrainer._generate

    def wrapped(self, prompts):
        start = time.perf_counter()
        try:
            return inner(self, prompts)
        finally:
            seconds.append(time.perf_counter() - start)

    GRPOTrainer._generate = wrapped
    return seconds


def one_run(root: Path, batch: str, p: GrpoParams, tp: TrainParams, gen_seconds: list[float]) -> dict:
    """One probe; its wall time, generation time and the record's outcome numbers."""
    first = len(gen_seconds)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clap-grpo-rollouts-") as scratch:
        res = run_probe(
            root / "data" / "admitted" / batch,
            root / "metrics" / "admit" / f"{batch}.json",
            root / "models" / "base",
            root / "models" / "adapters" / batch,
            Path(scratch) / "grpo",
            p,
            scoring_params(ROOT / "params.yaml"),
            tp,
        )
    rows = res.curves
    return {
        "rollouts": p.rollouts,
        "probe_wall_s": round(time.perf_counter() - start, 2),
        "generation_s": round(sum(gen_seconds[first:]), 2),
        "steps": res.record["steps"],
        "runtime_verdict": res.record["runtime_verdict"],
        "kl_peak": res.record["kl_peak"],
        "mean_reward": statistics.fmean(float(r["reward"]) for r in rows),
        "mean_completion_length": statistics.fmean(float(r["completion_length"]) for r in rows),
        "curve": [
            {
                k: r[k]
                for k in ("step", "kl", "reward", "reward_std", "frac_reward_zero_std", "completion_length")
            }
            for r in rows
        ],
        "machine": machine(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="a checkout where dvc repro has run (read only)")
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grpo_rollouts.json")
    args = ap.parse_args()
    pfile = ROOT / "params.yaml"
    tp = params.section("train", TrainParams, pfile)
    raw = params.raw_section("grpo", pfile)
    gen_seconds = timed_generation()
    runs = []
    for repeat in range(args.repeats):
        for path in ("trl", "clap") if repeat % 2 == 0 else ("clap", "trl"):
            run = one_run(
                args.root, args.batch, params.build(GrpoParams, {**raw, "rollouts": path}), tp, gen_seconds
            )
            runs.append({**run, "repeat": repeat})
            print(json.dumps(runs[-1]), flush=True)

    def median(path: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["rollouts"] == path)

    summary = {
        path: {
            k: median(path, k)
            for k in ("probe_wall_s", "generation_s", "mean_reward", "mean_completion_length")
        }
        for path in ("trl", "clap")
    }
    result = {
        "about": __doc__.splitlines()[0],
        "command": "python benchmarks/grpo_rollouts.py " + " ".join(sys.argv[1:]),
        "cpu_model": cpu_model(),
        "torch_threads": tp.torch_threads,
        "batch": args.batch,
        "grpo": {
            k: raw[k]
            for k in (
                "max_steps",
                "num_generations",
                "prompts_per_step",
                "max_completion_length",
                "temperature",
            )
        },
        "medians": summary,
        "generation_speedup": summary["trl"]["generation_s"] / summary["clap"]["generation_s"],
        "probe_speedup": summary["trl"]["probe_wall_s"] / summary["clap"]["probe_wall_s"],
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(
        f"generation {result['generation_speedup']:.2f}x, probe {result['probe_speedup']:.2f}x "
        f"(medians of {args.repeats}; {cpu_model()})"
    )


if __name__ == "__main__":
    main()
