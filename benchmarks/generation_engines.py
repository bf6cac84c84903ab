"""Generation engines side by side: clap's decoding loop on torch and on OpenVINO (``chain.engine``),
and OpenVINO GenAI's own loop on the same OpenVINO graph, same prompts, one process, one run.

Prompts: the first ``--items`` eval questions of a raw demo batch with their retrieved documents
(``eval_speed.raw_chats``), greedy, ``chain.max_new_tokens``, ``eval.batch_size`` rows at a time.
Modes: ``batch`` (all prompts in one call), ``fixed`` (the same, but every answer runs to
``max_new_tokens`` past its end of sequence: equal work for every engine, whatever it answers; GenAI's
``ignore_eos``, clap with no stop ids), ``latency`` (``--latency-items`` prompts one call each,
p50) and, for clap's engines, ``constrained`` (the eval stage's mode: each answer decoded inside its
request's schema). Runs alternate between engines in each repeat (machines here drift by 10-15 %);
the results are medians with the ratio to clap-on-torch, and how many answers equal clap-on-torch's
(token ids for clap's engines, text for GenAI, which tokenizes the templated prompt itself). Where
answers differ the work differs too (a rambling row keeps a batch decoding to ``max_new_tokens``), so
each row also states the tokens generated (GenAI's text re-tokenized) and tokens per second.

GenAI is optional (``pip install --no-deps openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0``);
it runs the graph clap builds (``clap.model.ov_graph.causal_lm_graph``, saved uncompressed at f32) with
tokenizer models converted by openvino-tokenizers: the graph, not the exporter, is held fixed. Each
GenAI run gets a fresh pipeline, so its prefix cache holds nothing from an earlier run.

    nice -n 10 .venv/bin/python benchmarks/generation_engines.py [--adapter models/adapters/2026-01] [--items 40] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_speed import raw_chats, raw_items  # noqa: E402
from machine import header, machine  # noqa: E402

from clap.chain.grounding import Constrainer, answer_space  # noqa: E402
from clap.data.normalize import normalize_params  # noqa: E402
from clap.judge.evaluation import eval_params  # noqa: E402
from clap.model import generate as clap_generate  # noqa: E402
from clap.model.base import load_model, load_tokenizer  # noqa: E402
from clap.model.engine import PRECISIONS, OpenVINOModel  # noqa: E402
from clap.model.generate import generate_batched  # noqa: E402
from clap.model.ov_graph import causal_lm_graph  # noqa: E402
from clap.stage import reuse_freed_memory  # noqa: E402
from clap.task.scoring import scoring_params  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def no_stops():
    """clap's decoding with no end-of-sequence ids: every row runs to ``max_new_tokens`` (mode ``fixed``)."""
    original = clap_generate.stop_ids
    clap_generate.stop_ids = lambda model, tokenizer: []
    try:
        yield
    finally:
        clap_generate.stop_ids = original


def _genai(model, tok, base: Path, precision: str, threads: int, folder: Path):
    """An OpenVINO GenAI pipeline over clap's graph of ``model`` at ``precision`` (None when GenAI is not
    installed); the graph (f32 or int8 weights) is saved once under ``folder``."""
    try:
        import openvino as ov
        import openvino_genai
        from openvino_tokenizers import convert_tokenizer
    except ImportError:
        return None
    weights = "int8" if precision == "int8" else "f32"
    folder = folder / weights
    if not (folder / "openvino_model.xml").exists():
        folder.mkdir(parents=True)
        ov.save_model(causal_lm_graph(model, weights), folder / "openvino_model.xml", compress_to_fp16=False)
        for name, m in zip(("tokenizer", "detokenizer"), convert_tokenizer(tok, with_detokenizer=True)):
            ov.save_model(m, folder / f"openvino_{name}.xml")
        for f in ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"):
            shutil.copy(base / f, folder / f)
    return openvino_genai.LLMPipeline(
        str(folder),
        "CPU",
        INFERENCE_PRECISION_HINT="f32" if precision == "int8" else precision,  # as OpenVINOModel
        KV_CACHE_PRECISION="f32",
        INFERENCE_NUM_THREADS=threads,
    )


