"""clap.train.budget: the run's cost estimated before training, refused or held over budget (tiny model)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import write_tiny_admitted
from transformers import TrainerCallback

from clap import io, params
from clap.errors import ClapError
from clap.judge.gating import GateParams, run_gate
from clap.judge.scored import scored_columns
from clap.model import base as mdl
from clap.train import budget
from clap.train import sft as tr
from clap.train.budget import Estimate
from clap.train.lora import lora_config

from .test_sft import ANSWER, BP, _dp, _tp

ROOT = Path(__file__).resolve().parents[3]


def test_planned_tokens_follow_epochs_or_max_steps():
    rows = [100, 300, 2000]  # the last is capped at max_length 1024
    assert budget.planned_tokens(rows, max_length=1024, epochs=1, max_steps=-1, rows_per_step=2) == 1424
    assert budget.planned_tokens(rows, max_length=1024, epochs=2.5, max_steps=-1, rows_per_step=2) == 3560
    # max_steps caps the run: 4 steps x 2 rows x the mean row (1424 / 3)
    assert budget.planned_tokens(rows, max_length=1024, epochs=1, max_steps=4, rows_per_step=2) == 3798
    assert budget.planned_tokens([], max_length=1024, epochs=1, max_steps=-1, rows_per_step=2) == 0


def test_estimate_arithmetic_and_record():
    est = Estimate(
        planned_tokens=36000,
        measured_tokens=600,
        measured_s=2.0,
        setup_s=30.0,
        world_size=1,
        kind="cpu",
        budget_s=7200.0,
    )
    assert est.tokens_per_s == 300.0 and est.seconds == 150.0 and not est.over  # 30 + 36000 / 300
    assert dataclasses.replace(est, world_size=2).seconds == 90.0  # two processes share the tokens
    over = dataclasses.replace(est, budget_s=120.0)
    assert over.over and over.record() == {
        "cost_estimate_s": 150.0,
        "cost_setup_wall_s": 30.0,
        "cost_planned_tokens": 36000,
        "cost_measured_tokens_per_s": 300.0,
        "cost_kind": "cpu",
        "cost_budget_s": 120.0,
        "cost_over_budget": 1,
    }
    assert "estimated 150 s" in over.describe() and "budget 120 s" in over.describe()
    assert budget.over_budget(est, BP) is False
    assert budget.over_budget(over, dataclasses.replace(BP, over_budget="hold")) is True
    with pytest.raises(ClapError, match=r"estimated 150 s .* vs budget 120 s") as err:
        budget.over_budget(over, BP)
    assert err.value.rule == "over_budget"


def test_budget_params_come_from_release_cost_and_are_checked(tmp_path):
    real = budget.budget_params(ROOT / "params.yaml")
    cost = params.raw_section("release", ROOT / "params.yaml")["cost"]
    assert (real.over_budget, real.budget_cpu_hours, real.budget_gpu_hours, real.estimate_batches) == (
        cost["over_budget"],
        cost["budget_cpu_hours"],
        cost["budget_gpu_hours"],
        cost["estimate_batches"],
    )
    for bad in ({"over_budget": "ignore"}, {"budget_cpu_hours": 0.0}, {"estimate_batches": 0}):
        with pytest.raises(ClapError, match="release.cost") as e:
            dataclasses.replace(BP, **bad)
        assert (e.value.rule, e.value.column) == ("bad_params", f"release.cost.{next(iter(bad))}")
    (tmp_path / "params.yaml").write_text("release:\n  cost: {over_budget: refuse}\n")
    with pytest.raises(ClapError, match="estimate_batches"):
        budget.budget_params(tmp_path / "params.yaml")


def test_timed_passes_leave_weights_gradients_mode_and_rng_as_they_were(tiny_base):
    from peft import get_peft_model

    model = mdl.load_model(tiny_base)
    model = get_peft_model(model, lora_config(_tp(Path("."), lora_dropout=0.1), model))
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    ids = torch.arange(3, 40)[None].repeat(2, 1)
    batches = [{"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}] * 3
    tokens, seconds = budget.timed_passes(model, batches, "cpu")
    assert tokens == 2 * 2 * 37 and seconds > 0  # the first batch is the untimed warm-up
    assert torch.equal(torch.random.get_rng_state(), rng)  # dropout drew nothing the training will miss
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ClapError, match="warm-up"):
        budget.timed_passes(model, batches[:1], "cpu")


class _Steps(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    return write_tiny_admitted(tmp_path_factory.mktemp("adm") / "b", n_sft=16, n_probe=8, seed=0, n_combos=4)


TINY_BUDGET = {"budget_cpu_hours": 1e-7, "budget_gpu_hours": 1e-7}  # 0.36 ms: below any estimate


def test_over_budget_refuses_before_any_optimizer_step(tiny_base, batch, tmp_path):
    steps = _Steps()
    with pytest.raises(
        ClapError, match=r"training refused before it starts: estimated .* vs budget 0 s"
    ) as err:
        tr.train_batch(
            batch,
            tiny_base,
            tmp_path / "adapter",
            _tp(tmp_path),
            _dp(),
            answer=ANSWER,
            bp=dataclasses.replace(BP, **TINY_BUDGET),
            extra_callbacks=[steps],
        )
    assert err.value.rule == "over_budget" and "release.cost.budget_cpu_hours" in str(err.value)
    assert steps.steps == 0 and not (tmp_path / "adapter").exists()
    assert not list((tmp_path / "checkpoints").glob("*/checkpoint-*"))


def test_over_budget_held_by_policy_is_not_trained_and_the_gate_holds(tiny_base, batch, tmp_path):
    steps = _Steps()
    res = tr.train_batch(
        batch,
        tiny_base,
        tmp_path / "adapter",
        _tp(tmp_path),
        _dp(),
        answer=ANSWER,
        bp=dataclasses.replace(BP, over_budget="hold", **TINY_BUDGET),
        extra_callbacks=[steps],
    )
    rec = res.record
    assert steps.steps == 0 and rec["trained"] == 0 and rec["health"] == budget.OVER_BUDGET
    assert rec["skip_reason"].startswith("over budget: estimated") and rec["cost_over_budget"] == 1
    assert rec["cost_estimate_s"] > rec["cost_budget_s"] == 0.0 and rec["adapter_sha256"] == ""
    assert res.curves == [] and all(isinstance(v, (int, float, str, bool)) for v in rec.values())
    assert io.read_json(tmp_path / "adapter" / "skipped.json")["reason"] == rec["skip_reason"]
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    # the gate (real policy: gate.health over_budget -> hold) holds the batch: nothing was spent
    gp = params.section("gate", GateParams, ROOT / "params.yaml")
    assert gp.health[budget.OVER_BUDGET] == "hold"
    scored = pd.DataFrame(columns=scored_columns(ANSWER))  # eval scored no candidate
    meta = {"models": [{"role": "base", "adapter_sha256": "", "batch": ""}], "production": {}}
    gate = run_gate(scored, meta, rec, {"admitted": 1}, gp, replay=None, slices=ANSWER.slices)
    assert (gate.decision, gate.rule) == ("hold", "training_health")
    assert {c.name: c.cap for c in gate.checks}["candidate"] == "hold"
