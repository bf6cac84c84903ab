"""Generation engines: whose forward pass :mod:`clap.model.generate` drives.

``torch``: the Hugging Face model itself (CPU fp32, CUDA bf16). ``openvino``: the same weights
(the adapter merged in first, as :func:`clap.model.base.load_model` does) compiled by the
`OpenVINO <https://docs.openvino.ai>`_ runtime for the CPU, from the graph
:func:`clap.model.ov_graph.causal_lm_graph` writes op by op from the model's modules and config
(llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text). Nothing is exported to disk and no exporter
is needed: ``optimum-intel``, the usual route, pins other transformers and torch versions than clap's.

The engine is chosen per model (:func:`choose_engine`): where openvino is asked for but the device is
not a CPU, or the graph cannot express the model (:func:`clap.model.ov_graph.unsupported`: an unknown
family, a rope whose frequencies change with the length, ...), torch generates, and the records say so
(``generation_engine`` ``torch-f32``, ``engine_fallback`` the reason).

The decoding loop, the constraint, the batching and the stop rules stay clap's
(:func:`clap.model.generate.generate_batched`); an engine only answers "logits at the last position
of these rows" and "keep these rows". At f32 (keys and values kept at f32 at either precision: the
plugin's default is u8) answers are token-identical to the torch path on the benchmark prompts, free
and constrained; ``bf16`` (weights and activations) and ``int8`` (int8 weights, one scale per output
channel; the plugin quantizes activations on the fly) are params, measured separately for speed and
for decision agreement (docs/precision.md), never implied.

Speed against torch and against OpenVINO GenAI on each CPU kind, side by side: ``benchmarks/README.md``
(``generation_engines``); building and compiling the graph is paid once per model a stage loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clap.model.kv import buffered_cache
from clap.model.ov_graph import causal_lm_graph, unsupported
from clap.params import bad_param

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine that generates for one model on one device under ``chain.engine``."""

    name: str
    """``openvino`` or ``torch``: the engine that runs."""
    label: str
    """The engine and precision as records state them (``openvino-int8``, ``torch-f32``, ...)."""
    fallback: str
    """Why torch runs although openvino was asked for ("" when the engine asked for runs)."""

    def record(self) -> dict[str, str]:
        """The fields eval and replay records state the engine with."""
        return {"generation_engine": self.label, "engine_fallback": self.fallback}


def choose_engine(p: EngineParams, device: str, config: Any) -> EngineChoice:
    """The engine that generates on ``device`` for the model of ``config`` (a transformers config):
    openvino where asked for, on the CPU, for a model its graph can express; torch otherwise, with the
    reason (openvino compiles for the CPU only; :func:`clap.model.ov_graph.unsupported`)."""
    torch_label = "torch-bf16" if device == "cuda" else "torch-f32"
    if p.name == "torch":
        return EngineChoice("torch", torch_label, "")
    if device != "cpu":
        return EngineChoice("torch", torch_label, f"openvino compiles for the CPU only, not {device}")
    if (why := unsupported(config)) is not None:
        return EngineChoice("torch", torch_label, f"openvino cannot build {config.model_type}: {why}")
    return EngineChoice("openvino", f"openvino-{p.precision}", "")


def resolve_engine(p: EngineParams, device: str, config: Any) -> str:
    """The engine that runs on ``device`` for the model of ``config``: ``openvino`` or ``torch``."""
    return choose_engine(p, device, config).name


def engine_label(p: EngineParams, device: str, config: Any) -> str:
    """The engine and precision that generate on ``device`` for the model of ``config``, as records
    state it."""
    return choose_engine(p, device, config).label


def model_config(base_dir: Path | str) -> Any:
    """The base model's transformers config (its config.json): what the engine choice reads, without
    loading the weights. An adapter changes no field it reads."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(base_dir))


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
    """The one-row cache of ``ids`` (the prompt prefix every row shares).

    Every layer keeps every key, as the sessions' caches do: the cache a sliding-window model makes for
    itself keeps only its window's last keys, which the rows' caches would then take for the whole prefix.
    """
    import torch

    return model(
        input_ids=torch.tensor([list(ids)], device=model.device),
        cache=buffered_cache(None, 1, len(ids)),
        use_cache=True,
        logits_to_keep=1,
    ).cache


class OpenVINOModel:
    """A causal LM compiled by OpenVINO for the CPU, with what the generator reads of a model
    (``config``, ``generation_config``, ``device``)."""

    def __init__(self, model: Any, precision: str, threads: int):
        import openvino as ov

        self.config, self.generation_config, self.device = model.config, model.generation_config, "cpu"
        self.precision = precision
        int8 = precision == "int8"
        self._compiled = ov.Core().compile_model(
            causal_lm_graph(model, "int8" if int8 else "f32"),
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
    choice = choose_engine(p, default_device(), model.config)
    if choice.fallback:
        log.warning("generating on %s: %s", choice.label, choice.fallback)
    if choice.name == "torch":
        return model
    return OpenVINOModel(model, p.precision, torch.get_num_threads())
