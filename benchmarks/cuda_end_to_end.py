"""The CUDA path end to end on one demo batch, beside the CPU run committed for the same batch.

``run`` (on a CUDA machine, after ``make install-cuda`` and ``dvc repro`` up to ``admit@<batch>``) runs the
stage scripts as ``dvc.yaml`` does: base -> train (``train.quantization: auto`` = QLoRA nf4 with bf16 compute
on CUDA) -> grpo -> eval -> replay -> gate, and logs each stage's wall time. ``report`` reads the stage
outputs of that run (a copy of its ``metrics/`` and ``records/``) and its log, and writes
``benchmarks/results/cuda_end_to_end.{json,md}`` with this repository's committed CPU figures beside them.

usage: python benchmarks/cuda_end_to_end.py run LOG [--batch 2026-01]
       python benchmarks/cuda_end_to_end.py report OUTPUTS LOG [--batch 2026-01] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STAGES = ("base", "train", "grpo", "eval", "replay", "gate")
GATE_KEYS = (
    "decision",
    "n_items",
    "baseline_pass_rate",
    "candidate_pass_rate",
    "b",
    "c",
    "pvalue",
    "delta",
    "hallucination_rate",
    "wrong_fact_rate",
)
TRAIN_KEYS = (
    "train_loss_start",
    "train_loss_end",
    "probe_loss_start",
    "probe_loss_end",
    "detector_max_log_e",
    "detector_checks",
    "detector_seconds",
    "tokens_per_s",
    "peak_rss_mb",
)
LINE = re.compile(r"^\[\s*[\d.]+s\] rc=(\d+) ([\d.]+)s \S+ stages/(\w+)\.py")


def commands(b: str) -> list[list[str]]:
    """The stage commands of dvc.yaml for batch ``b`` (base first)."""
    return [
        ["stages/base.py", "models/base", "metrics/base.json"],
        ["stages/train.py", f"data/admitted/{b}", "models/base", f"records/warm_start/{b}.json",
         f"models/adapters/{b}", f"metrics/train/{b}.json", f"plots/train/{b}.csv"],
        ["stages/grpo.py", f"data/admitted/{b}", f"metrics/admit/{b}.json", "models/base", f"models/adapters/{b}",
         f"models/grpo/{b}", f"metrics/grpo/{b}.json", f"plots/grpo/{b}.csv"],
        ["stages/eval.py", f"data/admitted/{b}", "models/base", f"models/adapters/{b}", "releases/production.json",
         f"data/eval/{b}", f"metrics/eval/{b}.json"],
        ["stages/replay.py", f"data/admitted/{b}", "models/base", f"models/adapters/{b}", f"data/replay/{b}",
         f"reports/replay/{b}", f"metrics/replay/{b}.json", f"plots/replay/{b}.csv"],
        ["stages/gate.py", f"data/eval/{b}", f"metrics/train/{b}.json", f"plots/train/{b}.csv",
         f"metrics/admit/{b}.json", f"metrics/replay/{b}.json", f"reports/gate/{b}", f"metrics/gate/{b}.json",
         f"metrics/grpo/{b}.json"],
    ]  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    t0 = time.time()
    with open(args.log, "a", buffering=1) as log:
        log.write(f"machine: {machine()}\n")
        for cmd in commands(args.batch):
            t = time.time()
            rc = subprocess.run([sys.executable, *cmd], cwd=ROOT).returncode
            log.write(
                f"[{time.time() - t0:7.1f}s] rc={rc} {time.time() - t:.1f}s {sys.executable} {cmd[0]}\n"
            )
            if rc:
                return rc
    return 0


def stage_seconds(log_text: str) -> dict[str, float]:
    """Wall seconds per stage from a ``run`` log (the last line of each stage)."""
    out = {}
    for line in log_text.splitlines():
        m = LINE.match(line)
        if m and m.group(1) == "0":
            out[m.group(3)] = float(m.group(2))
    return out


def _side(root: Path, b: str) -> dict[str, object]:
    gate = json.loads((root / "metrics" / "gate" / f"{b}.json").read_text())
    train = json.loads((root / "metrics" / "train" / f"{b}.json").read_text())
    record = json.loads((root / "records" / "train" / f"{b}.json").read_text())
    return {
        "hardware": record.get("hardware"),
        "precision": record.get("precision"),
        "torch": record.get("torch_version"),
        **{f"gate_{k}": gate.get(k) for k in GATE_KEYS},
        **{f"train_{k}": train.get(k) for k in TRAIN_KEYS},
    }


def cmd_report(args: argparse.Namespace) -> int:
    log_text = Path(args.log).read_text()
    cuda = {**_side(Path(args.outputs), args.batch), "stage_seconds": stage_seconds(log_text)}
    cpu = _side(ROOT, args.batch)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {
        "command": f"python benchmarks/cuda_end_to_end.py report {args.outputs} {args.log} --batch {args.batch}",
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "batch": args.batch,
        "cuda_machine": next((ln[9:] for ln in log_text.splitlines() if ln.startswith("machine: ")), ""),
        "note": args.note,
        "cuda": cuda,
        "cpu_committed": cpu,
    }
    (RESULTS / "cuda_end_to_end.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    rows = [k for k in cuda if k not in ("stage_seconds",)]
    md = [
        f"# The CUDA path end to end: demo batch {args.batch}",
        "",
        f"Written by `{result['command']}` (commit {result['commit']}, {result['date']}). CUDA run on "
        f"{result['cuda_machine'] or 'an unnamed machine'}; CPU column: this repository's committed outputs for the "
        "same batch. " + (args.note or ""),
        "",
        "| | CUDA run | CPU (committed) |",
        "|---|---|---|",
        *[f"| {k} | {cuda[k]} | {cpu[k]} |" for k in rows],
        "",
        "Stage wall seconds on the CUDA machine: "
        + ", ".join(f"{s} {cuda['stage_seconds'].get(s, '–')}" for s in STAGES)
        + ".",
        "",
    ]
    (RESULTS / "cuda_end_to_end.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("log")
    r.add_argument("--batch", default="2026-01")
    p = sub.add_parser("report")
    p.add_argument("outputs", help="a copy of the CUDA run's metrics/ and records/ (their parent folder)")
    p.add_argument("log", help="the run's log (`run` writes it)")
    p.add_argument("--batch", default="2026-01")
    p.add_argument("--note", default="")
    args = ap.parse_args()
    return {"run": cmd_run, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
