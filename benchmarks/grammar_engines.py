"""Grammar engines for clap's per-request answer schema: compile time, mask time, mask agreement.

No language model is loaded: every engine walks the same fixed reference answer (the item's gold
answer as ``clap.task.prompt.format_answer`` writes it, tokenized by the base tokenizer, then
EOS) inside the item's schema (``answer_space(normalize).schema(docs)``, exactly what
constrained decoding compiles). Per step an engine computes its allowed-token mask and accepts
the reference token; a reference token outside the mask is a rejection (a correctness finding).
Allowed sets are compared with xgrammar's (the engine clap uses) at every step.

Engines: xgrammar (clap's layout: ``any_whitespace=False``, ``", "``/``": "``), llguidance
(``whitespace_flexible: False`` with the same separators), lm-format-enforcer (field order
forced, at most one consecutive whitespace: the closest it gets; it cannot forbid whitespace
between tokens) and outlines' engine ``outlines_core`` (regex from the schema, then an index over
the vocabulary). The ``outlines`` package itself is not installed into the project venv (it
would add pillow, jsonschema, cloudpickle and more); ``outlines_core`` (no dependencies) is what
it and vLLM's outlines backend run, and is measured when importable (``--outlines-core-path``
adds a ``pip install --target`` folder to ``sys.path``).

Single-threaded throughout (compilers with one thread, RAYON_NUM_THREADS=1, torch one thread):
the benchmark shares the machine with training and measures per-request cost, not parallel
throughput.

    nice -n 10 .venv/bin/python benchmarks/grammar_engines.py [--n 40] [--out benchmarks/results/grammar_engines.json]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # llguidance / outlines_core: no thread pools
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.metadata as md
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's clap, not an installed one
VOCAB = 49152


def _ms(ns: float) -> float:
    return ns / 1e6


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p95": None, "mean": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(a)),
        "p95": float(np.percentile(a, 95)),
        "mean": float(a.mean()),
        "max": float(a.max()),
    }


def bits_to_bool(words: Any) -> np.ndarray:
    """An int32 bitmask (bit i of word i // 32 = token i allowed) as a bool array of VOCAB."""
    a = np.ascontiguousarray(np.asarray(words, dtype=np.int32).reshape(-1)).view(np.uint8)
    return np.unpackbits(a, bitorder="little")[:VOCAB].astype(bool)


def ids_to_bool(ids: Any) -> np.ndarray:
    out = np.zeros(VOCAB, dtype=bool)
    ids = np.asarray(list(ids), dtype=np.int64)
    out[ids[ids < VOCAB]] = True
    return out


def package_info(dist: str, folders: list[str]) -> dict[str, Any]:
    """Version, declared dependencies (and which are absent) and the size of its site-packages folders."""
    try:
        meta = md.distribution(dist)
    except md.PackageNotFoundError:
        return {"installed": False}
    reqs = [r for r in (meta.requires or []) if "extra ==" not in r]
    missing = []
    for r in reqs:
        name = r.split(";")[0].split("[")[0]
        for sep in "<>=!~ (":
            name = name.split(sep)[0]
        try:
            md.version(name.strip())
        except md.PackageNotFoundError:
            missing.append(name.strip())
    site = Path(str(meta.locate_file("")))
    paths = [site / f for f in folders if (site / f).exists()]
    size = 0
    if paths:
        du = subprocess.run(["du", "-sk", *map(str, paths)], capture_output=True, text=True).stdout
        size = sum(int(line.split()[0]) for line in du.splitlines() if line.strip())
    return {
        "installed": True,
        "version": meta.version,
        "site_packages": str(site),
        "folders": [p.name for p in paths],
        "size_mib": round(size / 1024, 1),
        "requires": reqs,
        "requires_not_installed": missing,
    }


def simulate_jump_forward(accept, forced, ref: list[int], tok) -> dict[str, int]:
    """Generator-style decoding of ``ref``: after each free token, accept the tokens the grammar forces.

    As clap's generator does with xgrammar (``RowMatcher.forced`` after every sampled token):
    free tokens come from the reference; when a jump splits the text differently from the
    tokenizer, the rest of the reference is re-encoded after it (``retokenized_jumps``).
    """
    eos, text = ref[-1], tok.decode(ref[:-1])
    rest, accepted = list(ref), []
    free = n_forced = jumps = retokenized = off_reference = 0
    while rest:
        t = rest.pop(0)
        if not accept(t):
            off_reference += 1
            break
        free += 1
        if t == eos:
            break
        accepted.append(t)
        jf = list(forced())
        if not jf:
            continue
        if not text.startswith(tok.decode(accepted + jf)):
            off_reference += 1
            break
        for j in jf:
            accept(j)
        jumps, n_forced = jumps + 1, n_forced + len(jf)
        accepted.extend(jf)
        if rest[: len(jf)] == jf:
            rest = rest[len(jf) :]
        else:
            retokenized += 1
            rest = tok.encode(text[len(tok.decode(accepted)) :], add_special_tokens=False) + [eos]
    return {
        "free_steps": free,
        "forced_tokens": n_forced,
        "jumps": jumps,
        "retokenized_jumps": retokenized,
        "off_reference": off_reference,
    }


# ---------------------------------------------------------------- engines
#
# Each engine: setup(tok, eos) once (tokenizer tables), compile(schema) -> state per item, and
# walk(state, ref) -> per step (allowed mask as bool array, mask+accept ns, accepted?).


class XGrammar:
    name = "xgrammar"
    dist, folders = "xgrammar", ["xgrammar", "tvm_ffi"]  # tvm_ffi: apache-tvm-ffi, its runtime

    def setup(self, tok, eos: int) -> None:
        import torch
        import xgrammar as xgr

        self.xgr, self.torch = xgr, torch
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, VOCAB)

    def compile(self, schema_json: str):
        return self.compiler.compile_json_schema(
            schema_json, any_whitespace=False, separators=(", ", ": "), strict_mode=True
        )

    def walk(self, compiled, ref: list[int]):
        m = self.xgr.GrammarMatcher(compiled)
        steps = []
        for t in ref:
            t0 = time.perf_counter_ns()
            m.fill_next_token_bitmask(self.bitmask, 0)
            ok = m.accept_token(t)
            dt = time.perf_counter_ns() - t0
            steps.append((bits_to_bool(self.bitmask[0].numpy()), dt, bool(ok)))
            if not ok:
                break
        return steps, m.is_terminated()

    def jump_forward(self, compiled, ref: list[int], tok) -> dict[str, int]:
        m = self.xgr.GrammarMatcher(compiled)
        return simulate_jump_forward(m.accept_token, m.find_jump_forward_tokens, ref, tok)


