"""LoRA SFT of one admitted batch: TRL SFTTrainer + peft, runtime diagnosis, resume, record.

Completion-only loss comes from TRL's conversational prompt/completion format (built only
with :func:`clap.task.prompt.build_example`). Training runs in ``<checkpoint_root>/<batch>/``,
outside the DVC outputs (DVC deletes non-persistent outs before a run), so a killed run
resumes from its last complete checkpoint when the params/data fingerprint still matches. A run
that finished (its adapter written) marks the folder finished; the next run, a forced re-run
included, clears it and trains from scratch.
Everything is rank-safe under ``torchrun``: side effects happen on rank 0 only.

Before the first optimizer step the run's cost is estimated on this machine and held to the
batch's budget (:mod:`clap.train.budget`, params ``release.cost``): over it, the run is refused
(a :class:`ClapError`) or not trained at all (health ``over_budget``), by policy.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import resource
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from clap import determinism, io
from clap.errors import ClapError
from clap.model import base as mdl
from clap.task.answer import AnswerSchema
from clap.task.context import item_docs, kb_bodies
from clap.task.prompt import build_example
from clap.train import budget
from clap.train.detector import DetectorParams
from clap.train.diagnosis import (
    STATE_FILE,
    as_text_if_nonfinite,
    detector_constants,
    logged_tokens,
    shared,
)
from clap.train.lora import adapted, lora_config, resolve_targets
from clap.train.warm_start import WarmStart
from clap.train.warm_start import adapter_dir as start_adapter_dir

if TYPE_CHECKING:
    from clap.train.callbacks import Diagnosis

log = logging.getLogger(__name__)
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
SKIPPED_FILE = "skipped.json"  # the adapter folder of a batch not trained, and why
FINGERPRINT_FILE = "fingerprint.json"


@dataclass(frozen=True)
class TrainParams:
    """params.yaml ``train`` (see the comments there)."""

    seed: int
    torch_threads: int
    epochs: float
    max_steps: int
    lr: float
    lr_scheduler: str
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    batch_size: int
    grad_accum: int
    max_length: int
    packing: bool
    length_grouping: bool
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: Sequence[str]
    quantization: str
    precision: str
    loss_on_prompt: bool
    save_steps: int
    checkpoint_root: str
    inject_nan_at_step: int


@dataclass
class TrainResult:
    """What :func:`train_batch` hands the stage: the flat record, curve rows, whether to write."""

    record: dict[str, Any]
    curves: list[dict[str, Any]]
    is_main: bool


@dataclass(frozen=True)
class Encodings:
    """What a run trains and probes on: the chat examples, their token ids, and the probe items' token ids."""

    examples: list[dict]
    train: list[mdl.Encoded]
    probe: list[mdl.Encoded]


@dataclass
class TrainerRun:
    """One finished trainer run (SFT or the GRPO probe): its flat numbers and its per-step curve rows."""

    numbers: dict[str, Any]
    curves: list[dict[str, Any]]


# --- data -------------------------------------------------------------------------------
def build_examples(items: pd.DataFrame, kb: pd.DataFrame, schema: AnswerSchema) -> list[dict]:
    """Conversational prompt/completion examples for admitted items (context from the KB)."""
    bodies = kb_bodies(kb)
    return [
        build_example(
            row["question"], item_docs(row, bodies, schema.context), {k: row[k] for k in schema.names}, schema
        )
        for row in items.to_dict("records")
    ]


def length_stats(encoded: list[mdl.Encoded], max_length: int) -> dict[str, int]:
    """Rows TRL would truncate (longer than max_length) or drop (prompt alone fills max_length).

    ``prompt_tokens`` and ``completion_tokens`` count the rows that are trained on (a dropped row is
    in no batch, so the gate's masking check must not expect its prompt masked: with 1 of 32
    TAT-QA rows dropped it read 90.7 % masked and capped a fully masked run);
    ``prompt_tokens_dropped`` the dropped prompts.
    """
    dropped = sum(e.n_prompt >= max_length for e in encoded)
    truncated = sum(len(e.input_ids) > max_length for e in encoded) - dropped
    return {
        "rows_truncated": int(truncated),
        "rows_dropped": int(dropped),
        "prompt_tokens": int(sum(e.n_prompt for e in encoded if e.n_prompt < max_length)),
        "prompt_tokens_dropped": int(sum(e.n_prompt for e in encoded if e.n_prompt >= max_length)),
        "completion_tokens": int(sum(e.n_completion for e in encoded if e.n_prompt < max_length)),
        "max_example_tokens": int(max((len(e.input_ids) for e in encoded), default=0)),
    }


