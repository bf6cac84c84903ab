"""Generation engines: whose forward pass :mod:`clap.model.generate` drives.

``torch``: the Hugging Face model itself (CPU fp32, CUDA bf16). ``openvino``: the same weights
(the adapter merged in first, as :func:`clap.model.base.load_model` does) compiled by the
`OpenVINO <https://docs.openvino.ai>`_ runtime for the CPU, from a graph this module builds from
the model's config and state dict: the Llama architecture written out op by op (RMSNorm, rotary
embeddings, grouped-query attention, SiLU MLP) in the shape OpenVINO's CPU plugin fuses into its
own kernels (RMS, RoPE, and scaled-dot-product attention that keeps the keys and values in the
plugin's state, reordered by ``beam_idx``). Nothing is exported to disk and no exporter is needed:
``optimum-intel``, the usual route, pins other transformers and torch versions than clap's.

The decoding loop, the constraint, the batching and the stop rules stay clap's
(:func:`clap.model.generate.generate_batched`); an engine only answers "logits at the last position
of these rows" and "keep these rows". At f32 (keys and values kept at f32 at either precision: the
plugin's default is u8) answers are token-identical to the torch path on the benchmark prompts, free
and constrained; ``bf16`` (weights and activations) and ``int8`` (int8 weights, one scale per output
channel; the plugin quantizes activations on the fly) are params, measured separately for speed and
for decision agreement (docs/precision.md), never implied. On a CUDA machine
``openvino`` resolves to ``torch`` (the record says which engine ran).

Speed against torch and against OpenVINO GenAI on each CPU kind, side by side: ``benchmarks/README.md``
(``generation_engines``); building and compiling the graph is paid once per model a stage loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from clap.errors import ClapError
from clap.model.kv import buffered_cache
from clap.params import bad_param

ENGINES = ("openvino", "torch")
PRECISIONS = ("f32", "bf16", "int8")


@dataclasses.dataclass(frozen=True)
class EngineParams:
    """Params ``chain.engine``: which engine generates (``name``) and at which precision (openvino only)."""

    name: str
    precision: str

    def __post_init__(self) -> None:
        for key, value, allowed in (("name", self.name, ENGINES), ("precision", self.precision, PRECISIONS)):
            if value not in allowed:
                raise bad_param(
                    f"chain.engine.{key}",
                    f"chain.engine.{key} must be one of {', '.join(allowed)}, got {value!r}",
                )
        if self.name == "torch" and self.precision != "f32":
            raise bad_param(
                "chain.engine.precision",
                "chain.engine.precision applies to the openvino engine only (torch: CPU fp32, CUDA bf16)",
            )


def resolve_engine(p: EngineParams, device: str) -> str:
    """The engine that runs on ``device``: openvino compiles for the CPU, so CUDA keeps torch."""
    return "openvino" if p.name == "openvino" and device == "cpu" else "torch"


class TorchSession:
    """One batch's decoding state on the torch path: the model and a buffered key/value cache."""

    def __init__(self, model: Any, prefix: Any, rows: int, capacity: int):
        self.model, self.cache = model, buffered_cache(prefix, rows, capacity)

    def forward(self, ids: Any, mask: Any, positions: Any, rows: Sequence[int] | None = None) -> Any:
        """Logits at the last position of each row (rows x vocabulary); of ``rows`` only, in that order,
        when given: the output layer (a fifth of a one-token step) then runs for them alone."""
        device = self.model.device
        with _output_rows(self.model, rows):
            out = self.model(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[:, -1]

    def select(self, keep: Sequence[int]) -> None:
        """Keep only these rows (indices into the current rows, in this order)."""
        import torch

        self.cache.batch_select_indices(torch.tensor(keep, device=self.model.device))


@contextlib.contextmanager
def _output_rows(model: Any, rows: Sequence[int] | None):
    """Within the block, the model's output layer sees only ``rows`` of its input (None: all rows).

    A hook on the layer's input rather than a call of the decoder and the head by hand, so whatever
    the model's own forward does with the logits afterwards (scaling, soft-capping) still applies.
    """
    if rows is None:
        yield
        return
    import torch

    index = torch.tensor(list(rows), dtype=torch.long, device=model.device)
    handle = model.get_output_embeddings().register_forward_pre_hook(
        lambda _layer, args: (args[0].index_select(0, index), *args[1:])
    )
    try:
        yield
    finally:
        handle.remove()


def torch_prefix(model: Any, ids: Sequence[int]) -> Any:
    """The one-row cache of ``ids`` (the prompt prefix every row shares)."""
    import torch

    return model(
        input_ids=torch.tensor([list(ids)], device=model.device), use_cache=True, logits_to_keep=1
    ).cache


def _unsupported(config: Any) -> str | None:
    """Why the openvino graph cannot express this model (None: it can)."""
    rope = getattr(config, "rope_parameters", None) or {}
    checks = (
        (config.model_type == "llama", f"model_type {config.model_type!r} (llama only)"),
        (not getattr(config, "attention_bias", False), "attention_bias"),
        (not getattr(config, "mlp_bias", False), "mlp_bias"),
        (config.hidden_act == "silu", f"hidden_act {config.hidden_act!r}"),
        (rope.get("rope_type", "default") == "default", f"rope_type {rope.get('rope_type')!r}"),
        (getattr(config, "pretraining_tp", 1) == 1, "pretraining_tp"),
    )
    return next((why for ok, why in checks if not ok), None)


def llama_graph(model: Any, weights: str = "f32") -> Any:
    """The stateful OpenVINO graph of a Llama causal LM (weights as constants).

    ``weights``: ``f32`` as stored, or ``int8``: every projection and the output layer as int8 values
    with one f32 scale per output channel (symmetric, round to nearest: :func:`int8_weights`), written
    as int8 constant -> convert -> multiply by the scales, the pattern the CPU plugin keeps compressed
    in memory and multiplies without expanding. The embedding lookup keeps the f32 table.

    Inputs: ``input_ids``, ``attention_mask`` (past + new positions), ``position_ids`` and
    ``beam_idx`` (which rows of the kept keys/values continue, in order: ``[0] * n`` widens a one-row
    prefix to ``n`` rows, a subset drops finished rows). Output ``logits``: each row's last position
    (rows x 1 x vocabulary, the shape OpenVINO GenAI reads, so ``benchmarks/generation_engines.py`` runs the
    same graph under GenAI's own loop).
    The attention mask is the causal mask within the new tokens and the padding mask over all keys,
    as transformers builds it (query ``i`` of ``T`` new tokens sits at index ``S - T + i`` of ``S`` keys).
    """
    if (why := _unsupported(model.config)) is not None:
        raise ClapError(f"the openvino engine cannot build this model: {why}", rule="engine_unsupported")
    g = _LlamaOps(model, weights)
    np, ov, ops = g.np, g.ov, g.ops
    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], ov.Type.i64, name="position_ids")
    beam_idx = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    rope = _rotary(g, position_ids)
    mask, batch = _attention_mask(g, input_ids, attention_mask)
    empty = ops.broadcast(g.const(0.0, np.float32), ops.concat([batch, g.i64(g.kv_heads, 0, g.dim)], 0))
    x = ops.gather(g.const(g.sd["model.embed_tokens.weight"]), input_ids, g.const(0, np.int64))
    sinks: list[Any] = []
    for layer in range(g.cfg.num_hidden_layers):
        x = _decoder_layer(g, x, layer, rope, mask, empty, beam_idx, sinks)
    last = ops.gather(g.rms_norm(x, "model.norm"), g.const(-1, np.int64), g.const(1, np.int64))  # B,E
    head = g.sd.get("lm_head.weight", g.sd["model.embed_tokens.weight"])
    logits = ops.unsqueeze(
        ops.matmul(last, g.weight(head), False, True), g.i64(1)
    )  # B,1,V as exporters shape it
    logits.output(0).set_names({"logits"})
    return ov.Model(
        [ops.result(logits)], sinks, [input_ids, attention_mask, position_ids, beam_idx], "clap-llama"
    )


