"""clap.judge.grpo_gate: the GRPO-candidate decision in the gate, its evidence and report, the summary table.

(The probe's params and static verdict, clap.train.grpo_policy: tests/unit/train/test_grpo_policy.py.)"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import GRPO_ADMIT as ADMIT
from conftest import grpo_params

from clap import io, params
from clap.errors import ClapError
from clap.judge.gating import GateParams, decide, flat_metrics, run_gate
from clap.judge.grpo_gate import (
    candidate_decision,
    evidence_section,
    gate_fields,
    render_static_runtime,
    report_section,
    sft_checks,
    static_runtime_row,
    summary_fields,
)
from clap.task.answer import load_answer_schema
from clap.train.grpo_policy import static_verdict

ROOT = Path(__file__).resolve().parents[3]


def held_record(**extra) -> dict:
    return {
        "run": 1,
        "health": "hold",
        "runtime_verdict": "hold",
        "stop_reason": "kl_peak",
        "stop_step": 3,
        "stop_detail": "KL 168 > 1",
        "kl_peak": 168.0,
        "reward_final": 0.41,
        "steps": 3,
        **static_verdict(ADMIT, "admit.json"),
        **extra,
    }


def test_candidate_decision_never_promotes_without_a_paired_test():
    assert candidate_decision(held_record())[:2] == ("hold", "grpo_kl_peak")
    stable = held_record(health="ok", runtime_verdict="stable", stop_reason="completed")
    assert candidate_decision(stable)[:2] == ("hold", "grpo_not_evaluated")
    assert candidate_decision({"run": 0, "stop_reason": "disabled"})[0] == "not_run"
    fields = gate_fields(held_record())
    assert (
        fields["grpo_decision"] == "hold"
        and fields["grpo_kl_peak"] == 168.0
        and fields["grpo_static_verdict"] == "pass"
    )


def test_held_probe_caps_sft_only_when_the_switch_says_so():
    assert sft_checks(held_record(), grpo_params(hold_sft_on_hold=False)) == []
    assert sft_checks(held_record(health="ok"), grpo_params(hold_sft_on_hold=True)) == []
    checks = sft_checks(held_record(), grpo_params(hold_sft_on_hold=True))
    assert decide(checks) == ("hold", "grpo_probe") and "kl_peak" in checks[0].detail
    gate = params.section("gate", GateParams, ROOT / "params.yaml")
    scored = pd.DataFrame({"model": ["base"]})
    result = run_gate(
        scored,
        {"models": []},
        {
            "health": "ok",
            "trained": 1,
            "masked_tokens_fraction": 0.6,
            "label_tokens": 100,
            "prompt_tokens": 60,
        },
        {"admitted": 1},
        gate,
        checks,
        replay=None,  # no candidate here: no latency check either way
        slices=load_answer_schema(ROOT / "params.yaml").slices,
    )
    assert flat_metrics(result)["check_grpo_probe"] == "hold"


def test_evidence_and_report_carry_the_kl_evidence():
    ev = evidence_section(held_record(), "ab" * 32)
    assert ev["decision"] == "hold" and ev["record"]["kl_peak"] == 168.0 and ev["record"]["stop_step"] == 3
    md = report_section(held_record())
    assert "GRPO candidate: **HOLD**" in md and "KL peak 168" in md and "rank-pass rate 1" in md


def test_summary_shows_static_pass_but_runtime_hold(tmp_path):
    io.write_json(tmp_path / "grpo" / "2026-01.json", held_record())
    io.write_json(
        tmp_path / "grpo" / "2026-03.json",
        {
            **held_record(),
            "run": 0,
            "runtime_verdict": "not_run",
            "stop_reason": "disabled",
            "kl_peak": "nan",
        },
    )
    rows = [static_runtime_row(tmp_path, b) for b in ("2026-01", "2026-03")]
    md = render_static_runtime(rows)
    assert (
        "| 2026-01 | pass (1, 0.225) | hold (168, kl_peak) | hold |" in md
        and "| 2026-03 |" in md
        and "not_run (nan, disabled)" in md
    )
    assert "passed but the runtime probe was held: **2026-01**" in md
    assert summary_fields(rows) == {
        "grpo_probes_run": 1,
        "grpo_probes_held": 1,
        "grpo_static_pass_runtime_hold": 1,
    }
    with pytest.raises(ClapError):
        static_runtime_row(tmp_path, "2026-05")
