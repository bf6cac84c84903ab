"""Fault-injection calibration on the real model: the table the issue asks for, with committed results.

Runs :func:`clap.judge.calibrate.calibrate` (every fault of params ``calibrate`` x ``fault_seeds``
plus the clean runs) on an admitted demo batch and models/base, with the repository's
params (train, detector, eval, scoring, gate): the same loop the stages run. It reads
``<root>/data/admitted/<batch>`` and ``<root>/models/base`` (read only; ``--root`` may point
at another checkout that has them) and writes ``<out>.md`` and ``<out>.json`` (the table,
the summary, the settings, machine and wall time). Exit status 1 when a fault is released.

Cost: the full run is ~9 trainings of the CPU demo profile plus 10 evals (~4 + ~1-2 min each
on 2 idle cores: about an hour). ``--reduced`` is a smoke run of the same code path: it caps
training steps, uses the first eval items, and may restrict faults and seeds; its numbers
say nothing about the gate's power (a few steps do not teach the model) and are labelled so.

    nice -n 10 .venv/bin/python benchmarks/calibration.py [--root /work/main] [--batch 2026-01]
    nice -n 10 .venv/bin/python benchmarks/calibration.py --reduced --max-steps 2 --eval-items 4 --faults nan lr_zero --clean-seeds 20260301
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from clap import io  # noqa: E402
from clap.judge import calibrate as cal  # noqa: E402


def reduce(
    cp: cal.CalibrateParams, loop: cal.LoopParams, args: argparse.Namespace
) -> tuple[cal.CalibrateParams, cal.LoopParams]:
    """The ``--reduced`` overrides (only those given)."""
    cp = dataclasses.replace(
        cp, **{k: v for k, v in (("faults", args.faults), ("clean_seeds", args.clean_seeds)) if v is not None}
    )
    train = {k: v for k, v in (("max_steps", args.max_steps), ("torch_threads", args.threads)) if v}
    return cp, dataclasses.replace(loop, train=dataclasses.replace(loop.train, **train))


def batch_copy(admitted: Path, work: Path, held_out_items: int) -> Path:
    """The admitted batch (copied), keeping the first ``held_out_items`` eval and probe items when > 0."""
    out = work / "batch" / admitted.name
    shutil.copytree(admitted, out)
    for name in ("eval.parquet", "probe.parquet") if held_out_items > 0 else ():
        io.write_parquet(out / name, io.read_parquet(admitted / name).head(held_out_items))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="checkout holding data/admitted/<batch> and models/base (read only)",
    )
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks/results/calibration",
        help="writes <out>.md and <out>.json",
    )
    ap.add_argument("--reduced", action="store_true", help="smoke run: apply the overrides below")
    ap.add_argument("--max-steps", type=int, default=0, help="(--reduced) cap optimizer steps per run")
    ap.add_argument(
        "--eval-items", type=int, default=0, help="(--reduced) first N eval and N probe items only"
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="(--reduced) torch threads for training (default: params)"
    )
    ap.add_argument("--faults", nargs="*", help="(--reduced) faults to run (default: params)")
    ap.add_argument("--clean-seeds", nargs="*", type=int, help="(--reduced) clean seeds (default: params)")
    args = ap.parse_args()
    cp, loop = cal.load_params(args.params)
    if args.reduced:
        cp, loop = reduce(cp, loop, args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clap-calibration-bench-") as tmp:
        work = Path(tmp)
        admitted = batch_copy(
            args.root / "data/admitted" / args.batch, work, args.eval_items if args.reduced else 0
        )
        result = cal.calibrate(
            admitted,
            args.root / "models/base",
            work / "runs",
            cp,
            loop,
            on_row=lambda r: print(cal.progress_line(r), flush=True),
        )
    wall = time.perf_counter() - started
    title = f"{args.batch}, real base" + (" (REDUCED smoke run: not a calibration)" if args.reduced else "")
    io.atomic_write_text(args.out.with_suffix(".md"), cal.render_markdown(result, title))
    io.write_json(
        args.out.with_suffix(".json"),
        {
            "batch": args.batch,
            "reduced": args.reduced,
            "summary": result.summary,
            "runs": result.rows,
            "overrides": {"max_steps": args.max_steps, "eval_items": args.eval_items, "threads": args.threads}
            if args.reduced
            else {},
            "calibrate": dataclasses.asdict(cp),
            "wall_s": round(wall, 1),
            "load_avg_1m_at_end": os.getloadavg()[0],
            "machine": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cpus".strip(),
        },
    )
    print(f"wrote {args.out.with_suffix('.md')} ({wall:.0f} s)")
    return 0 if result.summary["no_fault_released"] else 1


if __name__ == "__main__":
    sys.exit(main())