class LLGuidance:
    name = "llguidance"
    dist, folders = "llguidance", ["llguidance"]

    def setup(self, tok, eos: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.lltorch = llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=VOCAB, eos_token=eos)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, VOCAB)

    def compile(self, schema_json: str):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema_json,
            defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        )
        m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return (grammar, m)

    def walk(self, compiled, ref: list[int]):
        grammar, m = compiled
        if m.is_stopped() or m.is_error():  # second walk of the same grammar: a fresh matcher
            m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        steps = []
        for t in ref:
            t0 = time.perf_counter_ns()
            self.lltorch.fill_next_token_bitmask(m, self.bitmask, 0)
            ok = m.consume_token(t)
            dt = time.perf_counter_ns() - t0
            steps.append((bits_to_bool(self.bitmask[0].numpy()), dt, bool(ok)))
            if not ok:
                break
        return steps, m.is_stopped()

    def jump_forward(self, compiled, ref: list[int], tok) -> dict[str, int]:
        m = self.ll.LLMatcher(self.tokenizer, compiled[0], log_level=0)
        return simulate_jump_forward(m.consume_token, m.compute_ff_tokens, ref, tok)


class LMFormatEnforcer:
    name = "lm-format-enforcer"
    dist, folders = "lm-format-enforcer", ["lmformatenforcer"]

    def setup(self, tok, eos: int) -> None:
        from lmformatenforcer import CharacterLevelParserConfig, JsonSchemaParser, TokenEnforcer

        self.Parser, self.Enforcer, self.Config = JsonSchemaParser, TokenEnforcer, CharacterLevelParserConfig
        try:
            from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

            self.note = "tokenizer data from lmformatenforcer.integrations.transformers"
        except ImportError as e:
            build_token_enforcer_tokenizer_data = _lmfe_tokenizer_data
            self.note = (
                f"lmformatenforcer.integrations.transformers does not import here ({e}; it imports "
                "transformers.tokenization_utils, gone in transformers 5): its "
                "build_token_enforcer_tokenizer_data is reproduced line for line"
            )
        self.data = build_token_enforcer_tokenizer_data(tok, vocab_size=VOCAB)

    def compile(self, schema_json: str):
        enforcer = self.Enforcer(self.data, self.Parser(json.loads(schema_json)))
        # TokenEnforcer replaces the parser's config; the tightest it offers: keys in the
        # required order, at most one whitespace in a row (none at all would forbid ", ").
        enforcer.root_parser.config = self.Config(
            alphabet=self.data.tokenizer_alphabet, max_consecutive_whitespaces=1, force_json_field_order=True
        )
        return enforcer

    def walk(self, enforcer, ref: list[int]):
        steps = []
        for i, t in enumerate(ref):
            t0 = time.perf_counter_ns()
            allowed = enforcer.get_allowed_tokens(ref[:i]).allowed_tokens
            dt = time.perf_counter_ns() - t0
            mask = ids_to_bool(allowed)
            ok = bool(mask[t])
            steps.append((mask, dt, ok))
            if not ok:
                break
        return steps, bool(steps) and steps[-1][2]


