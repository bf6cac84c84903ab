"""What a base of each family costs to generate with on this CPU, on both engines (``chain.engine``).

One row per family at the shapes of its smallest public model (hidden size, heads, vocabulary, layer
count): the two real bases clap runs (SmolLM2-135M, ``models/base``; Gemma 3 270M, the demo-gemma
profile's ``models/base``) with their weights; the others built from their transformers config with
random weights, since none is installable here (a forward costs the same whatever the weights' values;
the largest are cut to a few of their layers, which the row says: cost per layer is what it shows).
Work is fixed and equal: ``--rows`` prompts of ``--prompt`` random token ids, prefilled together, then
``--new`` greedy tokens each, on clap's torch session and its OpenVINO graph at f32, alternating per
repeat. Reported: the graph's build + compile time, prefill and decode tokens/s per engine, the ratio,
the largest logit difference after prefill relative to the largest logit, and whether the greedy tokens
were identical (random weights give near-tied logits, where float rounding may flip a choice: the real
bases' identity is the one that speaks for answers; tests/unit/model/test_engine_families.py checks
every family's identity on peaked tiny models).

    nice -n 10 .venv/bin/python benchmarks/model_families.py [--families smollm2,gemma3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import header  # noqa: E402

from clap.model.base import load_model  # noqa: E402
from clap.model.engine import OpenVINOModel, session  # noqa: E402
from clap.model.ov_graph import unsupported  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "model_families.json"


def _shapes() -> dict[str, tuple[str, str, dict]]:
    """family -> (the public model whose shapes it takes, its config class, the config's values)."""
    return {
        "qwen2": (
            "Qwen2.5-0.5B",
            "Qwen2Config",
            dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
        ),
        "qwen3": (
            "Qwen3-0.6B",
            "Qwen3Config",
            dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
        ),
        "llama3": (
            "Llama-3.2-1B",
            "LlamaConfig",
            dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                 rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=8192)),
        ),
        "phi3": (
            "Phi-3-mini (4 of 32 layers)",
            "Phi3Config",
            dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32064, pad_token_id=0),
        ),
        "mistral": (
            "Mistral-7B-v0.3 (2 of 32 layers)",
            "MistralConfig",
            dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=32768),
        ),
        "gemma2": (
            "gemma-2-2b (4 of 26 layers)",
            "Gemma2Config",
            dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, vocab_size=256000, query_pre_attn_scalar=256,
                 sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
        ),
    }  # fmt: skip


REAL = {"smollm2": ("SmolLM2-135M-Instruct (weights)", ROOT / "models/base"),
        "gemma3": ("gemma-3-270m (weights)", ROOT / "profiles/demo-gemma/models/base")}  # fmt: skip


def build(family: str):
    """(label, torch model in eval mode at f32 on the CPU) of ``family``."""
    import transformers

    if family in REAL:
        label, base = REAL[family]
        return label, load_model(base)
    label, config_class, values = _shapes()[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**values)
    return label + " (random weights)", transformers.AutoModelForCausalLM.from_config(config).eval()


def greedy(model, prompt: torch.Tensor, new: int) -> tuple[float, float, list[list[int]], torch.Tensor]:
    """(prefill s, decode s, the greedy tokens, the logits after prefill) of ``prompt`` (rows x length)."""
    rows, length = prompt.shape
    state = session(model, None, rows, length + new)
    mask = torch.ones((rows, length), dtype=torch.long)
    positions = torch.arange(length).expand(rows, -1)
    start = time.perf_counter()
    with torch.no_grad():
        first = logits = state.forward(prompt, mask, positions)
        prefill = time.perf_counter() - start
        tokens = [logits.argmax(-1)]
        start = time.perf_counter()
        for k in range(1, new):
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], 1)
            logits = state.forward(tokens[-1][:, None], mask, torch.full((rows, 1), length + k - 1))
            tokens.append(logits.argmax(-1))
    decode = time.perf_counter() - start
    return prefill, decode, torch.stack(tokens, 1).tolist(), first


