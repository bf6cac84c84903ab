"""Where each OpenVINO precision pays, phase by phase: one request's prefill and its decode steps.

``chain.engine.precision`` trades answers for speed (docs/precision.md). A whole-stage comparison
(``benchmarks/engine_stages.py``) mixes the two phases of generation: prefill, a long prompt's forward,
bound by compute; decode, one token per step, bound by reading the weights. This times them apart, one
request at a time (batch 1, what ``clap serve`` and replay's latency sample pay), on the graph the
engine builds (``clap.model.ov_graph.causal_lm_graph``) compiled as :class:`clap.model.engine.OpenVINOModel`
compiles it, for f32, int8 with the plugin's dynamic activation quantization (clap's ``int8``) and
int8 weight-only (activations stay f32), at each prompt length. Prompts are random token ids: the
compute does not depend on them. Runs alternate between variants in each repeat; results are medians.

    nice -n 10 .venv/bin/python benchmarks/precision_phases.py [--base models/base] [--lengths 300 1000] \\
        [--new-tokens 48] [--repeats 5] [--out benchmarks/results/precision_phases_avx2.json]
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

# variant -> (graph weights, the plugin's dynamic activation quantization group size: 0 is off)
VARIANTS = {
    "f32": ("f32", 0),
    "int8 (clap: dynamic activations)": ("int8", 32),
    "int8 weight-only": ("int8", 0),
}


def compile_variants(base: Path, threads: int) -> dict:
    import openvino as ov

    from clap.model.base import load_model
    from clap.model.ov_graph import causal_lm_graph

    model = load_model(base, None)
    graphs = {w: causal_lm_graph(model, w) for w in ("f32", "int8")}
    return {
        name: ov.Core()
        .compile_model(
            graphs[weights],
            "CPU",
            {
                "INFERENCE_PRECISION_HINT": "f32",
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": group,
                "KV_CACHE_PRECISION": "f32",
                "INFERENCE_NUM_THREADS": threads,
            },
        )
        .create_infer_request()
        for name, (weights, group) in VARIANTS.items()
    }


def one_request(request, ids, new_tokens: int) -> tuple[float, float]:
    """(prefill ms, decode ms per token) of one greedy request from an empty state."""
    import numpy as np

    length = ids.shape[1]
    beam = np.zeros(1, np.int32)
    request.reset_state()
    start = time.perf_counter()
    out = request.infer(
        {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(length)[None],
            "beam_idx": beam,
        }
    )[0]
    prefilled = time.perf_counter()
    token = int(out[0, -1].argmax())
    for k in range(new_tokens):
        out = request.infer(
            {
                "input_ids": np.array([[token]], np.int64),
                "attention_mask": np.ones((1, length + k + 1), np.int64),
                "position_ids": np.array([[length + k]], np.int64),
                "beam_idx": beam,
            }
        )[0]
        token = int(out[0, -1].argmax())
    return (prefilled - start) * 1000, (time.perf_counter() - prefilled) * 1000 / new_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, default=ROOT / "models" / "base")
    ap.add_argument("--lengths", type=int, nargs="+", default=[300, 1000], help="prompt lengths (tokens)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import numpy as np

    requests = compile_variants(args.base, args.threads)
    rng = np.random.default_rng(args.seed)
    rows = []
    for length in args.lengths:
        ids = rng.integers(100, 40000, size=(1, length)).astype(np.int64)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in requests}
        for rep in range(args.repeats):
            order = list(requests) if rep % 2 == 0 else list(requests)[::-1]
            for name in order:
                times[name].append(one_request(requests[name], ids, args.new_tokens))
        f32 = [statistics.median(t[i] for t in times["f32"]) for i in (0, 1)]
        for name, t in times.items():
            prefill, decode = (statistics.median(x[i] for x in t) for i in (0, 1))
            rows.append(
                {
                    "variant": name,
                    "prompt_tokens": length,
                    "prefill_ms_median": round(prefill, 1),
                    "decode_ms_per_token_median": round(decode, 2),
                    "prefill_speed_vs_f32": round(f32[0] / prefill, 2),
                    "decode_speed_vs_f32": round(f32[1] / decode, 2),
                }
            )
            print(rows[-1])
    result = {
        **header(sys.argv),
        "benchmark": "precision_phases",
        "machine": machine(),
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.out:
        io.write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
