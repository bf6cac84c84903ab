"""Scale-out with DVC's experiment queue: two batches' chains run at the same time.

A tiny project with two raw batches (2026-01, 2026-02) queues two experiments, each selecting one
batch (``dvc exp run --queue -S batches=[<b>]``), and ``dvc exp run --run-all -j 2`` starts two
celery queue workers, each running one experiment's whole ``dvc repro`` (base, assetize … gate,
summary) in its own temporary workspace (``.dvc/tmp/exps/tmp*``). While they run, the test polls
the process table: a stage script (``stages/<stage>.py``) of both batches alive at the same
instant, in the queue's temporary workspaces, is the proof that the chains ran concurrently (with
``-j 1`` they run one after the other and this test fails). Afterwards both queue tasks must have
succeeded and each experiment's commit (``refs/exps/...``) must hold its own batch's metrics.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import e2e_env, git, make_e2e_repo, repo_params, run_dvc, tiny_params

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # make test-heavy (CI runs it after make test)

BATCHES = ("2026-01", "2026-02")
JOBS = 2
TIMEOUT_S = 900  # both chains together
POLL_S = 0.5
STAGE_SCRIPT = re.compile(r"\bstages/(\w+)\.py\b")


def _name(batch: str) -> str:
    return f"batch-{batch}"


@pytest.fixture
def two_batch_repo(tmp_path, tiny_base) -> Path:
    """The tiny project with both batches' raw data committed (nothing run yet)."""
    p = tiny_params(repo_params(), tiny_base)
    p["batches"] = list(BATCHES)
    p["grpo"]["enabled"] = []  # the optional GRPO probe: not what this test is about
    # two workers on two cores: one thread each (docs/reproducibility.md); the chains shrunk further
    # than the tiny config (each stage still runs; most of a chain's time is then process start-up)
    p["train"].update(torch_threads=1, max_steps=2, save_steps=2)
    p["sizes"].update(eval=4, probe=4, replay=3)
    p["replay"]["latency"].update(requests=1, warmup=1)
    p["chain"].update(max_new_tokens=16)
    return make_e2e_repo(tmp_path / "repo", p, BATCHES)


def _stage_processes(exps_dir: str) -> dict[str, set[str]]:
    """batch -> the stage scripts running now in the queue's temporary workspaces under ``exps_dir``."""
    running: dict[str, set[str]] = {}
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cwd, cmdline = proc.info.get("cwd") or "", proc.info.get("cmdline") or []
        if not cwd.startswith(exps_dir):
            continue
        text = " ".join(cmdline)
        script = STAGE_SCRIPT.search(text)
        batches = [b for b in BATCHES if f"/{b}" in text]
        if script and len(batches) == 1:  # base and summary name no batch
            running.setdefault(batches[0], set()).add(script.group(1))
    return running


def _workers(repo: Path) -> list[psutil.Process]:
    """The queue worker processes of ``repo`` (``dvc exp queue-worker``, started by --run-all)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info.get("cmdline") or []
        if "queue-worker" in cmdline and proc.info.get("cwd") == str(repo):
            found.append(proc)
    return found


def _stop_workers(repo: Path) -> None:
    """Stop this repository's queue workers (a worker idles on after its task); kill by pid if they linger."""
    run_dvc(repo, "queue", "stop", "--kill")
    workers = _workers(repo)
    _, alive = psutil.wait_procs(workers, timeout=30)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)


def _diagnostics(repo: Path, log: Path) -> str:
    """What to read when the queue failed: queue status, each task's log, the tail of --run-all's output."""
    parts = [f"dvc queue status:\n{run_dvc(repo, 'queue', 'status').stdout}"]
    for b in BATCHES:
        logs = run_dvc(repo, "queue", "logs", _name(b))
        parts.append(f"dvc queue logs {_name(b)}:\n{(logs.stdout + logs.stderr)[-3000:]}")
    parts.append(f"dvc exp run --run-all:\n{log.read_text(errors='replace')[-3000:]}")
    return "\n\n".join(parts)


def _exp_file(repo: Path, ref: str, rel: str) -> dict | None:
    done = subprocess.run(
        ["git", "show", f"{ref}:{rel}"], cwd=repo, env=e2e_env(), capture_output=True, text=True
    )
    return json.loads(done.stdout) if done.returncode == 0 else None


