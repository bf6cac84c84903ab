"""Which layers of the base a LoRA adapter adapts: named in params, or derived from the architecture.

``train.target_modules`` is ``auto`` or a list of module names. ``auto`` adapts every linear layer of
the decoder's blocks, whatever the family calls them: Llama's, Qwen's, Mistral's and Gemma's seven
projections (``q_proj`` ... ``down_proj``), Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` with
``o_proj`` and ``down_proj``. A list is matched as peft matches it (a module whose name is the entry
or ends with ``.`` + the entry), and every entry must match a linear layer of the loaded base: peft
adapts whatever matches and ignores the rest, so a Llama list on a Phi-3 base would train an
adapter of two layers per block while its config names seven. What was adapted is read back from the
model (:func:`adapted`), never from params, and recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clap.errors import ClapError

AUTO = "auto"


def _linear_layers(model: Any) -> list[str]:
    """Full names of the linear layers of the (unwrapped) causal LM, as peft sees them."""
    import torch

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [
        n for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear) and not n.endswith("base_layer")
    ]


def _block_layers(model: Any) -> list[str]:
    """Leaf names of the linear layers inside the decoder's blocks (not the LM head or embeddings)."""
    import torch

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = {
        n.rsplit(".", 1)[1]
        for n, m in lm.get_decoder().named_modules()
        if isinstance(m, torch.nn.Linear) and "." in n
    }
    return sorted(names)


def resolve_targets(model: Any, spec: str | Sequence[str]) -> list[str]:
    """The module names a fresh LoRA on ``model`` targets under ``train.target_modules`` = ``spec``.

    Raises:
        ClapError: ``spec`` is neither ``auto`` nor a non-empty list of names, or an entry of the list
            matches no linear layer of the base (the message names the architecture, the entries that
            matched nothing and the layer names the base's blocks have).
    """
    arch = getattr(getattr(model, "config", None), "model_type", "?")
    blocks = _block_layers(model)
    if spec == AUTO:
        if not blocks:
            raise ClapError(
                f"the {arch} base has no linear layers in its decoder blocks to adapt",
                column="train.target_modules",
                rule="lora_targets",
            )
        return blocks
    if isinstance(spec, str) or not spec or not all(isinstance(t, str) and t for t in spec):
        raise ClapError(
            f"train.target_modules must be {AUTO!r} or a non-empty list of module names, got {spec!r}",
            column="train.target_modules",
            rule="bad_param",
        )
    layers = _linear_layers(model)
    unmatched = [t for t in spec if not any(n == t or n.endswith("." + t) for n in layers)]
    if unmatched:
        raise ClapError(
            f"train.target_modules {unmatched} match no linear layer of this {arch} base, whose blocks have "
            f"{blocks}: peft would adapt only the rest. Name those layers, or set "
            f"train.target_modules: {AUTO} (every linear layer of the blocks)",
            column="train.target_modules",
            rule="lora_targets",
        )
    return sorted(spec)


def lora_config(tp: Any, model: Any):
    """The fresh LoRA of params ``train`` (shape, dropout) on the layers :func:`resolve_targets` gives."""
    from peft import LoraConfig

    return LoraConfig(
        r=tp.lora_r,
        lora_alpha=tp.lora_alpha,
        lora_dropout=tp.lora_dropout,
        target_modules=resolve_targets(model, tp.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )


def adapted(model: Any) -> dict[str, Any]:
    """What the adapter on ``model`` adapts, read from the model's LoRA layers: their leaf names
    (``lora_targets``, comma-separated), how many (``lora_layers``) and the trainable parameters."""
    layers = [n for n, m in model.named_modules() if len(getattr(m, "lora_A", None) or {})]
    return {
        "lora_targets": ",".join(sorted({n.rsplit(".", 1)[-1] for n in layers})),
        "lora_layers": len(layers),
        "trainable_params": int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
    }
