"""No-op ``dvc repro`` time: with ruamel's C YAML parser (the install) vs its pure-Python parser.

DVC re-reads params.yaml once per stage and dvc.lock twice per command, so on a no-op the YAML
parser dominates. Both variants run in the same workspace, alternating, ``--runs`` times each;
the pure-Python variant hides the C extension from the import system before DVC starts. The
workspace must be up to date (run ``dvc repro`` first): every run must print that nothing changed.

    .venv/bin/python benchmarks/noop_repro.py [TARGET ...] [--runs 5] [--out benchmarks/results/noop_repro.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from clap import io

ROOT = Path(__file__).resolve().parents[1]
PURE = (
    "import sys; sys.modules['_ruamel_yaml'] = None; from dvc.cli import main; sys.exit(main(sys.argv[1:]))"
)
C_PARSER = "import sys; from dvc.cli import main; sys.exit(main(sys.argv[1:]))"


def _one(code: str, targets: list[str]) -> float:
    """Wall seconds of one ``dvc repro`` (a whole new process, as a user runs it)."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, "repro", *targets], cwd=ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0 or "Running stage" in out.stdout:
        raise SystemExit(f"not a no-op (rc {out.returncode}):\n{out.stdout}\n{out.stderr}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/noop_repro.json")
    a = ap.parse_args()
    times: dict[str, list[float]] = {"c_parser": [], "pure_python": []}
    for _ in range(a.runs):
        times["c_parser"].append(_one(C_PARSER, a.targets))
        times["pure_python"].append(_one(PURE, a.targets))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "command": "dvc repro " + " ".join(a.targets),
        "stages_in_lock": len(yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]),
        "params_yaml_bytes": (ROOT / "params.yaml").stat().st_size,
        "dvc_lock_bytes": (ROOT / "dvc.lock").stat().st_size,
        "runs": a.runs,
        "median_s": med,
        "all_s": times,
        "speedup": med["pure_python"] / med["c_parser"],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
    }
    io.write_json(a.out, result)
    print(
        f"no-op {result['command']}: C parser {med['c_parser']:.2f} s, pure Python {med['pure_python']:.2f} s "
        f"(median of {a.runs}; {result['speedup']:.2f}x)"
    )


if __name__ == "__main__":
    main()
