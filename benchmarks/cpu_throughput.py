"""Where generation's CPU time goes: the rate each engine and precision reaches on the model's shapes.

Eval, replay, serving and GRPO rollouts run three shapes of SmolLM2-135M arithmetic: a prompt prefill
(rows x many new positions after the shared prefix), a batched decode step (one position for each of up
to ``eval.batch_size`` rows) and a one-request decode step (serving, replay's timed requests). This times
each shape on clap's torch path and on its openvino engine at f32, bf16 and int8 weights (the graph
:func:`clap.model.ov_graph.causal_lm_graph` builds; the settings :class:`clap.model.engine.OpenVINOModel`
compiles with), medians of ``--repeats``, and states each as GFLOP/s of the decoder body: 2 x the
non-embedding parameters per position computed (the output layer, applied at each row's last position
only, is not counted). A rate near the machine's practical peak says the shape is compute bound: only
less work or cheaper arithmetic makes it faster there; a low rate says it waits on memory or overhead.

usage: .venv/bin/python benchmarks/cpu_throughput.py [--base models/base] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402
from clap import io  # noqa: E402

CONTEXT = 150  # kept positions before a decode step (a demo prompt and a few answer tokens)
SHAPES = {  # name: (rows, new positions per row, kept positions before them)
    "prefill_48x96": (48, 96, 0),
    "decode_48": (48, 1, CONTEXT),
    "decode_1": (1, 1, CONTEXT),
}


def body_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)


def _inputs(rows: int, new: int, kept: int):
    import numpy as np

    ids = np.full((rows, new), 100, np.int64)
    mask = np.ones((rows, kept + new), np.int64)
    positions = np.tile(np.arange(kept, kept + new, dtype=np.int64), (rows, 1))
    return ids, mask, positions


def time_openvino(model, precision: str, threads: int, repeats: int) -> dict[str, float]:
    """Median seconds per shape on the openvino engine at ``precision``."""
    import numpy as np

    from clap.model.engine import OpenVINOModel

    request = OpenVINOModel(model, precision, threads)._request
    out = {}
    for name, (rows, new, kept) in SHAPES.items():
        beams = np.arange(rows, dtype=np.int32)
        walls = []
        for _ in range(repeats + 1):  # the first is a warm-up
            request.reset_state()
            if kept:
                ids, mask, pos = _inputs(rows, kept, 0)
                request.infer(
                    {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "beam_idx": beams}
                )
            ids, mask, pos = _inputs(rows, new, kept)
            start = time.perf_counter()
            request.infer({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "beam_idx": beams})
            walls.append(time.perf_counter() - start)
        out[name] = statistics.median(walls[1:])
    return out


def time_torch(model, repeats: int) -> dict[str, float]:
    """Median seconds per shape on the torch path (the model's forward, keys/values kept in a cache)."""
    import torch

    out = {}
    with torch.inference_mode():
        for name, (rows, new, kept) in SHAPES.items():
            walls = []
            for _ in range(repeats + 1):
                cache = None
                if kept:
                    ids, mask, pos = (torch.from_numpy(x) for x in _inputs(rows, kept, 0))
                    cache = model(
                        input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1
                    ).past_key_values
                ids, mask, pos = (torch.from_numpy(x) for x in _inputs(rows, new, kept))
                start = time.perf_counter()
                model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=cache,
                    logits_to_keep=1,
                )
                walls.append(time.perf_counter() - start)
            out[name] = statistics.median(walls[1:])
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="models/base", help="a base folder (the base stage's output)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/cpu_throughput.json")
    args = ap.parse_args(argv)

    import torch

    from clap.determinism import hardware_class
    from clap.model.base import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.base)
    params = body_params(model)
    runs = {"torch-f32": time_torch(model, args.repeats)}
    for precision in ("f32", "bf16", "int8"):
        runs[f"openvino-{precision}"] = time_openvino(model, precision, args.threads, args.repeats)
    rows = []
    for engine, walls in runs.items():
        for name, seconds in walls.items():
            n_rows, new, _ = SHAPES[name]
            rows.append(
                {
                    "engine": engine,
                    "shape": name,
                    "rows": n_rows,
                    "new_positions": new,
                    "ms": round(seconds * 1000, 2),
                    "body_gflop_per_s": round(2 * params * n_rows * new / seconds / 1e9, 1),
                    "vs_openvino_f32": None,
                }
            )
    f32 = {r["shape"]: r["ms"] for r in rows if r["engine"] == "openvino-f32"}
    for r in rows:
        r["vs_openvino_f32"] = round(f32[r["shape"]] / r["ms"], 2)  # > 1: faster than the default engine
    result = {
        "benchmark": "cpu_throughput",
        **header(["benchmarks/cpu_throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "hardware": hardware_class("cpu"),
        "threads": args.threads,
        "body_params": params,
        "repeats": args.repeats,
        "rows": rows,
    }
    io.write_json(ROOT / args.out if not Path(args.out).is_absolute() else args.out, result)
    for r in rows:
        print(
            f"{r['engine']:16s} {r['shape']:14s} {r['ms']:9.1f} ms {r['body_gflop_per_s']:7.1f} GFLOP/s  x{r['vs_openvino_f32']}"
        )
    return result


if __name__ == "__main__":
    main()
