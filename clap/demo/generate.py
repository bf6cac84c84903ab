"""``clap demo-data``: the deterministic generator of the demo raw batches (data/raw/<batch>/).

Each batch is a month of a plant's exports (docs/data-contract.md): MES shift reports,
QMS inspections, CMMS tickets, KB documents describing each record, and the question log
with reviewer gold answers. Everything is drawn from one seeded generator per batch
(params.yaml ``demo``), so regenerating gives byte-identical files; MANIFEST.json records
sizes and the exact count (and physical lines) of every injected noise kind.

Pipeline: :mod:`clap.demo.world` (clean facts and questions) -> optional answer shuffle
(corrupted batch) -> :mod:`clap.demo.render` rows -> :mod:`clap.demo.noise` -> render.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clap import io, params
from clap.demo import exports as A
from clap.demo.noise import CATALOGUE, FILE_ORDER, inject
from clap.demo.render import Row, build_rows, render
from clap.demo.world import build_world, wrong_column_answers
from clap.errors import ClapError

KINDS = ("clean", "corrupted", "shifted")
FORMATS = {
    A.MES: "';' delimiter, '\"' quoting, decimal comma, day-first dates (DD.MM.YYYY), UTF-8, LF",
    A.QMS: "JSON lines; recorded_at ISO-8601 with offset (or YYYY/MM/DD HH:MM); measured a JSON number",
    A.CMMS: "',' delimiter, '\"' quoting with multi-line free text, US dates (MM/DD/YYYY HH:MM), CRLF",
    A.KB: "JSON lines; body prose uses a decimal point and canonical units",
    A.QLOG: "JSON lines; gold.date dotted = day-first, slashed with year last = US (month first)",
}


@dataclass(frozen=True)
class NoiseRates:
    """Fraction of a file's clean rows that get each noise kind (params ``demo.noise``)."""

    numeric_prefix_label: float
    unit_variant: float
    date_format_variant: float
    duplicate_within_system: float
    duplicate_across_systems: float
    evidence_not_verbatim: float
    evidence_not_verbatim_unrepairable: float
    evidence_missing_value: float
    overlap_id: float
    overlap_text: float
    malformed_missing_field: float
    malformed_wrong_type: float
    malformed_broken_quoting: float
    trailing_whitespace: float
    unicode_lookalike: float


@dataclass(frozen=True)
class BatchSpec:
    """One batch of params ``demo.batches``."""

    kind: str  # clean | corrupted | shifted
    train: int
    eval: int
    replay: int
    lines: list[str]
    mix: str  # a key of demo.mixes
    phrasing: str  # standard | shifted
    cmms_encoding: str


@dataclass(frozen=True)
class DemoParams:
    """params.yaml section ``demo``."""

    seed: int
    scale: float
    extra_facts: float
    orphan_facts: float
    distractors: list[int]
    body_words: list[int]
    same_metric_distractor: float
    value_as_text: float
    mixes: dict[str, dict[str, float]]
    batches: dict[str, dict[str, Any]]
    noise: NoiseRates


def load_params(path: Path | str = params.DEFAULT_PATH) -> DemoParams:
    """The ``demo`` section, with every batch spec checked."""
    p = params.section("demo", DemoParams, path)
    for name in p.batches:
        batch_spec(p, name, path)
    return p


def batch_spec(p: DemoParams, name: str, path: Path | str = params.DEFAULT_PATH) -> BatchSpec:
    """The spec of batch ``name`` (ClapError if it is not configured or invalid)."""
    if name not in p.batches:
        raise ClapError(
            f"batch {name!r} is not in params demo.batches {sorted(p.batches)}",
            file=path,
            column="demo.batches",
            rule="unknown_batch",
        )
    spec = params.build(BatchSpec, p.batches[name], where=f"demo.batches.{name}", file=path)
    params.check_keys(
        {f"demo.batches.{name}.kind": spec.kind in KINDS, f"demo.batches.{name}.mix": spec.mix in p.mixes},
        f"batch {name}: kind must be one of {KINDS} and mix one of {sorted(p.mixes)}",
        path,
    )
    return spec


def batch_rng(p: DemoParams, name: str) -> np.random.Generator:
    """The batch's own stream: batches do not shift each other when one changes."""
    return np.random.default_rng([p.seed, int(name.replace("-", ""))])


