"""clap.train.grpo_policy: the probe's params section and its static verdict from admission metrics.

(The GRPO-candidate decision in the gate, clap.judge.grpo_gate: tests/unit/judge/test_grpo_gate.py.)"""

from __future__ import annotations

import pytest
from conftest import GRPO_ADMIT as ADMIT
from conftest import grpo_params

from clap.errors import ClapError
from clap.train.grpo_policy import probe_enabled, static_verdict


def test_params_section_loads_and_rejects_bad_switches():
    p = grpo_params()
    assert p.beta > 0 and p.thresholds.max_kl > 0
    assert probe_enabled(grpo_params(enabled=True), "x") and not probe_enabled(
        grpo_params(enabled=False), "x"
    )
    assert probe_enabled(grpo_params(enabled=["2026-01"]), "2026-01") and not probe_enabled(
        grpo_params(enabled=["2026-01"]), "2026-03"
    )
    for bad in ({"beta": 0.0}, {"enabled": "2026-01"}, {"start_from": "sft2"}, {"num_generations": 1}):
        with pytest.raises(ClapError):
            grpo_params(**bad)


def test_static_verdict_reads_admission_metrics():
    assert static_verdict(ADMIT, "a.json") == {
        "admitted": 1,
        "static_verdict": "pass",
        "static_rank_pass_rate": 1.0,
        "static_reward_margin": 0.225,
        "static_reward_variance_min": 0.04,
    }
    assert static_verdict({**ADMIT, "reward_margin_passed": 0}, "a.json")["static_verdict"] == "fail"
    with pytest.raises(ClapError, match="rank_pass_rate"):
        static_verdict({"admitted": 1}, "a.json")
