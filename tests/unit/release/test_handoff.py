"""Handoff artifacts: model card (offline validation), reproducibility manifest, cost report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import yaml

from clap import io
from clap.errors import ClapError
from clap.params import raw_section
from clap.release.approval import Binding
from clap.release.handoff import (
    CardParams,
    CostParams,
    build_handoff,
    cost_report,
    model_card,
    stage_params,
    validate_card,
    validate_manifest,
    write_handoff,
)

B = "2026-01"
CARD_P = CardParams(
    license="apache-2.0",
    task="question answering (JSON)",
    summary="answers questions",
    tags=["clap", "lora"],
    packages=["pandas", "pyyaml"],
)
COST_P = CostParams(
    over_budget="refuse",
    budget_cpu_hours=1.0,
    budget_gpu_hours=0.5,
    estimate_batches=2,
    stages=["train", "eval"],
    wall_time_key="wall_s",
    estimate_key="cost_estimate_s",
    device_key="device",
)
BINDING = Binding(B, "promote", "a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)
LOCK = {
    "schema": "2.0",
    "stages": {
        "base": {"params": {"params.yaml": {"base": {"model": "m", "dtype": "float32"}}}},
        f"train@{B}": {
            "params": {
                "params.yaml": {"train": {"seed": 3, "lr": 0.1}, "detector": {"seed": 7, "alpha": 0.05}}
            }
        },
        "train@2026-02": {"params": {"params.yaml": {"train": {"seed": 99}}}},
        f"gate@{B}": {"deps": []},
    },
}


@pytest.fixture
def root(tmp_path):
    task = raw_section(
        "task", Path(__file__).resolve().parents[3] / "params.yaml"
    )  # the card names its fields
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"task": task}))
    io.write_metrics_and_record(
        tmp_path / "metrics" / "base.json",
        None,
        {
            "source": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "weights_sha256": "e" * 64,
            "architecture": "llama",
            "chat_template": "params",
            "chat_template_sha256": "d" * 64,
        },
    )
    io.write_metrics_and_record(
        tmp_path / "metrics" / "eval" / f"{B}.json",
        None,
        {"candidate_pass_rate": 0.7, "base_pass_rate": 0.1, "incumbent_batch": "", "wall_s": 900.0},
    )
    io.write_metrics_and_record(
        tmp_path / "metrics" / "train" / f"{B}.json",
        None,
        {
            "wall_s": 1800.0,
            "device": "cpu",
            "health": "ok",
            "lora_targets": "down_proj,gate_up_proj,o_proj,qkv_proj",
            "lora_layers": 8,
            "trainable_params": 1234,
        },
    )
    io.write_metrics_and_record(
        tmp_path / "metrics" / "gate" / f"{B}.json",
        None,
        {"decision": "promote", "certified": 0, "certification": "positive control x did not learn"},
    )
    frame = pd.DataFrame({"item_id": ["i1", "i2"], "value": [1.0, 2.5]})
    io.write_parquet(tmp_path / "data" / "admitted" / B / "sft.parquet", frame)
    io.write_parquet(tmp_path / "data" / "admitted" / B / "eval.parquet", frame.head(1))
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(LOCK))
    return tmp_path


def _front(card: str) -> dict:
    return yaml.safe_load(card.split("---\n")[1])


def _with_front(card: str, meta: dict) -> str:
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n" + card.split("---\n", 2)[2]


def test_valid_handoff_has_no_problems_and_writes_three_files(root):
    h = build_handoff(root, BINDING, "f" * 40, CARD_P, COST_P)
    assert h.problems == []
    paths = write_handoff(h, root / "out")
    assert [p.name for p in paths] == ["README.md", "manifest.json", "cost.json"] and all(
        p.exists() for p in paths
    )
    meta = _front(h.card)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["library_name"] == "peft"
    metrics = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics == {
        "base_pass_rate": 0.1,
        "candidate_pass_rate": 0.7,
        "wall_s": 900.0,
    }  # numbers only, strings left out
    assert any(ds.startswith(f"clap/{B}/sft@sha256:") for ds in meta["datasets"])
    assert "scenario **UNCERTIFIED**: positive control x did not learn" in h.card  # the card says it
    # what the base prompts with and what the adapter adapts, as the base and train stages recorded them
    assert "Prompt format: params `base.plain_chat_template`" in h.card and "d" * 64 in h.card
    assert "LoRA on `down_proj,gate_up_proj,o_proj,qkv_proj` (8 layers, 1234 trainable parameters" in h.card


@pytest.mark.parametrize("key", ["base_model", "datasets", "library_name", "license", "tags", "model-index"])
def test_card_without_a_required_key_fails(root, key):
    card = model_card(root, BINDING, {"sft": "1", "eval": "2"}, CARD_P)
    meta = _front(card)
    del meta[key]
    assert any(key in p for p in validate_card(_with_front(card, meta)))


@pytest.mark.parametrize(
    "bad", [{"library_name": "transformers"}, {"tags": []}, {"datasets": "clap"}, {"license": ""}]
)
def test_card_with_a_wrong_type_fails(root, bad):
    card = model_card(root, BINDING, {"sft": "1", "eval": "2"}, CARD_P)
    assert validate_card(_with_front(card, {**_front(card), **bad})) != []


@pytest.mark.parametrize("value", [".nan", "'high'", "true"])
def test_card_metric_must_be_a_finite_number(root, value):
    card = model_card(root, BINDING, {"sft": "1", "eval": "2"}, CARD_P)
    broken = card.replace("value: 0.7", f"value: {value}", 1)
    assert broken != card and any("finite number" in p for p in validate_card(broken))


def test_card_without_front_matter_fails():
    assert validate_card("# just markdown\n") != []


def test_empty_eval_record_leaves_the_model_index_without_metrics(root):
    io.write_metrics_and_record(root / "metrics" / "eval" / f"{B}.json", None, {"incumbent_batch": ""})
    card = model_card(root, BINDING, {"sft": "1", "eval": "2"}, CARD_P)
    assert any("metrics must be a non-empty list" in p for p in validate_card(card))


def test_manifest_records_what_the_batch_ran_with(root):
    m = build_handoff(root, BINDING, "f" * 40, CARD_P, COST_P).manifest
    assert set(m["params"]) == {"base", f"train@{B}"}  # the other batch's stages are left out
    assert m["seeds"] == {"detector.seed": 7, "train.seed": 3}
    assert m["dvc_lock_sha256"] == io.sha256_file(root / "dvc.lock") and m["git_commit"] == "f" * 40
    assert m["artifacts"]["adapter_sha256"] == "a" * 64 and m["hardware"]["train_device"] == "cpu"


def test_manifest_with_a_missing_package_or_seed_is_incomplete(root):
    m = build_handoff(
        root, BINDING, "f" * 40, dataclasses.replace(CARD_P, packages=["no-such-package-xyz"]), COST_P
    ).manifest
    assert validate_manifest(m) == ["package no-such-package-xyz is not installed"]
    assert "seeds is empty" in validate_manifest({**m, "seeds": {}})


def test_stage_params_skips_stages_without_params():
    assert set(stage_params(LOCK, "2026-02")) == {"base", "train@2026-02"}


def test_cost_is_within_budget(root):
    c = cost_report(root, B, COST_P)
    assert (
        c["status"] == "within"
        and c["cpu_hours"] == 0.75
        and c["gpu_hours"] == 0.0
        and c["missing_wall_time"] == []
    )


def test_cost_report_reconciles_the_training_estimate_with_the_wall_time(root):
    io.write_metrics_and_record(
        root / "metrics" / "train" / f"{B}.json",
        None,
        {"wall_s": 1800.0, "device": "cpu", "health": "ok", "cost_estimate_s": 1500.0},
    )
    c = cost_report(root, B, COST_P)
    train, evals = c["stages"]["train"], c["stages"]["eval"]
    assert train["estimate_s"] == 1500.0 and train["wall_s"] == 1800.0
    assert train["actual_over_estimate"] == 1.2  # 1800 / 1500: the run took 20 % longer than estimated
    assert evals["estimate_s"] is None and evals["actual_over_estimate"] is None  # eval estimates nothing
    assert c["estimate_batches"] == 2 and c["status"] == "within"


def test_missing_wall_time_is_reported_missing_not_zero(root):
    io.write_metrics_and_record(root / "metrics" / "eval" / f"{B}.json", None, {"candidate_pass_rate": 0.7})
    c = cost_report(root, B, COST_P)
    assert c["stages"]["eval"]["wall_s"] is None and c["stages"]["eval"]["hours"] is None
    assert c["missing_wall_time"] == ["eval"] and c["status"] == "incomplete" and c["cpu_hours"] == 0.5


def test_gpu_stages_count_against_the_gpu_budget(root):
    io.write_metrics_and_record(
        root / "metrics" / "train" / f"{B}.json", None, {"wall_s": 3600.0, "device": "cuda"}
    )
    assert "device" not in io.read_json(root / "metrics" / "train" / f"{B}.json")  # in records/train
    c = cost_report(root, B, COST_P)
    assert c["stages"]["train"]["kind"] == "gpu" and c["gpu_hours"] == 1.0 and c["status"] == "over"


def test_unknown_over_budget_policy_is_an_error(root):
    with pytest.raises(ClapError):
        build_handoff(root, BINDING, "f" * 40, CARD_P, dataclasses.replace(COST_P, over_budget="ignore"))


def test_stage_params_merge_a_profiles_inherited_keys_under_its_own():
    """A profile's stage records its own keys under params.yaml and the ones it inherits, dotted, under the
    root's file (profiles/render_dvc_yaml.py): the manifest shows the values the stage read."""
    lock = {
        "stages": {
            "train@r": {
                "params": {
                    "params.yaml": {"train": {"max_length": 2048}},
                    "../../params.yaml": {"train.seed": 1, "train.max_length": 1024, "detector": {"seed": 7}},
                }
            }
        }
    }
    assert stage_params(lock, "r") == {
        "train@r": {"train": {"seed": 1, "max_length": 2048}, "detector": {"seed": 7}}
    }
