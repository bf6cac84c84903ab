"""A training run's cost, estimated before it spends anything, against the batch's budget.

The budget is the one the release checks (params ``release.cost``: ``budget_cpu_hours``, or
``budget_gpu_hours`` on CUDA, machine hours per batch); the train stage checks that the run
alone fits in it before the first optimizer step:

    estimate_s = setup_s + planned_tokens / (tokens_per_s x world_size)

- ``setup_s``: the wall time the stage has already spent (reading, tokenizing, loading the model,
  preparing the trainer's dataset), measured;
- ``planned_tokens``: the tokens of the trainer's prepared rows (capped at ``train.max_length``)
  times ``train.epochs``, or ``train.max_steps`` x rows per optimizer step x the mean row when
  max_steps caps the run;
- ``tokens_per_s``: measured here and now: ``release.cost.estimate_batches`` forward + backward
  passes of the model the trainer will train (LoRA attached, train mode), on the first real
  training batches as the trainer's collator builds them, after one untimed pass (allocation,
  first-call overhead). No optimizer step is taken, the gradients are dropped and the RNG state
  is restored, so the run that follows is the one without the estimate. The plain forward
  scores every position through the LM head (the trainer scores only loss positions), which
  makes the measured rate a little low.

A run resumed from a checkpoint is estimated whole. Not in the estimate: the TBDL detector's
scoring of probe items and check batches and checkpoint saving (inside ``wall_s``), and the eval
stage's share of the budget. With the detector on, those outweigh the low rate, so the estimate
falls short of the wall time: it says whether a run can fit at all, not what it will cost. The
release's cost report (``cost.json``) counts the whole stage and shows this estimate beside the
wall time it turned out to be.

Over the budget, ``release.cost.over_budget`` decides: ``refuse`` raises before training;
``hold`` does not train: the record's health is ``over_budget`` and ``gate.health`` maps it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clap import params
from clap.errors import ClapError
from clap.params import bad_param, check_keys

POLICIES = ("refuse", "hold")
OVER_BUDGET = "over_budget"  # training health of a batch held over its budget (params gate.health)
COLLATED = ("input_ids", "labels", "seq_lengths")  # the prepared dataset's columns the collator reads


@dataclasses.dataclass(frozen=True)
class BudgetParams:
    """The train stage's part of params ``release.cost`` (:func:`budget_params`)."""

    over_budget: str
    budget_cpu_hours: float
    budget_gpu_hours: float
    estimate_batches: int

    def __post_init__(self) -> None:
        n = self.estimate_batches
        check_keys(
            {
                "release.cost.over_budget": self.over_budget in POLICIES,
                "release.cost.budget_cpu_hours": self.budget_cpu_hours > 0,
                "release.cost.budget_gpu_hours": self.budget_gpu_hours > 0,
                "release.cost.estimate_batches": isinstance(n, int) and not isinstance(n, bool) and n >= 1,
            },
            f"release.cost: over_budget one of {POLICIES}, budgets > 0 and estimate_batches an integer >= 1",
        )


def budget_params(path: Path | str = params.DEFAULT_PATH) -> BudgetParams:
    """:class:`BudgetParams` from params ``release.cost`` (its other keys are the release's)."""
    cost = params.raw_section("release", path).get("cost")
    names = [f.name for f in dataclasses.fields(BudgetParams)]
    if not isinstance(cost, dict) or any(n not in cost for n in names):
        raise ClapError(
            f"params release.cost must set {names} (the train stage checks its budget before training)",
            file=path,
            column="release.cost",
            rule="missing_param",
        )
    return params.build(BudgetParams, {n: cost[n] for n in names}, where="release.cost", file=path)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A run's estimated cost before training, and the budget it is held to."""

    planned_tokens: int
    measured_tokens: int
    measured_s: float
    setup_s: float
    world_size: int
    kind: str  # cpu | gpu: which budget
    budget_s: float

    @property
    def tokens_per_s(self) -> float:
        """The measured training throughput of one process (tokens of forward + backward per second)."""
        return self.measured_tokens / self.measured_s if self.measured_s > 0 else math.inf

    @property
    def seconds(self) -> float:
        """The estimated wall time of the whole stage: setup plus the planned tokens at the measured rate."""
        return self.setup_s + self.planned_tokens / (self.tokens_per_s * self.world_size)

    @property
    def over(self) -> bool:
        return self.seconds > self.budget_s

    def describe(self) -> str:
        return (
            f"estimated {self.seconds:.0f} s ({self.seconds / 3600:.3g} {self.kind.upper()} h: {self.setup_s:.0f} s "
            f"setup + {self.planned_tokens} planned tokens at {self.tokens_per_s:.0f} tokens/s measured on "
            f"{self.measured_tokens} tokens"
            + (f" x {self.world_size} processes" if self.world_size > 1 else "")
            + f") vs budget {self.budget_s:.0f} s ({self.budget_s / 3600:g} h, release.cost.budget_{self.kind}_hours)"
        )

    def record(self) -> dict[str, Any]:
        """The flat fields the train record carries (the cost report reads ``cost_estimate_s``)."""
        return {
            "cost_estimate_s": round(self.seconds, 3),
            "cost_setup_wall_s": round(self.setup_s, 3),
            "cost_planned_tokens": int(self.planned_tokens),
            "cost_measured_tokens_per_s": round(self.tokens_per_s, 3),
            "cost_kind": self.kind,
            "cost_budget_s": round(self.budget_s, 3),
            "cost_over_budget": int(self.over),
        }


