"""clap.judge.stats: the exact McNemar test, its lower bound and power, against identities and tables."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from clap.judge.stats import (
    critical_wins,
    discordant_counts,
    mcnemar_power,
    mcnemar_pvalue,
    minimum_detectable_effect,
    paired_lcb,
    paired_test,
    rate_lcb,
    required_pairs,
)


@pytest.mark.parametrize("b, c", [(1, 0), (5, 5), (41, 12), (3, 17), (60, 10), (0, 4)])
def test_pvalue_is_the_binomial_tail(b, c):
    assert mcnemar_pvalue(b, c) == pytest.approx(binom.sf(b - 1, b + c, 0.5), rel=1e-12)


def test_hand_cases_from_the_research_notes():
    r = paired_test(
        [True] * 41 + [False] * 12 + [True] * 100 + [False] * 147,
        [False] * 41 + [True] * 12 + [True] * 100 + [False] * 147,
        0.05,
    )
    assert (r.n, r.b, r.c) == (300, 41, 12)
    assert r.pvalue == pytest.approx(4.09e-5, rel=1e-2) and r.delta == pytest.approx(29 / 300)
    assert 0 < r.lcb < r.delta


def test_no_discordant_pairs_is_no_evidence():
    r = paired_test([True, False, True], [True, False, True], 0.05)
    assert (r.b, r.c, r.delta, r.pvalue) == (0, 0, 0.0, 1.0)
    assert r.lcb < 0.0


def test_all_losses():
    r = paired_test([False] * 8, [True] * 8, 0.05)
    assert r.pvalue == 1.0 and r.delta == -1.0 and r.lcb == -1.0


def test_all_wins_bound_is_below_one():
    r = paired_test([True] * 5, [False] * 5, 0.05)
    assert r.pvalue == pytest.approx(1 / 32) and 0.0 < r.lcb < 1.0


def test_pairs_must_align():
    with pytest.raises(ValueError):
        discordant_counts([True, False], [True])
    with pytest.raises(ValueError):
        paired_test([], [], 0.05)


def test_critical_wins_is_the_smallest_significant_count():
    d = np.arange(0, 200)
    k = critical_wins(d, 0.05)
    for di, ki in zip(d, k):
        assert ki == di + 1 or binom.sf(ki - 1, di, 0.5) < 0.05
        assert ki == 0 or binom.sf(ki - 2, di, 0.5) >= 0.05  # one fewer win is not significant


def test_false_promotion_rate_at_zero_true_difference_is_within_alpha():
    rng = np.random.default_rng(20260301)
    alpha, reps, n = 0.05, 2000, 200
    hits = 0
    for _ in range(reps):
        base = rng.random(n) < 0.5
        flip = rng.random(n) < 0.2  # 20 % discordance, wins and losses equally likely
        cand = np.where(flip, ~base, base)
        hits += paired_test(cand, base, alpha).pvalue < alpha
    assert hits / reps <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / reps)


def test_lower_bound_covers_the_true_difference():
    rng = np.random.default_rng(7)
    n, disc, delta, reps = 300, 0.2, 0.06, 1000
    d = rng.binomial(n, disc, reps)
    b = rng.binomial(d, (disc + delta) / (2 * disc))
    covered = np.mean([paired_lcb(n, int(bi), int(di - bi), 0.05) <= delta for bi, di in zip(b, d)])
    assert covered >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / reps)


@pytest.mark.parametrize("k, n", [(1, 40), (3, 40), (6, 100), (39, 40)])
def test_rate_lcb_is_where_the_upper_tail_equals_alpha(k, n):
    lcb = rate_lcb(k, n, 0.05)
    assert 0.0 < lcb < k / n
    assert binom.sf(k - 1, n, lcb) == pytest.approx(0.05, abs=1e-9)  # P(X >= k | rate = lcb) = alpha


def test_rate_lcb_hand_cases():
    assert rate_lcb(0, 40, 0.05) == 0.0
    assert rate_lcb(40, 40, 0.05) == pytest.approx(0.05 ** (1 / 40))  # all events: p^n = alpha
    assert rate_lcb(3, 40, 0.05) < 0.05 < rate_lcb(6, 40, 0.05)  # 3/40 is noise against 0.05, 6/40 is not
    with pytest.raises(ValueError):
        rate_lcb(5, 4, 0.05)


def test_rate_lcb_covers_the_true_rate():
    rng = np.random.default_rng(11)
    n, rate, reps = 40, 0.05, 4000
    k = rng.binomial(n, rate, reps)
    covered = np.mean([rate_lcb(int(ki), n, 0.05) <= rate for ki in k])
    assert covered >= 0.95  # exact bounds are conservative: never below the level


def test_power_table_case_delta_006_discordance_02_needs_369_pairs():
    assert required_pairs(0.06, 0.2, 0.05, 0.8) == 369
    assert required_pairs(0.06, 0.1, 0.05, 0.8) == 185
    assert mcnemar_power(369, 0.06, 0.2, 0.05) == pytest.approx(0.800, abs=0.005)


def test_minimum_detectable_effect_inverts_power():
    assert minimum_detectable_effect(369, 0.2, 0.05, 0.8) == pytest.approx(0.06, abs=0.002)
    small = minimum_detectable_effect(60, 0.2, 0.05, 0.8)
    assert small > 0.06 and mcnemar_power(60, small, 0.2, 0.05) == pytest.approx(0.8, abs=1e-3)
    assert minimum_detectable_effect(60, 0.0, 0.05, 0.8) == 1.0
    assert minimum_detectable_effect(3, 0.5, 0.05, 0.8) == 1.0  # 3 pairs can never reach p < .05
