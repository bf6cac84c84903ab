"""The stateful OpenVINO graph of a decoder-only causal LM, written op by op from the torch model.

One builder for the families in :data:`LAYOUTS`. What differs between them is read from the model's
own modules and config where they show it: separate q/k/v projections or phi3's fused ``qkv_proj``,
a gate/up MLP or phi3's fused ``gate_up_proj``, biases where a projection has one, per-head q/k norms
where the attention has them (qwen3, gemma3), the attention's ``scaling`` (gemma:
``query_pre_attn_scalar``), attention and final logit soft-capping, the embedding's scale (gemma's
``embed_scale``), the rotary inverse frequencies and attention factor from transformers' own rope
functions (per layer type for gemma3), and which layers attend through a sliding window. What only a
family's modeling file says is in its :class:`Layout`: the RMSNorm weight convention, the norms
around attention and MLP, where its config names the activation and its sliding layers.

The ops are in the shapes OpenVINO's CPU plugin fuses into its own kernels (RMS, RoPE, and
scaled-dot-product attention that keeps the keys and values in the plugin's state, reordered by
``beam_idx``); soft-capped attention is written out (the fused kernel has no cap).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from clap.errors import ClapError


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a family's modeling file fixes and its modules and config values do not show."""

    norm_offset: float
    """RMSNorm scales by ``norm_offset + weight``: gemma stores its weights about 0 (``x * (1 + w)``)."""
    sandwich: bool
    """Norms after attention and after the MLP too (gemma), not only before them."""
    activation: str
    """The config field that names the MLP's activation."""
    sliding: str
    """Which layers attend through ``sliding_window``: ``layer_types`` (those marked sliding), ``all``
    (every layer when the config sets a window: mistral, phi3) or ``none`` (llama)."""