def planned_tokens(
    row_lengths: Sequence[int], *, max_length: int, epochs: float, max_steps: int, rows_per_step: int
) -> int:
    """Tokens the run will train on: every prepared row (capped at ``max_length``) ``epochs`` times, or,
    when ``max_steps`` > 0 caps the run, ``max_steps`` x ``rows_per_step`` rows of the mean length."""
    lengths = [min(int(n), max_length) for n in row_lengths]
    if not lengths:
        return 0
    if max_steps > 0:
        return math.ceil(max_steps * rows_per_step * sum(lengths) / len(lengths))
    return math.ceil(epochs * sum(lengths))


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _tokens(batch: dict[str, Any]) -> int:
    """Real (not padding) tokens of a collated batch."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def timed_passes(model, batches: Sequence[dict[str, Any]], device: str) -> tuple[int, float]:
    """(tokens, seconds) of forward + backward passes of ``batches[1:]`` on ``model`` in train mode
    (``batches[0]`` is an untimed warm-up). No optimizer step; the gradients are dropped and the
    CPU and CUDA RNG states (dropout) restored afterwards."""
    import torch

    if len(batches) < 2:
        raise bad_param(
            "release.cost.estimate_batches",
            "the throughput measurement needs a warm-up batch and a timed one",
        )
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    was_training = model.training
    model.train()
    tokens, seconds = 0, 0.0
    try:
        for i, batch in enumerate(batches):
            inputs = {k: v.to(model.device) if hasattr(v, "to") else v for k, v in batch.items()}
            _sync(device)
            start = time.perf_counter()
            model(**inputs).loss.backward()
            _sync(device)
            if i:
                seconds += time.perf_counter() - start
                tokens += _tokens(batch)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return tokens, seconds


def estimate_run(trainer, tp, bp: BudgetParams, *, device: str, world_size: int, setup_s: float) -> Estimate:
    """Measure this machine's training throughput on the trainer's first rows and estimate the run.

    ``trainer`` is the SFTTrainer about to train (its prepared ``train_dataset``, ``data_collator``
    and LoRA model); ``tp`` the ``train`` params (batch size, epochs, max_steps, max_length)."""
    dataset = trainer.train_dataset
    lengths = [len(ids) for ids in dataset["input_ids"]]
    if not lengths:
        raise ClapError("the trainer's prepared dataset has no rows", rule="empty_sft")
    columns = [c for c in COLLATED if c in dataset.column_names]
    n = tp.batch_size * (bp.estimate_batches + 1)
    rows = [{c: dataset[i % len(lengths)][c] for c in columns} for i in range(n)]
    batches = [trainer.data_collator(rows[i : i + tp.batch_size]) for i in range(0, n, tp.batch_size)]
    tokens, seconds = timed_passes(trainer.model, batches, device)
    kind = "gpu" if device.startswith("cuda") else "cpu"
    hours = bp.budget_gpu_hours if kind == "gpu" else bp.budget_cpu_hours
    planned = planned_tokens(
        lengths,
        max_length=tp.max_length,
        epochs=tp.epochs,
        max_steps=tp.max_steps,
        rows_per_step=tp.batch_size * tp.grad_accum * world_size,
    )
    return Estimate(planned, tokens, seconds, setup_s, world_size, kind, hours * 3600.0)


def over_budget(est: Estimate, bp: BudgetParams) -> bool:
    """False within budget; True to hold (policy ``hold``); raises under policy ``refuse``."""
    if not est.over:
        return False
    if bp.over_budget == "hold":
        return True
    raise ClapError(
        f"training refused before it starts: {est.describe()}; release.cost.over_budget is refuse "
        "(raise the budget, shrink the run, or set it to hold)",
        column="release.cost",
        rule="over_budget",
    )