def measure(family: str, args) -> dict:
    label, model = build(family)
    why = unsupported(model.config)
    row = {"family": family, "model": label, "model_type": model.config.model_type,
           "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
           "layers": model.config.num_hidden_layers, "vocab": model.config.vocab_size,
           "openvino_builds": why is None, "openvino_refusal": why or ""}  # fmt: skip
    if why is not None:
        return row
    start = time.perf_counter()
    ov_model = OpenVINOModel(model, "f32", args.threads)
    row["openvino_build_s"] = round(time.perf_counter() - start, 2)
    prompt = torch.randint(
        0,
        min(model.config.vocab_size, 32000),
        (args.rows, args.prompt),
        generator=torch.Generator().manual_seed(1),
    )
    engines = {"torch": model, "openvino": ov_model}
    times: dict[str, dict[str, list[float]]] = {e: {"prefill": [], "decode": []} for e in engines}
    out = {}
    for rep in range(args.repeats):
        for name in engines if rep % 2 == 0 else reversed(engines):
            prefill, decode, tokens, logits = greedy(engines[name], prompt, args.new)
            times[name]["prefill"].append(prefill)
            times[name]["decode"].append(decode)
            out[name] = (tokens, logits)
            print(
                f"{family:8s} rep {rep} {name:8s} prefill {prefill:6.2f} s decode {decode:6.2f} s", flush=True
            )
    for name in engines:
        row[f"{name}_prefill_tok_s"] = round(
            args.rows * args.prompt / statistics.median(times[name]["prefill"]), 1
        )
        row[f"{name}_decode_tok_s"] = round(
            args.rows * (args.new - 1) / statistics.median(times[name]["decode"]), 2
        )
    row["openvino_vs_torch_prefill"] = round(row["openvino_prefill_tok_s"] / row["torch_prefill_tok_s"], 2)
    row["openvino_vs_torch_decode"] = round(row["openvino_decode_tok_s"] / row["torch_decode_tok_s"], 2)
    (t_tok, t_logits), (o_tok, o_logits) = out["torch"], out["openvino"]
    row["prefill_logits_max_rel_diff"] = float((t_logits - o_logits).abs().max() / t_logits.abs().max())
    row["greedy_tokens_identical"] = t_tok == o_tok
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join([*REAL, *_shapes()]))
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per row")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [measure(f, args) for f in args.families.split(",")]
    result = {**header([sys.argv[0], *(argv or sys.argv[1:])]), "threads": args.threads, "rows_per_call": args.rows,
              "prompt_tokens": args.prompt, "new_tokens": args.new, "repeats": args.repeats, "families": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    """The result as the table docs/models.md links to."""
    lines = [
        "# Generation cost per base family (benchmarks/model_families.py)",
        "",
        f"Commit {result['commit']}, {result['date']}, {result['lscpu_model']}, {result['threads']} threads; "
        f"{result['rows_per_call']} rows x {result['prompt_tokens']} prompt tokens, {result['new_tokens']} greedy "
        f"tokens each, f32, median of {result['repeats']}.",
        "",
        "| family | shapes of | params (M) | openvino graph | build s | prefill tok/s torch / openvino | "
        "decode tok/s torch / openvino | logits rel. diff | greedy identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["families"]:
        if not r["openvino_builds"]:
            lines.append(
                f"| {r['family']} | {r['model']} | {r['params_m']} | refused: {r['openvino_refusal']} | | | | | |"
            )
            continue
        lines.append(
            f"| {r['family']} | {r['model']} | {r['params_m']} | built | {r['openvino_build_s']} | "
            f"{r['torch_prefill_tok_s']} / {r['openvino_prefill_tok_s']} ({r['openvino_vs_torch_prefill']}x) | "
            f"{r['torch_decode_tok_s']} / {r['openvino_decode_tok_s']} ({r['openvino_vs_torch_decode']}x) | "
            f"{r['prefill_logits_max_rel_diff']:.1e} | {'yes' if r['greedy_tokens_identical'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