_LLAMA = Layout(norm_offset=0.0, sandwich=False, activation="hidden_act", sliding="none")
_QWEN = dataclasses.replace(_LLAMA, sliding="layer_types")
_MISTRAL = dataclasses.replace(_LLAMA, sliding="all")
_GEMMA = Layout(norm_offset=1.0, sandwich=True, activation="hidden_activation", sliding="layer_types")
LAYOUTS = {
    "llama": _LLAMA,
    "qwen2": _QWEN,
    "qwen3": _QWEN,
    "mistral": _MISTRAL,
    "phi3": _MISTRAL,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# rope types whose inverse frequencies are fixed when the model loads: "dynamic" and "longrope" change
# them in every forward with the sequence length (transformers' dynamic_rope_update)
ROPE_TYPES = ("default", "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_types(config: Any) -> list[str]:
    """Each layer's attention, ``full_attention`` or ``sliding_attention``, as the family's model decides it."""
    sliding = LAYOUTS[config.model_type].sliding
    if sliding == "layer_types":
        return list(config.layer_types)
    window = sliding == "all" and getattr(config, "sliding_window", None) is not None
    return ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers


def _rope_parameters(config: Any) -> dict[str, Any]:
    """The rope parameters of each layer type (gemma3 keeps a set per type, the others one for all)."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope and set(rope) <= set(LAYER_TYPES):
        return rope
    return dict.fromkeys(LAYER_TYPES, rope)


def unsupported(config: Any) -> str | None:
    """Why :func:`causal_lm_graph` cannot express this model (None: it can)."""
    if config.model_type not in LAYOUTS:
        return f"model_type {config.model_type!r} (the graph covers {', '.join(LAYOUTS)})"
    layout = LAYOUTS[config.model_type]
    act = getattr(config, layout.activation, None)
    kinds = set(layer_types(config))
    ropes = _rope_parameters(config)
    rope_types = sorted({str((ropes.get(k) or {}).get("rope_type")) for k in kinds & set(LAYER_TYPES)})
    checks = (
        (act in ACTIVATIONS, f"{layout.activation} {act!r}"),
        (kinds <= set(LAYER_TYPES), f"layer_types {sorted(kinds - set(LAYER_TYPES))}"),
        (set(rope_types) <= set(ROPE_TYPES), f"rope_type {', '.join(rope_types)} (fixed frequencies only)"),
        (
            "sliding_attention" not in kinds or isinstance(getattr(config, "sliding_window", None), int),
            "sliding layers without an integer sliding_window",
        ),
        (
            not getattr(config, "use_bidirectional_attention", False) and getattr(config, "is_causal", True),
            "bidirectional attention",
        ),
    )
    return next((why for ok, why in checks if not ok), None)


def causal_lm_graph(model: Any, weights: str = "f32") -> Any:
    """The stateful OpenVINO graph of a causal LM of a family in :data:`LAYOUTS` (weights as constants).

    ``weights``: ``f32`` as stored, or ``int8``: every projection and the output layer as int8 values
    with one f32 scale per output channel (symmetric, round to nearest: :func:`int8_weights`), written
    as int8 constant -> convert -> multiply by the scales, the pattern the CPU plugin keeps compressed
    in memory and multiplies without expanding. The embedding lookup keeps the f32 table.

    Inputs: ``input_ids``, ``attention_mask`` (past + new positions), ``position_ids`` and
    ``beam_idx`` (which rows of the kept keys/values continue, in order: ``[0] * n`` widens a one-row
    prefix to ``n`` rows, a subset drops finished rows). Output ``logits``: each row's last position
    (rows x 1 x vocabulary, the shape OpenVINO GenAI reads, so ``benchmarks/generation_engines.py`` runs the
    same graph under GenAI's own loop).

    Raises:
        ClapError: the model is one :func:`unsupported` refuses (rule ``engine_unsupported``).
    """
    if (why := unsupported(model.config)) is not None:
        raise ClapError(f"the openvino engine cannot build this model: {why}", rule="engine_unsupported")
    g = _Ops(model, weights)
    np, ov, ops = g.np, g.ov, g.ops
    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], ov.Type.i64, name="position_ids")
    beam_idx = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    kinds = layer_types(g.cfg)
    ropes = {kind: _rotary(g, position_ids, *_inverse_frequencies(model, kind)) for kind in set(kinds)}
    windows = {kind: g.cfg.sliding_window if kind == "sliding_attention" else None for kind in set(kinds)}
    masks, batch = _attention_masks(g, input_ids, attention_mask, windows)
    state = _KeptState(g, batch, beam_idx)
    decoder = model.get_decoder()
    x = _embed(g, decoder.embed_tokens, input_ids)
    for index, layer in enumerate(decoder.layers):
        x = _decoder_layer(g, layer, index, x, ropes[kinds[index]], masks[kinds[index]], state)
    last = ops.gather(g.rms_norm(x, decoder.norm), g.const(-1, np.int64), g.const(1, np.int64))  # B,E
    logits = _soft_cap(g, g.linear(last, model.get_output_embeddings()), g.final_cap)
    logits = ops.unsqueeze(logits, g.i64(1))  # B,1,V as exporters shape it
    logits.output(0).set_names({"logits"})
    return ov.Model(
        [ops.result(logits)],
        state.sinks,
        [input_ids, attention_mask, position_ids, beam_idx],
        f"clap-{g.cfg.model_type}",
    )


class _Ops:
    """What :func:`causal_lm_graph` writes its ops with: the config, the family's layout, the head
    sizes, and constants, (int8) linear layers and RMSNorm as OpenVINO ops of the torch modules."""

    def __init__(self, model: Any, weights: str):
        import numpy as np
        import openvino as ov
        import openvino.opset13 as ops

        self.np, self.ov, self.ops, self.weights = np, ov, ops, weights
        cfg = self.cfg = model.config
        self.layout = LAYOUTS[cfg.model_type]
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = model.get_decoder().layers[0].self_attn.head_dim
        self.final_cap = getattr(cfg, "final_logit_softcapping", None)  # gemma2

    def const(self, x: Any, dtype: Any = None) -> Any:
        return self.ops.constant(self.np.asarray(x, dtype=dtype))

    def i64(self, *x: int) -> Any:
        return self.const(list(x), self.np.int64)

    def array(self, tensor: Any) -> Any:
        return tensor.detach().float().cpu().numpy()

    def weight(self, w: Any) -> Any:  # (out, in)
        if self.weights == "f32":
            return self.const(w)
        q, scale = int8_weights(w)
        return self.ops.multiply(self.ops.convert(self.const(q), self.ov.Type.f32), self.const(scale))

    def linear(self, x: Any, layer: Any) -> Any:  # x @ W^T (+ b), W (out, in) as torch stores it
        y = self.ops.matmul(x, self.weight(self.array(layer.weight)), False, True)
        return y if layer.bias is None else self.ops.add(y, self.const(self.array(layer.bias)))

    def rms_norm(self, x: Any, norm: Any) -> Any:
        ops, f32 = self.ops, self.np.float32
        var = ops.reduce_mean(ops.power(x, self.const(2.0, f32)), self.i64(-1), True)
        inv = ops.divide(self.const(1.0, f32), ops.sqrt(ops.add(var, self.const(self.cfg.rms_norm_eps, f32))))
        scale = (self.array(norm.weight) + f32(self.layout.norm_offset)).astype(f32)
        return ops.multiply(ops.multiply(x, inv), self.const(scale))

    def slice_last(self, x: Any, start: int, stop: int) -> Any:
        return self.ops.slice(x, self.i64(start), self.i64(stop), self.i64(1), self.i64(-1))


def _embed(g: _Ops, embed: Any, input_ids: Any) -> Any:
    """The embedding lookup, times the embedding's own scale where it has one (gemma: sqrt(hidden),
    rounded to the table's dtype as its forward does)."""
    x = g.ops.gather(g.const(g.array(embed.weight)), input_ids, g.const(0, g.np.int64))
    scale = getattr(embed, "embed_scale", None)
    if scale is None:
        return x
    return g.ops.multiply(x, g.const(float(scale.to(embed.weight.dtype)), g.np.float32))


def _inverse_frequencies(model: Any, kind: str) -> tuple[Any, float]:
    """The rotary inverse frequencies and attention factor of layers of type ``kind``, from the
    function the model's rotary embedding computed its own with (transformers' ``ROPE_INIT_FUNCTIONS``,
    or the module's default: it knows phi3's ``partial_rotary_factor``)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotary = model.get_decoder().rotary_emb
    per_type = isinstance(rotary.rope_type, dict)  # gemma3: one rope per layer type
    rope_type = rotary.rope_type[kind] if per_type else rotary.rope_type
    init = (
        rotary.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
    )
    inv_freq, scaling = init(model.config, **({"layer_type": kind} if per_type else {}))
    return inv_freq.float().cpu().numpy(), float(scaling)


def _rotary(g: _Ops, position_ids: Any, inv_freq: Any, scaling: float) -> Callable[[Any], Any]:
    """The rotary embedding at ``position_ids`` as transformers applies it (angle = position * inverse
    frequency, cos and sin times the attention factor, halves rotated): a function from a B,h,T,D tensor
    to its rotated self. Where the frequencies cover only part of each head (phi3's
    ``partial_rotary_factor``) the rest passes unrotated."""
    ops, i64, f32 = g.ops, g.i64, g.np.float32
    angles = ops.multiply(
        ops.unsqueeze(ops.convert(position_ids, g.ov.Type.f32), i64(-1)), g.const(inv_freq.astype(f32))
    )
    angles = ops.concat([angles, angles], -1)
    cos, sin = (ops.unsqueeze(f(angles), i64(1)) for f in (ops.cos, ops.sin))  # B,1,T,R
    if scaling != 1.0:
        cos, sin = (ops.multiply(t, g.const(scaling, f32)) for t in (cos, sin))
    rotated = 2 * len(inv_freq)

    def rope(t):  # B,h,T,D
        part = t if rotated == g.dim else g.slice_last(t, 0, rotated)
        x1, x2 = g.slice_last(part, 0, rotated // 2), g.slice_last(part, rotated // 2, rotated)
        out = ops.add(ops.multiply(part, cos), ops.multiply(ops.concat([ops.negative(x2), x1], -1), sin))
        return out if rotated == g.dim else ops.concat([out, g.slice_last(t, rotated, g.dim)], -1)

    return rope


def _attention_masks(
    g: _Ops, input_ids: Any, attention_mask: Any, windows: dict[str, int | None]
) -> tuple[dict[str, Any], Any]:
    """The additive attention mask of each layer type (B,1,T,S: 0 where allowed, the f32 minimum
    elsewhere), and the batch size (a 1-element i64 tensor).

    As transformers builds them (masking_utils): query ``i`` of ``T`` new tokens sits at index
    ``S - T + i`` of ``S`` keys; a key is allowed where it is not padding and not after the query, and on
    a sliding layer of window ``w`` only where ``key > query - w`` (the query and the ``w - 1`` keys
    before it). Indices count padding as transformers' cache does, not positions.
    """
    np, ov, ops, const, i64 = g.np, g.ov, g.ops, g.const, g.i64
    shape = ops.shape_of(input_ids, ov.Type.i64)
    batch, new = (ops.gather(shape, i64(k), const(0, np.int64)) for k in (0, 1))
    keys = ops.gather(ops.shape_of(attention_mask, ov.Type.i64), i64(1), const(0, np.int64))
    query_at = ops.add(
        ops.range(const(0, np.int64), ops.squeeze(new, i64(0)), const(1, np.int64), ov.Type.i64),
        ops.subtract(keys, new),
    )
    key_at = ops.unsqueeze(
        ops.range(const(0, np.int64), ops.squeeze(keys, i64(0)), const(1, np.int64), ov.Type.i64), i64(0)
    )  # 1,S
    query_at = ops.unsqueeze(query_at, i64(1))  # T,1
    padding = ops.unsqueeze(ops.convert(attention_mask, ov.Type.boolean), i64(1, 2))  # B,1,1,S
    causal = ops.less_equal(key_at, query_at)  # T,S
    masks = {}
    for kind, window in windows.items():
        allowed = causal
        if window is not None:
            allowed = ops.logical_and(allowed, ops.greater(key_at, ops.subtract(query_at, i64(window))))
        allowed = ops.logical_and(ops.unsqueeze(allowed, i64(0, 1)), padding)  # B,1,T,S
        masks[kind] = ops.select(allowed, const(0.0, np.float32), const(np.finfo(np.float32).min, np.float32))
    return masks, batch


def _decoder_layer(
    g: _Ops, layer: Any, index: int, x: Any, rope: Callable[[Any], Any], mask: Any, state: _KeptState
) -> Any:
    """Decoder layer ``index`` on the hidden states ``x``: norm, attention, norm, MLP, each residual;
    with gemma's sandwich norms the attention's and the MLP's outputs are normed too before they add."""
    sandwich = g.layout.sandwich
    out = _attention(g, layer.self_attn, index, g.rms_norm(x, layer.input_layernorm), rope, mask, state)
    if sandwich:
        out = g.rms_norm(out, layer.post_attention_layernorm)
    x = g.ops.add(x, out)
    out = _mlp(
        g,
        layer.mlp,
        g.rms_norm(x, layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm),
    )
    if sandwich:
        out = g.rms_norm(out, layer.post_feedforward_layernorm)
    return g.ops.add(x, out)


def _projections(g: _Ops, attn: Any, h: Any) -> tuple[Any, Any, Any]:
    """Queries, keys and values (B,T,heads x dim each): three projections, or one fused ``qkv_proj``
    split in that order (phi3)."""
    if not hasattr(attn, "qkv_proj"):
        return tuple(g.linear(h, getattr(attn, name)) for name in ("q_proj", "k_proj", "v_proj"))
    qkv, q, kv = g.linear(h, attn.qkv_proj), g.heads * g.dim, g.kv_heads * g.dim
    return g.slice_last(qkv, 0, q), g.slice_last(qkv, q, q + kv), g.slice_last(qkv, q + kv, q + 2 * kv)


def _attention(
    g: _Ops, attn: Any, index: int, h: Any, rope: Callable[[Any], Any], mask: Any, state: _KeptState
) -> Any:
    """Grouped-query attention of layer ``index`` over its kept and new keys and values: per-head q/k
    norms before the rotary embedding where the module has them, scores scaled by the module's
    ``scaling`` and soft-capped where it caps them, then its output projection."""
    ops, i64, dim = g.ops, g.i64, g.dim

    def split_heads(t, n):
        return ops.transpose(ops.reshape(t, i64(0, 0, n, dim), True), i64(0, 2, 1, 3))  # B,n,T,D

    q, k, v = _projections(g, attn, h)
    q, k, v = split_heads(q, g.heads), split_heads(k, g.kv_heads), split_heads(v, g.kv_heads)
    if hasattr(attn, "q_norm"):  # over each head's dimensions (qwen3, gemma3)
        q, k = g.rms_norm(q, attn.q_norm), g.rms_norm(k, attn.k_norm)
    q, k = rope(q), state.kept_and_new(f"past_key.{index}", rope(k))
    v = state.kept_and_new(f"past_value.{index}", v)
    scale, cap = g.const(attn.scaling, g.np.float32), getattr(attn, "attn_logit_softcapping", None)
    if cap is None:
        out = ops.scaled_dot_product_attention(q, k, v, mask, scale, causal=False)
    else:  # written out as transformers' eager attention: the fused kernel has no cap
        scores = _soft_cap(g, ops.multiply(ops.matmul(q, k, False, True), scale), cap)
        out = ops.matmul(ops.softmax(ops.add(scores, mask), -1), v, False, False)
    out = ops.reshape(ops.transpose(out, i64(0, 2, 1, 3)), i64(0, 0, g.heads * dim), True)
    return g.linear(out, attn.o_proj)


def _soft_cap(g: _Ops, x: Any, cap: float | None) -> Any:
    """``cap * tanh(x / cap)`` (None: ``x``)."""
    if cap is None:
        return x
    c = g.const(cap, g.np.float32)
    return g.ops.multiply(g.ops.tanh(g.ops.divide(x, c)), c)


def _mlp(g: _Ops, mlp: Any, h: Any) -> Any:
    """The gated MLP: ``down(act(gate) * up)``, gate and up apart or one fused ``gate_up_proj`` (phi3:
    gate first); the activation SiLU or GELU's tanh approximation (gemma's GeGLU)."""
    if hasattr(mlp, "gate_up_proj"):
        both, width = g.linear(h, mlp.gate_up_proj), mlp.down_proj.in_features
        gate, up = g.slice_last(both, 0, width), g.slice_last(both, width, 2 * width)
    else:
        gate, up = g.linear(h, mlp.gate_proj), g.linear(h, mlp.up_proj)
    act = getattr(g.cfg, g.layout.activation)
    gate = g.ops.swish(gate) if act == "silu" else g.ops.gelu(gate, approximation_mode="tanh")
    return g.linear(g.ops.multiply(gate, up), mlp.down_proj)


class _KeptState:
    """The keys and values each layer keeps in the plugin's state between calls: a variable per layer
    and kind, read with the rows ``beam_idx`` picks, extended by the new ones and assigned back."""

    def __init__(self, g: _Ops, batch: Any, beam_idx: Any):
        self.g, self.beam_idx, self.sinks = g, beam_idx, []
        self.empty = g.ops.broadcast(
            g.const(0.0, g.np.float32), g.ops.concat([batch, g.i64(g.kv_heads, 0, g.dim)], 0)
        )

    def kept_and_new(self, name: str, cur: Any) -> Any:
        """The kept keys (or values) of variable ``name`` followed by the new ones ``cur``; for
        grouped-query attention each kv head repeated for its query heads."""
        g = self.g
        np, ov, ops, i64, heads, kv_heads, dim = g.np, g.ov, g.ops, g.i64, g.heads, g.kv_heads, g.dim
        from openvino import op as ov_op

        info = ov_op.util.VariableInfo()
        info.data_shape = ov.PartialShape([-1, kv_heads, -1, dim])
        info.data_type = ov.Type.f32
        info.variable_id = name
        variable = ov_op.util.Variable(info)
        past = ops.gather(ops.read_value(self.empty, variable), self.beam_idx, g.const(0, np.int64))
        full = ops.concat([past, cur], 2)
        self.sinks.append(ops.assign(full, variable))
        if heads != kv_heads:  # grouped-query attention: each kv head serves heads // kv_heads query heads
            full = ops.unsqueeze(full, i64(2))
            full = ops.broadcast(full, i64(1, 1, heads // kv_heads, 1, 1), broadcast_spec="BIDIRECTIONAL")
            full = ops.reshape(full, i64(0, heads, -1, dim), True)
        return full


def int8_weights(w: Any) -> tuple[Any, Any]:
    """``w`` (out, in) as int8 values and f32 scales (out, 1), ``w ~ q * scale``: symmetric per output
    channel, the channel's largest magnitude at 127 (an all-zero channel gets the smallest scale)."""
    import numpy as np

    w = np.asarray(w, dtype=np.float32)
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), np.finfo(np.float32).tiny) / np.float32(127)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale.astype(np.float32)