def fingerprint(
    tp: TrainParams,
    dp: DetectorParams,
    encoded: dict[str, list],
    base_dir: Path,
    world_size: int,
    start_sha256: str = "",
) -> str:
    """Hash of everything that must match for a checkpoint to be resumed.

    ``encoded`` holds the token ids actually trained on and probed, not the data files: a change
    of the prompt builder or answer format (code, not data) must also start training afresh.
    """
    blob = {
        "train": asdict(tp),
        "detector": asdict(dp),
        "encoded": encoded,
        "base": mdl.base_sha256(base_dir),
        "world_size": world_size,
        **(
            {"start": start_sha256} if start_sha256 else {}
        ),  # absent for fresh weights: old fingerprints hold
    }
    return io.sha256_bytes(io.dumps_json(blob).encode())


def last_complete_checkpoint(ckpt_dir: Path, fp: str, is_main: bool) -> str | None:
    """The newest checkpoint of an unfinished run of this fingerprint holding the diagnosis state
    (written last), or None.

    Resuming is for a killed run. A folder with another fingerprint (params, data or base
    changed), or one its run marked finished (:func:`mark_finished`), is wiped on rank 0: a
    forced re-run of a finished run trains from scratch instead of continuing from its
    checkpoints (which would train nothing, or again from a checkpoint before its stop step).
    """
    marker = ckpt_dir / FINGERPRINT_FILE
    state = io.read_json(marker) if marker.exists() else {}
    if ckpt_dir.exists() and (state.get("fingerprint") != fp or state.get("finished")):
        _barrier()  # every rank has read the marker before rank 0 removes the folder
        if is_main:
            why = "belong to a finished run" if state.get("fingerprint") == fp else "do not match this run"
            log.warning("checkpoints in %s %s: starting fresh", ckpt_dir, why)
            shutil.rmtree(ckpt_dir)
        return None
    done = (
        [p for p in ckpt_dir.glob("checkpoint-*") if (p / STATE_FILE).exists()] if ckpt_dir.exists() else []
    )
    return str(max(done, key=lambda p: int(p.name.split("-")[1]))) if done else None


PRECISIONS = ("auto", "fp32", "bf16")
BITSANDBYTES = "bitsandbytes==0.50.2"  # the `cuda` extra of pyproject.toml (a test holds them equal)


def precision_plan(tp: TrainParams, device: str) -> str:
    """'qlora-nf4' (params ``quantization``), else the LoRA's precision: 'fp32-lora' or 'bf16-lora'
    (params ``precision``; ``auto``: bf16 on CUDA, fp32 on CPU)."""
    if tp.quantization not in ("auto", "none", "nf4"):
        raise ClapError(
            f"train.quantization must be auto, none or nf4, got {tp.quantization!r}",
            column="train.quantization",
            rule="bad_param",
        )
    if tp.precision not in PRECISIONS:
        raise ClapError(
            f"train.precision must be one of {', '.join(PRECISIONS)}, got {tp.precision!r}",
            column="train.precision",
            rule="bad_param",
        )
    if tp.quantization == "nf4" or (tp.quantization == "auto" and device == "cuda"):
        return "qlora-nf4"
    return lora_precision(tp, device)


def lora_precision(tp: TrainParams, device: str) -> str:
    """'bf16-lora' or 'fp32-lora': the precision of an unquantized LoRA run (SFT without nf4, the GRPO probe)."""
    bf16 = tp.precision == "bf16" or (tp.precision == "auto" and device == "cuda")
    return "bf16-lora" if bf16 else "fp32-lora"


def autocast_bf16(precision: str, device: str) -> bool:
    """Whether a run of plan ``precision`` computes under bf16 autocast (the trainers' ``bf16``, the
    detector's scoring): bf16 LoRA anywhere, QLoRA on CUDA (its compute dtype; 4-bit on CPU stays fp32)."""
    return precision == "bf16-lora" or (precision == "qlora-nf4" and device == "cuda")


