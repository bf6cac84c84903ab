"""The TBDL detector on real training runs: faults caught, when, and clean false alarms (issue 17).

Two commands. ``run`` trains one run per spec on the real base (models/base) exactly as the train
stage does (params ``train`` and ``detector`` of params.yaml), but with ``stop_on_alarm`` off so the
whole run is watched, and keeps its per-check record (training loss and its reference, probe loss and
its reference, the gap increment) in ``<runs>/<name>.json``. Runs already there are skipped, so an
interrupted campaign resumes. ``report`` replays every kept run under the pre-registered constants of
params ``detector`` (the increments do not depend on them) and writes the table.

A spec is ``set:batch:fault:seed``: ``set`` is ``calibration`` (runs the constants may be chosen on),
``validation`` (runs made after round 1's constants were fixed) or ``validation2`` (faulted runs made
after round 2's); ``batch`` an admitted batch folder name
under ``--admitted``; ``fault`` ``clean``, ``relabel`` (every training answer moved to another item:
:func:`clap.judge.calibrate.corrupt_sft`), ``dirty_values`` (30 % of the values swapped: a subtle
fault) or ``as_is`` (the batch as admitted: the demo's wrong-column batch 2026-03 is faulty as it
arrived); ``seed`` the training seed (LoRA init and data order).

    .venv/bin/python benchmarks/detector_calibration.py run --admitted /tmp/det/admitted \\
        validation:2026-02:clean:1 validation:2026-03:as_is:2 ...
    # the real-data profile (its admitted batches from `dvc repro admit@...` in profiles/tatqa):
    .venv/bin/python benchmarks/detector_calibration.py --params profiles/tatqa/params.yaml run \\
        --admitted profiles/tatqa/data/admitted validation2:reports-a:relabel:20260331 ...
    .venv/bin/python benchmarks/detector_calibration.py report

Set ``pool`` holds the runs made after admission drew the probe from the training pool (issue 38), kept
in ``benchmarks/results/detector_pool_runs`` and tabled per batch, worst rows first, by ``pool-report``
(``as_is`` there is a fault in the whole delivery, so in the probe too)::

    .venv/bin/python benchmarks/detector_calibration.py --runs benchmarks/results/detector_pool_runs run \
        --admitted /tmp/det/admitted --threads 1 pool:2026-04:clean:20260401 pool:2026-02:relabel:20260401 ...
    .venv/bin/python benchmarks/detector_calibration.py --runs benchmarks/results/detector_pool_runs pool-report

``checks-pilot`` simulates a profile's kept pool runs at more checks than they made (a larger probe pool),
through the real schedule and e-process, to choose a probe pool before validation runs at it::

    .venv/bin/python benchmarks/detector_calibration.py --params profiles/tatqa/params.yaml \\
        --runs benchmarks/results/detector_pool_runs checks-pilot
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
# validation2: faulted runs made after round 2 was fixed; pool: runs whose probe admission drew from the training
# pool (issue 38), under round 2's constants as pre-registered before any of them was made
SETS = ("calibration", "validation", "validation2", "pool")
POOL_RUNS = ROOT / "benchmarks/results/detector_pool_runs"
POOL_OUT = ROOT / "benchmarks/results/detector_pool"
CHECKS_OUT = ROOT / "benchmarks/results/detector_checks_pilot"
# the targets are about severe faults: relabel, and as_is on a corrupted batch (the demo's wrong column 2026-03);
# corrupted batches whose fault is subtle in the kept runs of detector_runs/ (made when TAT-QA's wrong-cell copy
# answered 51 of 324 training items with another verbatim fact; a run of today's copy, 161 of 165 spans, is `as_is`:
# a delivery-wide fault, counted apart by `_kind`)
SUBTLE_BATCHES = ("reports-b-wrongcell",)


def severity(fault: str, batch: str) -> str:
    """``severe``, ``subtle`` or ``clean``: what the run's fault is counted as in the tables."""
    if fault == "clean":
        return "clean"
    return "subtle" if fault == "dirty_values" or batch in SUBTLE_BATCHES else "severe"


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
        if len(part) != 4 or part[0] not in SETS or part[2] not in FAULTS:
            raise SystemExit(f"bad spec {text!r}: set:batch:fault:seed, set in {SETS}, fault in {FAULTS}")
        return cls(part[0], part[1], part[2], int(part[3]))


