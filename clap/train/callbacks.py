"""The ``TrainerCallback`` classes of training and the GRPO probe: the detector's :class:`Diagnosis`,
:class:`GrpoDiagnosis` and :class:`TrainProgress`. They are here, not beside their plain decision functions
(:mod:`clap.train.diagnosis`, :mod:`clap.train.grpo_diagnosis`), because importing transformers' trainer
costs seconds (torch, peft): only a process that trains imports this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from clap import io
from clap.model.base import Encoded, Prefix, completion_nll, prefix_cache
from clap.progress import Progress
from clap.train import detector as det
from clap.train.diagnosis import (
    CURVE_COLUMNS,
    STATE_FILE,
    DiagState,
    as_text_if_nonfinite,
    from_text,
    gathered,
    is_finite,
    logged_tokens,
    poison_lora,
    probe_order,
    shared,
    token_mean,
)
from clap.train.grpo_diagnosis import (
    Signal,
    curve_row,
    first_signal,
    inject_lora_noise,
    trajectory_summary,
)
from clap.train.grpo_noise import RewardTests
from clap.train.grpo_policy import GrpoThresholds

log = logging.getLogger(__name__)


class TrainProgress(TrainerCallback):
    """Optimizer steps as :class:`clap.progress.Progress` shows them (a bar on a terminal, plain lines in a
    log), with the latest logged ``keys`` (loss, reward, ...) after the counts; on the main process only.
    It replaces transformers' ``PrinterCallback`` (:func:`quiet_trainer`): it reads logs, never changes them.
    """

    def __init__(self, desc: str, keys: Sequence[str]):
        self.desc, self.keys = desc, tuple(keys)
        self.bar: Progress | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = Progress(int(state.max_steps), self.desc, "step", initial=int(state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None and not control.should_log:  # a logging step is counted with its log
            self.bar.set(int(state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs:
            self.bar.set(int(state.global_step), **{k: logs[k] for k in self.keys if k in logs})

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def quiet_trainer(trainer, progress: TrainProgress) -> None:
    """Show ``progress`` instead of the raw log dicts transformers prints every logging step when its
    tqdm is disabled (``PrinterCallback``): the logs still reach every other callback and the history."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(progress)


def batch_items(inputs: dict[str, Any]) -> list[Encoded]:
    """The sequences of a collated training batch as :class:`Encoded` items (prompt = the unlabelled head).

    Rows are right-padded (``attention_mask``) or padding-free packed (``position_ids`` restart at 0
    for each sequence). The loss positions (``labels != -100``) of each sequence must be one
    contiguous tail after position 0 (completion-only loss, or ``loss_on_prompt``), as :func:`completion_nll`
    scores them; anything else is an error, never a silently different pairing.
    """
    ids, labels = inputs["input_ids"].tolist(), inputs["labels"].tolist()
    mask = inputs["attention_mask"].tolist() if inputs.get("attention_mask") is not None else None
    pos = inputs["position_ids"].tolist() if inputs.get("position_ids") is not None else None
    items: list[Encoded] = []
    for r, row in enumerate(ids):
        n = sum(mask[r]) if mask is not None else len(row)
        starts = [t for t in range(n) if pos is None and t == 0 or pos is not None and pos[r][t] == 0]
        for a, b in zip(starts, [*starts[1:], n]):
            lab = labels[r][a:b]
            # a causal LM never predicts position 0, so its label (set when the loss is on the prompt) is moot
            first = next((t for t, v in enumerate(lab) if t > 0 and v != -100), len(lab))
            if first == len(lab) or any(v == -100 for v in lab[first:]):
                raise RuntimeError(
                    f"training row {r}: its loss positions are not one tail after the first token; "
                    "the detector cannot pair them"
                )
            items.append(Encoded(tuple(int(t) for t in row[a:b]), first))
    return items