def load_train_model(base_dir: Path, precision: str, device: str):
    """The base model to put LoRA on: its frozen weights in bf16 for 'bf16-lora' (the LoRA weights peft
    adds stay fp32), fp32 for 'fp32-lora'; 4-bit nf4 for QLoRA (bf16 compute on CUDA, fp32 on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    bf16 = precision == "bf16-lora" or (precision == "qlora-nf4" and device != "cpu")
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
    if precision == "qlora-nf4":
        try:
            import bitsandbytes  # noqa: F401  (optional dependency: CUDA QLoRA)
        except ImportError as e:
            raise ClapError(
                f"QLoRA needs bitsandbytes, the `cuda` extra: make install-cuda (or pip install -e '.[cuda]', "
                f"which pins {BITSANDBYTES}); train.quantization: none trains LoRA without it",
                column="train.quantization",
                rule="missing_bitsandbytes",
            ) from e
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        if device == "cuda":
            from accelerate import PartialState

            kwargs["device_map"] = {"": PartialState().local_process_index}
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), **kwargs)
    if precision == "qlora-nf4" and device == "cpu":
        _disable_bnb_cpu_repacking(model)
    return model


def _disable_bnb_cpu_repacking(model) -> None:
    # On AVX512-BF16 CPUs an eval forward repacks 4-bit weights in place and later LoRA
    # gradients are silently wrong (research notes §4); the detector scores in eval mode.
    import bitsandbytes as bnb

    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False


def sft_config(tp: TrainParams, out_dir: Path, device: str, world_size: int):
    """The SFTConfig: every knob from params; CPU-safe (use_cpu; bf16 autocast only as params say,
    never TRL's default)."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(out_dir),
        use_cpu=device == "cpu",
        bf16=autocast_bf16(precision_plan(tp, device), device),
        fp16=False,
        seed=tp.seed,
        data_seed=tp.seed,
        num_train_epochs=tp.epochs,
        max_steps=tp.max_steps,
        learning_rate=tp.lr,
        lr_scheduler_type=tp.lr_scheduler,
        warmup_steps=tp.warmup_ratio,
        weight_decay=tp.weight_decay,
        max_grad_norm=tp.max_grad_norm,
        per_device_train_batch_size=tp.batch_size,
        gradient_accumulation_steps=tp.grad_accum,
        max_length=tp.max_length,
        packing=tp.packing,
        completion_only_loss=not tp.loss_on_prompt,
        train_sampling_strategy="group_by_length" if tp.length_grouping and not tp.packing else "random",
        activation_checkpointing=False,
        logging_steps=1,
        logging_nan_inf_filter=False,  # the filter hides NaN losses
        save_strategy="steps",
        save_steps=tp.save_steps,
        save_total_limit=2,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo" if device == "cpu" and world_size > 1 else None,
    )


