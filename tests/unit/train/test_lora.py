"""clap.train.lora: LoRA targets derived from the architecture or checked against it, and what an
adapter adapts read back from the model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import transformers
from peft import get_peft_model

from clap.errors import ClapError
from clap.train.lora import AUTO, adapted, lora_config, resolve_targets

LLAMA_NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SIZES = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
# family -> (its config class, extra config, what `auto` adapts)
FAMILIES = {
    "llama": ("LlamaConfig", {"num_key_value_heads": 2}, sorted(LLAMA_NAMES)),
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2}, sorted(LLAMA_NAMES)),
    "qwen3": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 8}, sorted(LLAMA_NAMES)),
    "mistral": ("MistralConfig", {"num_key_value_heads": 2}, sorted(LLAMA_NAMES)),
    "gemma3_text": ("Gemma3TextConfig", {"num_key_value_heads": 1, "head_dim": 8}, sorted(LLAMA_NAMES)),
    "phi3": (
        "Phi3Config",
        {"num_key_value_heads": 2, "pad_token_id": 0},
        ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"],
    ),
}


def _model(family: str):
    cls, extra, _ = FAMILIES[family]
    return transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**SIZES, **extra))


def _tp(targets):
    return SimpleNamespace(lora_r=2, lora_alpha=4, lora_dropout=0.0, target_modules=targets)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_adapts_every_linear_layer_of_the_blocks_as_the_family_names_them(family):
    model = _model(family)
    assert resolve_targets(model, AUTO) == FAMILIES[family][2]
    peft_model = get_peft_model(model, lora_config(_tp(AUTO), model))
    got = adapted(peft_model)
    assert got["lora_targets"].split(",") == FAMILIES[family][2]
    assert got["lora_layers"] == len(FAMILIES[family][2]) * SIZES["num_hidden_layers"]
    # r x (in + out) per adapted layer, counted independently of peft's own bookkeeping
    expected = sum(
        2 * (m.base_layer.in_features + m.base_layer.out_features)
        for m in peft_model.modules()
        if hasattr(m, "base_layer") and hasattr(m, "lora_A")
    )
    assert expected > 0 and got["trainable_params"] == expected


def test_a_llama_list_on_a_phi3_base_is_refused_naming_what_matched_nothing_and_what_exists():
    """peft would adapt o_proj and down_proj only and record the seven names it was asked for."""
    with pytest.raises(ClapError, match="phi3") as err:
        resolve_targets(_model("phi3"), LLAMA_NAMES)
    message = str(err.value)
    assert "['q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj']" in message
    assert "qkv_proj" in message and "gate_up_proj" in message
    assert err.value.rule == "lora_targets"


def test_a_list_that_matches_is_kept_and_may_name_layers_outside_the_blocks():
    model = _model("llama")
    assert resolve_targets(model, ["v_proj", "q_proj"]) == ["q_proj", "v_proj"]
    assert resolve_targets(model, ["lm_head", "self_attn.q_proj"]) == ["lm_head", "self_attn.q_proj"]
    adapter = get_peft_model(model, lora_config(_tp(["v_proj", "q_proj"]), model))
    assert adapted(adapter)["lora_targets"] == "q_proj,v_proj"


@pytest.mark.parametrize("bad", ["q_proj", [], [""], None])
def test_a_malformed_target_list_is_refused(bad):
    with pytest.raises(ClapError, match="train.target_modules"):
        resolve_targets(_model("llama"), bad)