def profile_of(params: Path) -> str:
    """``demo`` for the root params.yaml, else the profile folder's name (``tatqa``)."""
    params = params.resolve()
    return "demo" if params == ROOT / "params.yaml" else params.parent.name


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
    probe_split = sorted(set(io.read_parquet(data / "probe.parquet")["split"]))
    t0 = time.perf_counter()
    res = train_batch(data, base, work / "adapter", tp, dp, answer=answer, bp=budget_params(params))
    rec = res.record
    checks = [{k: r[k] for k in KEEP} for r in res.curves if r["gap_increment"] is not None]
    return {
        "spec": dataclasses.asdict(spec),
        "profile": profile_of(params),
        "machine": machine(),
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "probe_declared_split": probe_split,
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


def _commit() -> str:
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


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
        "profile": run.get("profile", "demo"),
        "checks": len(checks),
        "planned_steps": planned,
        "alarm_step": step,
        "alarm_fraction": step / planned if step > 0 else None,
        "max_log_e": float(max(log_e)) if len(log_e) else 0.0,
        "mean_gap": statistics.fmean(gaps) if gaps else math.nan,
    }


# Round 1's constants as pre-registered in commit 0a3e100 (params `detector` then); round 2 is params.yaml now.
ROUND1 = {
    "process": "empirical_bernstein",
    "clip": 0.25,
    "null_gap": 0.03,
    "lambdas": [0.3, 0.5, 0.7, 0.9],
    "weights": [0.1, 0.2, 0.3, 0.4],
}
# (round, constants' source, the sets whose faulted runs validate it); both rounds share the calibration runs
# and the clean validation runs (none of which had been looked at when round 2 was fixed)
ROUNDS = (("round 1", "commit 0a3e100", ("validation",)), ("round 2", "params.yaml", ("validation2",)))


def alarm_stats(sel: list[dict]) -> dict:
    """Runs, alarms, alarm rate (Clopper-Pearson 95 % interval) and median alarm fraction of replayed runs."""
    hit = [r for r in sel if r["alarm_step"] > 0]
    lo, hi = clopper_pearson(len(hit), len(sel))
    frac = [r["alarm_fraction"] for r in hit]
    return {
        "runs": len(sel),
        "alarms": len(hit),
        "alarm_rate": len(hit) / len(sel),
        "alarm_rate_ci95": [lo, hi],
        "median_alarm_fraction": statistics.median(frac) if frac else None,
    }


def summarize(rows: list[dict], alpha: float, fault_sets: tuple[str, ...]) -> list[dict]:
    """Per set and kind: runs, alarms (rate, 95 % CI), median alarm fraction."""
    out = []
    kinds = [
        ("severe faults", lambda r: severity(r["fault"], r["batch"]) == "severe"),
        ("subtle faults", lambda r: severity(r["fault"], r["batch"]) == "subtle"),
        ("clean", lambda r: r["fault"] == "clean"),
    ]
    groups = [(s, p) for s in ("calibration", "validation") for p in sorted({r["profile"] for r in rows})]
    for set_name, profile in groups:
        sets = ("calibration",) if set_name == "calibration" else ("validation", *fault_sets)
        for kind, keep in kinds:
            sel = [
                r
                for r in rows
                if keep(r)
                and r["profile"] == profile
                and (r["set"] in (sets if kind == "clean" or set_name == "calibration" else fault_sets))
            ]
            if not sel:
                continue
            out.append(
                {
                    "set": set_name,
                    "profile": profile,
                    "kind": kind,
                    **alarm_stats(sel),
                    "batches": sorted({r["batch"] for r in sel}),
                    "alpha": alpha,
                }
            )
    return out


