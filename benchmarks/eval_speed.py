"""Eval generation speed: clap's batched greedy generation vs naive per-item ``model.generate``.

Same model (models/base), same prompts (the first eval questions of a raw demo batch with
their retrieved documents, through clap.task.prompt), same greedy budget (params ``eval``). The
naive loop is what a first implementation does: one unpadded ``generate`` call per item.
Outputs must be identical token for token; the result is the items/s ratio. One run each.
Committed: ``results/eval_speed.json`` (the base model, whose answers ramble to the budget)
and ``results/eval_speed_adapter.json`` (``--adapter models/adapters/2026-01``: the eval
stage's candidate, answers ending at EOS), both with ``--items 40 --prefill`` (the demo's
eval size).

    nice -n 10 .venv/bin/python benchmarks/eval_speed.py [--items 32] [--batch 2026-01] [--adapter DIR] [--threads N] [--prefill] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from clap import io
from clap.judge.evaluation import eval_params
from clap.model.base import load_model, load_tokenizer
from clap.model.generate import encode_chats, generate_batched, stop_ids
from clap.task.answer import load_answer_schema
from clap.task.prompt import build_messages

ROOT = Path(__file__).resolve().parents[1]


def _jsonl(path: Path) -> list[dict]:
    """Well-formed object rows of a raw export (the demo data has malformed rows on purpose)."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append(row) if isinstance(row, dict) else None
    return rows


def raw_items(batch_dir: Path, n: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """The first ``n`` eval questions of a raw batch with their retrieved documents (doc id, body)."""
    kb = {
        d["doc_id"]: d["body"]
        for d in _jsonl(batch_dir / "kb_documents.jsonl")
        if isinstance(d.get("body"), str)
    }
    questions = [
        q
        for q in _jsonl(batch_dir / "question_log.jsonl")
        if q.get("split") == "eval" and isinstance(q.get("question"), str)
    ]
    return [
        (q["question"], [(d, kb[d]) for d in q.get("context_doc_ids") or [] if d in kb])
        for q in questions[:n]
    ]


def raw_chats(batch_dir: Path, n: int) -> list[list[dict[str, str]]]:
    """The first ``n`` eval questions of a raw batch with their retrieved documents as context."""
    answer = load_answer_schema(ROOT / "params.yaml")
    return [build_messages(q, docs, answer) for q, docs in raw_items(batch_dir, n)]


def naive(model, tok, chats, max_new_tokens: int) -> tuple[list[str], float]:
    """One unpadded greedy ``generate`` per item."""
    texts, start = [], time.perf_counter()
    for ids in encode_chats(tok, chats):
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=stop_ids(model, tok),
            )
        texts.append(tok.decode(out[0, len(ids) :], skip_special_tokens=True))
    return texts, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--batch", default="2026-01")
    ap.add_argument("--base", type=Path, default=ROOT / "models/base")
    ap.add_argument(
        "--adapter",
        type=Path,
        help="a trained adapter folder (its answers stop at EOS; the base often rambles)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one per core)")
    ap.add_argument(
        "--prefill",
        action="store_true",
        help="also time prompt processing alone (max_new_tokens=1) both ways",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    p = eval_params(ROOT / "params.yaml")
    chats = raw_chats(ROOT / "data/raw" / args.batch, args.items)
    model, tok = load_model(args.base, args.adapter), load_tokenizer(args.base, padding_side="left")
    start = time.perf_counter()
    gens = generate_batched(
        model, tok, chats, batch_size=p.batch_size, max_new_tokens=p.max_new_tokens, desc="batched"
    )
    batched_s = time.perf_counter() - start
    naive_texts, naive_s = naive(model, tok, chats, p.max_new_tokens)
    same = sum(g.text == t for g, t in zip(gens, naive_texts))
    result = {
        "items": len(chats),
        "batch_size": p.batch_size,
        "max_new_tokens": p.max_new_tokens,
        "model": f"{args.base.name}" + (f" + adapter {args.adapter.name}" if args.adapter else ""),
        "longest_answer_tokens": max(g.new_tokens for g in gens),
        # decode steps: naive runs one per new token; a batch runs until its longest answer ends
        "naive_decode_steps": sum(g.new_tokens for g in gens),
        "batched_decode_steps": sum(
            max(g.new_tokens for g in gens if g.batch_index == b) for b in {g.batch_index for g in gens}
        ),
        "batched_s": round(batched_s, 2),
        "naive_s": round(naive_s, 2),
        "batched_items_per_s": round(len(chats) / batched_s, 3),
        "naive_items_per_s": round(len(chats) / naive_s, 3),
        "speedup": round(naive_s / batched_s, 2),
        "identical_outputs": same,
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, device {model.device}, load avg {os.getloadavg()[0]:.1f} (shared machine)".replace(
            "  ", " "
        ),
    }
    if args.prefill:
        start = time.perf_counter()
        generate_batched(model, tok, chats, batch_size=p.batch_size, max_new_tokens=1, desc="prefill")
        result["batched_prefill_s"] = round(time.perf_counter() - start, 2)
        result["naive_prefill_s"] = round(naive(model, tok, chats, 1)[1], 2)
        result["prompt_tokens_mean"] = round(sum(g.prompt_tokens for g in gens) / len(gens), 1)
    print(json.dumps(result, indent=2))
    if args.out:
        io.write_json(args.out, result)
    assert same == len(chats), (
        f"batched and naive outputs differ on {len(chats) - same} of {len(chats)} items"
    )


if __name__ == "__main__":
    main()
