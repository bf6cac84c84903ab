"""train: LoRA SFT of one admitted batch with runtime diagnosis and the online TBDL detector.

usage: python stages/train.py data/admitted/<b> models/base records/warm_start/<b>.json models/adapters/<b> metrics/train/<b>.json plots/train/<b>.csv
       (unchanged under `torchrun --nproc_per_node N stages/train.py ...`)

in:  data/admitted/<b>/{sft,probe,kb}.parquet + admission.json; models/base; records/warm_start/<b>.json (what the
     adapter starts from: fresh weights, or a released adapter models/adapters/<from>, sha256-checked);
     params.yaml `train`, `detector`, `task` (the answer),
     `release.cost` (the batch's budget: the run's cost is estimated before training, clap/train/budget.py)
out: models/adapters/<b>/ (adapter_model.safetensors + adapter_config.json + tokenizer; a batch not
     admitted, or held over budget, gets only skipped.json), metrics/train/<b>.json (flat numbers, the
     cost estimate cost_* among them; over budget: refused with exit 2, or health over_budget by policy) +
     records/train/<b>.json (hashes, versions, seed, threads, device), plots/train/<b>.csv
     (step, loss, grad_norm, learning_rate, tokens_per_s, probe_loss, train_ref_loss, probe_ref_loss,
     gap_increment, log_e, log_threshold).
     Training runs in <train.checkpoint_root>/<b>/ and resumes from there after a kill.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from clap import determinism, io, params, progress, stage  # noqa: E402
from clap.model.base import default_device  # noqa: E402
from clap.task.answer import load_answer_schema  # noqa: E402
from clap.train.budget import budget_params  # noqa: E402
from clap.train.detector import DetectorParams  # noqa: E402
from clap.train.diagnosis import curves_csv  # noqa: E402
from clap.train.sft import TrainParams, train_batch  # noqa: E402
from clap.train.warm_start import read as read_warm_start  # noqa: E402

USAGE = (
    "usage: python stages/train.py ADMITTED_DIR BASE_DIR WARM_START_JSON ADAPTER_DIR METRICS_JSON CURVES_CSV"
)


def run(
    data_dir: Path, base_dir: Path, start: Path, adapter_dir: Path, metrics_path: Path, curves_path: Path
) -> dict | None:
    """Train one batch; rank 0 writes the record and curves and gets the record back."""
    progress.configure(params.section("progress", progress.ProgressParams))  # what is printed only
    dp = params.section("determinism", determinism.DeterminismParams)
    determinism.apply(dp)
    result = train_batch(
        data_dir,
        base_dir,
        adapter_dir,
        params.section("train", TrainParams),
        params.section("detector", DetectorParams),
        answer=load_answer_schema(),
        bp=budget_params(),
        start=read_warm_start(start, adapter_dir.name),
    )
    if not result.is_main:
        return None
    weights = adapter_dir / "adapter_model.safetensors"
    logical = (
        determinism.adapter_logical_hash(weights, dp.logical_decimals) if result.record["trained"] else ""
    )
    result.record.update(determinism.record(dp, default_device()), adapter_logical_sha256=logical)
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), result.record)
    io.atomic_write_text(curves_path, curves_csv(result.curves))
    return result.record


def describe(argv, r: dict) -> str:
    """One human line about the run (values may be the string 'nan')."""
    batch_dir = argv[0]
    if not r["trained"]:
        return f"train {batch_dir}: not trained, health {r['health']} ({r['skip_reason']})"
    start = (
        f"from batch {r['init_from_batch']}'s adapter" if r["init_from_batch"] else "from fresh LoRA weights"
    )

    def f(v) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else str(v)

    return (
        f"train {batch_dir} {start}: {r['steps']}/{r['planned_steps']} steps, health {r['health']}, loss {f(r['train_loss_start'])} -> "
        f"{f(r['train_loss_end'])}, probe {f(r['probe_loss_start'])} -> {f(r['probe_loss_end'])}, detector log E max "
        f"{f(r['detector_max_log_e'])} / {f(r['detector_log_threshold'])}, {f(r['tokens_per_s'])} tokens/s, {f(r['wall_s'])} s "
        f"(estimated {f(r['cost_estimate_s'])} s, budget {f(r['cost_budget_s'])} s)"
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (6,), run, describe))
