"""The generation engine at the stage level: a batch's eval and replay stages on torch and on openvino.

Runs in a scratch project where `dvc repro` has run the batch (its admitted data, base model and adapter
exist; e.g. a clone after `make demo`): for each run it sets ``chain.engine.name`` in that project's
params.yaml (restored at the end), runs the stage's command as dvc.yaml writes it, alternating the
engines, and records the stage's own metrics (wall, items/s, per-request p50/p95, pass rates) and
whether every output file but the timings is byte-identical to the torch run's. The stage outputs of the
project are overwritten: do not point it at a checkout you keep.

    .venv/bin/python benchmarks/engine_stages.py --project /tmp/demo/clap --batch 2026-01 [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402
from clap import io  # noqa: E402

ENGINES = ("torch", "openvino")
STAGES = ("eval", "replay")
KEEP = re.compile(
    r"(wall_s|items_per_s|request_p50_ms|request_p95_ms|pass_rate|value_accuracy|latency_cost_ms)$"
)


def _set_engine(params: Path, name: str) -> None:
    text = params.read_text(encoding="utf-8")
    new, n = re.subn(r"(\n  engine:[^\n]*\n    name: )\w+", rf"\g<1>{name}", text, count=1)
    if n != 1:
        raise SystemExit(f"{params}: no chain.engine.name line to set")
    params.write_text(new, encoding="utf-8")


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
    ap.add_argument("--repeats", type=int, default=1, help="runs per engine and stage, alternating")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/engine_stages.json"))
    a = ap.parse_args()
    params = a.project / "params.yaml"
    with tempfile.NamedTemporaryFile() as saved:
        saved.write(params.read_bytes())
        saved.flush()
        runs: dict[str, dict[str, list]] = {s: {e: [] for e in ENGINES} for s in STAGES}
        try:
            for stage in STAGES:
                for rep in range(a.repeats):
                    for engine in ENGINES if rep % 2 == 0 else ENGINES[::-1]:
                        _set_engine(params, engine)
                        runs[stage][engine].append(run_stage(a.project, stage, a.batch))
                        print(
                            f"{stage} {engine}: {runs[stage][engine][-1][0]:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            params.write_bytes(Path(saved.name).read_bytes())
    stages = {}
    for stage, by_engine in runs.items():
        torch_files = by_engine["torch"][0][2]
        walls = {e: sorted(r[0] for r in rs)[len(rs) // 2] for e, rs in by_engine.items()}
        stages[stage] = {
            "wall_s": {e: [round(r[0], 1) for r in rs] for e, rs in by_engine.items()},
            "speedup_openvino_median_wall": walls["torch"] / walls["openvino"],
            "metrics": {e: rs[-1][1] for e, rs in by_engine.items()},
            # every output but the timings the same bytes as torch's: the same answers, scores and cases
            "outputs_differing_from_torch": sorted(
                {k for r in by_engine["openvino"] for k, v in r[2].items() if torch_files.get(k) != v}
            ),
        }
    report = {
        **header([".venv/bin/python", "benchmarks/engine_stages.py", *sys.argv[1:]]),
        "machine": machine(),
        "batch": a.batch,
        "repeats": a.repeats,
        **stages,
    }
    io.write_json(a.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
