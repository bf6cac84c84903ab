"""clap.train.grpo on the tiny model: the reward is eval's score, a KL blow-up is held, a calm run finishes
(rollouts by clap's generator or TRL's), clap's rollouts are what TRL's path returns, the switch is respected."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import GRPO_ADMIT as ADMIT
from conftest import write_tiny_admitted
from safetensors.torch import load_file

from clap import io, params
from clap.errors import ClapError
from clap.task.scoring import reward, scoring_params
from clap.train.diagnosis import curves_csv
from clap.train.grpo import (
    NOT_RUN_FILE,
    clap_rollouts,
    completion_text,
    probe_rows,
    reward_function,
    run_probe,
)
from clap.train.grpo_policy import CURVE_COLUMNS, GrpoParams
from clap.train.sft import TrainParams

ROOT = Path(__file__).resolve().parents[3]
SP = scoring_params(ROOT / "params.yaml")
TP = dataclasses.replace(params.section("train", TrainParams, ROOT / "params.yaml"), torch_threads=1)


def tiny_params(**overrides) -> GrpoParams:
    """The real ``grpo`` section shrunk for the tiny model: 1 prompt x 2 completions of 6 tokens per step."""
    raw = params.raw_section("grpo", ROOT / "params.yaml")
    raw.update(
        {
            "enabled": True,
            "start_from": "base",
            "max_steps": 2,
            "num_generations": 2,
            "prompts_per_step": 1,
            "max_completion_length": 6,
            **overrides,
        }
    )
    return params.build(GrpoParams, raw)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("grpo")
    data = write_tiny_admitted(root / "data" / "b1", n_sft=8, n_probe=4, seed=0, n_combos=4)
    io.write_json(root / "admit.json", ADMIT)
    return data, root / "admit.json"


def test_reward_is_the_eval_score(batch):
    data, _ = batch
    rows = probe_rows(io.read_parquet(data / "grpo.parquet"), io.read_parquet(data / "kb.parquet"), SP.answer)
    r = rows[0]
    assert r["prompt"][0]["role"] == "system" and r["context"] in r["prompt"][1]["content"]
    gold = json.loads(r["gold"])
    wrong = json.dumps({**gold, "value": gold["value"] + 7})
    completions = [r["gold"], [{"role": "assistant", "content": r["gold"]}], wrong, "no json here"]
    scores = reward_function(SP)(
        completions=completions, gold=[r["gold"]] * 4, context=[r["context"]] * 4, prompts=None
    )
    assert scores[0] == scores[1] == 1.0 and 0.0 < scores[2] < 1.0 and scores[3] == 0.0
    assert scores == [reward(completion_text(c), gold, r["context"], SP) for c in completions]


def test_injected_kl_blowup_is_stopped_and_held(batch, tiny_base, tmp_path):
    data, admit = batch
    res = run_probe(
        data,
        admit,
        tiny_base,
        tmp_path / "no-sft",
        tmp_path / "grpo",
        tiny_params(max_steps=3, inject_kl_at_step=2),
        SP,
        TP,
    )
    rec = res.record
    assert (rec["health"], rec["runtime_verdict"], rec["stop_reason"], rec["stop_step"], rec["steps"]) == (
        "hold",
        "hold",
        "kl_peak",
        2,
        2,
    )
    assert (
        rec["kl_peak"] > rec["threshold_max_kl"]
        and rec["kl_peak_step"] == 2
        and rec["static_verdict"] == "pass"
    )
    assert [r["step"] for r in res.curves] == [1, 2] and res.curves[0]["kl"] == 0.0
    assert rec["adapter_sha256"] == io.sha256_file(
        tmp_path / "grpo" / "adapter_model.safetensors"
    )  # the held candidate is kept


@pytest.mark.parametrize("rollouts", ["clap", "trl"])
def test_calm_run_finishes_with_record_and_curves(batch, tiny_base, tmp_path, rollouts):
    data, admit = batch
    p = tiny_params(lr=1e-6, rollouts=rollouts)
    res = run_probe(data, admit, tiny_base, tmp_path / "no-sft", tmp_path / "grpo", p, SP, TP)
    rec = res.record
    assert (
        rec["run"],
        rec["health"],
        rec["runtime_verdict"],
        rec["stop_reason"],
        rec["steps"],
        rec["planned_steps"],
    ) == (1, "ok", "stable", "completed", 2, 2)
    assert rec["kl_peak"] < rec["threshold_max_kl"] and rec["beta"] > 0 and rec["wall_s"] > 0
    assert all(
        isinstance(v, (int, float, str, bool)) for v in rec.values()
    )  # flat, JSON-safe (io.write_json refuses NaN)
    io.write_json(tmp_path / "rec.json", rec)
    lines = curves_csv(res.curves, CURVE_COLUMNS).splitlines()
    assert (
        lines[0] == ",".join(CURVE_COLUMNS)
        and len(lines) == 3
        and all(lines[i].split(",")[1] != "" for i in (1, 2))
    )  # KL logged every step


def test_probe_follows_train_precision(batch, tiny_base, tmp_path):
    data, admit = batch
    tp = dataclasses.replace(TP, precision="bf16")
    rec = run_probe(
        data, admit, tiny_base, tmp_path / "no-sft", tmp_path / "grpo", tiny_params(lr=1e-6), SP, tp
    ).record
    assert (rec["precision"], rec["health"], rec["steps"]) == ("bf16-lora", "ok", 2)
    assert {w.dtype for w in load_file(tmp_path / "grpo" / "adapter_model.safetensors").values()} == {
        torch.float32
    }
    fp32 = run_probe(
        data, admit, tiny_base, tmp_path / "no-sft", tmp_path / "g32", tiny_params(lr=1e-6), SP, TP
    )
    assert fp32.record["precision"] == "fp32-lora"


def test_enable_switch_and_admission_are_respected(batch, tiny_base, tmp_path):
    data, admit = batch
    off = run_probe(
        data,
        admit,
        tiny_base,
        tmp_path / "no-sft",
        tmp_path / "off",
        tiny_params(enabled=["another-batch"]),
        SP,
        TP,
    )
    assert (off.record["run"], off.record["health"], off.record["stop_reason"], off.curves) == (
        0,
        "not_run",
        "disabled",
        [],
    )
    assert (
        io.read_json(tmp_path / "off" / NOT_RUN_FILE)["reason"] == "disabled"
        and not (tmp_path / "off" / "adapter_model.safetensors").exists()
    )
    io.write_json(tmp_path / "refused.json", {**ADMIT, "admitted": 0})
    refused = run_probe(
        data, tmp_path / "refused.json", tiny_base, tmp_path / "no-sft", tmp_path / "r", tiny_params(), SP, TP
    )
    assert refused.record["stop_reason"] == "not_admitted" and refused.record["static_verdict"] == "pass"
    with pytest.raises(ClapError, match="SFT adapter"):
        run_probe(
            data, admit, tiny_base, tmp_path / "no-sft", tmp_path / "s", tiny_params(start_from="sft"), SP, TP
        )
    # admitted, but the SFT run was not trained (held over its budget): not run, and why
    io.write_json(tmp_path / "held-sft" / "skipped.json", {"trained": False, "reason": "over budget: ..."})
    held = run_probe(
        data, admit, tiny_base, tmp_path / "held-sft", tmp_path / "h", tiny_params(start_from="sft"), SP, TP
    )
    assert (held.record["run"], held.record["stop_reason"]) == (0, "sft_not_trained")
    assert io.read_json(tmp_path / "h" / NOT_RUN_FILE)["reason"] == "sft_not_trained"


def fake_trainer(model, tok, step=0, **overrides):
    """What clap_rollouts reads of a GRPOTrainer (its attribute names in TRL 1.16), at TRL's defaults."""
    attrs = {
        "accelerator": SimpleNamespace(unwrap_model=lambda m: m),
        "model": model,
        "processing_class": tok,
        "state": SimpleNamespace(global_step=step),
        "max_completion_length": 5,
        "args": SimpleNamespace(generation_kwargs=None),
        "chat_template": None,
        "chat_template_kwargs": {},
        "tools": None,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
    }
    return SimpleNamespace(**{**attrs, **overrides})