def longer_runs(clean: list[dict], rounds: list[dict], seed: int, runs: int = 2000) -> list[dict]:
    """Clean runs of the demo's length and longer, simulated under each round's constants.

    A batch's clean runs share one train/probe split (admission's), and their mean gap is that split's
    offset: the difference between the training pool's and the probe pool's mean improvement (measured:
    a few hundredths of a nat either way). Three scenarios, each run drawing its increments with
    replacement from the real clean checks:

    - ``none (all clean checks pooled)``: the checks as they are; over random splits a clean run's
      items are one sample of one population, so this is the bound's own setting;
    - ``sampled, shrinks with the pools`` (conservative: the pooled draws already carry the splits'
      spread): the checks centred on their batch's mean plus one offset per run drawn
      N(mean, tau^2 * n0 / n), tau the real batches' spread at n0 checks (a longer run has
      proportionally larger pools, so a sampling offset shrinks as 1/sqrt(n));
    - ``worst batch's, kept``: the centred checks plus the largest real batch offset at every length
      (if the offset were a property of the data rather than of the split's sampling).
    """
    import numpy as np

    from clap.train import detector as det

    by_batch: dict[str, list[float]] = {}
    for r in clean:
        by_batch.setdefault(r["spec"]["batch"], []).extend(c["gap_increment"] for c in r["checks"])
    if len(by_batch) < 2:
        return []
    means = {b: float(np.mean(g)) for b, g in by_batch.items()}
    pooled = np.concatenate([np.array(g) for g in by_batch.values()])
    centred = np.concatenate([np.array(g) - means[b] for b, g in by_batch.items()])
    n0 = statistics.median(len(r["checks"]) for r in clean)
    mu, tau, worst = statistics.fmean(means.values()), statistics.stdev(means.values()), max(means.values())
    # a pure sampling offset is the mean of a run's n0 increments: sd(check) / sqrt(n0); chi-square test of the
    # real batches' spread against it
    from scipy.stats import chi2

    expected = float(centred.std(ddof=1)) / math.sqrt(n0)
    df = len(means) - 1
    p_sampling = float(chi2.sf(df * tau**2 / expected**2, df))
    rng = np.random.default_rng(seed)
    out = []
    for rnd in rounds:
        d = rnd["detector"]
        m0 = (d["null_gap"] + d["clip"]) / (2 * d["clip"])
        for scenario in (
            "none (all clean checks pooled)",
            "sampled, shrinks with the pools",
            "worst batch's, kept",
        ):
            for checks in (int(n0), 300, 1000):
                if scenario.startswith("none"):
                    g = rng.choice(pooled, size=(runs, checks))
                else:
                    offset = (
                        rng.normal(mu, tau * math.sqrt(n0 / checks), size=(runs, 1))
                        if scenario.startswith("sampled")
                        else np.full((runs, 1), worst)
                    )
                    g = offset + rng.choice(centred, size=(runs, checks))
                x = (np.clip(g, -d["clip"], d["clip"]) + d["clip"]) / (2 * d["clip"])
                log_e = det.log_e_paths(x, m0, d["lambdas"], d["weights"], d["process"])
                fired = log_e.max(axis=1) >= math.log(1 / d["alpha"])
                lo, hi = clopper_pearson(int(fired.sum()), runs)
                out.append(
                    {
                        "round": rnd["round"],
                        "scenario": scenario,
                        "checks": checks,
                        "runs": runs,
                        "false_alarms": int(fired.sum()),
                        "rate": float(fired.mean()),
                        "rate_ci95": [lo, hi],
                        "pool_checks": int(centred.size),
                        "batch_offsets": means,
                        "offset_sd_at_n0": tau,
                        "offset_sd_if_sampling": expected,
                        "offset_sd_p_value": p_sampling,
                        "n0": int(n0),
                    }
                )
    return out


