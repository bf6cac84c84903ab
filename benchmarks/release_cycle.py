"""Wall time of a full release + rollback cycle through the `clap` CLI, in a throw-away repo.

Builds the miniature git + DVC pipeline of tests/unit/release/release_fixtures.py (not timed), then
times each user-facing command as its own process, as a person would run it:
approve A, release A, (dvc repro, not timed), approve B, release B, rollback (restoring
A's adapter with `dvc checkout` after deleting it from the workspace).

    .venv/bin/python benchmarks/release_cycle.py [--out benchmarks/results/release_cycle.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "release"))
from release_fixtures import BATCHES, build_template, fingerprint, repro  # noqa: E402


def _clap(repo: Path, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "clap.cli", *args], cwd=repo, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"clap {args[0]} failed: {proc.stderr}")
    return wall, proc.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    out = parser.parse_args().out
    a, b = BATCHES
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_template(Path(tmp))
        os.environ["CLAP_TRUST_ROOT"] = fingerprint(repo, "alice")  # pinned outside the repository, as in CI
        key = str(Path(tmp) / "keys" / "alice.key")
        signer = str(Path(tmp) / "keys" / "signer.key")  # EC P-256: the release signs the adapter folder
        t = {}
        t["approve_a"], token = _clap(repo, "approve", a, "--key", key)
        t["release_a"], _ = _clap(repo, "release", a, "--token", token, "--signing-key", signer)
        repro(repo)
        t["approve_b"], token = _clap(repo, "approve", b, "--key", key)
        t["release_b"], _ = _clap(repo, "release", b, "--token", token, "--signing-key", signer)
        shutil.rmtree(repo / "models" / "adapters" / a)
        t["rollback"], message = _clap(repo, "rollback")
    result = {
        "seconds": {k: round(v, 2) for k, v in t.items()},
        "cycle_s": round(sum(t.values()), 2),
        "rollback_output": message.split(";")[0],
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
