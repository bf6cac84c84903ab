"""Training speed: clap's train path vs a plain TRL SFTTrainer, same batch, model and LoRA.

Both train the same first ``--examples`` admitted D_sft examples of a batch (built with
clap.task.prompt, completion-only loss) on models/base with the LoRA config of params ``train``:

- ``clap``:  params ``train`` as the stage runs it (batch size, packing and length grouping as
  params say; ``clap.train.sft.training_forwards``: the LM head applied to loss positions only and
  the rows' shared prompt prefix computed once per forward);
  the allocator setting every stage starts with (``clap.stage.reuse_freed_memory``);
- ``plain``: ``SFTConfig`` defaults for collation (no packing, pad to the longest in a
  batch of 4) and TRL's CPU LM head (every position), same lr/LoRA/threads/seed;
- ``clap-padded`` (``--paths``): ``clap`` with a batch's rows always run together, padded to the
  longest (``clap.model.base.ROW_CALL_TOKENS`` set past any padding), as clap ran them before rows
  of unequal length ran one at a time.

``--params profiles/tatqa/params.yaml`` trains a profile's batch (its ``data/admitted`` and
``models/base``) under its params.

``--precision bf16`` runs both paths at bf16 (params ``train.precision: bf16``: the frozen base in bf16,
fp32 LoRA weights, bf16 autocast; plain TRL with ``bf16=True`` on the same bf16 base), against the best
bf16 ``torch.mm`` rate; ``--precision fp32,bf16`` runs all four (path, precision) pairs alternating and
adds each path's bf16/fp32 ratio. Results are keyed ``clap``/``plain`` for one precision and
``<path>-<precision>`` for two.

Each path runs in its own process (clean peak RSS and thread state). Throughput counts real
(non-pad) tokens after the first ``--warmup`` optimizer steps (page faults, lazy init).
Achieved FLOP/s, against the best fp32 ``torch.mm`` rate measured in the same run with the
same threads, two ways:

- ``6N``: 6 * N_params * tokens/s (forward 2N + backward 4N per token, the usual dense
  estimate). With a frozen base there are no weight gradients, so it overstates the work;
- ``executed``: per token 2 * (2 * N_linear + 2 * N_head * f + 3 * A) with N_linear the
  decoder's projection weights, N_head the LM head, f the fraction of positions the LM head
  scores (completion tokens for clap, every position for plain TRL on CPU), A = 2 * L * d
  attention multiply-adds per layer summed over layers (L the mean sequence length, d the
  hidden size); forward once, backward once more for input gradients (twice for attention).

    nice -n 10 .venv/bin/python benchmarks/train_speed.py [--batch 2026-01] [--examples 24] [--threads 2] [--repeats 3] [--precision fp32]
    .venv/bin/python benchmarks/train_speed.py --params profiles/tatqa/params.yaml --batch reports-a \
        --examples 40 --paths clap,clap-padded --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("clap", "plain", "clap-padded")
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def machine() -> str:
    """CPU model, vector extensions that matter for fp32 GEMM, and core count."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next(
        (row.split(":", 1)[1].strip() for row in info.splitlines() if row.startswith("model name")),
        platform.processor(),
    )
    flags = next((row.split(":", 1)[1].split() for row in info.splitlines() if row.startswith("flags")), [])
    simd = ",".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    return f"{platform.machine()} {model} ({simd or 'no avx2'}), {os.cpu_count()} cpus"