class _LlamaOps:
    """What :func:`llama_graph` writes its ops with: the model's config and f32 state dict, its head
    sizes, and constants, (int8) linear layers and RMSNorm as OpenVINO ops."""

    def __init__(self, model: Any, weights: str):
        import numpy as np
        import openvino as ov
        import openvino.opset13 as ops

        self.np, self.ov, self.ops, self.weights = np, ov, ops, weights
        cfg = self.cfg = model.config
        self.sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads

    def const(self, x: Any, dtype: Any = None) -> Any:
        return self.ops.constant(self.np.asarray(x, dtype=dtype))

    def i64(self, *x: int) -> Any:
        return self.const(list(x), self.np.int64)

    def weight(self, w: Any) -> Any:  # (out, in)
        if self.weights == "f32":
            return self.const(w)
        q, scale = int8_weights(w)
        return self.ops.multiply(self.ops.convert(self.const(q), self.ov.Type.f32), self.const(scale))

    def linear(self, x: Any, name: str) -> Any:  # x @ W^T, W (out, in) as stored by torch
        return self.ops.matmul(x, self.weight(self.sd[name + ".weight"]), False, True)

    def rms_norm(self, x: Any, name: str) -> Any:
        ops, f32 = self.ops, self.np.float32
        var = ops.reduce_mean(ops.power(x, self.const(2.0, f32)), self.i64(-1), True)
        inv = ops.divide(self.const(1.0, f32), ops.sqrt(ops.add(var, self.const(self.cfg.rms_norm_eps, f32))))
        return ops.multiply(ops.multiply(x, inv), self.const(self.sd[name + ".weight"]))


