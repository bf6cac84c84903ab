"""A batch's eval and replay stages under params variants: by default the generation engine, torch vs openvino.

Runs in a scratch project where `dvc repro` has run the batch (its admitted data, base model and adapter
exist; e.g. a clone after `make demo`, or its profiles/tatqa after `make tatqa`): for each run it sets a
variant's keys in that folder's params.yaml (restored at the end), runs the stage's command as dvc.yaml
writes it, alternating the variants, and records the stage's own metrics (wall, items/s, per-request
p50/p95, pass rates) and which output files but the timings differ from the first variant's. The base
model's kept answers (``.clap/answers``) are set aside for the runs, so every run generates its own. The
stage outputs of the project are overwritten: do not point it at a checkout you keep.

    .venv/bin/python benchmarks/engine_stages.py --project /tmp/demo/clap --batch 2026-01 [--repeats 1]
    .venv/bin/python benchmarks/engine_stages.py --project /tmp/t/profiles/tatqa --batch reports-b --stages eval \
        --variant b8= --variant b16=eval.batch_size=16 --variant int8=chain.engine.precision=int8

A variant is ``name=key=value,key=value`` (dotted params keys; values parsed as YAML; ``name=`` alone
keeps the params as they are).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402
from clap import io  # noqa: E402

ENGINES = ("torch=chain.engine.name=torch", "openvino=chain.engine.name=openvino")
STAGES = ("eval", "replay")
MEMO = Path(".clap") / "answers"
KEEP = re.compile(
    r"(wall_s|items_per_s|request_p50_ms|request_p95_ms|pass_rate|value_accuracy|latency_cost_ms|_em|_f1|"
    r"hallucination_rate|wrong_fact_rate|mean_new_tokens)$"
)


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """``name=key=value,key=value`` -> (name, {dotted key: YAML-parsed value})."""
    name, _, sets = text.partition("=")
    keys = {}
    for item in filter(None, sets.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"variant {text!r}: {item!r} is not key=value")
        keys[key] = yaml.safe_load(value)
    return name, keys


def _set(params: Path, original: str, keys: dict[str, object]) -> None:
    """``params`` rewritten from ``original`` with ``keys`` set (comments dropped; restored at the end)."""
    data = yaml.safe_load(original)
    for dotted, value in keys.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    params.write_text(yaml.safe_dump(data, sort_keys=False) if keys else original, encoding="utf-8")


def _outputs(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def run_stage(project: Path, stage: str, batch: str) -> tuple[float, dict, dict[str, bytes]]:
    """(wall seconds, the stage's kept metrics, its data output files) of one run."""
    cmd = yaml.safe_load((project / "dvc.yaml").read_text())["stages"][stage]["do"]["cmd"].replace(
        "${item}", batch
    )
    start = time.perf_counter()
    # the project's own environment (its editable install is its own clap), else this interpreter's
    bin_dir = (
        project / ".venv" / "bin" if (project / ".venv" / "bin").is_dir() else Path(sys.executable).parent
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(shlex.split(cmd), cwd=project, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    metrics = json.loads((project / f"metrics/{stage}/{batch}.json").read_text())
    return (
        wall,
        {k: v for k, v in metrics.items() if KEEP.search(k)},
        _outputs(project / f"data/{stage}/{batch}"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", required=True, type=Path)
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--repeats", type=int, default=1, help="runs per variant and stage, alternating")
    ap.add_argument("--stages", default=",".join(STAGES), help="eval, replay or both, comma-separated")
    ap.add_argument(
        "--variant", action="append", help=f"name=key=value,... (default: {' and '.join(ENGINES)})"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/engine_stages.json"))
    a = ap.parse_args()
    params = a.project / "params.yaml"
    variants = dict(parse_variant(v) for v in (a.variant or ENGINES))
    names, stages_run = list(variants), a.stages.split(",")
    original = params.read_text(encoding="utf-8")
    memo, aside = a.project / MEMO, a.project / ".clap" / "answers.aside"
    if memo.exists():
        memo.rename(aside)
    runs: dict[str, dict[str, list]] = {s: {v: [] for v in names} for s in stages_run}
    try:
        for stage in stages_run:
            for rep in range(a.repeats):
                for name in names if rep % 2 == 0 else names[::-1]:
                    _set(params, original, variants[name])
                    shutil.rmtree(memo, ignore_errors=True)
                    runs[stage][name].append(run_stage(a.project, stage, a.batch))
                    print(f"{stage} {name}: {runs[stage][name][-1][0]:.1f} s", file=sys.stderr, flush=True)
    finally:
        params.write_text(original, encoding="utf-8")
        shutil.rmtree(memo, ignore_errors=True)
        if aside.exists():
            aside.rename(memo)
    ref = names[0]
    stages = {}
    for stage, by_variant in runs.items():
        ref_files = by_variant[ref][0][2]
        walls = {v: sorted(r[0] for r in rs)[len(rs) // 2] for v, rs in by_variant.items()}
        stages[stage] = {
            "wall_s": {v: [round(r[0], 1) for r in rs] for v, rs in by_variant.items()},
            f"speedup_vs_{ref}_median_wall": {v: walls[ref] / walls[v] for v in names[1:]},
            "metrics": {v: rs[-1][1] for v, rs in by_variant.items()},
            # every output but the timings the same bytes as the first variant's: the same answers, scores
            # and cases
            f"outputs_differing_from_{ref}": {
                v: sorted({k for r in by_variant[v] for k, x in r[2].items() if ref_files.get(k) != x})
                for v in names[1:]
            },
        }
    report = {
        **header([".venv/bin/python", "benchmarks/engine_stages.py", *sys.argv[1:]]),
        "machine": machine(),
        "batch": a.batch,
        "repeats": a.repeats,
        "variants": variants,
        **stages,
    }
    io.write_json(a.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
