"""End to end: `dvc repro` of the real dvc.yaml on a tiny config (one batch, tiny model, few items).

This is the test that the stages fit together as DVC runs them: argv paths, deps/outs,
params sections, metrics files. It runs in a copy of the working tree (fixtures ``tiny_repo``
and ``tiny_run`` in tests/conftest.py, shared with the other e2e tests) so the repository's
own dvc.lock, cache and outputs are never touched.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from conftest import E2E_BATCH as BATCH
from conftest import run_dvc

from clap import io

pytestmark = pytest.mark.slow


def test_dvc_repro_runs_every_stage_then_is_a_noop(tiny_repo, tiny_run):
    run = tiny_run
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    assetize = json.loads((tiny_repo / f"metrics/assetize/{BATCH}.json").read_text())
    assert assetize["rows_in"] == assetize["rows_assets"] + assetize["rows_rejected"]
    admit = json.loads((tiny_repo / f"metrics/admit/{BATCH}.json").read_text())
    assert admit["admitted"] == 1 and admit["pool_overlap"] == 0 and admit["admitted_overlap"] == 0
    gate = json.loads((tiny_repo / f"metrics/gate/{BATCH}.json").read_text())
    assert gate["decision"] in {"promote", "canary", "hold", "reject"}
    assert (tiny_repo / f"reports/gate/{BATCH}/report.md").read_text().strip()
    probe = json.loads((tiny_repo / f"metrics/grpo/{BATCH}.json").read_text())
    assert probe["run"] == 1 and probe["steps"] >= 1 and probe["static_verdict"] in {"pass", "fail"}
    assert (
        gate["grpo_decision"] == "hold"
        and "GRPO probe: static admission vs runtime" in (tiny_repo / "reports/summary.md").read_text()
    )

    # metrics are what a reviewer compares: no hash or version string anywhere in `dvc metrics show`
    shown = run_dvc(tiny_repo, "metrics", "show", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    values = list(_leaves(json.loads(shown.stdout)))
    assert values and not [v for v in values if isinstance(v, str) and io.is_record_value(v)]
    assert not [v for v in values if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}|\d+\.\d+.*", v)]
    # provenance is in the record files (dvc outs, cache: false), with the hashes
    sha = re.compile(r"[0-9a-f]{64}")
    train = io.read_json(tiny_repo / f"records/train/{BATCH}.json")
    assert sha.fullmatch(train["adapter_sha256"]) and sha.fullmatch(train["base_sha256"])
    assert train["torch_version"] and train["device"] and "seed" in train
    replay = io.read_json(tiny_repo / f"records/replay/{BATCH}.json")
    assert sha.fullmatch(replay["cases_sha256"]) and replay["adapter_sha256"] == train["adapter_sha256"]
    assert sha.fullmatch(io.read_json(tiny_repo / f"records/eval/{BATCH}.json")["sha256_items"])
    assert sha.fullmatch(io.read_json(tiny_repo / "records/base.json")["weights_sha256"])
    for stage in ("assetize", "normalize", "admit", "grpo", "gate"):
        assert (tiny_repo / f"records/{stage}/{BATCH}.json").is_file()
    evidence = io.read_json(tiny_repo / f"reports/gate/{BATCH}/evidence.json")
    assert evidence["replay"]["cases_sha256"] == replay["cases_sha256"]  # the evidence keeps the hashes

    start = time.perf_counter()
    again = run_dvc(tiny_repo, "repro")
    assert again.returncode == 0
    assert "Data and pipelines are up to date" in again.stdout
    assert "Running stage" not in again.stdout
    status = run_dvc(tiny_repo, "status")
    assert "up to date" in status.stdout, status.stdout
    print(f"no-op dvc repro: {time.perf_counter() - start:.2f} s")


def _leaves(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _leaves(v)
    elif isinstance(node, list):
        for v in node:
            yield from _leaves(v)
    else:
        yield node


def _ran(run) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", run.stdout)


def test_a_gate_policy_change_reruns_only_gate_and_summary(tiny_repo, tiny_run):
    assert tiny_run.returncode == 0
    path = tiny_repo / "params.yaml"
    original = path.read_text()
    p = yaml.safe_load(original)
    p["gate"]["alpha"] = (
        0.04  # a plain gate knob, and one of the application-chain policy (decided by the gate too)
    )
    p["gate"]["chain"]["min_value_accuracy"] = 0.9
    try:
        path.write_text(yaml.safe_dump(p, sort_keys=False))
        changed = run_dvc(tiny_repo, "repro")
        assert changed.returncode == 0, changed.stderr[-3000:]
        ran = _ran(changed)  # summary re-runs when the gate's metrics changed
        assert ran[:1] == [f"gate@{BATCH}"] and set(ran) <= {f"gate@{BATCH}", "summary"}, changed.stdout[
            -3000:
        ]  # never replay nor eval
    finally:
        path.write_text(original)
    back = run_dvc(tiny_repo, "repro")  # the other e2e tests see the original run's decisions again
    assert back.returncode == 0 and set(_ran(back)) <= {f"gate@{BATCH}", "summary"}