def matmul_peak(threads: int, n: int = 2048, reps: int = 8, dtype: str = "fp32") -> float:
    """Best GEMM rate (FLOP/s) of ``reps`` n x n products at ``dtype`` (fp32 | bf16) on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind)
    a @ b
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def executed_flops_per_token(config, head_fraction: float, mean_len: float) -> float:
    """The ``executed`` estimate of the module docstring for a llama-style config."""
    d, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    n_linear = layers * (2 * d * d + 2 * d * kv + 3 * d * inter)
    attention = layers * 2 * mean_len * d
    return 2 * (2 * n_linear + 2 * config.vocab_size * d * head_fraction + 3 * attention)


def _rate_callback(warmup: int):
    from transformers import TrainerCallback

    class Rate(TrainerCallback):
        """(time, cumulative tokens) at every logged step after the warmup steps."""

        def __init__(self):
            self.points: list[tuple[float, float]] = []

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "num_tokens" in logs and state.global_step >= warmup:
                self.points.append((time.perf_counter(), float(logs["num_tokens"])))

    return Rate()


def run_path(
    path: str, batch: str, examples: int, threads: int, warmup: int, precision: str, params_path: Path
) -> dict:
    """Train ``examples`` examples one way; tokens/s after warmup, steps, peak RSS."""
    import dataclasses

    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from clap import io, params
    from clap.model.base import load_tokenizer
    from clap.task.answer import load_answer_schema
    from clap.train.lora import lora_config
    from clap.train.sft import (
        TrainParams,
        build_examples,
        load_train_model,
        sft_config,
        training_forwards,
    )

    if path != "plain":  # as every stage starts (clap.stage.main); plain TRL keeps glibc's default
        from clap.stage import reuse_freed_memory

        reuse_freed_memory()
    if path == "clap-padded":
        from clap.model import base

        base.ROW_CALL_TOKENS = 10**9
    tp = dataclasses.replace(
        params.section("train", TrainParams, params_path), torch_threads=threads, precision=precision
    )
    torch.set_num_threads(threads)
    torch.manual_seed(tp.seed)
    home = params_path.parent
    data = home / "data/admitted" / batch
    ex = build_examples(
        io.read_parquet(data / "sft.parquet").head(examples),
        io.read_parquet(data / "kb.parquet"),
        load_answer_schema(params_path),
    )
    tok = load_tokenizer(home / "models/base", padding_side="right")
    out = Path("/tmp") / f"clap-train-speed-{path}"
    if path != "plain":
        args = sft_config(dataclasses.replace(tp, save_steps=10**6, max_steps=-1), out, "cpu", 1)
    else:
        args = SFTConfig(
            output_dir=str(out),
            use_cpu=True,
            bf16=precision == "bf16",
            seed=tp.seed,
            learning_rate=tp.lr,
            per_device_train_batch_size=4,
            num_train_epochs=1,
            activation_checkpointing=False,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
    rate = _rate_callback(warmup)
    model = load_train_model(home / "models/base", f"{precision}-lora", "cpu")
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(ex),
        processing_class=tok,
        peft_config=lora_config(tp, model),
        callbacks=[rate],
    )
    if path != "plain":
        with training_forwards(trainer.model, bf16=args.bf16):
            trainer.train()
    else:
        trainer.train()
    (t0, n0), (t1, n1) = rate.points[0], rate.points[-1]
    labels = trainer.train_dataset["labels"]
    scored = (
        1.0
        if path == "plain"
        else sum(t != -100 for row in labels for t in row) / sum(len(row) for row in labels)
    )
    return {
        "tokens_per_s": (n1 - n0) / (t1 - t0),
        "steps": trainer.state.global_step,
        "tokens": int(n1),
        "executed_flops_per_token": executed_flops_per_token(
            trainer.model.config, scored, sum(map(len, labels)) / len(labels)
        ),
        "head_positions_fraction": scored,
        "timed_steps": len(rate.points) - 1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "n_params": sum(p.numel() for p in trainer.model.parameters()),
        "final_loss": next(h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs per path, alternating; medians reported")
    ap.add_argument("--note", default="", help="free text stored with the result (e.g. what else ran)")
    ap.add_argument("--precision", default="fp32", help="fp32 | bf16 | fp32,bf16 (both paths at each)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="a profile's params.yaml")
    ap.add_argument("--paths", default="clap,plain", help="clap | plain | clap-padded, comma-separated")
    ap.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)  # child process mode
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/train_speed.json"))
    a = ap.parse_args()
    precisions = a.precision.split(",")
    if a.path:
        result = run_path(a.path, a.batch, a.examples, a.threads, a.warmup, precisions[0], a.params.resolve())
        print(json.dumps(result))
        return
    paths = a.paths.split(",")
    variants = [(path, prec) for prec in precisions for path in paths]
    runs: dict[tuple[str, str], list[dict]] = {v: [] for v in variants}
    child = ["--batch", a.batch, "--examples", str(a.examples), "--threads", str(a.threads)]
    child += ["--warmup", str(a.warmup), "--params", str(a.params.resolve())]
    for rep in range(a.repeats):  # alternating order: these machines drift by 10-15 % within minutes
        for path, prec in variants if rep % 2 == 0 else variants[::-1]:
            cmd = [sys.executable, __file__, "--path", path, "--precision", prec, *child]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[(path, prec)].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(
                f"rep {rep} {path} {prec}: {runs[(path, prec)][-1]['tokens_per_s']:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
    # each variant's run of median throughput, with every run's throughput beside it
    peaks = {prec: matmul_peak(a.threads, dtype=prec) for prec in precisions}

    def key(path: str, prec: str) -> str:  # the result's name: the path alone for one precision
        return path if len(precisions) == 1 else f"{path}-{prec}"

    results = {}
    for (path, prec), rs in runs.items():
        r = {
            **sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2],
            "tokens_per_s_runs": [r["tokens_per_s"] for r in rs],
            "precision": prec,
        }
        r["flops_per_s_6N"] = 6 * r["n_params"] * r["tokens_per_s"]
        r["fraction_of_matmul_peak_6N"] = r["flops_per_s_6N"] / peaks[prec]
        r["flops_per_s_executed"] = r["executed_flops_per_token"] * r["tokens_per_s"]
        r["fraction_of_matmul_peak_executed"] = r["flops_per_s_executed"] / peaks[prec]
        results[key(path, prec)] = r

    def rate(path: str, prec: str) -> float:
        return results[key(path, prec)]["tokens_per_s"]

    # clap over the other paths measured, at the same precision
    speedups = {
        other: {prec: rate("clap", prec) / rate(other, prec) for prec in precisions}
        for other in paths
        if other != "clap" and "clap" in paths
    }
    report = {
        "params": str(a.params.resolve().relative_to(ROOT)),
        "batch": a.batch,
        "examples": a.examples,
        "threads": a.threads,
        "warmup_steps": a.warmup,
        "repeats": a.repeats,
        "precisions": precisions,
        "matmul_peak_flops_per_s": peaks[precisions[0]] if len(precisions) == 1 else peaks,
        # clap vs plain TRL (and vs clap-padded) at the same precision (one figure for one precision,
        # else per precision)
        **{
            ("speedup_tokens_per_s" if other == "plain" else f"speedup_vs_{other}"): (
                by[precisions[0]] if len(precisions) == 1 else by
            )
            for other, by in speedups.items()
        },
        "flops_formulas": "6N: 6 * n_params * tokens_per_s; executed: see benchmarks/train_speed.py docstring",
        "machine": machine(),
        "note": a.note,
        "load_avg_1m_at_end": os.getloadavg()[0],
        **results,
    }
    if len(precisions) > 1:  # each path's gain from its precision, last over first
        report["precision_ratio_tokens_per_s"] = {
            path: rate(path, precisions[-1]) / rate(path, precisions[0]) for path in paths
        }
    from clap import io

    io.write_json(a.out, report)
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
