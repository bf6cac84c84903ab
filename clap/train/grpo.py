"""The GRPO failure-boundary probe: a short TRL ``GRPOTrainer`` run on the admitted D_grpo.

CLAP used GRPO only as a probe: every batch passed static admission (rank-pass rate 1.0,
reward margin ~0.225) yet every run showed extreme KL at runtime and was held. Here the
probe is a working control: the reward is the field-level answer score eval uses
(:func:`clap.task.scoring.reward`), ``beta > 0`` so KL is measured against the starting policy,
and :class:`clap.train.grpo_diagnosis.GrpoDiagnosis` stops the run with ``health = hold`` when
a pre-registered runtime signal fires. The record puts the static admission verdict next to
the runtime verdict; :mod:`clap.train.grpo_policy` turns it into the batch's GRPO-candidate decision.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from clap import determinism, io
from clap.errors import ClapError
from clap.model import base as mdl
from clap.task.answer import AnswerSchema, gold_of
from clap.task.context import item_docs, kb_bodies
from clap.task.prompt import build_messages, format_answer
from clap.task.scoring import ScoringParams, context_text, reward
from clap.train.diagnosis import as_text_if_nonfinite
from clap.train.grpo_noise import reward_tests
from clap.train.grpo_policy import GrpoParams, probe_enabled, static_verdict
from clap.train.lora import lora_config
from clap.train.sft import (
    ADAPTER_FILES,
    SKIPPED_FILE,
    TrainerRun,
    TrainParams,
    autocast_bf16,
    canonical_adapter_config,
    load_train_model,
    lora_precision,
    training_forwards,
)

log = logging.getLogger(__name__)
NOT_RUN_FILE = "not_run.json"


@dataclass
class ProbeResult:
    """What :func:`run_probe` hands the stage: the flat record, curve rows, whether this rank writes."""

    record: dict[str, Any]
    curves: list[dict[str, Any]]
    is_main: bool


# --- reward and data ----------------------------------------------------------------------
def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or conversational ``[{"role", "content"}, ...]``."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def reward_function(sp: ScoringParams) -> Callable[..., list[float]]:
    """The GRPO reward: :func:`clap.task.scoring.reward` (eval's field-level ``overall``) per completion.

    TRL passes the dataset columns ``gold`` (canonical answer JSON) and ``context`` (the
    provided context as scoring renders it) next to the completions.
    """

    def answer_score(completions: list[Any], gold: list[str], context: list[str], **_: Any) -> list[float]:
        return [
            reward(completion_text(c), json.loads(g), ctx, sp)
            for c, g, ctx in zip(completions, gold, context, strict=True)
        ]

    return answer_score


def probe_rows(items: pd.DataFrame, kb: pd.DataFrame, schema: AnswerSchema) -> list[dict[str, Any]]:
    """One GRPO dataset row per D_grpo item: the chat prompt (clap.task.prompt), gold answer and context."""
    bodies = kb_bodies(kb)
    rows = []
    for row in items.to_dict("records"):
        # the reference is admit's: the answer its reward-margin check ranks first
        docs = item_docs(row, bodies, schema.context)
        rows.append(
            {
                "prompt": build_messages(row["question"], docs, schema),
                "gold": format_answer(gold_of(row, schema), schema),
                "context": context_text(docs),
            }
        )
    return rows


# --- rollouts -----------------------------------------------------------------------------
# TRL's sampling knobs and the values at which they do nothing (clap's rollouts implement none of them)
PLAIN_SAMPLING = {"top_p": (1.0,), "top_k": (0, None), "min_p": (None, 0.0), "repetition_penalty": (1.0,)}


def clap_rollouts(seed: int) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's ``rollout_func``: the probe's completions sampled by clap's batched generator.

    TRL's own path runs ``model.generate`` on the left-padded group: the shared prompt is prefilled once
    per completion and the cache re-concatenated every token. :func:`clap.model.generate.generate_batched`
    prefills the prompt once and writes keys and values in place; its :class:`~clap.model.generate.Sampling`
    draws from ``softmax(logits / temperature)``, TRL's sampling under the probe's settings (no top-k,
    top-p, min-p or repetition penalty: anything else is refused, never silently dropped). The draws come
    from a generator seeded with ``(seed, step)``, so a probe is reproducible. One completion per prompt
    TRL hands over (its sampler already repeats each prompt ``num_generations`` times), each up to and
    including its first end-of-sequence token, as TRL's path returns them; prompts tokenized through the
    chat template with the generation prompt, as TRL does. No sampling log-probabilities: TRL uses them
    only for vLLM's importance-sampling correction.
    """
    import torch

    from clap.model.generate import Sampling, encode_chats, generate_batched

    folded: dict[str, Any] = {}  # the policy with its LoRA folded in, kept across rounds and refreshed

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        other = {
            k: getattr(trainer, k) for k, off in PLAIN_SAMPLING.items() if getattr(trainer, k) not in off
        }
        if trainer.args.generation_kwargs:
            other["generation_kwargs"] = trainer.args.generation_kwargs
        if trainer.chat_template is not None or trainer.chat_template_kwargs or trainer.tools:
            other["chat template"] = "a template, its kwargs or tools of TRL's own"
        if other:
            raise ClapError(
                "grpo.rollouts clap samples from softmax(logits / temperature) with the tokenizer's chat template "
                f"only; set rollouts: trl for {other}"
            )
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        was_training = model.training
        model.eval()
        generator = torch.Generator(device=model.device)
        generator.manual_seed(seed * 1_000_003 + int(trainer.state.global_step))
        try:
            with torch.no_grad():
                folded["policy"] = merged_policy(model, folded.get("policy"))
            gens = generate_batched(
                folded["policy"] or model,
                tokenizer,
                prompts,
                batch_size=len(prompts),
                max_new_tokens=trainer.max_completion_length,
                desc=None,
                sampling=Sampling(trainer.temperature, generator),
            )
        finally:
            model.train(was_training)
        return {
            "prompt_ids": encode_chats(tokenizer, prompts),
            "completion_ids": [list(g.token_ids) for g in gens],
            "logprobs": None,
        }

    return rollout


def merged_policy(model: Any, into: Any = None) -> Any:
    """A plain model (no LoRA layers) that computes ``model``'s policy, for sampling rollouts from it.

    Each LoRA-wrapped linear layer's weight is its base weight plus the active adapters' deltas (peft's
    own ``get_delta_weight``: ``B @ A x scaling``, the arithmetic of ``merge``); every other parameter and
    buffer is ``model``'s own tensor, shared, not copied. Sampling from it skips LoRA's extra products and
    peft's per-layer dispatch in every decoding step (the unmerged policy's logits differ by float
    rounding only). ``into``: the copy an earlier round returned, refreshed in place. Returns None when a
    layer cannot be folded this way (DoRA, LoRA on a non-linear layer, adapters switched off or merged):
    the caller then samples from ``model`` itself.
    """
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    folds: dict[str, Any] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        active = [a for a in module.active_adapters if a in module.lora_A]
        if (
            not isinstance(module.base_layer, torch.nn.Linear)
            or module.disable_adapters
            or module.merged
            or any(module.use_dora.get(a, False) for a in active)
        ):
            return None
        folds[name] = (module, active)
    if not folds:
        return None
    if into is None:
        with torch.device("meta"):
            into = type(base)(base.config)
        # frozen first: load_state_dict(assign=True) gives each shared tensor the flag of the parameter it
        # replaces, and a fresh model's require gradients (the policy's frozen weights would then get some)
        into.requires_grad_(False)
        shared = {
            n: t
            for n, t in [*base.named_parameters(), *base.named_buffers()]
            if ".base_layer." not in n and "lora_" not in n
        }
        shared.update(
            {f"{name}.weight": torch.empty_like(m.base_layer.weight) for name, (m, _) in folds.items()}
        )
        shared.update(
            {
                f"{name}.bias": m.base_layer.bias
                for name, (m, _) in folds.items()
                if m.base_layer.bias is not None
            }
        )
        into.load_state_dict(shared, strict=False, assign=True)
        for (
            name,
            tensor,
        ) in into.named_buffers():  # non-persistent ones (rotary frequencies) are not in a state dict
            if tensor.is_meta:
                owner, _, leaf = name.rpartition(".")
                into.get_submodule(owner).register_buffer(leaf, shared[name], persistent=False)
        into.tie_weights()
        left = [n for n, t in [*into.named_parameters(), *into.named_buffers()] if t.is_meta]
        if left:
            raise RuntimeError(f"folding the policy's LoRA left {left[:3]} unset ({len(left)} tensors)")
        into.generation_config = base.generation_config
        into.eval()
    for name, (module, active) in folds.items():
        weight = into.get_submodule(name).weight
        weight.copy_(module.base_layer.weight)
        for adapter in active:
            weight.add_(module.get_delta_weight(adapter).to(weight.dtype))
    return into


# --- trainer ------------------------------------------------------------------------------
def grpo_config(p: GrpoParams, out_dir: Path, device: str, bf16: bool):
    """The GRPOConfig: every knob from params; one generation round per optimizer step; CPU-safe;
    ``bf16``: autocast as the SFT run's precision (params ``train.precision``), never TRL's default."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=False,
        seed=p.seed,
        data_seed=p.seed,
        max_steps=p.max_steps,
        learning_rate=p.lr,
        beta=p.beta,
        num_generations=p.num_generations,
        per_device_train_batch_size=p.prompts_per_step * p.num_generations,
        gradient_accumulation_steps=1,
        max_completion_length=p.max_completion_length,
        temperature=p.temperature,
        activation_checkpointing=False,
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )


def load_policy(base_dir: Path, sft_dir: Path, p: GrpoParams, tp: TrainParams, device: str):
    """(model, peft_config): a fresh LoRA of the SFT shape (params ``train``) on the base, or the batch's
    SFT adapter continued.

    Continuing a PeftModel with ``beta > 0``, TRL keeps a frozen ``ref`` copy of the adapter,
    so KL is measured against the SFT policy the probe started from.
    """
    from peft import PeftModel

    if p.start_from == "sft" and not (sft_dir / ADAPTER_FILES[0]).exists():
        raise ClapError(
            "grpo.start_from is sft but the batch has no SFT adapter (not trained?)",
            file=sft_dir,
            rule="missing_adapter",
        )
    model = load_train_model(base_dir, lora_precision(tp, device), device)
    if p.start_from == "sft":
        return PeftModel.from_pretrained(model, str(sft_dir), is_trainable=True), None
    return model, lora_config(tp, model)


def save_adapter(trainer, adapter_dir: Path) -> str:
    """Save the probe's trained ``default`` adapter (+ tokenizer) atomically; its sha256."""
    with io.atomic_dir(adapter_dir) as tmp:
        trainer.model.save_pretrained(str(tmp), selected_adapters=["default"])  # not TRL's frozen "ref" copy
        trainer.processing_class.save_pretrained(str(tmp))
        (tmp / "README.md").unlink(
            missing_ok=True
        )  # peft's generated card template (as the train stage drops it)
        canonical_adapter_config(
            tmp / ADAPTER_FILES[1]
        )  # byte-identical across PYTHONHASHSEED (found by clap verify)
    return io.sha256_file(adapter_dir / ADAPTER_FILES[0])


def write_not_run(adapter_dir: Path, reason: str) -> None:
    """The DVC output of a batch the probe did not run on: no weights, and why."""
    with io.atomic_dir(adapter_dir) as tmp:
        io.write_json(tmp / NOT_RUN_FILE, {"run": False, "reason": reason})


def not_run_record(reason: str, static: Mapping[str, Any], p: GrpoParams) -> dict[str, Any]:
    """The flat record of a batch the probe did not run on (disabled or not admitted)."""
    return {
        "run": 0,
        "health": "not_run",
        "runtime_verdict": "not_run",
        "stop_reason": reason,
        "stop_step": -1,
        "steps": 0,
        "planned_steps": 0,
        "kl_peak": "nan",
        "reward_final": "nan",
        "reward_std_final": "nan",
        "length_drift": "nan",
        "adapter_sha256": "",
        "start_from": p.start_from,
        "beta": p.beta,
        "wall_s": 0.0,
        **static,
    }


def run_probe(
    data_dir: Path | str,
    admit_json: Path | str,
    base_dir: Path | str,
    sft_dir: Path | str,
    adapter_dir: Path | str,
    p: GrpoParams,
    sp: ScoringParams,
    tp: TrainParams,
) -> ProbeResult:
    """Run (or skip) the GRPO probe of one batch and write its adapter folder (rank 0).

    Args:
        data_dir: ``data/admitted/<b>`` (grpo + kb parquet); its name is the batch.
        admit_json: ``metrics/admit/<b>.json`` (the static verdict on D_grpo).
        base_dir: the exported base model.  sft_dir: ``models/adapters/<b>`` (used when start_from is sft).
        adapter_dir: ``models/grpo/<b>``: the probe's adapter, or ``not_run.json``.
        p: ``grpo`` params.  sp: ``scoring`` params (the reward).  tp: ``train`` params (LoRA shape, threads).

    Returns:
        The flat record (static and runtime verdicts side by side) and the curve rows.
    """
    data_dir, base_dir, sft_dir, adapter_dir = (
        Path(data_dir),
        Path(base_dir),
        Path(sft_dir),
        Path(adapter_dir),
    )
    rank, _ = determinism.world()
    static = static_verdict(io.read_json(admit_json), admit_json)
    reason = (
        "disabled"
        if not probe_enabled(p, data_dir.name)
        else ("not_admitted" if not static["admitted"] else "")
    )
    if not reason and p.start_from == "sft" and (sft_dir / SKIPPED_FILE).exists():
        reason = "sft_not_trained"  # admitted, but its SFT run was not trained (held over budget)
    if reason:
        if rank == 0:
            write_not_run(adapter_dir, reason)
        return ProbeResult(not_run_record(reason, static, p), [], rank == 0)
    start = time.perf_counter()
    determinism.seed_everything(p.seed, tp.torch_threads)
    items, kb = io.read_parquet(data_dir / "grpo.parquet"), io.read_parquet(data_dir / "kb.parquet")
    if items.empty:
        raise ClapError("admitted batch has no GRPO items", file=data_dir / "grpo.parquet", rule="empty_grpo")
    run = _train(probe_rows(items, kb, sp.answer), base_dir, sft_dir, adapter_dir, p, sp, tp)
    record = {
        **run.numbers,
        **static,
        "run": 1,
        "start_from": p.start_from,
        "beta": p.beta,
        "lr": p.lr,
        "prompts": len(items),
        "num_generations": p.num_generations,
        "max_completion_length": p.max_completion_length,
        **{f"threshold_{k}": v for k, v in vars(p.thresholds).items()},
        "wall_s": round(time.perf_counter() - start, 3),
    }
    return ProbeResult({k: as_text_if_nonfinite(v) for k, v in record.items()}, run.curves, rank == 0)


def _train(
    rows: list[dict[str, Any]],
    base_dir: Path,
    sft_dir: Path,
    adapter_dir: Path,
    p: GrpoParams,
    sp: ScoringParams,
    tp: TrainParams,
) -> TrainerRun:
    from datasets import Dataset
    from trl import GRPOTrainer

    from clap.train.callbacks import GrpoDiagnosis, TrainProgress, quiet_trainer

    device = mdl.default_device()
    model, peft_config = load_policy(base_dir, sft_dir, p, tp, device)
    diag = GrpoDiagnosis(
        p.thresholds,
        reward_tests(p.thresholds, p.max_steps, p.prompts_per_step * p.num_generations),
        inject_at_step=p.inject_kl_at_step,
        inject_std=p.inject_kl_noise_std,
        seed=p.seed,
    )
    with tempfile.TemporaryDirectory(prefix="clap-grpo-") as scratch:  # the probe saves no checkpoints
        args = grpo_config(p, Path(scratch), device, autocast_bf16(lora_precision(tp, device), device))
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward_function(sp)],
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=mdl.load_tokenizer(base_dir, padding_side="left"),
            peft_config=peft_config,
            callbacks=[diag],
            rollout_func=clap_rollouts(p.seed) if p.rollouts == "clap" else None,
        )
        quiet_trainer(trainer, TrainProgress(f"grpo {adapter_dir.name}", ("reward", "kl")))
        with training_forwards(trainer.model, bf16=args.bf16):  # a group's rows share their whole prompt
            trainer.train()
    sha = save_adapter(trainer, adapter_dir) if args.process_index == 0 else ""
    numbers = {
        **diag.summary(),
        "steps": int(trainer.state.global_step),
        "device": device,
        "precision": lora_precision(tp, device),
        "adapter_sha256": sha,
        "base_sha256": mdl.base_sha256(base_dir),
    }
    return TrainerRun(numbers, diag.rows)