def _rotary(g: _LlamaOps, position_ids: Any) -> Callable[[Any], Any]:
    """The rotary embedding at ``position_ids``, as transformers' default rope (angle = position *
    theta^(-2i/d), halves rotated): a function from a B,h,T,D tensor to its rotated self."""
    np, ops, i64, dim = g.np, g.ops, g.i64, g.dim
    theta = (getattr(g.cfg, "rope_parameters", None) or {}).get(
        "rope_theta", getattr(g.cfg, "rope_theta", 10000.0)
    )
    inv_freq = (1.0 / theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)).astype(
        np.float32
    )
    angles = ops.multiply(ops.unsqueeze(ops.convert(position_ids, g.ov.Type.f32), i64(-1)), g.const(inv_freq))
    angles = ops.concat([angles, angles], -1)
    cos, sin = (ops.unsqueeze(f(angles), i64(1)) for f in (ops.cos, ops.sin))  # B,1,T,D

    def rope(t):  # B,h,T,D
        half = dim // 2
        x1 = ops.slice(t, i64(0), i64(half), i64(1), i64(3))
        x2 = ops.slice(t, i64(half), i64(dim), i64(1), i64(3))
        return ops.add(ops.multiply(t, cos), ops.multiply(ops.concat([ops.negative(x2), x1], -1), sin))

    return rope