def test_clap_rollouts_return_what_trls_path_returns(batch, tiny_base):
    from clap.model.base import load_model, load_tokenizer
    from clap.model.generate import stop_ids

    data, _ = batch
    rows = probe_rows(io.read_parquet(data / "grpo.parquet"), io.read_parquet(data / "kb.parquet"), SP.answer)
    prompts = [rows[0]["prompt"]] * 3 + [rows[1]["prompt"]] * 3  # TRL's sampler repeats each prompt
    model, tok = load_model(tiny_base), load_tokenizer(tiny_base, padding_side="left")
    model.train()
    out = clap_rollouts(seed=7)(prompts, fake_trainer(model, tok))
    # TRL's own tokenization of conversational prompts (GRPOTrainer._tokenize_prompts, no tools or kwargs)
    trl_ids = tok.apply_chat_template(
        conversation=prompts, chat_template=None, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert out["prompt_ids"] == [list(x) for x in trl_ids] and out["logprobs"] is None
    stops = set(stop_ids(model, tok))
    completions = out["completion_ids"]
    assert len(completions) == len(prompts) and model.training  # the train mode is restored
    # up to and including the first end-of-sequence token, as TRL's generate path cuts them
    assert all(len(c) == 5 or (c[-1] in stops and not stops & set(c[:-1])) for c in completions)
    assert out == clap_rollouts(seed=7)(prompts, fake_trainer(model, tok))  # seeded by (seed, step)
    assert out != clap_rollouts(seed=7)(prompts, fake_trainer(model, tok, step=1))


@pytest.mark.parametrize(
    "knob",
    [
        {"top_p": 0.9},
        {"top_k": 50},
        {"min_p": 0.05},
        {"repetition_penalty": 1.1},
        {"chat_template_kwargs": {"x": 1}},
    ],
)
def test_clap_rollouts_refuse_sampling_they_do_not_implement(knob):
    with pytest.raises(ClapError, match="rollouts: trl"):
        clap_rollouts(seed=0)([], fake_trainer(None, None, **knob))


@pytest.mark.parametrize("dora", [False, True])
def test_merged_policy_computes_the_lora_policy_and_follows_its_updates(tiny_base, dora):
    """Rollouts sample from the policy with its LoRA folded into a plain copy: same logits within float
    rounding, the non-LoRA tensors shared, refreshed in place after an update; DoRA is not folded."""
    import torch
    from conftest import scramble_weights
    from peft import LoraConfig, get_peft_model

    from clap.model.base import load_model
    from clap.train.grpo import merged_policy

    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_dora=dora)
    model = get_peft_model(scramble_weights(load_model(tiny_base), seed=3), config).eval()
    if dora:
        assert merged_policy(model) is None
        return
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    for module in model.modules():  # a fresh LoRA's B is 0: give every adapter a delta
        if hasattr(module, "lora_B") and "default" in module.lora_B:
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.2)
    trainable = {n for n, t in model.named_parameters() if t.requires_grad}
    with torch.no_grad():
        folded = merged_policy(model)
        assert {n for n, t in model.named_parameters() if t.requires_grad} == trainable  # nothing unfrozen
        torch.testing.assert_close(folded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        assert folded.get_input_embeddings().weight is model.get_base_model().get_input_embeddings().weight
        with model.disable_adapter():
            base_logits = model(ids).logits
        assert not torch.allclose(folded(ids).logits, base_logits, atol=1e-3)  # the adapter is in it
        for module in model.modules():  # an optimizer step
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                module.lora_A["default"].weight.mul_(-1.5)
        again = merged_policy(model, folded)
        assert again is folded
        torch.testing.assert_close(folded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        with model.disable_adapter():
            assert merged_policy(model) is None  # adapters off: sample from the model itself
