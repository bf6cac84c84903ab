"""clap.train.grpo_diagnosis: each runtime signal fires on its own pattern, a calm trajectory fires none."""

from __future__ import annotations

import math

import pytest

from clap.train.diagnosis import curves_csv
from clap.train.grpo_diagnosis import curve_row, first_signal, slope, trajectory_summary
from clap.train.grpo_noise import reward_tests
from clap.train.grpo_policy import CURVE_COLUMNS, GrpoThresholds

T = GrpoThresholds(
    max_kl=1.0,
    kl_window=3,
    max_kl_slope=0.1,
    max_reward_drop=0.3,
    reward_false_hold=0.05,
    zero_std_patience=3,
    plateau_window=4,
    max_length_drift=0.5,
    max_clipped_ratio=0.5,
    clipped_patience=2,
)
TESTS = reward_tests(T, planned_steps=12, group_size=4)  # collapse checked from step 6, plateau from 4


def row(
    step: int, kl=0.01, reward=0.5, std=0.1, length=80.0, clipped=0.0, zero=0.0, loss=0.01, grad=0.5
) -> dict:
    return {
        "step": step,
        "kl": kl,
        "reward": reward,
        "reward_std": std,
        "completion_length": length,
        "clipped_ratio": clipped,
        "frac_reward_zero_std": zero,
        "loss": loss,
        "grad_norm": grad,
    }


def calm(n: int) -> list[dict]:
    return [row(i + 1, kl=0.01 * (i + 1), reward=0.4 + 0.02 * i) for i in range(n)]


def test_calm_trajectory_fires_nothing():
    rows = calm(8)
    assert all(first_signal(rows[: i + 1], T, TESTS) is None for i in range(len(rows)))


@pytest.mark.parametrize(
    "last, name",
    [
        (row(9, kl=5.0), "kl_peak"),
        (row(9, kl=float("inf")), "nonfinite"),
        (row(9, loss=float("nan")), "nonfinite"),
        (row(9, loss=None), "nonfinite"),  # TRL logs an all-NaN metric as None
        (row(9, grad=float("nan")), "nonfinite"),
        (row(9, length=200.0), "length_drift"),
    ],
)
def test_each_signal_fires_at_the_step_it_appears(last, name):
    found = first_signal([*calm(8), last], T, TESTS)
    assert found is not None and found.name == name and found.step == 9


def test_reward_collapse_needs_a_decline_beyond_noise_and_the_drop():
    one_bad_step = [*calm(8), row(9, reward=0.05)]  # 0.49 below the best, but one low step is noise
    assert first_signal(one_bad_step, T, TESTS) is None
    falling = [row(i, reward=0.9 - 0.15 * (i - 1), std=0.1 / i) for i in range(1, 7)]
    assert all(first_signal(falling[:i], T, TESTS) is None for i in range(1, 6))  # checked from step 6
    found = first_signal(falling, T, TESTS)
    assert (found.name, found.step, found.threshold) == ("reward_collapse", 6, TESTS.collapse_step_level)
    assert found.value == pytest.approx(1 / 720)  # every pair declines: 1/6!


def test_kl_trend_fires_before_the_peak():
    rows = [row(1, kl=0.0), row(2, kl=0.3), row(3, kl=0.6)]
    found = first_signal(rows, T, TESTS)
    assert found.name == "kl_trend" and found.value == pytest.approx(0.3) and found.threshold == 0.1
    assert first_signal(rows[:2], T, TESTS) is None  # the window needs kl_window points


def test_zero_variance_needs_consecutive_steps():
    rows = [row(i, zero=z, reward=0.1 * i) for i, z in enumerate((1.0, 1.0, 0.5, 1.0, 1.0), start=1)]
    assert first_signal(rows, T, TESTS) is None
    found = first_signal([*rows, row(6, zero=1.0, reward=0.6)], T, TESTS)
    assert found.name == "zero_variance" and found.value == 3


def test_plateau_and_clipping():
    flat = [row(i, reward=0.25, kl=0.0) for i in range(1, 5)]
    assert first_signal(flat, T, TESTS).name == "reward_plateau"
    clipped = [row(1, clipped=0.9), row(2, clipped=0.9, reward=0.6)]
    assert first_signal(clipped, T, TESTS).name == "clipped"
    off = GrpoThresholds(**{**vars(T), "clipped_patience": 0, "plateau_window": 0})
    OFF_TESTS = reward_tests(off, planned_steps=12, group_size=4)
    assert first_signal(flat, off, OFF_TESTS) is None and first_signal(clipped, off, OFF_TESTS) is None


def test_curve_row_reads_trl_keys_and_none():
    r = curve_row(
        4,
        {
            "kl": 0.5,
            "reward": 0.2,
            "completions/mean_length": 12,
            "completions/clipped_ratio": 1,
            "loss": 0.1,
        },
    )
    assert (
        r["step"] == 4
        and r["completion_length"] == 12.0
        and r["clipped_ratio"] == 1.0
        and r["reward_std"] is None
    )


def test_summary_and_csv():
    rows = [
        row(1, kl=0.0, reward=0.2, length=50.0),
        row(2, kl=2.0, reward=0.4, length=60.0),
        row(3, kl=float("nan"), reward=0.3, length=100.0),
    ]
    s = trajectory_summary(rows, T)
    assert (s["kl_peak"], s["kl_peak_step"]) == (2.0, 2) and math.isnan(s["kl_final"])
    assert (s["reward_first"], s["reward_final"], s["reward_max"]) == (0.2, 0.3, 0.4) and s[
        "length_drift"
    ] == pytest.approx(1.0)
    text = curves_csv([*rows, {c: None for c in CURVE_COLUMNS} | {"step": 4}], CURVE_COLUMNS)
    lines = text.splitlines()
    assert (
        lines[0] == ",".join(CURVE_COLUMNS)
        and lines[3].split(",")[1] == "nan"
        and lines[4] == "4" + "," * (len(CURVE_COLUMNS) - 1)
    )
    assert math.isnan(trajectory_summary([], T)["kl_peak"]) and slope([1.0]) == 0.0
