"""Online TBDL detector: an e-process (betting or empirical-Bernstein) on paired clean-probe gap increments.

A run "trains but does not learn" when its training loss improves much more than the loss
on clean held-out probe items. At each check ``j`` the step's own training batch ``B_j`` and a
fresh, non-overlapping probe draw ``P_j`` give one gap increment (nats per completion token)::

    g_j = (L_ref(B_j) - L_j(B_j)) - (L_ref(P_j) - L_j(P_j))

L_j(B_j) is the logged training loss of check step j (a batch not trained on yet: epochs 1)
and L_j(P_j) the probe draw scored just before that step, so both are taken at the same
parameters. L_ref is the model the run starts from (the base model, or the adapter a warm
start continues) on the *same* items: both sides are paired item by item, so item difficulty
and any difference in level between the training and the probe items cancel, and no
baseline estimated once per run (a run-level offset shared by every increment) enters.

Under the null that the training items are exchangeable with the clean probe items (a clean
batch), B_j and P_j are both unseen by the parameters they are scored at, so the expected
training improvement equals the expected probe improvement: E[g_j | past] = 0. A relabelled
or wrong-column run improves on its own targets only, and g_j drifts positive.

g_j is clipped to [-B, B] and mapped to x_j in [0, 1]. Null H0: E[x_j | past] <= m0 with
m0 = (gamma0 + B) / (2B), i.e. "the training improvement exceeds the probe improvement by at
most the pre-registered tolerance gamma0". The e-process is a fixed mixture of bets
(Waudby-Smith & Ramdas 2024)::

    E_t = sum_k w_k prod_{i<=t} F(lam_k, x_i)
    betting:             F = 1 + (lam / m0) (x_i - m0)                       (lam in (0, 1))
    empirical_bernstein: F = exp(lam (x_i - m0) - psi(lam) (x_i - muhat_{i-1})^2),
                         psi(lam) = -log(1-lam) - lam,  muhat_{i-1} = (1/2 + sum_{k<i} x_k) / i

Either is a nonnegative supermartingale under every null mean <= m0, so by Ville's inequality
P_H0(E_t >= 1/alpha for some t) <= alpha, at any run length. The alarm is sticky. Validity
needs increments whose conditional mean satisfies the null: each probe item is drawn once
(no reuse) and each training batch is seen once, so checks are spread evenly over the planned
steps (:func:`check_steps`), the last one at the last step, as many as the probe pool allows.
The argument, sample sizes and what is not covered: docs/detector.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp


@dataclass(frozen=True)
class DetectorParams:
    """params.yaml ``detector`` (every constant pre-registered before a run).

    Attributes:
        enabled: run the detector (False: curves and record carry no detector values).
        alpha: per-run false-alarm bound; alarm at E_t >= 1/alpha.
        clip: B, increments are clipped to [-B, B] nats.
        null_gap: gamma0, the tolerated excess of training over probe improvement (nats);
            m0 = (gamma0 + B) / (2B).
        lambdas: the fixed bet sizes, each in (0, 1) (betting: as a fraction of the largest bet 1/m0).
        weights: their mixture weights (>= 0, summing to 1).
        process: ``empirical_bernstein`` (bets penalised by the predictable variance) or ``betting``
            (each factor 1 + (lambda / m0)(x - m0): grows up to log(1/m0) a check on a steady signal).
        probe_draw: fresh probe items scored per check (draws never overlap; the number of
            checks is the probe pool over this, at most one per step: :func:`check_steps`).
        seed: seed of the probe draw order.
        stop_on_alarm: stop training at the alarm (else only record it).
    """

    enabled: bool
    alpha: float
    clip: float
    null_gap: float
    lambdas: Sequence[float]
    weights: Sequence[float]
    process: str
    probe_draw: int
    seed: int
    stop_on_alarm: bool


def null_mean(p: DetectorParams) -> float:
    """m0 of the rescaled increments: (gamma0 + B) / (2B)."""
    return (p.null_gap + p.clip) / (2 * p.clip)


def to_unit(gap: float, clip: float) -> float:
    """Clip a gap increment to [-clip, clip] and map it linearly to [0, 1]."""
    return float((np.clip(gap, -clip, clip) + clip) / (2 * clip))


def gap_increment(train_ref: float, train_now: float, probe_ref: float, probe_now: float) -> float:
    """Training improvement minus probe improvement (positive: training says more than the probe)."""
    return (train_ref - train_now) - (probe_ref - probe_now)


def check_steps(planned_steps: int, pool: int, draw: int) -> list[int]:
    """The optimizer steps (1-based) a run checks at: ``min(planned_steps, pool // draw)`` checks,
    spread evenly so that the last check is at the last planned step.

    Each check consumes ``draw`` probe items that are never drawn again, so a pool smaller than
    the run spaces the checks out instead of running dry part way (a fault that shows late is
    still watched); a pool as large as the run checks every step.
    """
    checks = min(planned_steps, pool // draw) if draw > 0 else 0
    return [-(-i * planned_steps // checks) for i in range(1, checks + 1)] if checks > 0 else []


def _check(m0: float, lambdas: Sequence[float], weights: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    lam, w = np.asarray(lambdas, float), np.asarray(weights, float)
    if not 0 < m0 < 1:
        raise ValueError(f"m0 must be in (0, 1), got {m0}")
    if lam.ndim != 1 or lam.shape != w.shape or not np.all((lam > 0) & (lam < 1)):
        raise ValueError("lambdas must be in (0, 1), one weight per lambda")
    if np.any(w < 0) or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise ValueError("weights must be >= 0 and sum to 1")
    return lam, w


PROCESSES = ("empirical_bernstein", "betting")


def _log_factors(
    x: np.ndarray, muhat_prev: np.ndarray, m0: float, lam: np.ndarray, process: str
) -> np.ndarray:
    """log of each bet's factor for increments ``x`` (any shape; a trailing axis is added for the bets).

    empirical_bernstein: lam (x - m0) - psi(lam) (x - muhat_prev)^2 (Waudby-Smith & Ramdas 2024, Thm 2).
    betting: log(1 + (lam / m0) (x - m0)), lam the fraction of the largest bet 1/m0 that keeps every
    factor positive (their Sec. 4, fixed bets): E[factor | past] <= 1 whenever E[x | past] <= m0.
    """
    if process == "betting":
        return np.log1p((lam / m0) * (x[..., None] - m0))
    if process == "empirical_bernstein":
        psi = -np.log1p(-lam) - lam
        return lam * (x[..., None] - m0) - psi * ((x - muhat_prev)[..., None] ** 2)
    raise ValueError(f"process must be one of {PROCESSES}, got {process!r}")


def log_e_paths(
    x: np.ndarray,
    m0: float,
    lambdas: Sequence[float],
    weights: Sequence[float],
    process: str = "empirical_bernstein",
) -> np.ndarray:
    """log E_t for every prefix of each row of ``x`` (shape (runs, T), values in [0, 1]) at once."""
    lam, w = _check(m0, lambdas, weights)
    x = np.atleast_2d(np.asarray(x, float))
    t = np.arange(1, x.shape[1] + 1)
    muhat_prev = (0.5 + np.cumsum(x, axis=1) - x) / t  # uses x_1..x_{t-1} only
    terms = _log_factors(x, muhat_prev, m0, lam, process)
    return logsumexp(np.cumsum(terms, axis=1) + np.log(np.maximum(w, 1e-300)), axis=2)


@dataclass
class EProcess:
    """Streaming e-process; :meth:`update` takes one increment already in [0, 1]."""

    m0: float
    alpha: float
    lambdas: Sequence[float]
    weights: Sequence[float]
    process: str = "empirical_bernstein"
    t: int = 0
    sum_x: float = 0.0
    log_k: list[float] = field(default_factory=list)
    alarm_at: int | None = None  # 1-based index of the increment that crossed the threshold

    def __post_init__(self) -> None:
        _check(self.m0, self.lambdas, self.weights)
        if self.process not in PROCESSES:
            raise ValueError(f"process must be one of {PROCESSES}, got {self.process!r}")
        if not self.log_k:
            self.log_k = [0.0] * len(self.lambdas)

    @property
    def log_threshold(self) -> float:
        return math.log(1 / self.alpha)

    @property
    def log_e(self) -> float:
        return float(
            logsumexp(np.asarray(self.log_k) + np.log(np.maximum(np.asarray(self.weights, float), 1e-300)))
        )

    def update(self, x: float) -> bool:
        """Add one increment; returns whether the (sticky) alarm is on."""
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"increment must be clipped and rescaled into [0, 1], got {x}")
        lam = np.asarray(self.lambdas, float)
        muhat_prev = np.asarray((0.5 + self.sum_x) / (self.t + 1))
        factors = _log_factors(np.asarray(x, float), muhat_prev, self.m0, lam, self.process)
        self.log_k = list(np.asarray(self.log_k) + factors)
        self.t += 1
        self.sum_x += x
        if self.alarm_at is None and self.log_e >= self.log_threshold:
            self.alarm_at = self.t
        return self.alarm_at is not None

    def state(self) -> dict[str, Any]:
        """JSON-able state (for checkpoint resume)."""
        return {
            "t": self.t,
            "sum_x": self.sum_x,
            "log_k": [float(v) for v in self.log_k],
            "alarm_at": self.alarm_at,
        }


def min_checks_to_alarm(p: DetectorParams, limit: int = 1000) -> int:
    """The fewest checks after which the alarm can fire at all: every increment at its maximum (x = 1).

    A run with fewer checks (a probe pool smaller than this, over ``probe_draw``) cannot alarm whatever
    it learns; the train stage says so and the record carries the number.
    """
    log_e = log_e_paths(np.ones((1, limit)), null_mean(p), p.lambdas, p.weights, p.process)[0]
    hits = np.flatnonzero(log_e >= math.log(1 / p.alpha))
    return int(hits[0]) + 1 if hits.size else limit + 1


def make_eprocess(p: DetectorParams, state: dict[str, Any] | None = None) -> EProcess:
    """The e-process the params pre-register, optionally restored from :meth:`EProcess.state`."""
    return EProcess(null_mean(p), p.alpha, list(p.lambdas), list(p.weights), p.process, **(state or {}))


def replay(gaps: Sequence[float], p: DetectorParams) -> tuple[np.ndarray, int]:
    """log E_t of a recorded gap series under the constants ``p``, and the 1-based alarm index (-1: none).

    The gap increments do not depend on alpha, clip, null_gap, lambdas or weights, so a run's
    curves can be re-read under other constants (calibration on fault-injected runs).
    """
    x = np.array([[to_unit(g, p.clip) for g in gaps]])
    log_e = log_e_paths(x, null_mean(p), p.lambdas, p.weights, p.process)[0] if len(gaps) else np.zeros(0)
    hits = np.flatnonzero(log_e >= math.log(1 / p.alpha))
    return log_e, int(hits[0]) + 1 if hits.size else -1
