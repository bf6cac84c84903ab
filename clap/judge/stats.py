"""Paired statistics for the post-training gate: exact one-sided McNemar, a lower bound, power.

Candidate and baseline are scored on the same held-out items in the same order. With
b = items only the candidate gets right and c = items only the baseline gets right, the
one-sided exact McNemar p-value is P(Bin(b + c, 1/2) >= b); no discordant pair means no
evidence (p = 1). The paired difference is (b - c) / N over all N pairs. Because
"p < alpha and delta_hat >= delta*" passes only about half the time when the true gain
equals delta*, the gate also reports a one-sided lower confidence bound on the difference
(Tango's score bound) and the minimum detectable effect for the N actually used
(exact conditional power, as SAS PROC POWER DIST=EXACT_COND). Risk rates (hallucination,
wrong facts, regressions) get an exact one-sided lower bound, so a gate rejects only a rate
that is over its bound beyond sampling noise at the N used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.stats import beta, binom, binomtest, norm


@dataclasses.dataclass(frozen=True)
class PairedResult:
    """Outcome of a paired candidate-vs-baseline comparison.

    Attributes:
        n: paired items; b: candidate-only wins; c: baseline-only wins.
        delta: (b - c) / n, the paired difference of pass rates.
        pvalue: one-sided exact McNemar p-value (1.0 without discordant pairs).
        lcb: one-sided lower confidence bound on the difference at ``1 - alpha``.
        discordance: (b + c) / n.
    """

    n: int
    b: int
    c: int
    delta: float
    pvalue: float
    lcb: float
    discordance: float


def discordant_counts(candidate: Sequence[bool], baseline: Sequence[bool]) -> tuple[int, int, int]:
    """(n, b, c) for two paired pass vectors of the same items in the same order."""
    y1, y0 = np.asarray(candidate, dtype=bool), np.asarray(baseline, dtype=bool)
    if y1.shape != y0.shape or y1.ndim != 1:
        raise ValueError(f"paired vectors must be 1-D and equally long, got {y1.shape} and {y0.shape}")
    return int(y1.size), int(np.sum(y1 & ~y0)), int(np.sum(~y1 & y0))


def mcnemar_pvalue(b: int, c: int) -> float:
    """One-sided exact McNemar p-value P(Bin(b+c, 1/2) >= b); 1.0 when b + c = 0."""
    if b + c == 0:
        return 1.0
    return float(binomtest(b, b + c, 0.5, alternative="greater").pvalue)


def _tango_gap(delta0: float, n: int, b: int, c: int, z: float) -> float:
    """Numerator minus z times the standard error of Tango's score statistic at delta0."""
    a_ = 2.0 * n
    b_ = -b - c + (2.0 * n - b + c) * delta0
    c_ = -c * delta0 * (1.0 - delta0)
    q21 = (math.sqrt(max(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (
        2.0 * a_
    )  # restricted MLE of P(baseline-only win)
    var = max(n * (2.0 * q21 + delta0 * (1.0 - delta0)), 0.0)
    return (b - c - n * delta0) - z * math.sqrt(var)


def paired_lcb(n: int, b: int, c: int, alpha: float) -> float:
    """One-sided ``1 - alpha`` lower confidence bound on the paired difference (Tango 1998 score bound).

    Args:
        n: paired items (> 0); b, c: discordant counts.
        alpha: one-sided error rate.

    Returns:
        The smallest difference the score test at level alpha does not reject, in [-1, delta_hat].
    """
    if n <= 0:
        raise ValueError("no paired items")
    z, hi = float(norm.ppf(1.0 - alpha)), (b - c) / n
    if _tango_gap(-1.0, n, b, c, z) <= 0.0:
        return -1.0
    if _tango_gap(hi, n, b, c, z) >= 0.0:  # zero variance at the estimate: step inside
        hi -= 1e-9
    return float(brentq(_tango_gap, -1.0, hi, args=(n, b, c, z), xtol=1e-10))


def rate_lcb(k: int, n: int, alpha: float) -> float:
    """One-sided ``1 - alpha`` exact (Clopper-Pearson) lower confidence bound on a rate ``k / n``.

    The smallest true rate under which seeing ``k`` or more events in ``n`` has probability
    at least alpha; 0 when ``k == 0``.
    """
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def paired_test(candidate: Sequence[bool], baseline: Sequence[bool], alpha: float) -> PairedResult:
    """McNemar p-value, paired difference and its lower bound for two pass vectors."""
    n, b, c = discordant_counts(candidate, baseline)
    if n == 0:
        raise ValueError("no paired items")
    return PairedResult(n, b, c, (b - c) / n, mcnemar_pvalue(b, c), paired_lcb(n, b, c, alpha), (b + c) / n)


def critical_wins(d: np.ndarray, alpha: float) -> np.ndarray:
    """For each count d of discordant pairs, the fewest wins b with P(Bin(d, 1/2) >= b) < alpha.

    ``d + 1`` (unreachable) when no count of wins is significant.
    """
    d = np.asarray(d, dtype=np.int64)
    k = binom.ppf(1.0 - alpha, d, 0.5).astype(np.int64) + 1  # P(Bin >= k) <= alpha
    k = np.where(binom.sf(k - 1, d, 0.5) >= alpha, k + 1, k)  # the test needs p < alpha strictly
    return np.minimum(k, d + 1)


def mcnemar_power(n: int, delta: float, discordance: float, alpha: float) -> float:
    """Exact unconditional power of the one-sided exact McNemar test.

    Discordant pairs D ~ Bin(n, discordance); given D = d the wins are Bin(d, pi) with
    pi = (discordance + delta) / (2 discordance); the test rejects when p < alpha.
    """
    if not 0.0 < discordance <= 1.0 or abs(delta) > discordance:
        raise ValueError(f"need 0 < discordance <= 1 and |delta| <= discordance, got {delta}, {discordance}")
    d = np.arange(n + 1)
    win = (discordance + delta) / (2.0 * discordance)
    reject = binom.sf(critical_wins(d, alpha) - 1, d, win)
    return float(np.sum(binom.pmf(d, n, discordance) * reject))


@lru_cache(maxsize=64)  # pure and ~0.5 s per call: the gate asks the same question for every batch
def required_pairs(
    delta: float, discordance: float, alpha: float, power: float, stay: int = 50, n_max: int = 5000
) -> int:
    """Fewest pairs with power >= ``power`` that keeps it for the next ``stay`` sizes (power is saw-toothed)."""
    run_start, run = None, 0
    for n in range(1, n_max + 1):
        if mcnemar_power(n, delta, discordance, alpha) >= power:
            run_start, run = (n if run == 0 else run_start), run + 1
            if run > stay:
                return int(run_start)
        else:
            run = 0
    raise ValueError(f"power {power} not reached within {n_max} pairs")


def minimum_detectable_effect(n: int, discordance: float, alpha: float, power: float) -> float:
    """Smallest true difference detected with probability >= ``power`` at ``n`` pairs.

    The difference cannot exceed the discordance; when even delta = discordance is not
    detectable (or there is no discordance) the result is 1.0: nothing is detectable.
    """
    if discordance <= 0.0 or mcnemar_power(n, discordance, discordance, alpha) < power:
        return 1.0
    gap = lambda delta: mcnemar_power(n, delta, discordance, alpha) - power  # noqa: E731
    if gap(0.0) >= 0.0:
        return 0.0
    return float(brentq(gap, 0.0, discordance, xtol=1e-6))
