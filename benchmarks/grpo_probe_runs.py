"""Real GRPO probes on the demo's base model and a batch's SFT adapter: a calm and a KL blow-up setting.

Runs :func:`clap.train.grpo.run_probe` (the stage's code, the same runtime rules) with the
committed ``grpo`` params and a few overrides, reading a finished pipeline's outputs
(``--root``: data/admitted/<b>, metrics/admit/<b>.json, models/base, models/adapters/<b>; read only)
and writing the probe adapter to a scratch folder. Per setting it commits the flat record and the
curve to ``benchmarks/results/grpo_runs/<name>.{json,csv}`` (``dvc plots show`` draws the CSV).

    nice -n 10 .venv/bin/python benchmarks/grpo_probe_runs.py --root /path/to/finished/checkout \
        --name calm --name kl_lr100:lr=0.02 \
        --name kl_lr100_unstopped:lr=0.02,thresholds.max_kl=1e9,thresholds.kl_window=0,...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.machine import cpu_model, machine  # noqa: E402
from clap import io, params  # noqa: E402
from clap.task.scoring import scoring_params  # noqa: E402
from clap.train.diagnosis import curves_csv  # noqa: E402
from clap.train.grpo import run_probe  # noqa: E402
from clap.train.grpo_policy import CURVE_COLUMNS, GrpoParams  # noqa: E402
from clap.train.sft import TrainParams  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "grpo_runs"


def setting(spec: str) -> tuple[str, dict[str, float]]:
    """``name`` or ``name:key=value,...``: overrides of params ``grpo`` (numbers; ``thresholds.<k>`` nested)."""
    name, _, rest = spec.partition(":")
    overrides = {
        k: int(v) if v.lstrip("-").isdigit() else float(v)
        for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)
    }
    return name, overrides


def apply(raw: dict, overrides: dict[str, float]) -> dict:
    """``raw`` (params ``grpo``) with the overrides set; an unknown key is an error."""
    raw = {**raw, "thresholds": dict(raw["thresholds"])}
    for key, value in overrides.items():
        section, _, leaf = key.rpartition(".")
        target = raw["thresholds"] if section == "thresholds" else raw
        if section not in ("", "thresholds") or leaf not in target:
            raise KeyError(f"unknown grpo param {key!r}")
        target[leaf] = value
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="a checkout where dvc repro has run (read only)")
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--name", action="append", required=True, help="name[:key=value,...]")
    args = ap.parse_args()
    pfile = ROOT / "params.yaml"
    sp = scoring_params(pfile)
    tp = params.section("train", TrainParams, pfile)
    OUT.mkdir(parents=True, exist_ok=True)
    for spec in args.name:
        name, overrides = setting(spec)
        p = params.build(GrpoParams, apply(params.raw_section("grpo", pfile), overrides))
        before = machine()
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="clap-grpo-bench-") as scratch:
            res = run_probe(
                args.root / "data" / "admitted" / args.batch,
                args.root / "metrics" / "admit" / f"{args.batch}.json",
                args.root / "models" / "base",
                args.root / "models" / "adapters" / args.batch,
                Path(scratch) / "grpo",
                p,
                sp,
                tp,
            )
        record = {
            **res.record,
            "setting": name,
            "overrides": overrides,
            "batch": args.batch,
            "sft_adapter_sha256": io.sha256_file(
                args.root / "models" / "adapters" / args.batch / "adapter_model.safetensors"
            ),
            "cpu_model": cpu_model(),
            "machine_before": before,
            "machine_after": machine(),
            "bench_wall_s": round(time.perf_counter() - start, 1),
            "torch_threads": tp.torch_threads,
        }
        (OUT / f"{name}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        (OUT / f"{name}.csv").write_text(curves_csv(res.curves, CURVE_COLUMNS))
        print(
            f"{name}: {record['runtime_verdict']} ({record['stop_reason']} at step {record['stop_step']}), "
            f"KL peak {record['kl_peak']}, static {record['static_verdict']}, {record['bench_wall_s']} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
