"""Detector cost: the TBDL detector's scoring seconds against the training run's seconds.

Runs clap's train path (``clap.train.sft.train_batch`` with params ``train``, ``detector`` and
``task`` of ``--params``, the determinism section applied as the stage applies it) on one
admitted batch and reports the training record's ``detector_seconds`` / ``train_runtime_s``.
The base side (``Diagnosis.on_train_begin``: the probe items' reference losses, scored once before
training; before the paired detector also a pilot draw of training items) is timed apart from the
checks (each check's probe draw, and since the paired detector its training batch under the start
model); the checks are split into their two halves (the step's training batch under the start model,
the probe draw at the current parameters), and ``share_floor_probe_now_only`` is the share the detector
would have if every start-model score were free. The process starts with the stages' allocator setting.
The entries dated 2026-12-03 measure the paired detector (before and after its cached prompt prefix); the older ones predate it. ``--code`` imports clap from another checkout (a worktree of main, say), so one
script measures before and after; each result goes under ``--label`` in ``--out``.

    nice -n 10 .venv/bin/python benchmarks/detector_cost.py --data data/admitted/2026-01 \
        --base models/base [--code PATH] [--max-steps N] [--label after] [--note "what else ran"]

``--max-steps`` shortens the run; the base side's share then grows (it scores the probe items of
the whole run before the first step), so compare only runs of equal length.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def commit(code: Path) -> str:
    """The checkout's HEAD (with ``+dirty`` when its tracked files differ from it)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=code).returncode != 0
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def _timed(method, times: list[float]):
    """``method`` that appends its wall seconds to ``times`` on every call."""

    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            times.append(time.perf_counter() - start)

    return wrapper


def run(data: Path, base: Path, params_file: Path, max_steps: int | None) -> dict:
    """One training run of ``data``; the record's timing fields and the base side's seconds."""
    from clap import determinism, params
    from clap.task.answer import load_answer_schema
    from clap.train import diagnosis, sft
    from clap.train.budget import budget_params
    from clap.train.detector import DetectorParams

    tp = params.section("train", sft.TrainParams, params_file)
    dp = params.section("detector", DetectorParams, params_file)
    determinism.apply(params.section("determinism", determinism.DeterminismParams, params_file))
    base_side = []
    on_train_begin = diagnosis.Diagnosis.on_train_begin

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = on_train_begin(self, *args, **kwargs)
        base_side.append(time.perf_counter() - start)
        return out

    diagnosis.Diagnosis.on_train_begin = timed
    # the checks' two halves: the step's training batch under the start model (see_batch) and the
    # fresh probe draw at the current parameters (_draw_probe)
    halves = {"see_batch": [], "_draw_probe": []}
    for name, times in halves.items():
        setattr(diagnosis.Diagnosis, name, _timed(getattr(diagnosis.Diagnosis, name), times))
    with tempfile.TemporaryDirectory() as tmp:  # fresh checkpoints: never a resume
        tp = dataclasses.replace(tp, checkpoint_root=str(Path(tmp) / "checkpoints"))
        if max_steps:
            tp = dataclasses.replace(tp, max_steps=max_steps)
        start = time.perf_counter()
        res = sft.train_batch(
            data,
            base,
            Path(tmp) / "adapter",
            tp,
            dp,
            answer=load_answer_schema(params_file),
            bp=budget_params(params_file),
        )
        wall = time.perf_counter() - start
    rec = res.record
    keys = ("steps", "detector_checks", "detector_seconds", "train_runtime_s", "wall_s", "adapter_sha256")
    out = {k: rec[k] for k in keys}
    out["detector_alarm_step"] = rec["detector_alarm_step"]
    out["base_side_seconds"] = round(sum(base_side), 3)
    out["checks_seconds"] = round(rec["detector_seconds"] - sum(base_side), 3)
    out["checks_train_reference_seconds"] = round(sum(halves["see_batch"]), 3)
    out["checks_probe_now_seconds"] = round(sum(halves["_draw_probe"]), 3)
    # the share the detector would have if every start-model score were free: the probe draws at the
    # current parameters over the training steps without any detector work (the floor of a check per step)
    steps_s = rec["train_runtime_s"] - rec["detector_seconds"]
    probe_now = sum(halves["_draw_probe"])
    out["share_floor_probe_now_only"] = round(probe_now / (steps_s + probe_now), 4)
    out["detector_share_of_train_runtime"] = round(rec["detector_seconds"] / rec["train_runtime_s"], 4)
    out["process_wall_s"] = round(wall, 3)
    # what the detector decided with, per check: compare runs of two checkouts (float tolerance)
    out["checks"] = [
        [r["step"], r["loss"], r["probe_loss"], r["gap_increment"], r["log_e"]]
        for r in res.curves
        if r["gap_increment"] is not None
    ]
    out["checks_columns"] = ["step", "loss", "probe_loss", "gap_increment", "log_e"]
    out["train_loss_start"] = rec["train_loss_start"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="an admitted batch folder")
    ap.add_argument("--base", type=Path, required=True, help="the exported base model folder")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose clap is measured")
    ap.add_argument(
        "--max-steps", type=int, default=None, help="cap the run (default: params train.max_steps)"
    )
    ap.add_argument("--label", default="", help="key of this result in --out (default: the code's commit)")
    ap.add_argument("--note", default="", help="free text stored with the result (e.g. what else ran)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/detector_cost.json")
    a = ap.parse_args()
    sys.path.insert(0, str(a.code.resolve()))
    from machine import machine  # benchmarks/machine.py, beside this script

    import clap
    from clap.stage import reuse_freed_memory

    reuse_freed_memory()  # as the train stage does
    result = {
        **run(a.data.resolve(), a.base.resolve(), a.params.resolve(), a.max_steps),
        "code": commit(a.code),
        "clap_imported_from": str(Path(clap.__file__).parent),
        "data": str(a.data),
        "max_steps": a.max_steps,
        "machine": machine(),
        "note": a.note,
    }
    results = json.loads(a.out.read_text()) if a.out.exists() else {}
    results[a.label or result["code"]] = result
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
