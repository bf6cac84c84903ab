"""Wall time and peak memory of every stage of a profile's pipeline, as `dvc repro` runs it.

The next stage `dvc repro` would run (the first of ``dvc repro --dry``, asked again after each stage:
a dry run cannot plan past a stage whose outputs do not exist yet) is run with ``dvc repro
--single-item <stage>``, a child process whose resource usage is read when it ends (``os.wait4``:
the largest resident set of the stage's process tree, user and system seconds), until none is left.
Together that is the profile's `dvc repro` (the same stages, order, locks and outputs); the result
file (commit, date, lscpu model) is what a profile's README quotes.

    .venv/bin/python benchmarks/stage_costs.py profiles/demo-gemma [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import header  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def next_stage(folder: Path, dvc: str) -> str | None:
    """The first stage `dvc repro` would run in ``folder`` (None: everything is up to date)."""
    dry = subprocess.run(
        [dvc, "repro", "--dry"], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = dry.stdout
    names = re.findall(r"Running stage '([^']+)'", out)
    return names[0] if names else None


def run_stage(folder: Path, dvc: str, name: str) -> dict:
    """One stage through dvc, with its wall time and its process tree's peak RSS and CPU seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen([dvc, "repro", "--single-item", name], cwd=folder)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"stage {name} failed (exit {code})")
    return {
        "stage": name,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="the folder of the dvc.yaml (a profile's, or .)")
    ap.add_argument("--out", type=Path, default=None, help="default: <folder>/stage_costs.json")
    args = ap.parse_args(argv)
    folder = args.folder.resolve()
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    started = time.perf_counter()
    rows = []
    while (name := next_stage(folder, dvc)) is not None:
        rows.append(run_stage(folder, dvc, name))
    result = {
        **header([sys.argv[0], *(argv or sys.argv[1:])]),
        "folder": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder),
        "cpu_count": os.cpu_count(),
        "total_wall_s": round(time.perf_counter() - started, 1),
        "stages": rows,
    }
    out = args.out or folder / "stage_costs.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
