"""The TBDL detector on real training runs: faults caught, when, and clean false alarms (issue 17).

Two commands. ``run`` trains one run per spec on the real base (models/base) exactly as the train
stage does (params ``train`` and ``detector`` of params.yaml), but with ``stop_on_alarm`` off so the
whole run is watched, and keeps its per-check record (training loss and its reference, probe loss and
its reference, the gap increment) in ``<runs>/<name>.json``. Runs already there are skipped, so an
interrupted campaign resumes. ``report`` replays every kept run under the pre-registered constants of
params ``detector`` (the increments do not depend on them) and writes the table.

A spec is ``set:batch:fault:seed``: ``set`` is ``calibration`` (runs the constants may be chosen on)
or ``validation`` (runs made after the constants were fixed); ``batch`` an admitted batch folder name
under ``--admitted``; ``fault`` ``clean``, ``relabel`` (every training answer moved to another item:
:func:`clap.judge.calibrate.corrupt_sft`), ``dirty_values`` (30 % of the values swapped: a subtle
fault) or ``as_is`` (the batch as admitted: the demo's wrong-column batch 2026-03 is faulty as it
arrived); ``seed`` the training seed (LoRA init and data order).

    .venv/bin/python benchmarks/detector_calibration.py run --admitted /tmp/det/admitted \\
        validation:2026-02:clean:1 validation:2026-03:as_is:2 ...
    .venv/bin/python benchmarks/detector_calibration.py report
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.machine import machine  # noqa: E402
from clap import io  # noqa: E402
from clap import params as cparams  # noqa: E402

RUNS = ROOT / "benchmarks/results/detector_runs"
OUT = ROOT / "benchmarks/results/detector_calibration"
FAULTS = ("clean", "relabel", "dirty_values", "as_is")
SEVERE = ("relabel", "as_is")  # the faults the targets are about (as_is: only on a corrupted batch)
KEEP = ("step", "loss", "train_ref_loss", "probe_loss", "probe_ref_loss", "gap_increment", "log_e")


@dataclasses.dataclass(frozen=True)
class Spec:
    set: str
    batch: str
    fault: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.set}-{self.batch}-{self.fault}-{self.seed}"

    @classmethod
    def parse(cls, text: str) -> Spec:
        part = text.split(":")
        if len(part) != 4 or part[0] not in ("calibration", "validation") or part[2] not in FAULTS:
            raise SystemExit(
                f"bad spec {text!r}: set:batch:fault:seed, set calibration|validation, fault {FAULTS}"
            )
        return cls(part[0], part[1], part[2], int(part[3]))


def train_run(spec: Spec, admitted: Path, base: Path, params: Path, work: Path, threads: int) -> dict:
    """Train one run (stop_on_alarm off) and return its kept record and per-check rows."""
    from clap.judge.calibrate import corrupt_sft
    from clap.task.answer import load_answer_schema
    from clap.train.budget import budget_params
    from clap.train.detector import DetectorParams
    from clap.train.sft import TrainParams, train_batch

    answer = load_answer_schema(params)
    data = work / "data"
    shutil.copytree(admitted / spec.batch, data)
    if spec.fault in ("relabel", "dirty_values"):
        sft = io.read_parquet(data / "sft.parquet")
        io.write_parquet(data / "sft.parquet", corrupt_sft(sft, spec.fault, 0.3, spec.seed, answer))
    tp = dataclasses.replace(
        cparams.section("train", TrainParams, params), seed=spec.seed, checkpoint_root=str(work / "ckpt")
    )
    if threads:
        tp = dataclasses.replace(tp, torch_threads=threads)
    dp = dataclasses.replace(cparams.section("detector", DetectorParams, params), stop_on_alarm=False)
    t0 = time.perf_counter()
    res = train_batch(data, base, work / "adapter", tp, dp, answer=answer, bp=budget_params(params))
    rec = res.record
    checks = [{k: r[k] for k in KEEP} for r in res.curves if r["gap_increment"] is not None]
    return {
        "spec": dataclasses.asdict(spec),
        "machine": machine(),
        "torch_threads": tp.torch_threads,
        "wall_s": round(time.perf_counter() - t0, 1),
        "record": {
            k: rec[k]
            for k in (
                "steps",
                "planned_steps",
                "health",
                "train_runtime_s",
                "detector_seconds",
                "detector_checks",
                "probe_loss_start",
                "probe_loss_end",
                "train_loss_start",
                "train_loss_end",
                "adapter_sha256",
            )
        },
        "checks": checks,
    }


def cmd_run(args: argparse.Namespace) -> int:
    params = args.params
    args.runs.mkdir(parents=True, exist_ok=True)
    for text in args.specs:
        spec = Spec.parse(text)
        out = args.runs / f"{spec.name}.json"
        if out.exists():
            print(f"{spec.name}: kept, skipped", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="clap-det-") as tmp:
            run = train_run(spec, args.admitted, args.base, params, Path(tmp), args.threads)
        io.write_json(out, run)
        r = run["record"]
        print(
            f"{spec.name}: {run['wall_s']} s, detector {r['detector_seconds']} of {r['train_runtime_s']} s, "
            f"{len(run['checks'])} checks",
            flush=True,
        )
    return 0


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def replay_run(run: dict, dp) -> dict:
    from clap.train import detector as det

    checks = run["checks"]
    log_e, alarm = det.replay([c["gap_increment"] for c in checks], dp)
    planned = run["record"]["planned_steps"]
    step = checks[alarm - 1]["step"] if alarm > 0 else -1
    gaps = [c["gap_increment"] for c in checks]
    return {
        "name": Spec(**run["spec"]).name,
        **run["spec"],
        "checks": len(checks),
        "planned_steps": planned,
        "alarm_step": step,
        "alarm_fraction": step / planned if step > 0 else None,
        "max_log_e": float(max(log_e)) if len(log_e) else 0.0,
        "mean_gap": statistics.fmean(gaps) if gaps else math.nan,
        "detector_share": run["record"]["detector_seconds"] / max(run["record"]["train_runtime_s"], 1e-9),
    }


def summarize(rows: list[dict], alpha: float) -> list[dict]:
    """Per (set, kind): runs, caught, median alarm fraction; clean: false alarms with a 95 % CI."""
    out = []
    kinds = [
        ("severe faults", lambda r: r["fault"] in SEVERE),
        ("subtle faults (dirty_values 30 %)", lambda r: r["fault"] == "dirty_values"),
        ("clean", lambda r: r["fault"] == "clean"),
    ]
    for set_name in ("calibration", "validation"):
        for kind, keep in kinds:
            sel = [r for r in rows if r["set"] == set_name and keep(r)]
            if not sel:
                continue
            hit = [r for r in sel if r["alarm_step"] > 0]
            lo, hi = clopper_pearson(len(hit), len(sel))
            frac = [r["alarm_fraction"] for r in hit]
            out.append(
                {
                    "set": set_name,
                    "kind": kind,
                    "runs": len(sel),
                    "alarms": len(hit),
                    "alarm_rate": len(hit) / len(sel),
                    "alarm_rate_ci95": [lo, hi],
                    "median_alarm_fraction": statistics.median(frac) if frac else None,
                    "batches": sorted({r["batch"] for r in sel}),
                    "alpha": alpha,
                }
            )
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from clap.train.detector import DetectorParams

    dp = cparams.section("detector", DetectorParams, args.params)
    runs = [io.read_json(p) for p in sorted(args.runs.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {args.runs}")
    rows = [replay_run(r, dp) for r in runs]
    table = summarize(rows, dp.alpha)
    shares = [r["detector_share"] for r in rows]
    result = {
        "about": "benchmarks/detector_calibration.py report: every kept run replayed under params.yaml `detector`",
        "detector": dataclasses.asdict(dp),
        "machines": sorted({r["machine"] for r in runs}),
        "summary": table,
        "detector_share_of_train_runtime_median": statistics.median(shares),
        "runs": rows,
    }
    io.write_json(args.out.with_suffix(".json"), result)
    args.out.with_suffix(".md").write_text(render(result))
    print(render(result))
    return 0


def _f(v, spec=".2f") -> str:
    return "—" if v is None else format(v, spec)


def render(result: dict) -> str:
    lines = [
        "# The TBDL detector on real training runs (issue 17)",
        "",
        "Written by `python benchmarks/detector_calibration.py report` from the runs in "
        "`benchmarks/results/detector_runs/` (each made by its `run` command, `stop_on_alarm` off so the whole "
        "run is watched, then replayed under the pre-registered constants of params `detector`).",
        f"Machines: {', '.join(result['machines'])}.",
        "",
        "| set | runs | kind | batches | alarms | rate (95 % CI) | median alarm at (share of steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result["summary"]:
        lo, hi = s["alarm_rate_ci95"]
        lines.append(
            f"| {s['set']} | {s['runs']} | {s['kind']} | {', '.join(s['batches'])} | {s['alarms']} | "
            f"{s['alarm_rate']:.3f} ({lo:.3f}–{hi:.3f}) | {_f(s['median_alarm_fraction'])} |"
        )
    lines += [
        "",
        f"Detector time as a share of training runtime, median over runs: "
        f"{result['detector_share_of_train_runtime_median']:.2f}.",
        "",
        "| run | checks / steps | alarm step | max log E | mean gap (nats) | detector share |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['name']} | {r['checks']} / {r['planned_steps']} | {r['alarm_step'] if r['alarm_step'] > 0 else '—'} | "
            f"{r['max_log_e']:.2f} | {r['mean_gap']:+.3f} | {r['detector_share']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--runs", type=Path, default=RUNS, help="folder of the kept runs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--admitted", type=Path, default=ROOT / "data/admitted")
    run.add_argument("--base", type=Path, default=ROOT / "models/base")
    run.add_argument(
        "--threads", type=int, default=0, help="torch threads per run (0: params train.torch_threads)"
    )
    run.add_argument("specs", nargs="+")
    rep = sub.add_parser("report")
    rep.add_argument("--out", type=Path, default=OUT, help="writes <out>.md and <out>.json")
    args = ap.parse_args()
    return cmd_run(args) if args.cmd == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