def test_queue_with_two_workers_runs_two_batches_chains_in_parallel(two_batch_repo, tmp_path):
    repo = two_batch_repo.resolve()
    for b in BATCHES:
        queued = run_dvc(repo, "exp", "run", "--queue", "-n", _name(b), "-S", f"batches=['{b}']")
        assert queued.returncode == 0, queued.stdout + queued.stderr
    exps_dir = str(repo / ".dvc" / "tmp" / "exps") + os.sep
    log = tmp_path / "run-all.log"
    seen: dict[str, list[float]] = {b: [] for b in BATCHES}  # when each batch had a stage running
    together: list[tuple[float, dict[str, set[str]]]] = []  # instants when both had
    started = time.monotonic()
    with log.open("w") as out:
        run_all = subprocess.Popen(
            [str(Path(sys.executable).parent / "dvc"), "exp", "run", "--run-all", "-j", str(JOBS)],
            cwd=repo,
            env=e2e_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        while run_all.poll() is None:
            now = time.monotonic() - started
            assert now < TIMEOUT_S, f"the queue ran past {TIMEOUT_S} s\n{_diagnostics(repo, log)}"
            running = _stage_processes(exps_dir)
            for b in running:
                seen[b].append(now)
            if len(running) == len(BATCHES):
                together.append((now, running))
            time.sleep(POLL_S)
        wall = time.monotonic() - started
    finally:
        if run_all.poll() is None:
            run_all.kill()
            run_all.wait()
        _stop_workers(repo)
    # --run-all exits 0 even when an experiment failed (it prints "Failed to reproduce"): the queue's status decides
    assert run_all.returncode == 0 and "Failed to reproduce" not in log.read_text(errors="replace"), (
        _diagnostics(repo, log)
    )
    status = run_dvc(repo, "queue", "status").stdout
    for b in BATCHES:
        line = next((x for x in status.splitlines() if _name(b) in x.split()), "")
        assert line.split()[-1:] == ["Success"], _diagnostics(repo, log)

    # concurrency: stage processes of both batches alive at the same instant, in the queue's workspaces
    for b in BATCHES:
        assert seen[b], f"no stage of {b} was seen running\n{_diagnostics(repo, log)}"
    overlap = min(t[-1] for t in seen.values()) - max(t[0] for t in seen.values())
    pairs = sorted({"+".join(sorted(f"{s}@{b}" for b, ss in r.items() for s in ss)) for _, r in together})
    print(
        f"\nqueue -j {JOBS}: {wall:.0f} s for both chains; stages of both batches ran together "
        f"for {len(together)} polls every {POLL_S} s ({overlap:.0f} s between the later start and the "
        f"earlier end); e.g. {pairs[:4]}"
    )
    spans = {b: (round(t[0]), round(t[-1])) for b, t in seen.items()}
    assert len(together) >= 2 and overlap > 0, (
        f"the two chains did not overlap (first and last second each batch had a stage running: {spans})\n"
        f"{_diagnostics(repo, log)}"
    )

    # each experiment's commit holds its own batch's outputs, and only those
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    metrics = {}
    for b in BATCHES:
        ref = next((r for r in refs if r.endswith(f"/{_name(b)}")), None)
        assert ref, f"no experiment ref for {_name(b)} in {refs}"
        other = next(o for o in BATCHES if o != b)
        for stage in ("assetize", "admit", "train", "eval", "replay", "gate"):
            assert _exp_file(repo, ref, f"metrics/{stage}/{b}.json") is not None, (ref, stage)
            assert _exp_file(repo, ref, f"metrics/{stage}/{other}.json") is None, (ref, stage)
        gate = _exp_file(repo, ref, f"metrics/gate/{b}.json")
        assert gate["decision"] in {"promote", "canary", "hold", "reject"}
        summary = _exp_file(repo, ref, "metrics/summary.json")
        assert sum(v for k, v in summary.items() if k.startswith("decisions_")) == 1  # its one batch
        metrics[b] = (
            _exp_file(repo, ref, f"metrics/assetize/{b}.json"),
            _exp_file(repo, ref, f"records/assetize/{b}.json"),
        )
    (m1, r1), (m2, r2) = (metrics[b] for b in BATCHES)
    assert m1 != m2 and r1 != r2  # two batches' data, not one run twice