def generate_batch(name: str, p: DemoParams) -> dict[str, bytes]:
    """All files of one batch (the five exports and MANIFEST.json) as bytes.

    Args:
        name: batch name ``YYYY-MM`` configured in ``p.batches``.
        p: the demo params.

    Returns:
        file name -> exact file bytes.
    """
    spec = batch_spec(p, name)
    rng = batch_rng(p, name)
    world = build_world(name, spec, p, rng)
    moved = wrong_column_answers(world.items) if spec.kind == "corrupted" else 0
    rows = build_rows(world, p.value_as_text, rng)
    counts = inject(rows, world, p.noise, rng)
    texts = {f: render(f, rows[f]) for f in FILE_ORDER}
    encodings = {f: (spec.cmms_encoding if f == A.CMMS else "utf-8") for f in FILE_ORDER}
    files = {f: _encode(texts[f], encodings[f], f) for f in FILE_ORDER}
    counts["non_utf8_file"] = {A.CMMS: int(encodings[A.CMMS] != "utf-8")}
    counts["answer_wrong_column"] = {A.QLOG: moved}
    manifest = _manifest(name, spec, p, world, rows, counts, encodings)
    files["MANIFEST.json"] = io.dumps_json(manifest).encode("utf-8")
    return files


def _encode(text: str, encoding: str, file: str) -> bytes:
    data = text.encode(encoding)
    if encoding != "utf-8":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return data
        raise ValueError(f"{file} in {encoding} would also decode as UTF-8: it needs non-ASCII text")
    return data


def _manifest(
    name: str,
    spec: BatchSpec,
    p: DemoParams,
    world,
    rows: dict[str, list[Row]],
    counts: dict[str, dict[str, int]],
    encodings: dict[str, str],
) -> dict[str, Any]:
    sizes = {s: sum(it.split == s for it in world.items) for s in A.SPLITS}
    return {
        "batch": name,
        "kind": spec.kind,
        "seed": p.seed,
        "scale": p.scale,
        "generator": "clap demo-data",
        "lines": list(spec.lines),
        "metric_mix": spec.mix,
        "phrasing": spec.phrasing,
        "sizes": {
            **sizes,
            "facts": len(world.facts),
            "orphan_facts": sum(f.role == "orphan" for f in world.facts),
        },
        "rows": {f: len(rows[f]) for f in FILE_ORDER},
        "encodings": encodings,
        "formats": FORMATS,
        "noise": {k: sum(counts.get(k, {}).values()) for k in CATALOGUE},
        "noise_by_file": {f: {k: c[f] for k, c in sorted(counts.items()) if c.get(f)} for f in FILE_ORDER},
        "noise_lines": _noise_lines(rows),
    }


def _noise_lines(rows: dict[str, list[Row]]) -> dict[str, list[str]]:
    """kind -> sorted ``file:line`` of every noisy row (the copy for duplicates, the twin for twins)."""
    out: dict[str, list[str]] = {k: [] for k in CATALOGUE if k != "non_utf8_file"}
    for f in FILE_ORDER:
        for r in sorted(rows[f], key=lambda r: r.line):
            if r.noise in out:
                out[r.noise].append(f"{f}:{r.line}")
            moved = f == A.QLOG and r.ref.split == "train" and r.ref.answer is not r.ref.fact
            if moved and r.noise != "duplicate_within_system":  # the copy is counted as a duplicate
                out["answer_wrong_column"].append(f"{f}:{r.line}")
    return out


def write_batch(out_root: Path | str, name: str, files: dict[str, bytes]) -> Path:
    """Replace ``out_root/name`` atomically with exactly ``files``."""
    target = Path(out_root) / name
    with io.atomic_dir(target) as tmp:
        for fname, data in files.items():
            io.atomic_write_bytes(tmp / fname, data)
    return target


def generate(out_root: Path | str, p: DemoParams, batches: list[str] | None = None) -> list[Path]:
    """Generate and write the given batches (all configured ones by default).

    Returns:
        The batch folders written.
    """
    names = batches if batches else sorted(p.batches)
    return [write_batch(out_root, n, generate_batch(n, p)) for n in names]
