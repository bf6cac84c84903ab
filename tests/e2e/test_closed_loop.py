"""End to end: benchmarks/closed_loop.py on the tiny config, two batches in time order, each trained
from the adapter in production (``warm_start.mode: incumbent``) (the
committed report runs three; two keep the suite's slowest test at ~2/3 of its three-batch time and
still gate the second batch against the first's released adapter and roll it back).

The tiny random model never passes an item (b = c = 0, McNemar p = 1), and no gate policy in
params can promote that (p < alpha needs alpha > 1, which the statistics refuse), so the run
uses ``--force-release`` to exercise the mechanics: each batch is reproduced against the
adapter in production, approved with the loop's throwaway key and released; the last
release is rolled back and the previous adapter must come back byte for byte from the
DVC cache (the last batch's gate is asked again first, with its adapter in production, and
decides the rollback when it says so). The project the loop clones is a tiny git repository built from the working tree
(like tests/e2e/test_pipeline.py's), so no real releases/ or cache is involved.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import e2e_env, git, make_e2e_repo, repo_params, tiny_params

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ("2026-01", "2026-02")  # two clean months (2026-03 is the corrupted one)


@pytest.fixture(scope="module")
def loop_project(tmp_path_factory, tiny_base) -> Path:
    """A committed git repository with the project's files, two raw batches and the tiny params."""
    p = tiny_params(repo_params(), tiny_base)
    p["grpo"]["enabled"] = False  # the probe is not part of the loop; keep the run short
    p["sizes"].update(eval=4, replay=2)  # the admission floors of tiny_params
    p["replay"]["latency"].update(requests=1, warmup=1)  # of the 2 replay cases
    p["chain"]["max_new_tokens"] = 8  # the random model never stops early: every answer is this long
    return make_e2e_repo(tmp_path_factory.mktemp("loop") / "project", p, BATCHES)


def test_closed_loop_releases_against_the_incumbent_and_rolls_back_byte_for_byte(loop_project, tmp_path):
    out = tmp_path / "report" / "closed_loop.md"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "closed_loop.py"), "--project", str(loop_project),
         "--batches", *BATCHES, "--out", str(out), "--force-release", "--set", "warm_start.mode=incumbent"],
        cwd=ROOT, env=e2e_env(), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    print(f"closed loop on the tiny config: {time.perf_counter() - start:.1f} s")
    if out.exists():
        print(out.read_text())  # with the wall time of every command
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    result = json.loads(out.with_suffix(".json").read_text())
    rows = result["rows"]
    assert [r["batch"] for r in rows] == list(BATCHES)
    table = [line for line in out.read_text().splitlines() if line.startswith("| 2026-")]
    assert [line.split(" | ")[0] for line in table] == [f"| {b}" for b in BATCHES]  # one row per batch

    # each batch was released (forced: the tiny model never passes) and the next one was gated
    # against it: the incumbent, not the base model
    assert all(r["released"] for r in rows), [r["release_outcome"] for r in rows]
    assert rows[0]["baseline_batch"] == "base"
    assert [r["baseline"] for r in rows[1:]] == ["incumbent"]
    assert [r["baseline_batch"] for r in rows[1:]] == list(BATCHES[:1])
    shas = [r["released_sha256"] for r in rows]
    assert len(set(shas)) == 2  # two different adapters: restoring the previous one is not trivial
    assert [r["incumbent_sha256"] for r in rows] == [None, shas[0]]  # eval loaded the released bytes
    # continual training: the second batch's adapter continued the released one (stage warm_start)
    assert [r["trained_from"] for r in rows] == ["fresh", BATCHES[0]]
    assert [r["trained_from_sha256"] for r in rows] == [None, shas[0]]

    # the last batch's gate, asked again with its adapter in production, decides the rollback when it
    # says so (`clap rollback --batch`); otherwise it is by hand
    rb = result["rollback"]
    again = rb["gate_again"]["production_decision"]
    assert rb["decided_by"] == (f"gate {BATCHES[1]}" if again == "rollback" else "hand"), rb["gate_again"]
    assert rb["exercised"] and rb["equal"]
    assert (rb["from_batch"], rb["to_batch"]) == (BATCHES[1], BATCHES[0])
    assert rb["from_sha256"] == shas[1] and rb["restored_sha256"] == rb["pointer_sha256"] == shas[0]
    assert "restored by checkout" in rb["output"]  # the folder was deleted: the bytes came from the cache
    assert result["registry_check"][-1].startswith(f"production: batch {BATCHES[0]}")
    signed = [line for line in result["registry_check"] if ": model signature " in line]
    assert len(signed) == len(BATCHES)  # each release signed the adapter folder (OpenSSF model-signing)

    commands = [c["command"] for c in result["commands"]]
    repros = [c for c in commands if c.startswith("dvc repro")]
    assert repros == [f"dvc repro gate@{b}" for b in (*BATCHES, BATCHES[-1])]
    assert f"python -m clap.cli approve {BATCHES[0]} --key keys/closed-loop.key" in commands
    assert not any("eyJ" in c for c in commands)  # the token went through stdin, never a command line
    assert "FORCED" in out.read_text() and "Rollback (" in out.read_text()

    # the project itself is untouched: no trusted key, no release, nothing to commit
    assert not (loop_project / "releases" / "trusted_keys" / "closed-loop.pub").exists()
    assert json.loads((loop_project / "releases" / "production.json").read_text())["batch"] is None
    assert git(loop_project, "status", "--porcelain") == ""
    assert not Path(result["scratch"]).exists()  # no --keep: the scratch clone and its key are gone
