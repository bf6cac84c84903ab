"""The CPU LM head: TRL's chunked log-prob kernel at its default tile width vs clap's (``CPU_LOGPROB_CHUNK``).

One forward + backward of ``trl.kernels.ChunkedLogProbFunction`` as SFT training calls it (outputs
log_probs, entropy, is_top1; the gradient of the hidden states, the head frozen as under LoRA) at the
default base's shapes (SmolLM2-135M: hidden 576, vocabulary 49152) for several numbers of scored
positions, the two tile widths alternating in one process; medians of ``--repeats``. Also records the
largest difference between the two runs' log-probs, entropies and hidden-state gradients.

    .venv/bin/python benchmarks/lm_head.py [--positions 256,1024,4096] [--threads 2] [--repeats 5] [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import header, machine  # noqa: E402

OUTPUTS = ("log_probs", "entropy", "is_top1")  # what TRL's SFTTrainer asks of its fused head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="256,1024,4096")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lm_head.json")
    args = ap.parse_args()

    import torch
    import trl.trainer.utils as trl_utils
    from trl.kernels import ChunkedLogProbFunction

    from clap.train.sft import CPU_LOGPROB_CHUNK

    torch.set_num_threads(args.threads)
    widths = {"trl_default": trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, "clap": CPU_LOGPROB_CHUNK}
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=gen) * 0.05
    rows = []
    for n in (int(x) for x in args.positions.split(",")):
        hidden = torch.randn(n, args.hidden, generator=gen).requires_grad_()
        targets = torch.randint(0, args.vocab, (n,), generator=gen)
        times: dict[str, list[float]] = {k: [] for k in widths}
        results = {}
        for _ in range(args.repeats):
            for name, width in widths.items():
                start = time.perf_counter()
                lp, ent, _, _, top1 = ChunkedLogProbFunction.apply(
                    hidden, weight, None, targets, 1.0, width, None, 1.0, OUTPUTS
                )
                lp.sum().backward()
                times[name].append(time.perf_counter() - start)
                results[name] = (lp.detach(), ent.detach(), top1, hidden.grad.clone())
                hidden.grad = None
        a, b = results["trl_default"], results["clap"]
        medians = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "positions": n,
                "median_s": medians,
                "speedup": medians["trl_default"] / medians["clap"],
                "max_abs_diff": {
                    "log_probs": float((a[0] - b[0]).abs().max()),
                    "entropy": float((a[1] - b[1]).abs().max()),
                    "grad_hidden": float((a[3] - b[3]).abs().max()),
                },
                "is_top1_equal": bool(torch.equal(a[2], b[2])),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        **header(sys.argv),
        "machine": machine(),
        "hidden": args.hidden,
        "vocab": args.vocab,
        "threads": args.threads,
        "repeats": args.repeats,
        "tile_widths": widths,
        "outputs": list(OUTPUTS),
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
