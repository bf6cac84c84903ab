"""clap.train.grpo_noise: the reward rules against scipy, and their false-hold rate on simulated calm runs.

The calm null is simulated independently of the rules: a policy that does not change, a fresh
prompt per step (difficulty drawn from a Beta law), ``num_generations`` completions scored like the
field-level reward (k of 9 fields right). A calm run must be held by reward_collapse or
reward_plateau with probability <= ``reward_false_hold`` (a 99% Clopper-Pearson lower bound above it
fails), and a simulated real collapse (mean falling, reward std -> 0) must be held.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from clap.errors import ClapError
from clap.train.grpo_diagnosis import first_signal
from clap.train.grpo_noise import collapse_steps, decline_pvalue, plateau_pvalue, reward_tests
from clap.train.grpo_policy import GrpoThresholds

LEVEL = 0.05


def thresholds(plateau_window: int = 6, max_reward_drop: float = 0.3) -> GrpoThresholds:
    """The committed params' thresholds (max_kl etc. never fire on the simulated rows)."""
    return GrpoThresholds(
        max_kl=1.0,
        kl_window=4,
        max_kl_slope=0.1,
        max_reward_drop=max_reward_drop,
        reward_false_hold=LEVEL,
        zero_std_patience=0,  # not one of the rules under test here
        plateau_window=plateau_window,
        max_length_drift=0.5,
        max_clipped_ratio=0.5,
        clipped_patience=3,
    )


def rows_of(means, stds, zero=None) -> list[dict]:
    zero = [0.0] * len(means) if zero is None else zero
    return [
        {
            "step": i + 1,
            "kl": 0.0,
            "reward": float(m),
            "reward_std": float(s),
            "completion_length": 60.0,
            "clipped_ratio": 0.0,
            "frac_reward_zero_std": float(z),
            "loss": 0.0,
            "grad_norm": 0.1,
        }
        for i, (m, s, z) in enumerate(zip(means, stds, zero, strict=True))
    ]


def held_at(rows, t, tests) -> tuple[str, int] | None:
    """(name, step) of the first signal over the run's prefixes (as the callback checks them), or None."""
    for i in range(1, len(rows) + 1):
        found = first_signal(rows[:i], t, tests)
        if found is not None:
            return found.name, found.step
    return None


def simulate(rng, steps, generations, prompts, mu, tau, drift=0.0):
    """One run's (step means, batch stds): difficulty ~ Beta(mean mu + drift*step, sd tau) per prompt
    (fixed when tau is 0), each completion k/9 with k ~ Binomial(9, difficulty)."""
    means, stds = [], []
    for s in range(steps):
        m = min(max(mu + drift * s, 0.005), 0.995)
        if tau > 0:
            nu = m * (1 - m) / tau**2 - 1
            q = rng.beta(m * nu, (1 - m) * nu, size=prompts)
        else:
            q = np.full(prompts, m)
        r = rng.binomial(9, np.repeat(q, generations)) / 9.0
        means.append(r.mean())
        stds.append(r.std(ddof=1))
    return means, stds


def upper_is_fine(holds: int, n: int) -> float:
    """99% one-sided Clopper-Pearson lower bound of the hold rate."""
    return 0.0 if holds == 0 else float(stats.beta.ppf(0.01, holds, n - holds + 1))