def _genai_run(
    pipe, prompts: list[str], max_new_tokens: int, batch_size: int, ignore_eos: bool = False
) -> list[str]:
    import openvino_genai

    cfg = openvino_genai.GenerationConfig()
    cfg.max_new_tokens, cfg.do_sample, cfg.apply_chat_template = max_new_tokens, False, False
    cfg.ignore_eos = ignore_eos
    texts = []
    for lo in range(0, len(prompts), batch_size):
        texts.extend(pipe.generate(prompts[lo : lo + batch_size], cfg).texts)
    return texts


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, default=ROOT / "models" / "base")
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--latency-items", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    # the stages' allocator setting (every engine runs in this one process, so all of them get it)
    allocator = "reuse_freed_memory" if reuse_freed_memory() else "glibc default"
    torch.set_num_threads(args.threads)
    ep = eval_params(ROOT / "params.yaml")
    chats = raw_chats(ROOT / "data" / "raw" / args.batch, args.items)
    tok = load_tokenizer(args.base, padding_side="left")
    torch_model = load_model(args.base, args.adapter)
    start = time.perf_counter()
    engines = {"clap-torch": torch_model}
    for precision in PRECISIONS:
        engines[f"clap-openvino-{precision}"] = OpenVINOModel(torch_model, precision, args.threads)
    build_s = (time.perf_counter() - start) / len(PRECISIONS)
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    tmp = Path(tempfile.mkdtemp(prefix="genai-"))
    genai_skipped = {}
    for precision in PRECISIONS:
        try:
            pipe = _genai(torch_model, tok, args.base, precision, args.threads, tmp)
        except Exception as e:  # noqa: BLE001 - GenAI cannot take this model or tokenizer: say so, run the rest
            genai_skipped[precision] = f"{type(e).__name__}: {e}"[:300]
            print(f"genai-{precision} skipped: {genai_skipped[precision]}", flush=True)
            continue
        if pipe is not None:
            # a fresh pipeline for every run (built outside the timing): GenAI caches the keys and values of
            # the prompts it has seen (prefix caching), so a second run over the same prompts skips their
            # prefill (measured: time to first token 9.6 s -> 1.0 s), which no eval or replay run would get
            engines[f"genai-{precision}"] = functools.partial(
                _genai, torch_model, tok, args.base, precision, args.threads, tmp
            )

    # the eval stage's constraint: each chat's schema over its own documents (clap.chain.grounding)
    space = answer_space(normalize_params(ROOT / "params.yaml"), scoring_params(ROOT / "params.yaml").answer)
    constrainer = Constrainer(space, torch_model, tok)
    chat_docs = [tuple(docs) for _, docs in raw_items(ROOT / "data" / "raw" / args.batch, args.items)]

    def run(name, mode, items):
        engine, sub = engines[name], chats[:items]
        if name.startswith("genai"):
            engine = engine()
        t = time.perf_counter()
        if name.startswith("genai"):
            texts = _genai_run(
                engine,
                prompts[:items],
                ep.max_new_tokens,
                1 if mode == "latency" else ep.batch_size,
                ignore_eos=mode == "fixed",
            )
            return time.perf_counter() - t, texts, None
        constraint = constrainer(chat_docs[:items]) if mode == "constrained" else None
        with no_stops() if mode == "fixed" else contextlib.nullcontext():
            gens = generate_batched(
                engine,
                tok,
                sub,
                batch_size=ep.batch_size if mode != "latency" else 1,
                max_new_tokens=ep.max_new_tokens,
                desc=None,
                constraint=constraint,
            )
        return time.perf_counter() - t, [g.text for g in gens], [g.token_ids for g in gens]

    modes = {
        "batch": args.items,
        "fixed": args.items,
        "latency": args.latency_items,
        "constrained": args.items,
    }
    walls: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], tuple] = {}

    def n_tokens(texts, ids) -> list[int]:
        return (
            [len(x) for x in ids]
            if ids is not None
            else [len(tok(t, add_special_tokens=False).input_ids) for t in texts]
        )

    for rep in range(args.repeats):
        names = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for mode, items in modes.items():
            for name in names:
                if mode == "constrained" and name.startswith("genai"):
                    continue
                wall, texts, ids = run(name, mode, items)
                walls.setdefault((name, mode), []).append(wall)
                answers[(name, mode)] = (texts, ids)
                print(f"rep {rep} {mode:11s} {name:20s} {wall:7.2f} s", flush=True)
    result = {
        "benchmark": "generation_engines",
        **header([sys.argv[0], *(argv or sys.argv[1:])]),
        "machine": machine(),
        "threads": args.threads,
        "allocator": allocator,
        "model": str(args.base.relative_to(ROOT) if args.base.is_relative_to(ROOT) else args.base)
        + (f" + {args.adapter}" if args.adapter else ""),
        "genai_skipped": genai_skipped,
        "batch": args.batch,
        "items": args.items,
        "latency_items": args.latency_items,
        "repeats": args.repeats,
        "batch_size": ep.batch_size,
        "max_new_tokens": ep.max_new_tokens,
        "openvino_graph_build_and_compile_s": round(build_s, 2),
        "rows": [],
    }
    for (name, mode), ws in walls.items():
        ref_texts, ref_ids = answers[("clap-torch", mode)]
        texts, ids = answers[(name, mode)]
        same = (
            sum(a == b for a, b in zip(ids, ref_ids))
            if ids is not None
            else sum(a == b for a, b in zip(texts, ref_texts))
        )
        median = statistics.median(ws)
        counts = n_tokens(texts, ids)  # GenAI: its text re-tokenized, once per row
        base = statistics.median(walls[("clap-torch", mode)])
        row = {
            "engine": name,
            "mode": mode,
            "wall_s_median": round(median, 2),
            "walls_s": [round(w, 2) for w in ws],
            "speed_vs_clap_torch": round(base / median, 2),
            "identical_to_clap_torch": f"{same}/{len(texts)} ({'token ids' if ids is not None else 'text'})",
            "new_tokens": sum(counts),
            "longest_answer_tokens": max(counts),
            "tokens_per_s": round(sum(counts) / median, 1),
        }
        if mode == "latency":
            row["p50_ms_per_request"] = round(median / args.latency_items * 1000)
        result["rows"].append(row)
    shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
