"""Constrained vs free decoding on real held-out prompts: speed, identical answers, validity.

Same prompts (a batch's admitted eval items), same model, one process, side by side:

- ``free``: no constraint (what clap did before ``chain.decoding``);
- ``constrained``: the request's answer schema (clap/chain/grounding.py), the tokens the grammar
  forces queued and fed in cost-chosen chunks (``clap.model.generate.chunk_length``), as eval runs it;
- ``constrained-step``: the same constraint, every forced token its own decoding step.

For each it reports wall time, new tokens, tokens/s, forward passes, the parse rate and pass rate,
and for the constrained modes how many answers are identical (same text) to the free answer
where the free answer already parsed, and to each other.

usage: python benchmarks/constrained_decoding.py BATCH [--adapter DIR] [--n 40] [--repeat 1] [--out JSON]
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

from benchmarks.machine import cpu_model  # noqa: E402


def _accepted(grammar, tok, text: str) -> bool:
    """Whether the free answer ``text`` (as the model's tokens would re-encode it) is a complete
    object of the request's schema: a valid JSON answer may still name a date no document gives."""
    m = grammar.matcher()
    try:
        for t in tok.encode(text, add_special_tokens=False):
            m.accept(t)
    except RuntimeError:
        return False
    return bool(m._m.is_completed())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("batch")
    ap.add_argument("--adapter", default=None, help="adapter folder (default: the base model alone)")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode (the median wall is reported)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from clap import io, params
    from clap.chain.grounding import Constrainer, answer_space
    from clap.data.normalize import normalize_params
    from clap.judge.evaluation import eval_params, item_contexts
    from clap.model import constrain
    from clap.model.base import load_model, load_tokenizer
    from clap.model.generate import generate_batched
    from clap.task.prompt import build_messages
    from clap.task.scoring import context_text, parse_answer, score_item, scoring_params

    torch.set_num_threads(int(params.raw_section("train")["torch_threads"]))
    ep, sp = eval_params(), scoring_params()
    admitted = ROOT / "data" / "admitted" / a.batch
    items = io.read_parquet(admitted / "eval.parquet").head(a.n)
    docs = item_contexts(items, io.read_parquet(admitted / "kb.parquet"))
    chats = [build_messages(q, d, sp.answer) for q, d in zip(items["question"], docs)]
    model = load_model(ROOT / "models" / "base", a.adapter)
    tok = load_tokenizer(ROOT / "models" / "base", padding_side="left")
    started = time.perf_counter()
    constraint = Constrainer(answer_space(normalize_params(), sp.answer), model, tok)(docs)
    compile_s = time.perf_counter() - started

    forwards = {"n": 0}
    forward = type(model).forward

    def counting(self, *args, **kw):
        forwards["n"] += 1
        return forward(self, *args, **kw)

    type(model).forward = counting
    jump = constrain.RowMatcher.forced
    results, texts = {}, {}
    for mode in ("free", "constrained", "constrained-step"):
        constrain.RowMatcher.forced = jump if mode == "constrained" else (lambda self, limit: [])
        walls = []
        for _ in range(a.repeat):
            forwards["n"] = 0
            t = time.perf_counter()
            gens = generate_batched(
                model,
                tok,
                chats,
                batch_size=ep.batch_size,
                max_new_tokens=ep.max_new_tokens,
                constraint=None if mode == "free" else constraint,
                desc=mode,
            )
            walls.append(time.perf_counter() - t)
        scores = [
            score_item(
                parse_answer(g.text, sp.answer), {k: r[k] for k in sp.answer.names}, context_text(d), sp
            )
            for g, r, d in zip(gens, items.to_dict("records"), docs)
        ]
        tokens = sum(g.new_tokens for g in gens)
        wall = statistics.median(walls)
        texts[mode] = [g.text for g in gens]
        results[mode] = {
            "wall_s": round(wall, 2),
            "new_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1),
            "forward_passes": forwards["n"],
            "parse_rate": round(sum(s["parse_ok"] for s in scores) / len(scores), 4),
            "pass_rate": round(sum(s["pass"] for s in scores) / len(scores), 4),
        }
    constrain.RowMatcher.forced = jump
    type(model).forward = forward
    valid_free = [i for i, t in enumerate(texts["free"]) if parse_answer(t, sp.answer).ok]
    in_schema = [i for i in valid_free if _accepted(constraint.per_chat[i], tok, texts["free"][i])]
    for mode in ("constrained", "constrained-step"):
        results[mode]["identical_to_valid_free"] = (
            f"{sum(texts[mode][i] == texts['free'][i] for i in valid_free)}/{len(valid_free)}"
        )
        results[mode]["identical_to_free_within_schema"] = (
            f"{sum(texts[mode][i] == texts['free'][i] for i in in_schema)}/{len(in_schema)}"
        )
    results["constrained"]["identical_to_step"] = (
        f"{sum(x == y for x, y in zip(texts['constrained'], texts['constrained-step']))}/{len(chats)}"
    )
    out = {
        "batch": a.batch,
        "model": "base" if a.adapter is None else f"base + {Path(a.adapter).name}",
        "items": len(chats),
        "batch_size": ep.batch_size,
        "max_new_tokens": ep.max_new_tokens,
        "grammar_compile_s": round(compile_s, 2),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "modes": results,
    }
    print(json.dumps(out, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
