"""False-hold rate of the GRPO probe's reward rules on simulated calm runs (the calm null).

A calm run is a policy that does not change: each step draws ``prompts_per_step`` fresh prompts
(difficulty ~ Beta with mean ``mu`` and sd ``tau``; fixed when ``tau`` is 0) and
``num_generations`` completions each, scored like the field-level reward (k of 9 fields right,
k ~ Binomial(9, difficulty)); the step logs the mean, the batch std (Bessel, as TRL logs it) and
the share of zero-variance groups. Each simulated run goes through
:func:`clap.train.grpo_diagnosis.first_signal` step by step, with the committed
``grpo.thresholds`` (KL, length and clipping never fire on these rows). Reported per scenario:

- ``held``: held by reward_collapse or reward_plateau, the rules ``reward_false_hold`` bounds,
  with its 95% Clopper-Pearson interval;
- ``zero_variance``: held by the zero-variance rule alone (a run whose every group is unanimous
  learns nothing; this rule is not a noise test and is not covered by the level);
- ``old_rule``: the previous collapse rule (mean reward more than ``max_reward_drop`` below its best
  at any step, no noise test) on the same runs.

    nice -n 10 .venv/bin/python benchmarks/grpo_calibration.py [--runs 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model, machine  # noqa: E402
from clap import params  # noqa: E402
from clap.train.grpo_diagnosis import first_signal  # noqa: E402
from clap.train.grpo_noise import reward_tests  # noqa: E402
from clap.train.grpo_policy import GrpoParams  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
STEPS = (4, 8, 16, 32)
GROUPS = ((4, 1), (8, 1), (4, 2))  # (num_generations, prompts_per_step)
REWARDS = (  # (mu, tau): the demo's level (2026-01: step means 0.64-0.97), a mid batch, one difficulty, a hard batch
    (0.86, 0.15),
    (0.5, 0.25),
    (0.5, 0.0),
    (0.2, 0.1),
)


def simulate(
    rng: np.random.Generator, steps: int, gens: int, prompts: int, mu: float, tau: float
) -> list[dict]:
    """One calm run's curve rows."""
    rows = []
    for s in range(steps):
        if tau > 0:
            nu = mu * (1 - mu) / tau**2 - 1
            q = rng.beta(mu * nu, (1 - mu) * nu, size=prompts)
        else:
            q = np.full(prompts, mu)
        r = (rng.binomial(9, np.repeat(q, gens)) / 9.0).reshape(prompts, gens)
        rows.append(
            {
                "step": s + 1,
                "kl": 0.0,
                "reward": float(r.mean()),
                "reward_std": float(r.std(ddof=1)),
                "completion_length": 60.0,
                "clipped_ratio": 0.0,
                "frac_reward_zero_std": float(np.mean(r.std(axis=1) == 0.0)),
                "loss": 0.0,
                "grad_norm": 0.1,
            }
        )
    return rows


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    a = (1 - conf) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def scenario(
    p: GrpoParams, steps: int, gens: int, prompts: int, mu: float, tau: float, runs: int, seed: int
) -> dict:
    t = p.thresholds
    tests = reward_tests(t, steps, gens * prompts)
    no_zero = dataclasses.replace(t, zero_std_patience=0)
    rng = np.random.default_rng([seed, steps, gens, prompts, int(mu * 100), int(tau * 100)])
    held = zero = old = 0
    held_steps: list[int] = []
    for _ in range(runs):
        rows = simulate(rng, steps, gens, prompts, mu, tau)
        found = next(
            (f for i in range(1, steps + 1) if (f := first_signal(rows[:i], no_zero, tests)) is not None),
            None,
        )
        if found is not None:
            held += 1
            held_steps.append(found.step)
        zero += (
            any(
                all(r["frac_reward_zero_std"] >= 1.0 for r in rows[i - t.zero_std_patience : i])
                for i in range(t.zero_std_patience, steps + 1)
            )
            if t.zero_std_patience > 0
            else 0
        )
        means = [r["reward"] for r in rows]
        old += any(max(means[:i]) - means[i - 1] > t.max_reward_drop for i in range(1, steps + 1))
    lo, hi = clopper_pearson(held, runs)
    return {
        "steps": steps,
        "num_generations": gens,
        "prompts_per_step": prompts,
        "mu": mu,
        "tau": tau,
        "runs": runs,
        "held": held,
        "held_rate": held / runs,
        "held_ci95": [lo, hi],
        "held_median_step": float(np.median(held_steps)) if held_steps else None,
        "zero_variance_rate": zero / runs,
        "old_rule_rate": old / runs,
        "old_rule_ci95": list(clopper_pearson(old, runs)),
        **tests.record(),
    }


