"""benchmarks/detector_calibration.py's checks pilot: its resampling gives a kept run back and never reuses an item."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "detector_calibration", ROOT / "benchmarks/detector_calibration.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_a_run_at_its_own_steps_with_no_window_is_given_back(bench):
    checks = [(3, 0.1), (5, -0.2), (7, 0.3), (9, 0.05)]
    other = [(3, 9.0), (5, 9.0), (7, 9.0), (9, 9.0)]  # another run's gaps at the same steps
    got = bench.resample_checks(checks, [3, 5, 7, 9], np.random.default_rng(0), window=0)
    assert got == [0.1, -0.2, 0.3, 0.05]
    mixed = bench.resample_checks(checks + other, [3, 5, 7, 9], np.random.default_rng(0), window=0)
    assert all(g in (a, 9.0) for g, (_, a) in zip(mixed, checks))


def test_a_simulated_run_draws_every_item_once_and_step_one_at_zero(bench):
    rng = np.random.default_rng(1)
    checks = [(s, float(i)) for i, s in enumerate([3, 5, 7, 9, 12, 14])]
    got = bench.resample_checks(checks, [1, 2, 3, 4, 5, 6, 7], rng, window=1)
    assert got[0] == 0.0
    assert len(set(got[1:])) == 6  # more steps than items near the start: the nearest unused items, each once
    assert sorted(got[1:]) == [c[1] for c in checks]