def write_result(out: Path, result: dict, render_md) -> int:
    """``<out>.json`` and its rendering ``<out>.md``, which is also printed."""
    io.write_json(out.with_suffix(".json"), result)
    out.with_suffix(".md").write_text(render_md(result))
    print(render_md(result))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from clap.train.detector import DetectorParams

    now = cparams.section("detector", DetectorParams, args.params)
    runs = [io.read_json(p) for p in sorted(args.runs.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {args.runs}")
    rounds = []
    for name, source, fault_sets in ROUNDS:
        dp = dataclasses.replace(now, **ROUND1) if name == "round 1" else now
        rows = [replay_run(r, dp) for r in runs]
        rounds.append(
            {
                "round": name,
                "constants_from": source,
                "detector": dataclasses.asdict(dp),
                "summary": summarize(rows, dp.alpha, fault_sets),
                "runs": rows,
            }
        )
    demo_clean = [r for r in runs if r["spec"]["fault"] == "clean" and r.get("profile", "demo") == "demo"]
    long_runs = longer_runs(demo_clean, rounds, args.seed)
    shares = [r["record"]["detector_seconds"] / max(r["record"]["train_runtime_s"], 1e-9) for r in runs]
    result = {
        "about": "benchmarks/detector_calibration.py report: every kept run replayed under each round's constants",
        "machines": sorted({r["machine"].split(", load")[0] for r in runs}),
        "detector_share_of_train_runtime_median": statistics.median(shares),
        "rounds": rounds,
        "longer_runs": long_runs,
    }
    return write_result(args.out, result, render)


def _f(v, spec=".2f") -> str:
    return "—" if v is None else format(v, spec)


def render(result: dict) -> str:
    lines = [
        "# The TBDL detector on real training runs (issue 17)",
        "",
        "Written by `python benchmarks/detector_calibration.py report` from the runs in "
        "`benchmarks/results/detector_runs/` (each made by its `run` command with `stop_on_alarm` off, so the "
        "whole run is watched, then replayed under each round's pre-registered constants: the increments do not "
        "depend on them). Runs on "
        + ", ".join(result["machines"])
        + ", two at a time with one torch thread each.",
        "",
        "Both rounds' constants were chosen on the two calibration runs of 2026-01 (seed 20260301) only. Round 1's "
        "faulted validation runs (set `validation`) were made, and seen, before round 2 was fixed, so round 2 is "
        "validated on the faulted runs made after it (set `validation2`, new seeds); the clean validation runs were "
        "all made after round 2 was fixed and serve both. Severe faults: `relabel` (answers permuted across rows) "
        "and `as_is` on 2026-03, the demo batch whose answers come from the wrong column.",
        "",
        "**Superseded construction.** Every run here took the detector's probe from the batch's declared eval "
        "split, as admission did then; admission now draws it from the training pool (docs/detector.md), and "
        "the runs of that construction are in [detector_pool.md](detector_pool.md).",
        "",
    ]
    for rnd in result["rounds"]:
        d = rnd["detector"]
        lines += [
            f"## {rnd['round']}: {d['process']}, clip {d['clip']}, null_gap {d['null_gap']}, "
            f"lambdas {d['lambdas']}, weights {d['weights']}, alpha {d['alpha']} ({rnd['constants_from']})",
            "",
            "| set | profile | kind | runs | batches | alarms | rate (95 % CI) | median alarm at (share of steps) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in rnd["summary"]:
            lo, hi = s["alarm_rate_ci95"]
            lines.append(
                f"| {s['set']} | {s['profile']} | {s['kind']} | {s['runs']} | {', '.join(s['batches'])} | {s['alarms']} | "
                f"{s['alarm_rate']:.3f} ({lo:.3f}–{hi:.3f}) | {_f(s['median_alarm_fraction'])} |"
            )
        lines.append("")
    if result["longer_runs"]:
        p0 = result["longer_runs"][0]
        offsets = ", ".join(f"{b} {m:+.3f}" for b, m in sorted(p0["batch_offsets"].items()))
        lines += [
            "Clean runs of one batch share its train/probe split, and their mean gap is that split's offset "
            f"(demo batches, nats: {offsets}; sd {p0['offset_sd_at_n0']:.3f} at {p0['n0']} checks, against "
            f"{p0['offset_sd_if_sampling']:.3f} if it is the pools' sampling error, sd(check) / sqrt(checks): "
            f"chi-square p = {p0['offset_sd_p_value']:.2f}). So the 24 "
            "clean runs above are 3 splits, not 24 independent draws of one, and the clean rates are also "
            f"simulated, each run's increments drawn from the {p0['pool_checks']} real clean checks: as they are "
            "(over random splits a run's items are one sample of one population: the bound's own setting); "
            "centred on their batch's mean plus one offset per run sampled with an sd that shrinks as "
            "1/sqrt(checks) (a longer run has larger pools; conservative, since the draws already carry the "
            "spread); or centred plus the worst batch's offset kept at every length (if the offset were a "
            "property of the data, not of the split's sampling: then a larger null_gap is needed for long runs).",
            "",
            "| round | offset | checks | runs | false alarms | rate (95 % CI) |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["longer_runs"]:
            lo, hi = r["rate_ci95"]
            lines.append(
                f"| {r['round']} | {r['scenario']} | {r['checks']} | {r['runs']} | {r['false_alarms']} | "
                f"{r['rate']:.4f} ({lo:.4f}–{hi:.4f}) |"
            )
        lines.append("")
    lines += [
        f"Detector time as a share of training runtime, median over runs: "
        f"{result['detector_share_of_train_runtime_median']:.2f}.",
        "",
        "Every run under round 2 (alarm step and max log E under round 1 in brackets):",
        "",
        "| run | checks / steps | alarm step | max log E | mean gap (nats) |",
        "|---|---|---|---|---|",
    ]
    r1 = {r["name"]: r for r in result["rounds"][0]["runs"]}
    for r in result["rounds"][-1]["runs"]:
        o = r1[r["name"]]
        step = r["alarm_step"] if r["alarm_step"] > 0 else "—"
        old = o["alarm_step"] if o["alarm_step"] > 0 else "—"
        lines.append(
            f"| {r['name']} | {r['checks']} / {r['planned_steps']} | {step} ({old}) | "
            f"{r['max_log_e']:.2f} ({o['max_log_e']:.2f}) | {r['mean_gap']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def _kind(r: dict) -> str:
    """A fault the batch arrived with (``as_is``) is in its whole training pool, so in the probe too: the
    detector is not built to see it (docs/detector.md); injected faults corrupt D_sft alone."""
    if r["fault"] == "as_is":
        return "delivery-wide fault (probe alike)"
    return {"severe": "severe fault", "subtle": "subtle fault"}.get(severity(r["fault"], r["batch"]), "clean")


def pool_summary(rows: list[dict], alpha: float) -> list[dict]:
    """Per profile, batch and kind: runs, alarms (rate, Clopper-Pearson 95 % interval), median alarm
    fraction, and the mean gap over the runs (a clean batch's: its partition's offset)."""
    out = []
    for key in sorted({(r["profile"], r["batch"], r["fault"]) for r in rows}):
        sel = [r for r in rows if (r["profile"], r["batch"], r["fault"]) == key]
        out.append(
            {
                "profile": key[0],
                "batch": key[1],
                "fault": key[2],
                "kind": _kind(sel[0]),
                **alarm_stats(sel),
                "mean_gap": statistics.fmean(r["mean_gap"] for r in sel),
                "alpha": alpha,
            }
        )
    return out


def cmd_pool_report(args: argparse.Namespace) -> int:
    """The runs whose probe admission drew from the training pool, replayed under params ``detector``,
    beside the clean offsets of the construction it replaced (the runs in ``--before``)."""
    from clap.train.detector import DetectorParams

    dp = cparams.section("detector", DetectorParams, args.params)
    runs = [io.read_json(p) for p in sorted(args.runs.glob("*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {args.runs}")
    rows = [
        {**replay_run(r, dp), "commit": r.get("commit"), "probe": r.get("probe_declared_split")} for r in runs
    ]
    before = [replay_run(io.read_json(p), dp) for p in sorted(args.before.glob("*.json"))]
    offsets_before = {}
    for r in before:
        if r["fault"] == "clean":
            offsets_before.setdefault((r["profile"], r["batch"]), []).append(r["mean_gap"])
    per_kind = {}
    for r in rows:
        per_kind.setdefault((r["profile"], _kind(r)), []).append(r)
    kinds = [{"profile": p, "kind": k, **alarm_stats(sel)} for (p, k), sel in sorted(per_kind.items())]
    shares = [r["record"]["detector_seconds"] / max(r["record"]["train_runtime_s"], 1e-9) for r in runs]
    result = {
        "about": "benchmarks/detector_calibration.py pool-report: runs with the probe from the training pool",
        "command": "python benchmarks/detector_calibration.py --runs benchmarks/results/detector_pool_runs "
        "pool-report",
        "commits": sorted({r["commit"] or "unknown" for r in rows}),
        "dates": sorted({r.get("date", "unknown") for r in runs}),
        "machines": sorted({r["machine"].split(", load")[0] for r in runs}),
        "torch_threads": sorted({int(r.get("torch_threads") or 0) for r in runs}),
        "detector": dataclasses.asdict(dp),
        "probe_declared_splits": sorted({s for r in rows for s in (r["probe"] or ["unrecorded"])}),
        "detector_share_of_train_runtime_median": statistics.median(shares),
        "by_kind": kinds,
        "by_batch": pool_summary(rows, dp.alpha),
        "clean_offset_before": {
            f"{p}/{b}": statistics.fmean(v) for (p, b), v in sorted(offsets_before.items())
        },
        "runs": rows,
    }
    return write_result(args.out, result, render_pool)


def render_pool(result: dict) -> str:
    d = result["detector"]
    lines = [
        "# The TBDL detector with the probe drawn from the training pool (issue 38)",
        "",
        f"Written by `{result['command']}` (commit {', '.join(result['commits'])}; {', '.join(result['dates'])}; "
        f"{', '.join(result['machines'])}; torch threads per run: {', '.join(map(str, result['torch_threads']))}; "
        "detector timings are not comparable across machines or thread counts). Every run trains the "
        "real base exactly as the train stage does with `stop_on_alarm` off, on a batch admitted by the code "
        "of that commit: the probe is a random part of the training pool (declared split of every probe item: "
        f"{', '.join(result['probe_declared_splits'])}). Constants: params `detector` ({d['process']}, clip "
        f"{d['clip']}, null_gap {d['null_gap']}, lambdas {d['lambdas']}, weights {d['weights']}, alpha "
        f"{d['alpha']}), pre-registered in round 2 before any of these runs "
        "([detector_calibration.md](detector_calibration.md)); none was tuned on them.",
        "",
        "## Per profile",
        "",
        "| profile | kind | runs | alarms | rate 95 % interval | median alarm at (share of steps) |",
        "|---|---|---|---|---|---|",
    ]
    for k in result["by_kind"]:
        lo, hi = k["alarm_rate_ci95"]
        lines.append(
            f"| {k['profile']} | {k['kind']} | {k['runs']} | {k['alarms']} | {lo:.3f}–{hi:.3f} | "
            f"{_f(k['median_alarm_fraction'])} |"
        )
    lines += [
        "",
        "## Per batch (worst first: clean by alarm rate and offset, faults by misses)",
        "",
        "A clean batch's mean gap is its training/probe partition's offset (before: the same batch's clean "
        "runs with the probe from the declared eval split, detector_calibration.md).",
        "",
        "| profile | batch | fault | runs | alarms | rate (upper end of 95 % CI) | median alarm at | mean gap (nats) "
        "| before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def worst(s: dict) -> tuple:
        clean = s["fault"] == "clean"
        return (not clean, -s["alarm_rate"] if clean else s["alarm_rate"], -abs(s["mean_gap"]))

    for s in sorted(result["by_batch"], key=worst):
        before = (
            result["clean_offset_before"].get(f"{s['profile']}/{s['batch']}")
            if s["fault"] == "clean"
            else None
        )
        lines.append(
            f"| {s['profile']} | {s['batch']} | {s['fault']} | {s['runs']} | {s['alarms']} | "
            f"{s['alarm_rate']:.3f} ({s['alarm_rate_ci95'][1]:.3f}) | {_f(s['median_alarm_fraction'])} | "
            f"{s['mean_gap']:+.3f} | {_f(before, '+.3f')} |"
        )
    over = [s for s in result["by_batch"] if s["fault"] == "clean" and s["mean_gap"] > d["null_gap"]]
    lines += [
        "",
        "Clean batches whose offset exceeds null_gap, the tolerance the false-alarm bound assumes (their "
        "bound does not hold as stated): "
        + (", ".join(f"{s['profile']} {s['batch']} ({s['mean_gap']:+.3f})" for s in over) if over else "none")
        + ".",
        "",
        f"Detector time as a share of training runtime, median over runs: "
        f"{result['detector_share_of_train_runtime_median']:.2f}.",
        "",
        "## Every run",
        "",
        "| run | checks / steps | alarm step | max log E | mean gap (nats) |",
        "|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        step = r["alarm_step"] if r["alarm_step"] > 0 else "—"
        lines.append(
            f"| {r['name']} | {r['checks']} / {r['planned_steps']} | {step} | {r['max_log_e']:.2f} | "
            f"{r['mean_gap']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def resample_checks(checks: list[tuple[int, float]], steps: list[int], rng, window: int) -> list[float]:
    """Gap increments at check ``steps`` drawn from recorded single-item ``checks`` ((step, gap) of every
    run of one batch and fault): at each step, one gap not drawn before for this run, recorded within
    ``window`` steps of it (or the nearest unused one), so every increment is a fresh item from the same
    phase of training, as a real check draws. Recorded steps of one run with window 0 give its gaps
    back; step 1 is scored at the run's starting parameters, where every gap is 0."""
    import numpy as np

    at = np.array([c[0] for c in checks])
    gaps = np.array([c[1] for c in checks])
    free = np.ones(len(checks), bool)
    out = []
    for t in steps:
        if t == 1:
            out.append(0.0)
            continue
        dist = np.where(free, np.abs(at - t), np.iinfo(np.int64).max)
        near = np.flatnonzero(dist <= max(dist.min(), window))
        pick = int(rng.choice(near))
        free[pick] = False
        out.append(float(gaps[pick]))
    return out


def checks_pilot(runs: list[dict], dp, counts: list[int], draws: int, window: int, seed: int) -> list[dict]:
    """Runs of a profile whose probe pool is smaller than its run, simulated at other check counts through
    the real schedule (:func:`clap.train.detector.check_steps`) and the real e-process
    (:func:`clap.train.detector.replay`): per batch and kind (severe fault, clean), the alarm rate and the
    median alarm share of ``draws`` simulated runs, each drawing its gaps from the kept runs' checks
    (:func:`resample_checks`).

    A pilot for choosing a probe pool, not a validation: a simulated run borrows the kept runs' items
    (different seeds' trajectories mixed), and its draws are not independent of other simulated runs'."""
    import numpy as np

    from clap.train import detector as det

    rng = np.random.default_rng(seed)
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        kind = _kind(r["spec"])
        if kind in ("severe fault", "clean"):
            groups.setdefault((kind, r["spec"]["batch"]), []).append(r)
    out = []
    for (kind, batch), sel in sorted(groups.items(), key=lambda g: (g[0][0] != "severe fault", g[0][1])):
        checks = [(c["step"], c["gap_increment"]) for r in sel for c in r["checks"]]
        planned = sel[0]["record"]["planned_steps"]
        for count in counts:
            steps = det.check_steps(planned, count, 1)
            shares, caught = [], 0
            for _ in range(draws):
                _, alarm = det.replay(resample_checks(checks, steps, rng, window), dp)
                caught += alarm > 0
                shares.append(steps[alarm - 1] / planned if alarm > 0 else math.inf)
            out.append(
                {
                    "kind": kind,
                    "batch": batch,
                    "mean_gap": statistics.fmean(g for _, g in checks),
                    "checks": count,
                    "runs": len(sel),
                    "draws": draws,
                    "alarm_rate": caught / draws,
                    "median_alarm_fraction": float(np.median(shares)) if caught * 2 > draws else None,
                }
            )
    return out


def cmd_checks_pilot(args: argparse.Namespace) -> int:
    """Median alarm share against the number of checks, for the profile of ``--params`` (issue 38)."""
    from clap.train.detector import DetectorParams

    dp = cparams.section("detector", DetectorParams, args.params)
    profile = profile_of(args.params)
    runs = [
        r for r in map(io.read_json, sorted(args.runs.glob("*.json"))) if r.get("profile", "demo") == profile
    ]
    recorded = sorted({len(r["checks"]) for r in runs})
    steps = sorted({r["record"]["planned_steps"] for r in runs})
    if not runs or len(recorded) != 1 or len(steps) != 1 or recorded[0] >= steps[0]:
        raise SystemExit(
            f"{profile}: needs runs of one check count below one planned length ({recorded}, {steps})"
        )
    counts = sorted({*range(recorded[0], steps[0], 4), steps[0]})
    rows = checks_pilot(runs, dp, counts, args.draws, args.window, args.seed)
    result = {
        "about": "benchmarks/detector_calibration.py checks-pilot: a pilot, not a validation (see md)",
        "command": f"python benchmarks/detector_calibration.py --params {args.params.resolve().relative_to(ROOT)} "
        f"--runs {args.runs.resolve().relative_to(ROOT)} checks-pilot --draws {args.draws} --window {args.window} --seed {args.seed}",
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "profile": profile,
        "planned_steps": steps[0],
        "recorded_checks": recorded[0],
        "runs": sorted(Spec(**r["spec"]).name for r in runs),
        "detector": dataclasses.asdict(dp),
        "rows": rows,
    }
    return write_result(args.out, result, render_checks_pilot)


def render_checks_pilot(result: dict) -> str:
    lines = [
        f"# How early the detector alarms on {result['profile']} against its number of checks (a pilot)",
        "",
        f"Written by `{result['command']}` (commit {result['commit']}, {result['date']}; {result['machine']}; "
        "numpy only, no training). Input: the profile's kept pool runs "
        f"([detector_pool.md](detector_pool.md)), each with {result['recorded_checks']} single-item checks over "
        f"{result['planned_steps']} steps. Each row simulates runs of that many checks through the real "
        "schedule and the real e-process under params `detector`; a simulated run's gap at a check is a recorded "
        "single-item gap of the same batch and fault from a check within the window of that step (any seed's, "
        "none twice in one simulated run), step 1's is 0. It mixes the kept runs' items and trajectories: "
        "this chooses a probe pool to validate, it validates nothing (a validation is new runs at the chosen "
        "count, constants pre-registered). One check consumes one probe item "
        "(`probe_draw` 1), so the count is the probe pool `sizes.probe`, drawn from the training pool beside "
        "`sizes.sft`.",
        "",
        "| kind | batch (mean gap, nats) | checks (probe items) | runs pooled | simulated runs | alarm rate | "
        "median alarm at (share of steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['kind']} | {r['batch']} ({r['mean_gap']:+.3f}) | {r['checks']} | "
            f"{r['runs']} | {r['draws']} | "
            f"{r['alarm_rate']:.3f} | {_f(r['median_alarm_fraction'])} |"
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
    rep.add_argument("--seed", type=int, default=20261202, help="seed of the longer-run simulation")
    pool = sub.add_parser("pool-report", help="the runs with the probe from the training pool (issue 38)")
    pool.add_argument("--out", type=Path, default=POOL_OUT, help="writes <out>.md and <out>.json")
    pool.add_argument("--before", type=Path, default=RUNS, help="runs of the construction it replaced")
    pilot = sub.add_parser("checks-pilot", help="alarm time against the probe pool, from the kept pool runs")
    pilot.add_argument("--out", type=Path, default=CHECKS_OUT, help="writes <out>.md and <out>.json")
    pilot.add_argument(
        "--draws", type=int, default=400, help="simulated runs per batch, fault and check count"
    )
    pilot.add_argument(
        "--window",
        type=int,
        default=2,
        help="a gap comes from a check at most this many steps away (else the nearest unused)",
    )
    pilot.add_argument("--seed", type=int, default=20261207)
    args = ap.parse_args()
    commands = {
        "run": cmd_run,
        "report": cmd_report,
        "pool-report": cmd_pool_report,
        "checks-pilot": cmd_checks_pilot,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
