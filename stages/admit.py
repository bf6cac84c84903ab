"""admit: the pre-training gate for one batch, recomputed from the normalized data.

usage: python stages/admit.py data/normalized/<b> data/admitted/<b> metrics/admit/<b>.json [data/normalized]

in:  data/normalized/<b>/{sft,grpo,eval,replay,kb}.parquet; the training pool of every batch before <b>
     in params `batches`, data/normalized/<earlier>/sft.parquet (what earlier adapters may have trained on:
     excluded from <b>'s held-out splits, and from its GRPO split and probe under `warm_start.mode: incumbent`,
     clap/data/admission.py); params.yaml `batches`, `admit`, `sizes`, `normalize` (evidence vocabulary),
     `scoring` (the GRPO reward), `warm_start.mode`. Without the fourth argument no earlier batch is read
     (`clap certify`'s control batches: each judged against the base alone)
out: data/admitted/<b>/{sft,grpo,eval,probe,replay,kb}.parquet and admission.json (verdict,
     reasons, every check); flat metrics json (`admitted` 0/1). A batch that is not admitted
     still gets every file: later stages read the verdict and refuse to train or promote it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clap import io, params, stage
from clap.data.admission import AdmitParams, SplitSizes, admit_batch, admitted_set, seen_in_training
from clap.data.normalize import build_vocab, normalize_params
from clap.determinism import frame_hashes
from clap.errors import ClapError
from clap.task.scoring import reward, scoring_params
from schemas.admitted import AdmittedSet, admitted_items, admitted_kb, unseen_in_earlier_training
from schemas.normalized import normalized_items, normalized_kb, validate_frame

USAGE = "usage: python stages/admit.py NORMALIZED_DIR OUT_DIR METRICS_JSON [NORMALIZED_ROOT]"
POOLS = ("sft", "grpo", "eval", "replay", "kb")


def earlier_batches(batch: str) -> list[str]:
    """The batches before ``batch`` in params ``batches`` (error when it is not listed: no order)."""
    listed = params.load().get("batches")
    listed = [listed] if isinstance(listed, str) else list(listed or [])
    if batch not in listed:
        raise ClapError(
            f"batch {batch!r} is not in params `batches` {listed}: which batches came before it is unknown",
            file=params.DEFAULT_PATH,
            column="batches",
            rule="batch_not_listed",
        )
    return listed[: listed.index(batch)]


def run(src: Path, out_dir: Path, metrics_path: Path, normalized_root: Path | None = None) -> dict:
    """Admit one batch and write its folder and metrics; returns the admission record.

    Without ``normalized_root`` no earlier batch is read: a batch judged against the base alone, as
    `clap certify` prepares a control batch (no incumbent, a fresh adapter).
    """
    started = time.perf_counter()
    p = params.section("admit", AdmitParams)
    sizes = params.section("sizes", SplitSizes)
    vocab = build_vocab(normalize_params())
    sp = scoring_params()
    # the candidate continues an earlier adapter
    warm = params.raw_section("warm_start")["mode"] == "incumbent"
    pools = {
        name: validate_frame(
            normalized_kb(vocab) if name == "kb" else normalized_items(vocab),
            io.read_parquet(src / f"{name}.parquet"),
            str(src / f"{name}.parquet"),
        )
        for name in POOLS
    }
    earlier = {
        b: validate_frame(
            normalized_items(vocab),
            io.read_parquet(normalized_root / b / "sft.parquet"),
            str(normalized_root / b / "sft.parquet"),
        )
        for b in (earlier_batches(src.name) if normalized_root is not None else [])
    }
    result = admit_batch(
        pools,
        sizes,
        p,
        vocab,
        lambda text, gold, ctx: reward(text, gold, ctx, sp),
        out_dir.name,
        sp.answer,
        seen_in_training(earlier, sp.answer),
        warm=warm,
    )
    frames = {
        name: validate_frame(
            admitted_kb(vocab) if name == "kb" else admitted_items(vocab),
            df,
            str(out_dir / f"{name}.parquet"),
        )
        for name, df in result.frames.items()
    }
    seen = seen_in_training(earlier, sp.answer)
    # excluded by construction: a failure here is a bug (grpo and the probe only for a warm-started candidate)
    for name in ("grpo", "eval", "probe", "replay") if warm else ("eval", "replay"):
        validate_frame(
            unseen_in_earlier_training(seen, sp.answer), frames[name], str(out_dir / f"{name}.parquet")
        )
    if result.record["verdict"]:
        # an admitted batch must be leak-free as a whole; a refused one is written as is, for inspection
        validate_frame(AdmittedSet, admitted_set(frames), str(out_dir / "admission.json"))
    with io.atomic_dir(out_dir) as tmp:
        for name, df in frames.items():
            io.write_parquet(tmp / f"{name}.parquet", df)
        io.write_json(tmp / "admission.json", result.record)
    io.write_metrics_and_record(
        metrics_path,
        io.record_path(metrics_path),
        {
            **result.metrics,
            **frame_hashes(out_dir, frames),
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
    return result.record


def describe(argv, record: dict) -> str:
    verdict = "admitted" if record["verdict"] else "NOT admitted"
    return "\n".join(
        [f"admit {record['batch']}: {verdict}; {record['counts']}", *(f"  - {r}" for r in record["reasons"])]
    )


if __name__ == "__main__":
    sys.exit(stage.main(sys.argv[1:], USAGE, (3, 4), run, describe))