def detector_pairing(tp: TrainParams, dp: DetectorParams, model) -> None:
    """Refuse a run whose training side and probe side of a detector check would not be alike.

    A check pairs the step's logged training loss with a probe draw scored at the same parameters
    (docs/detector.md). Settings that break that silently are errors with the detector on:
    ``epochs`` above 1 (a step's batch seen before), ``length_grouping`` (rows sorted by length are not a random draw of the training items) and
    any dropout active in training (``lora_dropout``, or a dropout module or ``*dropout`` rate of the
    model's config): the training loss is then a train-mode loss and the probe's an eval-mode one.
    """
    if not dp.enabled:
        return
    if tp.epochs > 1:
        raise ClapError(
            f"train.epochs: {tp.epochs} shows training items again after the first epoch, when a step's loss is "
            "no longer on items the model has not seen, which the TBDL detector's null needs (its probe items "
            "are never trained on); set epochs to at most 1 or detector.enabled false",
            column="train.epochs",
            rule="detector_pairing",
        )
    if tp.length_grouping and not tp.packing:
        raise ClapError(
            "train.length_grouping: true sorts training rows by length, so a step's batch is not a random "
            "draw of the training items, which the TBDL detector's null needs; set it false or "
            "detector.enabled false",
            column="train.length_grouping",
            rule="detector_pairing",
        )
    import torch

    rates = {
        name: float(m.p) for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0
    }
    config = getattr(model, "config", None)
    rates.update(
        {
            f"config.{k}": float(v)
            for k, v in (vars(config).items() if config is not None else ())
            if "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        }
    )
    if rates:
        first = ", ".join(f"{k}={v}" for k, v in sorted(rates.items())[:3])
        raise ClapError(
            f"dropout is active in training ({len(rates)} places: {first}): the logged training loss "
            "would be a train-mode loss and the detector's probe an eval-mode one; set train.lora_dropout "
            "to 0 (and the model's dropout rates) or detector.enabled false",
            column="train.lora_dropout",
            rule="detector_pairing",
        )


LORA_KEYS = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout"}


def load_start_adapter(model, start_dir: Path, tp: TrainParams):
    """``model`` with the adapter of ``start_dir`` on it, trainable: the warm start.

    The adapter's LoRA shape must be the one params ask for: peft would otherwise train the
    loaded shape and silently ignore ``train.lora_*`` / ``target_modules``.

    Raises:
        ClapError: the adapter's LoRA config differs from params (names each key).
    """
    from peft import PeftModel

    config = io.read_json(start_dir / ADAPTER_FILES[1])
    want = {k: getattr(tp, v) for k, v in LORA_KEYS.items()} | {
        "target_modules": resolve_targets(model, tp.target_modules)
    }
    have = {k: config.get(k) for k in LORA_KEYS} | {
        "target_modules": sorted(config.get("target_modules") or [])
    }
    bad = [f"{k}: adapter {have[k]!r}, params {want[k]!r}" for k in want if have[k] != want[k]]
    if bad:
        raise ClapError(
            "the warm-start adapter's LoRA shape is not the one params ask for (" + "; ".join(bad) + "): "
            "set train.init: base to train a fresh adapter of the new shape",
            file=start_dir / ADAPTER_FILES[1],
            rule="warm_start_lora_mismatch",
        )
    return PeftModel.from_pretrained(model, str(start_dir), is_trainable=True)


# TRL's torch tile fallback (every device without Triton) folds each (positions x chunk) logits tile with
# ~10 whole-tile temporaries; at its 32768-column default those are tens of MB each, which the allocator
# maps and unmaps on every tile (page faults, as much system time as compute). 1024-column tiles stay
# in cache: the same log-probs and gradients, a faster CPU LM head (benchmarks/lm_head.py measures both).
CPU_LOGPROB_CHUNK = 1024


@contextlib.contextmanager
def compact_lm_head(device_type: str = "cpu"):
    """Make TRL's fused LM head score only loss positions on CPU too (it does so on CUDA), in
    cache-sized tiles where TRL has no Triton kernel (:data:`CPU_LOGPROB_CHUNK`).

    TRL 1.16 projects every position through the 49k-token LM head unless Triton is in use
    (a Neuron recompilation concern, ``trl/trainer/utils.py`` ``compact = _use_triton(...)``).
    With completion-only loss ~80 % of positions carry no label, so on CPU this is most of
    the LM-head work; the loss and gradients are identical (tested).
    """
    import trl.trainer.utils as trl_utils

    patches = {"_use_triton": lambda device: True}  # only the `compact` decision reads this module's name
    if device_type == "cpu":
        patches["_CHUNKED_LOGPROB_CHUNK_SIZE"] = CPU_LOGPROB_CHUNK
    missing = [name for name in patches if not hasattr(trl_utils, name)]
    if missing:  # a TRL without these names: nothing to patch
        log.warning("trl.trainer.utils has no %s: the LM head runs as TRL ships it", ", ".join(missing))
        yield
        return
    originals = {name: getattr(trl_utils, name) for name in patches}
    for name, value in patches.items():
        setattr(trl_utils, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(trl_utils, name, value)


def _lora_addmm_forward(original):
    """peft's ``lora.Linear.forward`` with the LoRA update added inside one ``addmm``.

    peft computes ``result + lora_B(lora_A(dropout(x))) * scaling``: two passes over the
    (tokens x out_features) output besides the products (the scaling, the sum), and two more in
    the backward. ``addmm(result, lora_A(dropout(x)), B^T, alpha=scaling)`` scales and adds inside
    the product's own write: one fewer (tokens x out_features) tensor per layer and pass, the same
    loss and gradients to float rounding (the sum is rounded once instead of twice; with the
    demo's scaling 2 the adapters came out byte-identical on an AVX-512 Xeon). Everything else
    (adapters switched off or merged, several or per-row adapters, DoRA and other variants,
    autocast, an input peft would cast) goes to peft's own forward.
    """
    import torch

    def forward(self, x, *args, **kwargs):
        names = self.active_adapters
        if (
            args
            or kwargs
            or self.disable_adapters
            or self.merged
            or len(names) != 1
            or names[0] not in self.lora_A
            or names[0] in self.lora_variant
            or torch.is_autocast_enabled(x.device.type)
            or x.dtype != self.lora_A[names[0]].weight.dtype  # peft would cast the input first
        ):
            return original(self, x, *args, **kwargs)
        name = names[0]
        result = self.base_layer(x)
        low = self.lora_A[name](self.lora_dropout[name](x))
        flat = torch.addmm(
            result.reshape(-1, result.shape[-1]),
            low.reshape(-1, low.shape[-1]),
            self.lora_B[name].weight.t(),
            alpha=self.scaling[name],
        )
        return flat.view(result.shape)

    return forward


@contextlib.contextmanager
def fused_lora_update():
    """Every plain LoRA linear layer adds its update inside one ``addmm`` (:func:`_lora_addmm_forward`)
    while the context is open; peft's own forward is restored on exit."""
    from peft.tuners.lora.layer import Linear

    original = Linear.forward
    Linear.forward = _lora_addmm_forward(original)
    try:
        yield
    finally:
        Linear.forward = original


@contextlib.contextmanager
def training_forwards(model, bf16: bool = False):
    """How clap's trainers compute a training forward: TRL's fused LM head on loss positions only
    (:func:`compact_lm_head`) over a decoder that computes the rows' shared prefix once
    (:func:`clap.train.shared_prefix.shared_prefix_backbone`), each LoRA update added inside its
    product (:func:`fused_lora_update`). Loss and gradients as the plain forward's.

    ``bf16``: the run computes under bf16 autocast (:func:`autocast_bf16`). peft then casts each LoRA
    layer's bf16 input up to its fp32 weights' dtype and autocast casts it straight back down for the
    product: a lossless round trip of two copies per layer and pass. It is switched off
    (``peft.helpers.disable_input_dtype_casting``): loss and gradients bit-identical, ~5 % of a step.
    """
    from peft.helpers import disable_input_dtype_casting

    from clap.train.shared_prefix import shared_prefix_backbone

    with (
        compact_lm_head(model.device.type),
        shared_prefix_backbone(model),
        disable_input_dtype_casting(model, active=bf16),
        fused_lora_update(),
    ):
        yield


def masked_label_counts(dataset) -> tuple[int, int]:
    """(labels masked with -100, all label positions) in the trainer's prepared dataset."""
    labels = dataset["labels"]
    masked = sum(sum(1 for t in row if t == -100) for row in labels)
    return int(masked), int(sum(len(row) for row in labels))


# --- the run ------------------------------------------------------------------------------
def admitted(admission: dict[str, Any], data_dir: Path) -> bool:
    """The admission verdict (``verdict``, or ``admitted`` in older records); missing is an error."""
    verdict = admission.get("verdict", admission.get("admitted"))
    if not isinstance(verdict, bool):
        raise ClapError(
            "admission record has no boolean verdict",
            file=data_dir / "admission.json",
            column="verdict",
            rule="no_verdict",
        )
    return verdict


def skipped_record(reason: str, base_dir: Path, tp: TrainParams) -> dict[str, Any]:
    """The record of a batch that is not trained (not admitted)."""
    none = {k: -1 for k in ("detector_alarm_step", "stop_step")}
    zero = {
        k: 0
        for k in ("steps", "planned_steps", "tokens", "rows_truncated", "rows_dropped", "detector_checks")
    }
    return {
        "trained": 0,
        "health": "skipped",
        "skip_reason": reason,
        **none,
        **zero,
        "alarm_fraction": -1.0,
        "base_sha256": mdl.base_sha256(base_dir),
        "adapter_sha256": "",
        "seed": tp.seed,
        "torch_threads": tp.torch_threads,
    }


def train_batch(
    data_dir: Path | str,
    base_dir: Path | str,
    adapter_dir: Path | str,
    tp: TrainParams,
    dp: DetectorParams,
    *,
    answer: AnswerSchema,
    bp: budget.BudgetParams,
    start: WarmStart | None = None,
    extra_callbacks: Sequence[Any] = (),
) -> TrainResult:
    """Train one admitted batch's LoRA adapter and write it to ``adapter_dir`` (rank 0).

    Args:
        data_dir: ``data/admitted/<batch>`` (sft, probe, kb parquet + admission.json).
        base_dir: the exported base model folder.
        adapter_dir: destination of adapter_model.safetensors + adapter_config.json (+ tokenizer).
        tp: ``train`` params.  dp: ``detector`` params.
        answer: the declared answer (params ``task``): the completions' shape.
        bp: the budget the run is held to before it trains (params ``release.cost``).
        start: what the adapter starts from (stage ``warm_start``; None: fresh LoRA weights). A
            warm start loads that adapter (a sibling folder of ``adapter_dir``, its sha256 checked)
            and trains it further on this batch.
        extra_callbacks: more TrainerCallbacks (tests use one to interrupt a run).

    Returns:
        The flat record and the per-step curve rows; ``is_main`` says whether this rank writes.
        A run estimated over budget under policy ``hold`` is not trained: its record says
        ``trained: 0, health: over_budget`` with the estimate (``cost_*``), its adapter folder
        holds only ``skipped.json``.

    Raises:
        ClapError: the estimate is over budget under policy ``refuse`` (before any optimizer step).
    """
    data_dir, base_dir, adapter_dir = Path(data_dir), Path(base_dir), Path(adapter_dir)
    rank, world_size = determinism.world()
    admission = io.read_json(data_dir / "admission.json")
    if not admitted(admission, data_dir):
        reason = "; ".join(str(r) for r in admission.get("reasons", [])) or "batch not admitted"
        if rank == 0:
            write_skipped_adapter(adapter_dir, reason)
        return TrainResult(skipped_record(reason, base_dir, tp), [], rank == 0)
    t_start = time.perf_counter()
    start_dir = (
        start_adapter_dir(start, adapter_dir.parent) if start is not None and not start.fresh else None
    )
    determinism.seed_everything(tp.seed, tp.torch_threads)
    tok, data, stats = _encode_batch(data_dir, base_dir, tp, answer)
    try:
        run = _run_trainer(
            data,
            tok,
            base_dir,
            adapter_dir,
            tp,
            dp,
            bp,
            world_size=world_size,
            started=t_start,
            start_dir=start_dir,
            extra_callbacks=extra_callbacks,
        )
    except _HeldOverBudget as held:
        return _held_result(held.estimate, base_dir, adapter_dir, tp, stats, started=t_start, rank=rank)
    record = _trained_record(run, stats, data, tp, dp, start, world_size=world_size, started=t_start)
    # a NaN loss is reported as the string "nan", never dropped (JSON has no NaN)
    return TrainResult({k: as_text_if_nonfinite(v) for k, v in record.items()}, run.curves, rank == 0)


def _encode_batch(
    data_dir: Path, base_dir: Path, tp: TrainParams, answer: AnswerSchema
) -> tuple[Any, Encodings, dict[str, int]]:
    """The batch's training and probe items as chat examples and token ids (with the tokenizer), and
    their length stats under ``train.max_length`` (truncated and dropped rows are logged)."""
    sft, probe, kb = (io.read_parquet(data_dir / f"{n}.parquet") for n in ("sft", "probe", "kb"))
    if sft.empty:
        raise ClapError(
            "admitted batch has no training items", file=data_dir / "sft.parquet", rule="empty_sft"
        )
    tok = mdl.load_tokenizer(base_dir, padding_side="right")
    train_ex = build_examples(sft, kb, answer)
    data = Encodings(
        train_ex,
        [mdl.encode_example(tok, e) for e in train_ex],
        [mdl.encode_example(tok, e) for e in build_examples(probe, kb, answer)],
    )
    stats = length_stats(data.train, tp.max_length)
    if stats["rows_truncated"] or stats["rows_dropped"]:
        log.warning(
            "max_length %d: %d rows truncated, %d dropped (prompt alone too long)",
            tp.max_length,
            stats["rows_truncated"],
            stats["rows_dropped"],
        )
    return tok, data, stats


def _held_result(
    estimate: budget.Estimate,
    base_dir: Path,
    adapter_dir: Path,
    tp: TrainParams,
    stats: dict[str, int],
    *,
    started: float,
    rank: int,
) -> TrainResult:
    """A batch not trained because its estimate is over budget and policy holds it: its adapter folder
    says why (rank 0), its record says ``health: over_budget`` with the estimate."""
    reason = f"over budget: {estimate.describe()}"
    log.warning("not trained: %s (release.cost.over_budget is hold)", reason)
    if rank == 0:
        write_skipped_adapter(adapter_dir, reason)
    record = {
        **skipped_record(reason, base_dir, tp),
        **stats,
        "health": budget.OVER_BUDGET,
        **estimate.record(),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    return TrainResult(record, [], rank == 0)


def _trained_record(
    run: TrainerRun,
    stats: dict[str, int],
    data: Encodings,
    tp: TrainParams,
    dp: DetectorParams,
    start: WarmStart | None,
    *,
    world_size: int,
    started: float,
) -> dict[str, Any]:
    """The flat record of a trained batch: the run's numbers, what it trained on and from, where it ran."""
    return {
        **run.numbers,
        **stats,
        "trained": 1,
        "wall_s": round(time.perf_counter() - started, 3),
        "examples": len(data.examples),
        "probe_items": len(data.probe),
        "seed": tp.seed,
        "torch_threads": tp.torch_threads,
        "world_size": world_size,
        "loss_on_prompt": tp.loss_on_prompt,
        "init_from_batch": start.from_batch if start is not None else "",
        "init_adapter_sha256": start.adapter_sha256 if start is not None else "",
        "machine": platform.machine(),
        **detector_constants(dp),
    }


class _HeldOverBudget(Exception):
    """The run's estimate is over budget and policy holds it: nothing is trained."""

    def __init__(self, estimate: budget.Estimate):
        super().__init__(estimate.describe())
        self.estimate = estimate


def _run_trainer(
    data: Encodings,
    tok,
    base_dir: Path,
    adapter_dir: Path,
    tp: TrainParams,
    dp: DetectorParams,
    bp: budget.BudgetParams,
    *,
    world_size: int,
    started: float,
    start_dir: Path | None,
    extra_callbacks: Sequence[Any],
) -> TrainerRun:
    """One SFT run: set up the trainer (resuming a matching checkpoint), hold it to the budget, train
    (or restore a run that had stopped), score the probe and write the adapter (rank 0)."""
    device = mdl.default_device()
    precision = precision_plan(tp, device)
    if precision == "qlora-nf4" and device == "cpu":
        log.warning("4-bit nf4 forced on CPU (train.quantization: nf4): slower than fp32 LoRA here")
    ckpt_dir = Path(tp.checkpoint_root) / adapter_dir.name
    args = sft_config(tp, ckpt_dir, device, world_size)  # initialises the distributed state under torchrun
    is_main = args.process_index == 0
    fp, resume = _resume_point(data, base_dir, tp, dp, ckpt_dir, world_size, start_dir, is_main)
    trainer, diag = _build_trainer(
        data, tok, base_dir, adapter_dir, tp, dp, args, precision, device, start_dir, resume, extra_callbacks
    )
    masked, total = masked_label_counts(trainer.train_dataset)
    estimate = _hold_to_budget(trainer, tp, bp, device=device, world_size=world_size, started=started)
    out = _train_or_restore(trainer, diag, resume, bf16=args.bf16)
    probe_start, probe_end = diag.score_probe(trainer.model)
    adapter_sha = _save_adapter(trainer, ckpt_dir, adapter_dir, fp, is_main)
    numbers = {
        **_run_numbers(trainer, out, diag),
        **estimate.record(),
        "precision": precision,
        "device": device,
        "resumed_from": Path(resume).name if resume else "",
        "masked_tokens_fraction": masked / max(total, 1),
        "label_tokens": total,
        "probe_loss_start": probe_start,
        "probe_loss_end": probe_end,
        "base_sha256": mdl.base_sha256(base_dir),
        "adapter_sha256": adapter_sha,
        **adapted(trainer.model),  # what the adapter adapts, read from the model
    }
    return TrainerRun(numbers, diag.s.rows)


def _resume_point(
    data: Encodings,
    base_dir: Path,
    tp: TrainParams,
    dp: DetectorParams,
    ckpt_dir: Path,
    world_size: int,
    start_dir: Path | None,
    is_main: bool,
) -> tuple[str, str | None]:
    """The run's fingerprint (params, encoded examples, base, world size, start adapter) and the last
    complete checkpoint that matches it (None: train from scratch); rank 0 records the fingerprint."""
    fp = fingerprint(
        tp,
        dp,
        {
            name: [[e.n_prompt, *e.input_ids] for e in enc]
            for name, enc in (("train", data.train), ("probe", data.probe))
        },
        base_dir,
        world_size,
        io.sha256_file(start_dir / ADAPTER_FILES[0]) if start_dir is not None else "",
    )
    resume = last_complete_checkpoint(ckpt_dir, fp, is_main)
    _barrier()
    if is_main:
        io.write_json(ckpt_dir / FINGERPRINT_FILE, {"fingerprint": fp})
    return fp, resume


def _build_trainer(
    data: Encodings,
    tok,
    base_dir: Path,
    adapter_dir: Path,
    tp: TrainParams,
    dp: DetectorParams,
    args,
    precision: str,
    device: str,
    start_dir: Path | None,
    resume: str | None,
    extra_callbacks: Sequence[Any],
):
    """The SFT trainer over the base model (a fresh LoRA, or the warm start's adapter) with its
    diagnosis callback (its state restored from ``resume``), paired with the probe and quiet."""
    from datasets import Dataset
    from trl import SFTTrainer

    from clap.train.callbacks import (
        Diagnosis,
        TrainProgress,
        paired_trainer,
        quiet_trainer,
        trainable_weights,
    )

    model = load_train_model(base_dir, precision, device)
    if start_dir is not None:
        model = load_start_adapter(model, start_dir, tp)
    diag = Diagnosis(
        dp,
        data.probe,
        max_tokens=tp.max_length,
        inject_nan_at_step=tp.inject_nan_at_step,
        start_weights=trainable_weights(model) if start_dir is not None else None,
        prefix_ids=mdl.shared_prompt_prefix([*data.train, *data.probe]),
        bf16=autocast_bf16(precision, device),
    )
    if resume:
        log.warning("resuming from %s", resume)
        diag.load_state(resume)
    trainer = paired_trainer(SFTTrainer, diag)(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(data.examples),
        processing_class=tok,
        peft_config=None if start_dir is not None else lora_config(tp, model),  # a warm start is a PeftModel
        callbacks=[diag, *extra_callbacks],
    )
    detector_pairing(tp, dp, trainer.model)
    quiet_trainer(trainer, TrainProgress(f"train {adapter_dir.name}", ("loss",)))
    return trainer, diag


def _hold_to_budget(
    trainer, tp: TrainParams, bp: budget.BudgetParams, *, device: str, world_size: int, started: float
) -> budget.Estimate:
    """The run's cost estimate on this machine; raises :class:`_HeldOverBudget` (policy hold) or a
    :class:`ClapError` (policy refuse) when it is over budget, before any optimizer step."""
    estimate = shared(  # rank 0's estimate decides on every rank: they must stop (or train) together
        budget.estimate_run(
            trainer, tp, bp, device=device, world_size=world_size, setup_s=time.perf_counter() - started
        )
    )
    log.info("cost: %s", estimate.describe())
    if budget.over_budget(estimate, bp):
        raise _HeldOverBudget(estimate)
    return estimate


def _train_or_restore(trainer, diag: Diagnosis, resume: str | None, *, bf16: bool):
    """Train (from ``resume`` when given), or, when the checkpointed run had stopped, restore it as it
    stopped: that was its end, not a pause."""
    if resume and diag.s.stop_step >= 0:
        log.warning(
            "the run in %s stopped at step %d (%s): restoring it, nothing left to train",
            resume,
            diag.s.stop_step,
            diag.s.health,
        )
        return restore_stopped_run(trainer, diag, Path(resume))
    with training_forwards(trainer.model, bf16=bf16):
        return trainer.train(resume_from_checkpoint=resume)


def _save_adapter(trainer, ckpt_dir: Path, adapter_dir: Path, fp: str, is_main: bool) -> str:
    """Save the trained adapter (every rank: FSDP gathers), copy it to ``adapter_dir`` and mark the run
    finished (rank 0); its sha256 ("" on other ranks)."""
    final = ckpt_dir / "final"
    trainer.save_model(str(final))  # every rank (FSDP gathers); writes on the main process only
    _barrier()
    adapter_sha = write_adapter(final, adapter_dir) if is_main else ""
    if is_main:
        mark_finished(ckpt_dir, fp)
    return adapter_sha


def mark_finished(ckpt_dir: Path, fp: str) -> None:
    """Record that the run of ``ckpt_dir`` ended and its adapter is written: nothing to resume."""
    io.write_json(ckpt_dir / FINGERPRINT_FILE, {"fingerprint": fp, "finished": True})


def restore_stopped_run(trainer, diag: Diagnosis, checkpoint: Path):
    """Put a stopped run's last checkpoint (written at its stop step) back in place of training.

    ``trainer.train(resume_from_checkpoint=...)`` would train on: Trainer runs a step before
    it checks a stop flag, so a run the detector stopped would come back with more steps and
    another adapter.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState
    from transformers.trainer_utils import TrainOutput

    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    set_peft_model_state_dict(trainer.model, load_file(str(checkpoint / ADAPTER_FILES[0])))
    diag.resumed_tokens = logged_tokens(trainer.state.log_history)
    return TrainOutput(trainer.state.global_step, 0.0, {"train_runtime": 0.0})


def _run_numbers(trainer, out, diag: Diagnosis) -> dict[str, Any]:
    """Steps, tokens, losses, throughput and memory of a finished ``trainer.train()``."""
    rows = [r for r in diag.s.rows if r["loss"] is not None]
    losses = [float(r["loss"]) for r in rows]
    finite = [v for v in losses if np.isfinite(v)]
    tokens = diag.resumed_tokens + diag.run_tokens
    runtime = float(out.metrics.get("train_runtime", 0.0))
    summary = diag.summary()
    if summary["health"] == "ok" and trainer.state.global_step < diag.s.planned_steps:
        summary["health"] = "stopped"  # stopped early by something other than the diagnosis
    return {
        **summary,
        "steps": int(trainer.state.global_step),
        "planned_steps": int(diag.s.planned_steps),
        "epochs": float(trainer.state.epoch or 0.0),
        "tokens": int(tokens),
        "train_runtime_s": round(runtime, 3),
        "tokens_per_s": round(diag.run_tokens / runtime, 3) if runtime > 0 else 0.0,
        "final_loss": losses[-1] if losses else float("nan"),
        "min_loss": min(finite) if finite else float("nan"),
        "train_loss_end": finite[-1] if finite else float("nan"),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def write_adapter(src: Path, adapter_dir: Path) -> str:
    """Copy the saved adapter (+ tokenizer files) into ``adapter_dir`` atomically; its sha256."""
    missing = [n for n in ADAPTER_FILES if not (src / n).exists()]
    if missing:
        raise ClapError(f"trainer did not save {missing}", file=src, rule="adapter_not_saved")
    with io.atomic_dir(adapter_dir) as tmp:
        for p in sorted(src.iterdir()):
            if p.is_file() and not p.name.startswith(("training_args", "README")):
                shutil.copy2(p, tmp / p.name)
        canonical_adapter_config(tmp / ADAPTER_FILES[1])
    return io.sha256_file(adapter_dir / ADAPTER_FILES[0])


def canonical_adapter_config(path: Path) -> None:
    """Rewrite peft's adapter_config.json with ``target_modules`` sorted.

    peft keeps target_modules as a set and writes it in string-hash order, which changes with
    PYTHONHASHSEED from run to run: without this the adapter folder is not byte-identical.
    """
    config = io.read_json(path)
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    io.write_json(path, config)


def write_skipped_adapter(adapter_dir: Path, reason: str) -> None:
    """An adapter folder without weights: the batch was not trained, and why."""
    with io.atomic_dir(adapter_dir) as tmp:
        io.write_json(tmp / SKIPPED_FILE, {"trained": False, "reason": reason})