# --- the statistics against scipy ----------------------------------------------------------------
@pytest.mark.parametrize("n", range(2, 11))
def test_decline_p_is_scipys_exact_kendall(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        x = rng.normal(size=n)
        ref = stats.kendalltau(np.arange(n), x, method="exact", alternative="less").pvalue
        assert decline_pvalue(x)[1] == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert decline_pvalue(np.arange(n, 0, -1))[1] == pytest.approx(1 / math.factorial(n))


def test_ties_never_make_the_decline_test_less_conservative():
    x = [0.9, 0.9, 0.5, 0.5, 0.5, 0.1]
    p_ties = decline_pvalue(x)[1]
    jitter = [-1e-9, 0.0, 1e-9]
    p_broken = [decline_pvalue(np.add(x, eps))[1] for eps in itertools.product(jitter, repeat=len(x))]
    assert p_ties >= max(p_broken) - 1e-12 and p_ties > min(p_broken)


def test_plateau_f_is_scipys_one_way_anova():
    rng = np.random.default_rng(3)
    groups = [rng.binomial(9, 0.6, size=4) / 9.0 for _ in range(6)]
    f, p = plateau_pvalue([g.mean() for g in groups], [g.std(ddof=1) for g in groups], 4)
    ref = stats.f_oneway(*groups)
    assert f == pytest.approx(ref.statistic) and p == pytest.approx(1 - ref.pvalue)
    assert plateau_pvalue([0.5, 0.5], [0.0, 0.0], 4) is None  # no group spread: zero_variance's case


def test_design_splits_the_level_and_never_checks_where_the_test_cannot_reach_it():
    demo = reward_tests(thresholds(plateau_window=6), planned_steps=4, group_size=4)
    assert demo.collapse_steps == (4,) and demo.collapse_step_level == LEVEL and demo.plateau_steps == ()
    long = reward_tests(thresholds(plateau_window=6), planned_steps=32, group_size=8)
    assert long.plateau_steps == tuple(range(6, 33)) and long.plateau_step_level == pytest.approx(
        LEVEL / 2 / 27
    )
    t0 = long.collapse_steps[0]
    assert 1 / math.factorial(t0) <= long.collapse_step_level
    assert 1 / math.factorial(t0 - 1) > LEVEL / 2 / (
        32 - t0 + 2
    )  # one step earlier could not reach its level
    assert collapse_steps(3, 0.05) == () and collapse_steps(4, 0.025) == ()
    with pytest.raises(ClapError, match="reward_false_hold"):
        reward_tests(GrpoThresholds(**{**vars(thresholds()), "reward_false_hold": 0.0}), 4, 4)


# --- calm runs: the false-hold rate ----------------------------------------------------------------
CALM = [  # steps, completions per prompt, prompts per step, mean reward, prompt sd, runs
    (4, 4, 1, 0.86, 0.12, 4000),  # the demo (and the full profile: same grpo section)
    (4, 4, 1, 0.5, 0.25, 4000),  # a mid-reward batch with very uneven prompts
    (8, 4, 1, 0.5, 0.0, 1500),  # one difficulty: the plateau test's exact case
    (16, 4, 1, 0.6, 0.2, 800),
    (16, 8, 2, 0.3, 0.1, 800),
]


@pytest.mark.parametrize("steps, gens, prompts, mu, tau, runs", CALM)
def test_calm_runs_are_held_at_most_at_the_stated_rate(steps, gens, prompts, mu, tau, runs):
    t = thresholds()
    tests = reward_tests(t, steps, gens * prompts)
    rng = np.random.default_rng(steps * 1000 + gens * 10 + prompts)
    holds = sum(
        held_at(rows_of(*simulate(rng, steps, gens, prompts, mu, tau)), t, tests) is not None
        for _ in range(runs)
    )
    assert upper_is_fine(holds, runs) <= LEVEL, f"{holds}/{runs} calm runs held"


def test_the_old_fixed_drop_rule_fails_this_check():
    """The same simulation flags the previous rule (drop > 0.3, no noise test): the check can fail."""
    rng = np.random.default_rng(7)
    runs, holds = 2000, 0
    for _ in range(runs):
        means, _ = simulate(rng, 4, 4, 1, 0.5, 0.25)
        holds += any(max(means[:i]) - means[i - 1] > 0.3 for i in range(1, 5))
    assert upper_is_fine(holds, runs) > LEVEL


# --- real collapses are held ------------------------------------------------------------------------
def test_a_real_collapse_is_held():
    t = thresholds()
    tests = reward_tests(t, 16, 4)
    rng = np.random.default_rng(11)
    held = 0
    for _ in range(200):  # mean 0.8 -> 0.05 over 16 steps, groups collapsing to one answer
        means, stds = simulate(rng, 16, 4, 1, 0.8, 0.05, drift=-0.05)
        stds = [s * (1 - i / 16) for i, s in enumerate(stds)]
        found = held_at(rows_of(means, stds), t, tests)
        held += found is not None and found[0] == "reward_collapse"
    assert held / 200 >= 0.95


def test_the_demo_curve_is_not_held_and_a_monotone_fall_is():
    t = thresholds()
    tests = reward_tests(t, 4, 4)
    demo = rows_of(
        [0.8889, 0.9722, 0.9444, 0.6389], [0.1283, 0.0556, 0.0642, 0.0556]
    )  # plots/grpo/2026-01.csv
    assert held_at(demo, t, tests) is None  # a 0.33 drop at the last step: one hard prompt, not a collapse
    fall = rows_of([0.9, 0.7, 0.5, 0.3], [0.1, 0.05, 0.02, 0.0])
    assert held_at(fall, t, tests) == ("reward_collapse", 4)
    small = rows_of([0.9, 0.85, 0.8, 0.75], [0.1] * 4)  # falling every step, but by less than max_reward_drop
    assert held_at(small, t, tests) is None


def test_a_flat_reward_with_noisy_groups_is_a_plateau():
    t = thresholds(plateau_window=4)
    tests = reward_tests(t, 8, 4)
    flat = rows_of([0.5] * 4, [0.3] * 4)
    assert held_at(flat, t, tests) == ("reward_plateau", 4)


# --- the committed real probes (benchmarks/grpo_probe_runs.py) under the committed rules -------------------
RUNS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "grpo_runs"


def committed_rules():
    from clap import params
    from clap.train.grpo_policy import GrpoParams

    p = params.section("grpo", GrpoParams, RUNS.parents[2] / "params.yaml")
    return p.thresholds, reward_tests(p.thresholds, p.max_steps, p.prompts_per_step * p.num_generations)


def curve(name: str) -> list[dict]:
    import csv

    with (RUNS / f"{name}.csv").open() as fh:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in r.items()} for r in csv.DictReader(fh)]


def test_the_committed_calm_probe_is_not_held_and_the_lr_x100_probe_is_held_by_kl_at_step_2():
    t, tests = committed_rules()
    assert held_at(curve("calm"), t, tests) is None
    assert held_at(curve("kl_lr100"), t, tests) == ("kl_peak", 2)
    unstopped = curve("kl_lr100_unstopped")  # the same setting run on with every stopping rule off
    assert held_at(unstopped, t, tests) == ("kl_peak", 2) and unstopped[-1]["kl"] > 3 * unstopped[1]["kl"]
