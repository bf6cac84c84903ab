"""grpo: the GRPO failure-boundary probe of one batch, with runtime risk diagnosis (KL, reward, length).

usage: python stages/grpo.py data/admitted/<b> metrics/admit/<b>.json models/base models/adapters/<b> models/grpo/<b> metrics/grpo/<b>.json plots/grpo/<b>.csv

in:  data/admitted/<b>/{grpo,kb}.parquet; metrics/admit/<b>.json (static verdict on D_grpo); models/base;
     models/adapters/<b> (the start policy when grpo.start_from is sft); params.yaml `grpo`, `scoring`
out: models/grpo/<b>/ (the probe's adapter; not_run.json when disabled, not admitted, or its SFT adapter was not trained),
     metrics/grpo/<b>.json (flat: static vs runtime verdict, KL peak, reward, length drift, stop reason, health),
     plots/grpo/<b>.csv (step, kl, reward, reward_std, completion_length, clipped_ratio, frac_reward_zero_std, loss, grad_norm)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from clap import determinism, io, params, progress, stage  # noqa: E402
from clap.model.base import default_device  # noqa: E402
from clap.task.scoring import scoring_params  # noqa: E402
from clap.train.diagnosis import curves_csv  # noqa: E402
from clap.train.grpo import run_probe  # noqa: E402
from clap.train.grpo_policy import CURVE_COLUMNS, GrpoParams  # noqa: E402
from clap.train.sft import TrainParams  # noqa: E402

USAGE = "usage: python stages/grpo.py ADMITTED_DIR ADMIT_JSON BASE_DIR SFT_ADAPTER_DIR GRPO_ADAPTER_DIR METRICS_JSON CURVES_CSV"


def run(
    data_dir: Path,
    admit_json: Path,
    base_dir: Path,
    sft_dir: Path,
    adapter_dir: Path,
    metrics_path: Path,
    curves_path: Path,
) -> dict | None:
    """Probe one batch; rank 0 writes the record and curves and gets the record back."""
    progress.configure(params.section("progress", progress.ProgressParams))  # what is printed only
    p, sp = params.section("grpo", GrpoParams), scoring_params()
    result = run_probe(
        data_dir, admit_json, base_dir, sft_dir, adapter_dir, p, sp, params.section("train", TrainParams)
    )
    if not result.is_main:
        return None
    result.record.update(
        determinism.versions(params.section("determinism", determinism.DeterminismParams).packages),
        hardware=determinism.hardware_class(default_device()),
    )
    io.write_metrics_and_record(metrics_path, io.record_path(metrics_path), result.record)
    io.atomic_write_text(curves_path, curves_csv(result.curves, CURVE_COLUMNS))
    return result.record


def describe(argv, r: dict) -> str:
    """One human line about the probe (values may be the string 'nan')."""
    batch = Path(argv[0]).name
    if not r["run"]:
        return f"grpo {batch}: not run ({r['stop_reason']}); static {r['static_verdict']}"
    return (
        f"grpo {batch}: {r['steps']}/{r['planned_steps']} steps, static {r['static_verdict']} vs runtime {r['runtime_verdict']} "
        f"({r['stop_reason']}), KL peak {r['kl_peak']}, reward {r['reward_first']} -> {r['reward_final']}, {r['wall_s']} s"
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (7,), run, describe))