def _lmfe_tokenizer_data(tokenizer, use_bitmask: bool = False, vocab_size: int | None = None):
    """lmformatenforcer 0.11.3's ``build_token_enforcer_tokenizer_data`` (integrations/transformers.py)."""
    import functools

    from lmformatenforcer import TokenEnforcerTokenizerData

    vocab_size = vocab_size or len(tokenizer)
    token_0 = tokenizer.encode("0")[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for idx in range(vocab_size):
        if idx in special:
            continue
        after_0 = tokenizer.decode([token_0, idx])[1:]
        regular.append((idx, after_0, len(after_0) > len(tokenizer.decode([idx]))))

    def decode(tok, tokens):
        return tok.decode(tokens).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(
        regular, functools.partial(decode, tokenizer), tokenizer.eos_token_id, use_bitmask, vocab_size
    )


class OutlinesCore:
    name = "outlines_core"
    dist, folders = "outlines_core", ["outlines_core"]

    def setup(self, tok, eos: int) -> None:
        import outlines_core as oc
        import torch
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.regex_of = oc, build_regex_from_schema
        # byte-level BPE: each token's bytes through GPT-2's byte <-> unicode table
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        byte_of = {chr(c): b for b, c in zip(bs, cs)}
        special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
        table: dict[bytes, list[int]] = {}
        for i, piece in enumerate(tok.convert_ids_to_tokens(list(range(VOCAB)))):
            if i in special or piece is None:
                continue
            table.setdefault(bytes(byte_of[ch] for ch in piece), []).append(i)
        self.vocabulary, self.eos = oc.Vocabulary(eos, table), eos
        self.mask = torch.zeros(VOCAB // 32, dtype=torch.int32)

    def compile(self, schema_json: str):
        # whitespace_pattern None -> "[ ]?" at every token boundary: the only pattern that admits
        # ", " and ": " ("" forbids them, " " demands spaces after "{" as well)
        return self.oc.Index(self.regex_of(schema_json), self.vocabulary)

    def walk(self, index, ref: list[int]):
        g = self.oc.Guide(index)
        steps = []
        for t in ref:
            t0 = time.perf_counter_ns()
            g.write_mask_into(self.mask.data_ptr(), self.mask.numel(), 4)
            try:  # EOS has no transition (generation ends there): allowed when the mask says so
                if t != self.eos:
                    g.advance(t, return_tokens=False)
                ok = True
            except ValueError:  # no transition: the token is refused
                ok = False
            dt = time.perf_counter_ns() - t0
            mask = bits_to_bool(self.mask.numpy())
            ok = ok and bool(mask[t])
            steps.append((mask, dt, ok))
            if not ok:
                break
        return steps, g.is_finished()


ENGINES = {e.name: e for e in (XGrammar, LLGuidance, LMFormatEnforcer, OutlinesCore)}


# ---------------------------------------------------------------- items


def load_items(admitted: Path, n: int):
    import pandas as pd

    from clap import params
    from clap.chain.grounding import answer_space
    from clap.data.normalize import NormalizeParams
    from clap.judge.evaluation import item_contexts
    from clap.task.answer import gold_of, load_answer_schema
    from clap.task.prompt import format_answer

    items = pd.read_parquet(admitted / "eval.parquet").head(n)
    kb = pd.read_parquet(admitted / "kb.parquet")
    answer = load_answer_schema(ROOT / "params.yaml")
    space = answer_space(params.section("normalize", NormalizeParams, ROOT / "params.yaml"), answer)
    out, skipped = [], []
    for row, docs in zip(items.to_dict("records"), item_contexts(items, kb)):
        schema = space.schema(docs)
        gold = gold_of(row, answer)
        branch = next(
            (
                b
                for b in schema.get("anyOf", [schema])
                if b["properties"]["metric"].get("const") == gold["metric"]
            ),
            None,
        )
        why = None
        if branch is None:
            why = "metric not in the schema"
        else:
            for field in ("line", "shift", "date", "evidence", "unit"):
                p = branch["properties"][field]
                allowed = p.get("enum", [p["const"]] if "const" in p else None)
                if allowed is not None and gold[field] not in allowed:
                    why = f"gold {field} not in the schema"
                    break
        if why:
            skipped.append({"item_id": row["item_id"], "reason": why})
            continue
        out.append(
            {
                "item_id": row["item_id"],
                "schema_json": json.dumps(schema, ensure_ascii=False),
                "answer": format_answer(gold, answer),
            }
        )
    return out, skipped


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="first N admitted eval items (default 40)")
    ap.add_argument("--admitted", type=Path, default=ROOT / "data/admitted/2026-01")
    ap.add_argument(
        "--base", type=Path, default=ROOT / "models/base", help="base model folder (tokenizer only)"
    )
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {list(ENGINES)}")
    ap.add_argument(
        "--outlines-core-path", type=Path, default=None, help="folder holding outlines_core (pip --target)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/grammar_engines.json")
    args = ap.parse_args(argv)
    if args.outlines_core_path:
        sys.path.insert(0, str(args.outlines_core_path))

    import torch

    torch.set_num_threads(1)
    from clap.model.base import load_tokenizer

    tok = load_tokenizer(args.base, padding_side="left")
    eos = int(tok.eos_token_id)
    items, skipped = load_items(args.admitted, args.n)
    refs = [tok.encode(it["answer"], add_special_tokens=False) + [eos] for it in items]
    print(f"{len(items)} items ({len(skipped)} skipped), {sum(map(len, refs))} reference tokens", flush=True)

    names = [n for n in args.engines.split(",") if n]
    results: dict[str, Any] = {}
    masks: dict[str, list[list[np.ndarray]]] = {}
    for name in names:
        eng = ENGINES[name]()
        res: dict[str, Any] = {"package": package_info(eng.dist, eng.folders)}
        results[name] = res
        try:
            t0 = time.perf_counter()
            eng.setup(tok, eos)
            res["setup_s"] = round(time.perf_counter() - t0, 3)
            if getattr(eng, "note", None):
                res["note"] = eng.note
        except Exception as e:  # noqa: BLE001 - an engine that cannot start is a finding, not a crash
            res["status"] = f"not measured: {type(e).__name__}: {e}"
            print(name, res["status"], flush=True)
            continue
        compile_ms, step_us, total_ms, allowed_counts = [], [], [], []
        rejected, unfinished, errors, item_masks = [], [], [], []
        for it, ref in zip(items, refs):
            try:
                t0 = time.perf_counter_ns()
                state = eng.compile(it["schema_json"])
                c = _ms(time.perf_counter_ns() - t0)
                steps, finished = eng.walk(state, ref)
            except Exception as e:  # noqa: BLE001
                errors.append({"item_id": it["item_id"], "error": f"{type(e).__name__}: {e}"[:300]})
                item_masks.append(None)
                continue
            compile_ms.append(c)
            step_us.extend(dt / 1e3 for _, dt, _ in steps)
            total_ms.append(c + sum(_ms(dt) for _, dt, _ in steps))
            allowed_counts.extend(int(m.sum()) for m, _, _ in steps)
            if not all(ok for _, _, ok in steps):
                i = len(steps) - 1
                rejected.append(
                    {
                        "item_id": it["item_id"],
                        "step": i,
                        "token": ref[i],
                        "token_text": tok.decode([ref[i]]),
                        "text_before": tok.decode(ref[:i]),
                        "allowed_count": int(steps[-1][0].sum()),
                    }
                )
            elif not finished:
                unfinished.append(it["item_id"])
            item_masks.append([m for m, _, _ in steps])
            if hasattr(eng, "jump_forward"):
                it.setdefault("jump_forward", {})[name] = eng.jump_forward(state, ref, tok)
        masks[name] = item_masks
        res.update(
            {
                "status": "measured",
                "items": len(compile_ms),
                "compile_ms": _stats(compile_ms),
                "mask_accept_us_per_token": _stats(step_us),
                "total_ms_per_answer": _stats(total_ms),
                "allowed_tokens_per_step": _stats(allowed_counts),
                "rejected_references": len(rejected),
                "rejections": rejected[:10],
                "not_finished_after_eos": unfinished,
                "errors": errors[:10],
                "error_count": len(errors),
            }
        )
        print(
            f"{name}: compile med {res['compile_ms']['median']} ms, step med "
            f"{res['mask_accept_us_per_token']['median']} us, rejected {len(rejected)}, errors {len(errors)}",
            flush=True,
        )

    # agreement of allowed sets with xgrammar, step by step (only steps both engines reached)
    if "xgrammar" in masks:
        for name, per_item in masks.items():
            if name == "xgrammar":
                continue
            same = total = 0
            extra, missing, examples = [], [], []
            for it, ref, a_steps, b_steps in zip(items, refs, masks["xgrammar"], per_item):
                if a_steps is None or b_steps is None:
                    continue
                for i, (a, b) in enumerate(zip(a_steps, b_steps)):
                    total += 1
                    if np.array_equal(a, b):
                        same += 1
                        continue
                    extra.append(int((b & ~a).sum()))
                    missing.append(int((a & ~b).sum()))
                    if len(examples) < 8:
                        examples.append(
                            {
                                "item_id": it["item_id"],
                                "step": i,
                                "text_before": tok.decode(ref[:i]),
                                "xgrammar_allowed": int(a.sum()),
                                "engine_allowed": int(b.sum()),
                                "only_engine": [tok.decode([t]) for t in np.flatnonzero(b & ~a)[:8]],
                                "only_xgrammar": [tok.decode([t]) for t in np.flatnonzero(a & ~b)[:8]],
                            }
                        )
            results[name]["agreement_with_xgrammar"] = {
                "steps_compared": total,
                "identical_steps": same,
                "share_identical": round(same / total, 4) if total else None,
                "differing_steps_extra_tokens": _stats(extra),
                "differing_steps_missing_tokens": _stats(missing),
                "examples": examples,
            }

    def jump_summary(name: str) -> dict[str, Any] | None:
        jf = [it["jump_forward"][name] for it in items if name in it.get("jump_forward", {})]
        if not jf:
            return None
        total = sum(j["forced_tokens"] + j["free_steps"] for j in jf)
        return {
            "per_answer": {k: _stats([j[k] for j in jf]) for k in jf[0]},
            "forced_share_of_tokens": round(sum(j["forced_tokens"] for j in jf) / max(1, total), 4),
            "answers_with_retokenized_jumps": sum(1 for j in jf if j["retokenized_jumps"]),
            "answers_off_reference": sum(1 for j in jf if j["off_reference"]),
        }

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    field = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in cpu.splitlines())}
    outlines_pkg = package_info("outlines", ["outlines"])
    report = {
        "batch": args.admitted.name,
        "admitted": str(args.admitted),
        "command": " ".join(["benchmarks/grammar_engines.py", *(argv if argv is not None else sys.argv[1:])]),
        "n_requested": args.n,
        "items_measured": len(items),
        "items_skipped": len(skipped),
        "skipped": skipped,
        "reference_tokens": {"total": sum(map(len, refs)), **_stats([len(r) for r in refs])},
        "tokenizer": {"vocab_size": VOCAB, "len": len(tok), "eos_id": eos},
        "machine": {
            "cpu_model": field.get("Model name"),
            "cpus": field.get("CPU(s)"),
            "threads_per_core": field.get("Thread(s) per core"),
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
            "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS"),
            "load_average_at_end": os.getloadavg(),
        },
        "engines": results,
        "outlines_package": outlines_pkg
        if outlines_pkg.get("installed")
        else {
            "installed": False,
            "note": "not installed into the project venv: `pip install outlines` (1.3.3) would add "
            "cloudpickle, genson, jsonschema, jsonschema-specifications, referencing, rpds-py, "
            "pillow and outlines_core; its grammar engine outlines_core is measured instead",
        },
        "xgrammar_jump_forward": jump_summary("xgrammar"),
        "llguidance_fast_forward": jump_summary("llguidance"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