def _attention_mask(g: _LlamaOps, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
    """The additive attention mask (B,1,T,S: 0 where allowed, the f32 minimum elsewhere): causal within
    the new tokens, padding over all keys; and the batch size (a 1-element i64 tensor)."""
    np, ov, ops, const, i64 = g.np, g.ov, g.ops, g.const, g.i64
    shape = ops.shape_of(input_ids, ov.Type.i64)
    batch, new = (ops.gather(shape, i64(k), const(0, np.int64)) for k in (0, 1))
    keys = ops.gather(ops.shape_of(attention_mask, ov.Type.i64), i64(1), const(0, np.int64))
    query_at = ops.add(
        ops.range(const(0, np.int64), ops.squeeze(new, i64(0)), const(1, np.int64), ov.Type.i64),
        ops.subtract(keys, new),
    )
    key_at = ops.range(const(0, np.int64), ops.squeeze(keys, i64(0)), const(1, np.int64), ov.Type.i64)
    causal = ops.less_equal(ops.unsqueeze(key_at, i64(0)), ops.unsqueeze(query_at, i64(1)))  # T,S
    padding = ops.unsqueeze(ops.convert(attention_mask, ov.Type.boolean), i64(1, 2))  # B,1,1,S
    allowed = ops.logical_and(ops.unsqueeze(causal, i64(0, 1)), padding)  # B,1,T,S
    mask = ops.select(allowed, const(0.0, np.float32), const(np.finfo(np.float32).min, np.float32))
    return mask, batch


def _decoder_layer(
    g: _LlamaOps,
    x: Any,
    layer: int,
    rope: Callable[[Any], Any],
    mask: Any,
    empty: Any,
    beam_idx: Any,
    sinks: list[Any],
) -> Any:
    """Decoder layer ``layer`` on the hidden states ``x``: RMSNorm, grouped-query attention over the kept
    and new keys and values (their state assigned into ``sinks``), RMSNorm, SiLU MLP, both residual."""
    np, ops, i64, heads, kv_heads, dim = g.np, g.ops, g.i64, g.heads, g.kv_heads, g.dim
    p = f"model.layers.{layer}."
    h = g.rms_norm(x, p + "input_layernorm")

    def split_heads(name, n):
        t = ops.reshape(g.linear(h, name), i64(0, 0, n, dim), True)
        return ops.transpose(t, i64(0, 2, 1, 3))

    q = rope(split_heads(p + "self_attn.q_proj", heads))
    current = {
        "key": rope(split_heads(p + "self_attn.k_proj", kv_heads)),
        "value": split_heads(p + "self_attn.v_proj", kv_heads),
    }
    kv = [
        _kept_and_new(g, f"past_{kind}.{layer}", cur, empty, beam_idx, sinks) for kind, cur in current.items()
    ]
    att = ops.scaled_dot_product_attention(
        q, kv[0], kv[1], mask, g.const(dim**-0.5, np.float32), causal=False
    )
    att = ops.reshape(ops.transpose(att, i64(0, 2, 1, 3)), i64(0, 0, heads * dim), True)
    x = ops.add(x, g.linear(att, p + "self_attn.o_proj"))
    h = g.rms_norm(x, p + "post_attention_layernorm")
    gated = ops.multiply(ops.swish(g.linear(h, p + "mlp.gate_proj")), g.linear(h, p + "mlp.up_proj"))
    return ops.add(x, g.linear(gated, p + "mlp.down_proj"))


def _kept_and_new(g: _LlamaOps, name: str, cur: Any, empty: Any, beam_idx: Any, sinks: list[Any]) -> Any:
    """The keys (or values) a layer attends to: those kept in the plugin's state variable ``name`` (rows
    picked by ``beam_idx``) followed by the new ones ``cur``; the concatenation is assigned back (into
    ``sinks``) and, for grouped-query attention, each kv head is repeated for its query heads."""
    np, ov, ops, i64, heads, kv_heads, dim = g.np, g.ov, g.ops, g.i64, g.heads, g.kv_heads, g.dim
    from openvino import op as ov_op

    info = ov_op.util.VariableInfo()
    info.data_shape = ov.PartialShape([-1, kv_heads, -1, dim])
    info.data_type = ov.Type.f32
    info.variable_id = name
    variable = ov_op.util.Variable(info)
    past = ops.gather(ops.read_value(empty, variable), beam_idx, g.const(0, np.int64))
    full = ops.concat([past, cur], 2)
    sinks.append(ops.assign(full, variable))
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


class OpenVINOModel:
    """A causal LM compiled by OpenVINO for the CPU, with what the generator reads of a model
    (``config``, ``generation_config``, ``device``)."""

    def __init__(self, model: Any, precision: str, threads: int):
        import openvino as ov

        self.config, self.generation_config, self.device = model.config, model.generation_config, "cpu"
        self.precision = precision
        int8 = precision == "int8"
        self._compiled = ov.Core().compile_model(
            llama_graph(model, "int8" if int8 else "f32"),
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": "f32" if int8 else precision,
                # int8: the plugin quantizes the f32 activations to int8 on the fly, one scale per group of 32
                # (its default, stated so that the precision means one thing), for its int8 products; 0 is off
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32 if int8 else 0,
                # kept keys/values stay f32 at every precision: the plugin's default is u8 (answers change), and
                # bf16 ones measured slower here (batch 40 decode step 210 vs 137 ms, Intel Xeon AVX512-BF16)
                "KV_CACHE_PRECISION": "f32",
                "INFERENCE_NUM_THREADS": threads,
            },
        )
        self._request = self._compiled.create_infer_request()

    def prefix(self, ids: Sequence[int]) -> dict[str, Any]:
        """The shared prompt prefix's keys and values (one batch-1 forward, run here once): every batch's
        session starts from a copy of them instead of running the prefix again."""
        import numpy as np

        ids = np.array([list(ids)], dtype=np.int64)
        self._request.reset_state()
        self._request.infer(
            {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
                "beam_idx": np.zeros(1, np.int32),
            }
        )
        return {v.name: np.array(v.state.data, copy=True) for v in self._request.query_state()}

    def session(self, prefix: dict[str, Any] | None, rows: int) -> OpenVINOSession:
        return OpenVINOSession(self._request, prefix or {}, rows)


