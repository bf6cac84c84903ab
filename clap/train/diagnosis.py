"""Runtime diagnosis of a training run: finite loss/grad checks, curves, the online TBDL detector.

:class:`Diagnosis` is a transformers ``TrainerCallback``; the decisions live in plain
functions/classes here and in :mod:`clap.train.detector`. Every decision that stops training is
rank-identical under torchrun: logged ``loss``/``grad_norm`` are already reduced across
ranks, and the probe losses each rank computes are replaced by rank 0's (broadcast).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from clap import io
from clap.model.base import Encoded, completion_nll
from clap.progress import Progress
from clap.train import detector as det

CURVE_COLUMNS = (
    "step",
    "loss",
    "grad_norm",
    "learning_rate",
    "tokens_per_s",
    "probe_loss",
    "gap_increment",
    "log_e",
    "log_threshold",
)
STATE_FILE = "clap_diagnosis.json"


def token_mean(scores: Sequence[tuple[float, int]]) -> float:
    """Token-weighted mean loss of (nll_sum, n_tokens) pairs (the training loss's own weighting)."""
    tokens = sum(n for _, n in scores)
    return sum(s for s, _ in scores) / max(tokens, 1)


def probe_order(n_items: int, seed: int) -> list[int]:
    """The pre-registered order in which probe items are drawn (seeded permutation)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n_items)]


def shared(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (identity when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def is_finite(value: Any) -> bool:
    """False for None, NaN and +-inf."""
    return value is not None and math.isfinite(float(value))


@dataclass
class DiagState:
    """Everything the callback must carry across a checkpoint resume."""

    train_base: float | None = None  # frozen pilot baseline L_train_base
    # per probe item (pool order), base model; None: an item the run never draws (not scored)
    probe_base: list[tuple[float, int] | None] = field(default_factory=list)
    draws: int = 0  # probe draws consumed
    drawn: list[list[Any]] = field(
        default_factory=list
    )  # per draw: [item indices, [[nll, tokens] at its check]]
    eprocess: dict[str, Any] | None = None
    alarm_step: int = -1
    health: str = "ok"
    stop_step: int = -1
    planned_steps: int = 0
    score_seconds: float = 0.0  # time spent scoring pilot/probe items (detector overhead)
    rows: list[dict[str, Any]] = field(default_factory=list)


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


class Diagnosis(TrainerCallback):
    """Per-step health checks, curves and the TBDL detector.

    Args:
        params: the ``detector`` params.
        probe: the clean probe items (encoded), in pool order.
        pilot: training items scored under the base model for the frozen training baseline.
        max_tokens: padded tokens per scoring forward (a check's draw is one forward when it fits).
        inject_nan_at_step: fault injection: poison a LoRA weight before this step (-1: off).
    """

    def __init__(
        self,
        params: det.DetectorParams,
        probe: list[Encoded],
        pilot: list[Encoded],
        *,
        max_tokens: int,
        inject_nan_at_step: int,
    ):
        self.p, self.probe, self.pilot = params, probe, pilot
        self.max_tokens, self.inject_nan_at_step = max_tokens, inject_nan_at_step
        self.resumed_tokens = 0.0  # tokens trained before a resume (set at train begin)
        self.run_tokens = 0.0  # tokens trained by this process (TRL's num_tokens restarts at 0 on resume)
        self.order = probe_order(len(probe), params.seed)
        self.s = DiagState()
        self.eproc = det.make_eprocess(params)
        self._pending: tuple[float, float] | None = None  # (probe now, probe base) of the coming step
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
        # tokens already trained before a resume: throughput counts only this process's tokens
        self.resumed_tokens = logged_tokens(state.log_history)
        self._last_time, self._last_tokens = time.perf_counter(), 0.0
        if self.p.enabled and self.s.train_base is None:  # fresh run (a resumed one restored them)
            self._score_base(model)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.inject_nan_at_step > 0 and state.global_step + 1 == self.inject_nan_at_step:
            poison_lora(model)
        if self._due(state.global_step + 1):
            # the probe is scored at the parameters the coming step's training loss is computed at
            self._pending = self._draw_probe(model)

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
    def drawable(self) -> list[int]:
        """Pool indices of every probe item the run can draw, in draw order.

        One draw per check, a check every ``every_steps`` of the planned steps, until the pool
        runs out (:meth:`_due`); items past that are never drawn.
        """
        checks = min(self.s.planned_steps // self.p.every_steps, len(self.probe) // self.p.probe_draw)
        return self.order[: checks * self.p.probe_draw]

    def _score_base(self, model) -> None:
        """The base side of every check, once, before training: L_train_base and L_probe_base.

        The base model's losses never change during a run, so the pilot items and every probe
        item the run can draw are scored together, in one batched pass with the LoRA layers
        switched off; each check then only looks its items' base losses up.
        """
        take = self.drawable()
        scores = self._score_as_base(model, self.pilot + [self.probe[i] for i in take])
        probe_base: list[tuple[float, int] | None] = [None] * len(self.probe)
        for i, score in zip(take, scores[len(self.pilot) :]):
            probe_base[i] = score
        self.s.train_base = shared(token_mean(scores[: len(self.pilot)]))
        self.s.probe_base = shared(probe_base)

    def _due(self, step: int) -> bool:
        left = (len(self.probe) - self.s.draws * self.p.probe_draw) >= self.p.probe_draw
        return self.p.enabled and self.s.health == "ok" and step % self.p.every_steps == 0 and left

    def _draw_probe(self, model) -> tuple[float, float]:
        """(current, base) token-mean loss of the next fresh, non-overlapping probe draw."""
        take = self.order[self.s.draws * self.p.probe_draw : (self.s.draws + 1) * self.p.probe_draw]
        self.s.draws += 1
        scores = self._score(model, [self.probe[i] for i in take])
        self.s.drawn.append([list(take), [list(x) for x in scores]])
        return shared(token_mean(scores)), token_mean([self._base_of(i) for i in take])

    def _base_of(self, item: int) -> tuple[float, int]:
        score = self.s.probe_base[item]
        if score is None:  # _score_base scores every drawable item: a miss is a bug, not a zero
            raise RuntimeError(f"probe item {item} was drawn but its base loss was never scored")
        return score

    def _check(self, train_now: float, row: dict[str, Any], step: int, control) -> None:
        probe_now, probe_base = self._pending
        self._pending = None
        if not is_finite(probe_now):
            self._stop(control, step, "nan")
            return
        gap = det.gap_increment(self.s.train_base, train_now, probe_base, probe_now)
        alarm = self.eproc.update(det.to_unit(gap, self.p.clip))
        row.update(
            probe_loss=probe_now,
            gap_increment=gap,
            log_e=self.eproc.log_e,
            log_threshold=self.eproc.log_threshold,
        )
        if alarm and self.s.alarm_step < 0:
            self.s.alarm_step = step
            if self.p.stop_on_alarm:
                self._stop(control, step, "alarm")

    def _score(self, model, items: list[Encoded]) -> list[tuple[float, int]]:
        import torch

        start, was_training = time.perf_counter(), model.training
        model.eval()  # no LoRA dropout while scoring
        device = next(model.parameters()).device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            scores = completion_nll(model, items, max_tokens=self.max_tokens)
        model.train(was_training)
        self.s.score_seconds += time.perf_counter() - start
        return scores

    def _score_as_base(self, model, items: list[Encoded]) -> list[tuple[float, int]]:
        """Scores under the base weights: the LoRA layers switched off (peft), not a second model."""
        with model.disable_adapter():
            return self._score(model, items)

    def score_probe(self, model) -> tuple[float, float]:
        """(base, trained) token-mean probe loss for the record: paired, over the same items.

        With detector draws: the draws of the last quarter of checks, each scored at its own
        check (already paid for; rescoring the pool at the end cost ~30% of the detector's
        time). Without (detector off, or no check ran): the whole pool, base vs now.
        """
        if not self.probe:
            return float("nan"), float("nan")
        tail = self.s.drawn[-max(1, len(self.s.drawn) // 4) :]
        if tail:
            items = [i for take, _ in tail for i in take]
            return token_mean([self._base_of(i) for i in items]), token_mean(
                [tuple(x) for _, sc in tail for x in sc]
            )
        base = self._score_as_base(model, self.probe)
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
            "detector_seconds": round(self.s.score_seconds, 3),
            "detector_max_log_e": max(
                [r["log_e"] for r in self.s.rows if r["log_e"] is not None], default=0.0
            ),
            "detector_log_threshold": self.eproc.log_threshold,
            "detector_alarm_step": self.s.alarm_step,
            "alarm_fraction": self.s.alarm_step / planned if self.s.alarm_step >= 0 else -1.0,
            "train_loss_start": self.s.train_base if self.s.train_base is not None else float("nan"),
        }


def logged_tokens(log_history: list[dict[str, Any]]) -> float:
    """Tokens trained so far by a Trainer's log history (its last ``num_tokens``), 0 if none."""
    return next((float(h["num_tokens"]) for h in reversed(log_history) if "num_tokens" in h), 0.0)


def as_text_if_nonfinite(value: Any) -> Any:
    """NaN/inf as the strings 'nan'/'inf'/'-inf' (JSON has no such numbers); other values unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def from_text(value: Any) -> Any:
    """Inverse of :func:`as_text_if_nonfinite`."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def poison_lora(model) -> None:
    """Fault injection: set the first trainable LoRA weight to NaN (the next loss is NaN)."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_" in name:
            with torch.no_grad():
                param.fill_(float("nan"))
            return
    raise RuntimeError("no trainable LoRA parameter to poison")


def curves_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] = CURVE_COLUMNS) -> str:
    """The curves as CSV text (empty cells where a column has no value at that step).

    ``columns`` defaults to the training curves; the GRPO probe passes its own.
    """

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else str(v).lower()
        return str(v)

    lines = [",".join(columns)] + [",".join(cell(r[c]) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


def detector_constants(p: det.DetectorParams) -> dict[str, Any]:
    """The pre-registered detector constants, flat, for the training record."""
    return {
        "detector_alpha": p.alpha,
        "detector_clip": p.clip,
        "detector_null_gap": p.null_gap,
        "detector_m0": det.null_mean(p),
        "detector_lambdas": json.dumps(list(p.lambdas)),
        "detector_weights": json.dumps(list(p.weights)),
        "detector_every_steps": p.every_steps,
        "detector_probe_draw": p.probe_draw,
        "detector_pilot_items": p.pilot_items,
        "detector_seed": p.seed,
    }
