"""A canary over real HTTP on the demo's models: a worse canary rolled back, a better one promoted.

Runs `clap serve`'s app (:func:`clap.chain.serve.create_app` with a :class:`clap.chain.serve.CanaryRoute`)
on a loopback port in a project where `dvc repro` has run ``--batch`` (e.g. a clone after `make demo`),
with the project's params ``chain`` and this checkout's ``serve`` (the pre-registered test, with
``serve.canary.watch_every``), and sends the batch's held-out questions (eval items, then replay cases, in
a seeded order, cycled) one request at a time until the app's own :class:`clap.chain.serve.CanaryWatcher`
decides (it tests the log after every ``watch_every``-th request, as `clap serve` does; no one runs `clap
canary`) or ``--max-requests`` is reached. The watcher's action is recorded, not applied: the scratch
models have no release registry (acting through release control is tested in
tests/unit/release/test_control.py). Two scenarios:

- ``worse``: incumbent = base + the batch's adapter, canary = the base model (no adapter);
- ``better``: incumbent = the base model, canary = base + the batch's adapter.

Both answer with the batch's knowledge base. Records per scenario: the decision, the request it came at,
both e-values then, per-arm requests, failure rates and latency, and the wall time.

    .venv/bin/python benchmarks/canary_http.py --project /tmp/demo --batch 2026-01 [--max-requests 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402


def questions(project: Path, batch: str, seed: int) -> list[str]:
    from clap import io

    frames = [
        io.read_parquet(project / "data/admitted" / batch / f"{split}.parquet")
        for split in ("eval", "replay")
    ]
    qs = [q for f in frames for q in f["question"].tolist()]
    order = np.random.default_rng(seed).permutation(len(qs))
    return [qs[i] for i in order]


def scenario(name: str, project: Path, batch: str, max_requests: int, seed: int) -> dict:
    import httpx

    from clap import io, params
    from clap.chain.chain import ChainParams, build_index, load_chain
    from clap.chain.grounding import answer_space
    from clap.chain.serve import CanaryRoute, CanaryWatcher, Served, ServeParams, create_app, serving
    from clap.data.normalize import normalize_params
    from clap.model.base import ADAPTER_FILE, base_sha256
    from clap.release import canary as C
    from clap.task.scoring import scoring_params

    pfile = project / "params.yaml"
    sp = params.section("serve", ServeParams, ROOT / "params.yaml")
    cp = params.section("chain", ChainParams, pfile)
    norm = normalize_params(pfile)
    space = answer_space(norm, norm.answer)
    index = build_index(io.read_parquet(project / "data/admitted" / batch / "kb.parquet"), cp)
    base_dir, adapter_dir = project / "models/base", project / "models/adapters" / batch
    base_sha, adapter_sha = base_sha256(base_dir), io.sha256_file(adapter_dir / ADAPTER_FILE)
    adapter = Served("adapter", batch, batch, adapter_sha, base_sha, "promote", None, f"adapter {batch}")
    base = Served("base", None, batch, None, base_sha, None, None, "the base model")
    canary_served, incumbent_served = (base, adapter) if name == "worse" else (adapter, base)
    load = time.perf_counter()
    canary_chain = load_chain(base_dir, None if name == "worse" else adapter_dir, index, cp, space)
    incumbent_chain = load_chain(base_dir, adapter_dir if name == "worse" else None, index, cp, space)
    load_s = time.perf_counter() - load
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "canary.jsonl"
        canary_key = canary_served.adapter_sha256 or "base"
        acted: list[str] = []
        watcher = CanaryWatcher(
            Path(tmp),
            {"batch": canary_served.batch or "base", "adapter_sha256": canary_key, "approval_id": None},
            lambda _root, _pointer, rec: acted.append(rec["decision"]),  # recorded, not applied (no registry)
            emit=lambda line: print(line, flush=True),
        )
        route = CanaryRoute(
            incumbent_chain,
            incumbent_served,
            sp.canary,
            C.RequestLog(log, canary_key),
            scoring_params(pfile),
            watcher,
        )
        app = create_app(canary_chain, canary_served, sp, route)
        qs = questions(project, batch, seed)
        start = time.perf_counter()
        with serving(app) as url, httpx.Client(base_url=url, timeout=300) as client:
            for i in range(max_requests):
                r = client.post("/answer", json={"question": qs[i % len(qs)]})
                r.raise_for_status()
                if watcher.decision is not None:
                    break
            watcher.done.wait(30)
        wall = time.perf_counter() - start
        rec = watcher.record or C.analyze(C.read_log(log, canary_key), sp.canary)
    return {
        "scenario": name,
        "canary": canary_served.note,
        "incumbent": incumbent_served.note,
        "model_load_s": round(load_s, 1),
        "wall_s": round(wall, 1),
        "decided_by": "the serve app's watcher (serve.canary.watch_every)" if watcher.record else "nobody",
        "action_called": acted,
        **rec,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--max-requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/canary_http.json")
    args = ap.parse_args()
    from clap import params

    rows = []
    for name in ("worse", "better"):
        rows.append(scenario(name, args.project.resolve(), args.batch, args.max_requests, args.seed))
        print(
            json.dumps(
                {k: rows[-1][k] for k in ("scenario", "decision", "decided_at_request", "requests", "wall_s")}
            ),
            flush=True,
        )
    result = {
        **header(sys.argv),
        "machine": machine(),
        "batch": args.batch,
        "canary_params": params.raw_section("serve", ROOT / "params.yaml")["canary"],
        "scenarios": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