class OpenVINOSession:
    """One batch's decoding state on the openvino path: the infer request's kept keys/values."""

    def __init__(self, request: Any, prefix: dict[str, Any], rows: int):
        import numpy as np
        import openvino as ov

        self._request = request
        request.reset_state()
        self._beams = np.arange(rows, dtype=np.int32)
        if prefix:  # the one prefix row's keys/values, widened to every row by the first step's beam_idx
            for variable in request.query_state():
                variable.state = ov.Tensor(prefix[variable.name])
            self._beams = np.zeros(rows, dtype=np.int32)

    def _infer(self, ids, mask, positions, beams):
        return self._request.infer(
            {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "beam_idx": beams}
        )[0][:, -1]

    def forward(self, ids: Any, mask: Any, positions: Any, rows: Sequence[int] | None = None) -> Any:
        """Logits at the last position of each row, or of ``rows`` only (the graph computes every row)."""
        import numpy as np
        import torch

        logits = self._infer(ids.numpy(), mask.numpy(), positions.numpy(), self._beams)
        self._beams = np.arange(len(logits), dtype=np.int32)
        return torch.from_numpy(np.array(logits if rows is None else logits[list(rows)]))

    def select(self, keep: Sequence[int]) -> None:
        import numpy as np

        self._beams = np.asarray(keep, dtype=np.int32)


def session(model: Any, prefix: Any, rows: int, capacity: int) -> Any:
    """A decoding session of ``rows`` rows after ``prefix`` on whichever engine ``model`` is."""
    if isinstance(model, OpenVINOModel):
        return model.session(prefix, rows)
    return TorchSession(model, prefix, rows, capacity)


def prefix_state(model: Any, ids: Sequence[int]) -> Any:
    """What every batch's session starts from: the shared prefix's cache (torch) or its kept keys and
    values (openvino), computed once."""
    return model.prefix(ids) if isinstance(model, OpenVINOModel) else torch_prefix(model, ids)


def load_generator(base_dir: Any, adapter_dir: Any, p: EngineParams) -> Any:
    """The model that generates: base (+ adapter merged) on the engine ``p`` resolves to here.

    Returns the torch model, or an :class:`OpenVINOModel` built from it (the torch weights are then freed).
    """
    import torch

    from clap.model.base import default_device, load_model

    model = load_model(base_dir, adapter_dir)
    if resolve_engine(p, default_device()) == "torch":
        return model
    return OpenVINOModel(model, p.precision, torch.get_num_threads())


def engine_label(p: EngineParams, device: str) -> str:
    """The engine and precision that generate on ``device`` under ``p``, as records state it."""
    if resolve_engine(p, device) == "openvino":
        return f"openvino-{p.precision}"
    return "torch-bf16" if device == "cuda" else "torch-f32"