def trainable_weights(model) -> dict[str, Any]:
    """A detached copy of the model's trainable weights, by parameter name (a warm start's reference)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@contextmanager
def swapped_weights(model, weights: dict[str, Any]):
    """``weights`` in place of the model's parameters of those names for the block, then its own back."""
    import torch

    params = dict(model.named_parameters())
    own = {n: params[n].detach().clone() for n in weights}
    with torch.no_grad():
        for n, w in weights.items():
            params[n].copy_(w)
    try:
        yield
    finally:
        with torch.no_grad():
            for n, w in own.items():
                params[n].copy_(w)


def paired_trainer(trainer_cls, diag: Diagnosis):
    """``trainer_cls`` whose ``compute_loss`` first shows each batch to ``diag`` (:meth:`Diagnosis.see_batch`)."""

    class Paired(trainer_cls):
        def compute_loss(self, model, inputs, *args, **kwargs):
            diag.see_batch(self.model, inputs, self.state.global_step + 1)
            return super().compute_loss(model, inputs, *args, **kwargs)

    Paired.__name__ = Paired.__qualname__ = f"Paired{trainer_cls.__name__}"
    return Paired


class Diagnosis(TrainerCallback):
    """Per-step health checks, curves and the TBDL detector.

    Args:
        params: the ``detector`` params.
        probe: the clean probe items (encoded), in pool order.
        max_tokens: padded tokens per scoring forward (a check's draw is one forward when it fits).
        inject_nan_at_step: fault injection: poison a LoRA weight before this step (-1: off).
        start_weights: the trainable (LoRA) weights a warm start begins from, by parameter name
            (``warm_start.mode: incumbent``); None: a fresh adapter. The reference side of every
            check (L_ref of the step's training batch and of the probe draw) is the model the run
            starts from: the base model (the LoRA layers switched off: a fresh LoRA's B is zero,
            so that is its start exactly) or these weights swapped in for the scoring forward.
            The detector asks what *this run* taught.
        prefix_ids: tokens every training and probe prompt starts with (chat template, system
            prompt): their keys and values under the reference weights are computed once, and every
            reference score runs only the tokens after them (the reference weights never change
            during a run). Empty: reference scores run every token.
        bf16: score under bf16 autocast, as the run trains (:func:`clap.train.sft.autocast_bf16`).

    The training side of a check is paired like the probe side: the trainer calls
    :meth:`see_batch` with each micro-batch it computes the loss on (:func:`paired_trainer`), and
    at a check step the batch's rows are scored under the reference weights.
    """

    def __init__(
        self,
        params: det.DetectorParams,
        probe: list[Encoded],
        *,
        max_tokens: int,
        inject_nan_at_step: int,
        start_weights: dict[str, Any] | None = None,
        prefix_ids: Sequence[int] = (),
        bf16: bool = False,
    ):
        self.p, self.probe, self.bf16 = params, probe, bf16
        self.start_weights = start_weights
        self.prefix_ids = tuple(prefix_ids)
        self._ref_prefix: Prefix | None = None  # the prefix under the reference weights, at first use
        self.max_tokens, self.inject_nan_at_step = max_tokens, inject_nan_at_step
        self.resumed_tokens = 0.0  # tokens trained before a resume (set at train begin)
        self.run_tokens = 0.0  # tokens trained by this process (TRL's num_tokens restarts at 0 on resume)
        self.order = probe_order(len(probe), params.seed)
        self.s = DiagState()
        self.eproc = det.make_eprocess(params)
        self._schedule: frozenset[int] = frozenset()
        self._pending: tuple[float, float] | None = None  # (probe now, probe ref) of the coming step
        self._batch_ref: list[tuple[float, int]] = []  # reference scores of the coming step's training rows
        self._last_time: float | None = None
        self._last_tokens = 0.0

    # --- resume -------------------------------------------------------------------------
    def load_state(self, checkpoint: Path | str) -> None:
        """Restore from the state file written into a checkpoint folder by :meth:`on_save`."""
        raw = io.read_json(Path(checkpoint) / STATE_FILE)
        raw["rows"] = [{k: from_text(v) for k, v in r.items()} for r in raw["rows"]]
        raw["probe_base"] = [None if x is None else tuple(x) for x in raw["probe_base"]]
        raw["drawn"] = [
            [take, [[from_text(v) for v in x] for x in scores]] for take, scores in raw.get("drawn", [])
        ]
        self.s = DiagState(**raw)
        self.eproc = det.make_eprocess(self.p, self.s.eprocess)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.s.eprocess = self.eproc.state()
            raw = asdict(self.s)
            raw["rows"] = [{k: as_text_if_nonfinite(v) for k, v in r.items()} for r in raw["rows"]]
            raw["drawn"] = [
                [take, [[as_text_if_nonfinite(v) for v in x] for x in scores]]
                for take, scores in raw["drawn"]
            ]
            io.write_json(Path(args.output_dir) / f"checkpoint-{state.global_step}" / STATE_FILE, raw)

    # --- events ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.s.planned_steps = int(state.max_steps)
        self._schedule = frozenset(self.check_steps())
        need = det.min_checks_to_alarm(self.p) if self.p.enabled else 0
        if self.p.enabled and len(self._schedule) < need and state.is_world_process_zero:
            log.warning(
                "TBDL detector: %d checks (probe pool %d / probe_draw %d, %d steps) cannot alarm: even maximal "
                "increments need %d; a larger probe pool (params sizes.probe) watches this run",
                len(self._schedule),
                len(self.probe),
                self.p.probe_draw,
                self.s.planned_steps,
                need,
            )
        # tokens already trained before a resume: throughput counts only this process's tokens
        self.resumed_tokens = logged_tokens(state.log_history)
        self._last_time, self._last_tokens = time.perf_counter(), 0.0
        if not self.s.probe_base and self.probe:  # a resumed run restored them
            self._score_probe_refs(model)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self._batch_ref = []
        if self.inject_nan_at_step > 0 and state.global_step + 1 == self.inject_nan_at_step:
            poison_lora(model)
        if self._due(state.global_step + 1):
            # the probe is scored at the parameters the coming step's training loss is computed at
            self._pending = self._draw_probe(model)

    def see_batch(self, model, inputs: dict[str, Any], step: int) -> None:
        """The trainer's (micro-)batch of optimizer step ``step``, before its loss is computed: at a
        check step its rows are scored under the reference weights (the training side's pair)."""
        if self._pending is None:  # not a check step (set by on_step_begin)
            return
        self._batch_ref.extend(self._score_reference(model, batch_items(inputs)))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:  # the final on_log carries only train_runtime etc.
            return control
        self.run_tokens = float(logs.get("num_tokens", self.run_tokens))
        row = self._curve_row(state.global_step, logs)
        self.s.rows.append(row)
        grad = logs.get("grad_norm")  # absent when gradient clipping is off
        if not is_finite(logs["loss"]) or (grad is not None and not is_finite(grad)):
            self._stop(control, state.global_step, "nan")
            return control
        if self._pending is not None:
            self._check(float(logs["loss"]), row, state.global_step, control)
        return control

    # --- detector -------------------------------------------------------------------------
    def check_steps(self) -> list[int]:
        """The steps this run checks at (:func:`clap.train.detector.check_steps`); none when off."""
        if not self.p.enabled:
            return []
        return det.check_steps(self.s.planned_steps, len(self.probe), self.p.probe_draw)

    def drawable(self) -> list[int]:
        """Pool indices of every probe item the run can draw, in draw order: one draw per check;
        items past that are never drawn. Without the detector, the whole pool (the record's
        start/end probe loss)."""
        if not self.p.enabled:
            return list(range(len(self.probe)))
        return self.order[: len(self.check_steps()) * self.p.probe_draw]

    def _score_probe_refs(self, model) -> None:
        """The reference side of every probe draw, once, before training: the reference losses
        never change during a run, so every item the run can draw is scored in one batched pass."""
        take = self.drawable()
        probe_base: list[tuple[float, int] | None] = [None] * len(self.probe)
        for i, score in zip(take, self._score_reference(model, [self.probe[i] for i in take])):
            probe_base[i] = score
        self.s.probe_base = shared(probe_base)

    def _due(self, step: int) -> bool:
        left = (len(self.probe) - self.s.draws * self.p.probe_draw) >= self.p.probe_draw
        return self.s.health == "ok" and step in self._schedule and left

    def _draw_probe(self, model) -> tuple[float, float]:
        """(current, reference) token-mean loss of the next fresh, non-overlapping probe draw."""
        take = self.order[self.s.draws * self.p.probe_draw : (self.s.draws + 1) * self.p.probe_draw]
        self.s.draws += 1
        scores = self._score(model, [self.probe[i] for i in take])
        self.s.drawn.append([list(take), [list(x) for x in scores]])
        return shared(token_mean(scores)), token_mean([self._base_of(i) for i in take])

    def _base_of(self, item: int) -> tuple[float, int]:
        score = self.s.probe_base[item]
        if score is None:  # _score_probe_refs scores every drawable item: a miss is a bug, not a zero
            raise RuntimeError(f"probe item {item} was drawn but its reference loss was never scored")
        return score

    def _check(self, train_now: float, row: dict[str, Any], step: int, control) -> None:
        probe_now, probe_ref = self._pending
        self._pending = None
        batch_ref = gathered(self._batch_ref)
        if not batch_ref:  # see_batch scores every check step's batch: a miss is a bug, not a zero
            raise RuntimeError(f"check at step {step}: the trainer never showed its training batch")
        train_ref = token_mean(batch_ref)
        if not is_finite(probe_now):
            self._stop(control, step, "nan")
            return
        gap = det.gap_increment(train_ref, train_now, probe_ref, probe_now)
        alarm = self.eproc.update(det.to_unit(gap, self.p.clip))
        row.update(
            probe_loss=probe_now,
            train_ref_loss=train_ref,
            probe_ref_loss=probe_ref,
            gap_increment=gap,
            log_e=self.eproc.log_e,
            log_threshold=self.eproc.log_threshold,
        )
        if alarm and self.s.alarm_step < 0:
            self.s.alarm_step = step
            if self.p.stop_on_alarm:
                self._stop(control, step, "alarm")

    def _score(self, model, items: list[Encoded], *, reference: bool = False) -> list[tuple[float, int]]:
        """Completion scores under the model as it is now; ``reference``: it holds the reference weights
        (:meth:`_score_reference`), whose prefix keys and values are computed once and reused."""
        import torch

        start, was_training = time.perf_counter(), model.training
        model.eval()  # no LoRA dropout while scoring
        device = next(model.parameters()).device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
            prefix = None
            if reference and self.prefix_ids:
                if self._ref_prefix is None:
                    self._ref_prefix = prefix_cache(model, self.prefix_ids)
                prefix = self._ref_prefix
            scores = completion_nll(model, items, max_tokens=self.max_tokens, prefix=prefix)
        model.train(was_training)
        self.s.score_seconds += time.perf_counter() - start
        return scores

    def _score_reference(self, model, items: list[Encoded]) -> list[tuple[float, int]]:
        """Scores under the run's reference weights: the base model (the LoRA layers switched off,
        not a second model), or for a warm start its starting weights, swapped in for the forward."""
        if self.start_weights is None:
            with model.disable_adapter():
                return self._score(model, items, reference=True)
        with swapped_weights(model, self.start_weights):
            return self._score(model, items, reference=True)

    def score_probe(self, model) -> tuple[float, float]:
        """(reference, trained) token-mean probe loss for the record: paired, over the same items.

        With detector draws: the draws of the last quarter of checks, each scored at its own
        check (already paid for). Without (detector off, or no check ran): the whole pool,
        reference (scored at train begin) vs now.
        """
        if not self.probe:
            return float("nan"), float("nan")
        tail = self.s.drawn[-max(1, len(self.s.drawn) // 4) :]
        if tail:
            items = [i for take, _ in tail for i in take]
            return token_mean([self._base_of(i) for i in items]), token_mean(
                [tuple(x) for _, sc in tail for x in sc]
            )
        base = [self._base_of(i) for i in range(len(self.probe))]
        return token_mean(base), shared(token_mean(self._score(model, self.probe)))

    # --- helpers --------------------------------------------------------------------------
    def _stop(self, control, step: int, health: str) -> None:
        self.s.health, self.s.stop_step = health, step
        control.should_training_stop = True

    def _curve_row(self, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        now, tokens = time.perf_counter(), float(logs.get("num_tokens", 0.0))
        rate = (tokens - self._last_tokens) / max(now - (self._last_time or now), 1e-9)
        self._last_time, self._last_tokens = now, tokens
        row = {c: None for c in CURVE_COLUMNS}
        row.update(
            step=step,
            loss=logs["loss"],
            grad_norm=logs.get("grad_norm"),
            learning_rate=logs.get("learning_rate"),
            tokens_per_s=rate,
        )
        return row

    def summary(self) -> dict[str, Any]:
        """Flat detector/health fields for the training record."""
        planned = max(self.s.planned_steps, 1)
        return {
            "health": self.s.health,
            "stop_step": self.s.stop_step,
            "detector_enabled": self.p.enabled,
            "detector_checks": self.eproc.t,
            "detector_checks_planned": len(self.check_steps()),
            "detector_min_checks_to_alarm": det.min_checks_to_alarm(self.p) if self.p.enabled else 0,
            "detector_seconds": round(self.s.score_seconds, 3),
            "detector_reference_prefix_tokens": len(self.prefix_ids),  # run once per run, not per check
            "detector_max_log_e": max(
                [r["log_e"] for r in self.s.rows if r["log_e"] is not None], default=0.0
            ),
            "detector_log_threshold": self.eproc.log_threshold,
            "detector_alarm_step": self.s.alarm_step,
            "alarm_fraction": self.s.alarm_step / planned if self.s.alarm_step >= 0 else -1.0,
            "train_loss_start": next((r["loss"] for r in self.s.rows), float("nan")),
        }


class GrpoDiagnosis(TrainerCallback):
    """Collect the probe curves; stop with ``health = hold`` when a runtime signal fires.

    Args:
        thresholds: params ``grpo.thresholds``.
        tests: the noise-aware reward rules' design (:func:`clap.train.grpo_noise.reward_tests`).
        inject_at_step: fault injection: LoRA noise before this step (-1: off).
        inject_std: standard deviation of that noise.
        seed: seed of the injected noise.
    """

    def __init__(
        self,
        thresholds: GrpoThresholds,
        tests: RewardTests,
        *,
        inject_at_step: int,
        inject_std: float,
        seed: int,
    ):
        self.t, self.tests = thresholds, tests
        self.inject_at_step, self.inject_std, self.seed = inject_at_step, inject_std, seed
        self.rows: list[dict[str, Any]] = []
        self.signal: Signal | None = None
        self.planned_steps = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.planned_steps = int(state.max_steps)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.inject_at_step > 0 and state.global_step + 1 == self.inject_at_step:
            inject_lora_noise(model, self.inject_std, self.seed)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:  # the final on_log carries only train_runtime etc.
            return control
        self.rows.append(curve_row(state.global_step, logs))
        found = first_signal(self.rows, self.t, self.tests)
        if found is not None and self.signal is None:
            self.signal = found
            control.should_training_stop = True
        return control

    def summary(self) -> dict[str, Any]:
        """Flat health, stop and trajectory fields for the probe record (non-finite as text)."""
        s = self.signal
        out = {
            "health": "hold" if s else "ok",
            "runtime_verdict": "hold" if s else "stable",
            "stop_reason": s.name if s else "completed",
            "stop_step": s.step if s else -1,
            "stop_value": s.value if s else 0.0,
            "stop_threshold": s.threshold if s else 0.0,
            "stop_detail": s.detail if s else "",
            "planned_steps": self.planned_steps,
            **self.tests.record(),
            **trajectory_summary(self.rows, self.t),
        }
        return {k: as_text_if_nonfinite(v) for k, v in out.items()}
