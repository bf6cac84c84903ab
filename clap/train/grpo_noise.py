"""Noise-aware reward rules of the GRPO probe: a collapse or plateau only beyond sampling noise.

A probe step's mean reward comes from ``prompts_per_step`` prompts drawn afresh and
``num_generations`` sampled completions each, so it moves from step to step by chance alone:
with 4 completions of one prompt, a harder prompt at step 4 drops the mean by 0.3 while the
policy barely moved (the demo's first "reward_collapse"). The calm null here is exactly that:
a policy that does not change, so the step means are i.i.d. (exchangeable: the prompt order is
a random shuffle) with whatever between-prompt and within-group spread the task has.

- **collapse**: the step means fall with time beyond chance: Kendall's one-sided decline test of
  ``reward_1..reward_t`` against the step order (exact permutation distribution; tied pairs
  counted as no decline, which can only raise the p-value), and the mean is more than
  ``max_reward_drop`` below its best so far (the effect size). Distribution-free: it holds for
  any group size, reward std or prompt mix, because under the null every order is equally likely.
- **plateau**: over ``plateau_window`` steps the step means vary *less* than the groups' own
  sampling noise allows: the lower tail of the one-way ANOVA ratio
  ``F = n * var(step means) / mean(reward_std^2)`` with ``(w - 1, w * (n - 1))`` degrees of freedom,
  ``n`` completions per step. Prompt-to-prompt spread only makes F larger, so the test is
  conservative under the calm null (exact for normal rewards and one difficulty).

``reward_false_hold`` is the per-run level: the rules that can be checked share it equally, and
each rule splits its share over the steps it checks (Bonferroni), so a calm run is held by the
reward rules with probability at most that level over the whole run. The collapse rule is
checked from the first step at which the exact test can reach its per-step level (at least
``t`` steps with ``1/t! <= share / checks``), never earlier; with 4 steps that is step 4 only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from clap.params import check_keys
from clap.train.grpo_policy import GrpoThresholds


@dataclass(frozen=True)
class RewardTests:
    """The reward rules' design for one probe: the steps each rule checks and its per-step level."""

    level: float
    group_size: int
    collapse_steps: tuple[int, ...]
    collapse_step_level: float
    plateau_steps: tuple[int, ...]
    plateau_step_level: float

    def record(self) -> dict[str, float | int]:
        """Flat record fields: where each rule starts checking (-1: never) and its per-step level."""
        return {
            "reward_test_level": self.level,
            "reward_test_group_size": self.group_size,
            "collapse_checked_from": self.collapse_steps[0] if self.collapse_steps else -1,
            "collapse_step_level": self.collapse_step_level,
            "plateau_checked_from": self.plateau_steps[0] if self.plateau_steps else -1,
            "plateau_step_level": self.plateau_step_level,
        }


def collapse_steps(planned_steps: int, share: float) -> tuple[int, ...]:
    """Steps ``t0..planned_steps`` with ``t0`` the first step whose exact minimum p (``1/t0!``) reaches
    ``share / (planned_steps - t0 + 1)``; () when no step can."""
    for t0 in range(2, planned_steps + 1):
        if 1.0 / math.factorial(t0) <= share / (planned_steps - t0 + 1):
            return tuple(range(t0, planned_steps + 1))
    return ()


def reward_tests(t: GrpoThresholds, planned_steps: int, group_size: int) -> RewardTests:
    """The design of the reward rules for a probe of ``planned_steps`` steps of ``group_size`` completions."""
    check_keys(  # a step's completions: grpo.prompts_per_step x grpo.num_generations (itself >= 2)
        {
            "grpo.thresholds.reward_false_hold": 0.0 < t.reward_false_hold < 1.0,
            "grpo.prompts_per_step": group_size >= 2,
            "grpo.max_steps": planned_steps >= 1,
        },
        "grpo: thresholds.reward_false_hold must be in (0, 1), a step needs >= 2 completions and >= 1 step",
    )
    plateau_on = 2 <= t.plateau_window <= planned_steps
    share = t.reward_false_hold / (2 if plateau_on else 1)
    c_steps = collapse_steps(planned_steps, share)
    p_steps = tuple(range(t.plateau_window, planned_steps + 1)) if plateau_on else ()
    return RewardTests(
        level=t.reward_false_hold,
        group_size=group_size,
        collapse_steps=c_steps,
        collapse_step_level=share / len(c_steps) if c_steps else 0.0,
        plateau_steps=p_steps,
        plateau_step_level=share / len(p_steps) if p_steps else 0.0,
    )


@lru_cache(maxsize=64)
def _inversion_tail(n: int) -> tuple[float, ...]:
    """P(I >= k), k = 0..n(n-1)/2, for the inversion count I of a uniformly random permutation of n."""
    dist = np.ones(1)
    for m in range(2, n + 1):  # inserting the m-th element adds 0..m-1 inversions, uniformly
        dist = np.convolve(dist, np.full(m, 1.0 / m))
    return tuple(np.cumsum(dist[::-1])[::-1].tolist())


def decline_pvalue(values: Sequence[float]) -> tuple[int, float]:
    """(strictly declining pairs, one-sided exact p) of Kendall's decline test of ``values`` against their order.

    The statistic counts pairs ``i < j`` with ``values[i] > values[j]``; ties count as no decline,
    so the p-value is never below that of any tie-breaking (conservative under ties).
    """
    x = np.asarray(values, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)):
        return 0, 1.0
    declining = int(np.sum(np.triu(x[:, None] > x[None, :], k=1)))
    return declining, float(_inversion_tail(x.size)[declining])


def plateau_pvalue(
    means: Sequence[float], stds: Sequence[float], group_size: int
) -> tuple[float, float] | None:
    """(F, lower-tail p) of the step means varying less than the groups' sampling noise; None when the
    groups have no spread (every reward std 0: the zero-variance rule's case) or a value is missing."""
    from scipy import stats

    m, s = np.asarray(means, dtype=float), np.asarray(stds, dtype=float)
    if m.size < 2 or m.size != s.size or not (np.all(np.isfinite(m)) and np.all(np.isfinite(s))):
        return None
    within = float(np.mean(s**2))
    if within <= 0.0:
        return None
    f = group_size * float(np.var(m, ddof=1)) / within
    return f, float(stats.f.cdf(f, m.size - 1, m.size * (group_size - 1)))