def markdown(res: dict) -> str:
    lines = [
        "# GRPO probe: false-hold rate of the reward rules on simulated calm runs",
        "",
        f"`{res['command']}`; {res['machine']}; {res['wall_s']:.0f} s. Stated level "
        f"(`grpo.thresholds.reward_false_hold`): **{res['level']}** per run. Pooled over all "
        f"{len(res['scenarios'])} scenarios: {res['pooled']['held']}/{res['pooled']['runs']} calm runs held = "
        f"{res['pooled']['held_rate']:.4f} (95% CI {res['pooled']['held_ci95'][0]:.4f}-{res['pooled']['held_ci95'][1]:.4f}); "
        f"worst scenario {res['worst']['held_rate']:.4f} (95% CI {res['worst']['held_ci95'][0]:.4f}-"
        f"{res['worst']['held_ci95'][1]:.4f}). The previous rule (drop > {res['max_reward_drop']} alone) held up to "
        f"{max(s['old_rule_rate'] for s in res['scenarios']):.3f} of the same runs.",
        "",
        "steps | G x P | mu, tau | held (collapse/plateau) | 95% CI | collapse from / plateau from | zero_variance | old rule",
        "---|---|---|---|---|---|---|---",
    ]
    for s in res["scenarios"]:
        lines.append(
            f"{s['steps']} | {s['num_generations']} x {s['prompts_per_step']} | {s['mu']}, {s['tau']} | "
            f"{s['held']}/{s['runs']} = {s['held_rate']:.4f} | {s['held_ci95'][0]:.4f}-{s['held_ci95'][1]:.4f} | "
            f"{s['collapse_checked_from']} / {s['plateau_checked_from']} | {s['zero_variance_rate']:.3f} | {s['old_rule_rate']:.3f}"
        )
    lines += [
        "",
        "G x P: completions per prompt x prompts per step; mu, tau: mean and between-prompt sd of a prompt's expected "
        "reward; -1: the rule never checks at that length (with 4 steps only the collapse rule runs, at step 4). "
        "zero_variance: the share held by the zero-variance rule (every group unanimous for `zero_std_patience` steps), "
        "not a noise test and not under the level. old rule: the collapse rule before the noise test, on the same runs.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    p = params.section("grpo", GrpoParams, ROOT / "params.yaml")
    start = time.perf_counter()
    scen = [
        scenario(p, steps, g, pr, mu, tau, args.runs, args.seed)
        for steps, (g, pr), (mu, tau) in itertools.product(STEPS, GROUPS, REWARDS)
    ]
    held, runs = sum(s["held"] for s in scen), sum(s["runs"] for s in scen)
    worst = max(scen, key=lambda s: s["held_rate"])
    res = {
        "command": f"python benchmarks/grpo_calibration.py --runs {args.runs} --seed {args.seed}",
        "level": p.thresholds.reward_false_hold,
        "max_reward_drop": p.thresholds.max_reward_drop,
        "plateau_window": p.thresholds.plateau_window,
        "pooled": {
            "held": held,
            "runs": runs,
            "held_rate": held / runs,
            "held_ci95": list(clopper_pearson(held, runs)),
        },
        "worst": {
            k: worst[k]
            for k in ("steps", "num_generations", "prompts_per_step", "mu", "tau", "held_rate", "held_ci95")
        },
        "scenarios": scen,
        "cpu_model": cpu_model(),
        "machine": machine(),
        "wall_s": time.perf_counter() - start,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "grpo_calibration.json").write_text(json.dumps(res, indent=2) + "\n")
    (OUT / "grpo_calibration.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
