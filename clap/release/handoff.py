"""Handoff artifacts of a release: model card, reproducibility manifest, cost report.

``releases/handoff/<batch>/`` receives three files, all derived from tracked records
(metrics/*, records/*, dvc.lock, params) and the artifact hashes an approval is bound to:

- ``README.md``: a Hugging Face model card (YAML front matter + markdown), validated
  offline: the front matter is parsed back and its required keys and types are checked
  here, and huggingface_hub's own parser must accept it (``ModelCard.validate()`` posts
  to the Hub, which is never called);
- ``manifest.json``: git commit, dvc.lock sha256, artifact and dataset hashes, package
  versions, seeds, hardware and the params each stage of the batch ran with;
- ``cost.json``: machine hours per stage from the wall times the stages record, against
  the budget in params ``release.cost``; a missing wall time is reported as missing. A stage that
  estimated its cost before it ran (train, :mod:`clap.train.budget`) has the estimate beside the
  wall time it turned out to be, and their ratio.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clap import io, vcs
from clap.params import bad_param
from clap.release.approval import Binding
from clap.task.answer import AnswerSchema, load_answer_schema

CARD, MANIFEST, COST = "README.md", "manifest.json", "cost.json"
COST_POLICIES = ("refuse", "hold")
MISSING_LOCK = "dvc.lock is missing: run `dvc repro` before a release"


@dataclass(frozen=True)
class CardParams:
    """params ``release.card``."""

    license: str
    task: str  # the model-index task name
    summary: str  # what the adapter does, in the card's first sentence
    tags: list[str]
    packages: list[str]


@dataclass(frozen=True)
class CostParams:
    """params ``release.cost``."""

    over_budget: str
    budget_cpu_hours: float
    budget_gpu_hours: float
    estimate_batches: int  # the train stage's throughput measurement (clap/train/budget.py); reported here
    stages: list[str]
    wall_time_key: str
    estimate_key: (
        str  # a stage's estimated seconds before it ran (the train stage's): shown beside its wall time
    )
    device_key: str


@dataclass(frozen=True)
class Handoff:
    """The three artifacts (not yet written) and every validation problem found in them."""

    card: str
    manifest: dict[str, Any]
    cost: dict[str, Any]
    problems: list[str]


def build_handoff(
    root: Path, binding: Binding, commit: str, card_p: CardParams, cost_p: CostParams
) -> Handoff:
    """Build and validate the handoff artifacts of ``binding.batch`` from the records under ``root``.

    Args:
        root: repository root.
        binding: the batch, decision and artifact hashes being released.
        commit: the git commit the release is made from.
        card_p: model card params.
        cost_p: cost report params.

    Returns:
        The artifacts and the list of problems (empty when all three are valid).
    """
    if cost_p.over_budget not in COST_POLICIES:
        raise bad_param(
            "release.cost.over_budget", f"release.cost.over_budget must be one of {COST_POLICIES}"
        )
    datasets = dataset_hashes(root, binding.batch)
    card = model_card(root, binding, datasets, card_p)
    manifest = reproducibility_manifest(root, binding, commit, datasets, card_p.packages)
    cost = cost_report(root, binding.batch, cost_p)
    problems = [f"model card: {p}" for p in validate_card(card)] + [
        f"manifest: {p}" for p in validate_manifest(manifest)
    ]
    return Handoff(card, manifest, cost, problems)


def write_handoff(handoff: Handoff, out_dir: Path) -> list[Path]:
    """Write the three artifacts into ``out_dir`` (each atomically); returns their paths."""
    out_dir = Path(out_dir)
    io.atomic_write_text(out_dir / CARD, handoff.card)
    io.write_json(out_dir / MANIFEST, handoff.manifest)
    io.write_json(out_dir / COST, handoff.cost)
    return [out_dir / CARD, out_dir / MANIFEST, out_dir / COST]


# ---------------------------------------------------------------- model card


def dataset_hashes(root: Path, batch: str) -> dict[str, str]:
    """Logical hashes (pyarrow-version independent) of the admitted training and eval sets."""
    admitted = Path(root) / "data" / "admitted" / batch
    return {
        split: io.logical_hash(io.read_parquet(admitted / f"{split}.parquet")) for split in ("sft", "eval")
    }


def _eval_metrics(root: Path, batch: str) -> list[dict[str, Any]]:
    record = io.read_json(Path(root) / "metrics" / "eval" / f"{batch}.json")
    numbers = {
        k: v for k, v in sorted(record.items()) if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return [
        {"type": k, "name": k.replace("_", " "), "value": v, "verified": False} for k, v in numbers.items()
    ]


def model_card(root: Path, binding: Binding, datasets: dict[str, str], p: CardParams) -> str:
    """The Hugging Face model card text (YAML front matter + markdown body)."""
    base = _base_record(root)
    b = binding.batch
    meta = {
        "base_model": str(base.get("source", "")),
        "datasets": [f"clap/{b}/{split}@sha256:{h}" for split, h in sorted(datasets.items())],
        "library_name": "peft",
        "license": p.license,
        "tags": list(p.tags),
        "model-index": [
            {
                "name": f"clap-adapter-{b}",
                "results": [
                    {
                        "task": {"type": "text-generation", "name": p.task},
                        "dataset": {
                            "name": f"clap {b} D_eval",
                            "type": f"clap/{b}/eval",
                            "split": "eval",
                            "revision": datasets["eval"],
                        },
                        "metrics": _eval_metrics(root, b),
                    }
                ],
            }
        ],
    }
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    gate = io.read_json(Path(root) / "metrics" / "gate" / f"{b}.json")
    lora = stage_record(root, "train", b)
    body = _card_body(binding, base, lora, p, load_answer_schema(Path(root) / "params.yaml"), gate)
    return f"---\n{front}---\n\n{body}"


PROMPT_FORMATS = {
    "tokenizer": "the base tokenizer's own chat template",
    "params": "params `base.plain_chat_template` (the base tokenizer has no chat template)",
}


def _card_body(
    binding: Binding,
    base: dict[str, Any],
    lora: dict[str, Any],
    p: CardParams,
    answer: AnswerSchema,
    gate: dict[str, Any],
) -> str:
    b = binding.batch
    prompt = PROMPT_FORMATS.get(str(base.get("chat_template")), "not recorded by the base stage")
    scenario = (
        "certified (`certification/record.json`)"
        if gate.get("certified")
        else f"**UNCERTIFIED**: {gate.get('certification', 'the gate recorded no certification status')}"
    )
    return f"""# clap LoRA adapter, batch {b}

A LoRA adapter for `{base.get("source", "?")}` that {p.summary} with one JSON object
({", ".join(answer.names)}; the evidence a verbatim quote) from retrieved documents. Trained and
evaluated by the clap pipeline on data batch `{b}`.

- Gate decision: **{binding.decision}** (see `reports/gate/{b}/report.md`); scenario {scenario}
- Adapter (`adapter_model.safetensors`) sha256: `{binding.adapter_sha256}`
- Base weights sha256: `{base.get("weights_sha256", "?")}`; architecture `{base.get("architecture", "?")}`
- Prompt format: {prompt} (sha256 `{base.get("chat_template_sha256", "?")}`)
- LoRA on `{lora.get("lora_targets", "?")}` ({lora.get("lora_layers", "?")} layers, \
{lora.get("trainable_params", "?")} trainable parameters, read from the trained model)
- Per-item eval record sha256: `{binding.eval_sha256}`; evidence bundle sha256: `{binding.evidence_sha256}`

## Use

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("models/base"), "models/adapters/{b}")
```

Prompts must be built with `clap.task.prompt.build_messages` (the training format).

## Evaluation

The `model-index` above lists every number in `metrics/eval/{b}.json` (held-out D_eval items,
scored per item; unverified by the Hub). The gate's paired test, regressions and risk checks
are in the gate report.

## Limitations

Facts come only from the retrieved documents: without retrieval the value cannot be known.
Evaluated on one synthetic demo domain; a new domain needs its own eval set and gate.

## Reproducibility and cost

`manifest.json` (commit, dvc.lock hash, package versions, seeds, hardware, params) and
`cost.json` (machine hours per stage against the budget) sit beside this card.
"""


def _front_matter(text: str) -> Any:
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise ValueError("no YAML front matter delimited by '---' lines")
    return yaml.safe_load(text[4 : text.index("\n---\n", 4) + 1])


def validate_card(text: str) -> list[str]:
    """Offline validation of a model card: required front-matter keys and types; [] when valid."""
    try:
        meta = _front_matter(text)
    except (ValueError, yaml.YAMLError) as e:
        return [f"front matter unreadable: {e}"]
    if not isinstance(meta, dict):
        return ["front matter is not a mapping"]
    problems = [
        f"{k} must be a non-empty string" for k in ("base_model", "license") if not _nonempty_str(meta.get(k))
    ]
    problems += [
        f"{k} must be a non-empty list of strings" for k in ("datasets", "tags") if not _str_list(meta.get(k))
    ]
    if meta.get("library_name") != "peft":
        problems.append("library_name must be 'peft'")
    problems += _validate_model_index(meta.get("model-index"))
    if not problems:
        problems += _hf_parse_problems(text)
    return problems


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_nonempty_str(x) for x in v)


def _validate_model_index(index: Any) -> list[str]:
    if not isinstance(index, list) or not index:
        return ["model-index must be a non-empty list"]
    problems = []
    for i, entry in enumerate(index):
        results = entry.get("results") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not _nonempty_str(entry.get("name"))
            or not isinstance(results, list)
            or not results
        ):
            problems.append(f"model-index[{i}] needs a name and a non-empty results list")
            continue
        for j, r in enumerate(results):
            problems += [f"model-index[{i}].results[{j}]: {p}" for p in _validate_result(r)]
    return problems


def _validate_result(r: Any) -> list[str]:
    if not isinstance(r, dict):
        return ["not a mapping"]
    problems = []
    if not _nonempty_str((r.get("task") or {}).get("type")):
        problems.append("task.type missing")
    ds = r.get("dataset") or {}
    problems += [f"dataset.{k} missing" for k in ("name", "type") if not _nonempty_str(ds.get(k))]
    metrics = r.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        return problems + ["metrics must be a non-empty list (is metrics/eval/<batch>.json empty?)"]
    for m in metrics:
        value = m.get("value") if isinstance(m, dict) else None
        if (
            not _nonempty_str(m.get("type") if isinstance(m, dict) else None)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            problems.append(f"metric {m!r} needs a type and a finite number value")
    return problems


def _hf_parse_problems(text: str) -> list[str]:
    """huggingface_hub must parse the card back (offline: the parser makes no request)."""
    from huggingface_hub import ModelCard

    try:
        card = ModelCard(text)
        results = card.data.eval_results or []
    except Exception as e:  # the parser raises several types; any means the Hub would reject it
        return [f"huggingface_hub cannot parse the card: {type(e).__name__}: {e}"]
    return [] if results else ["huggingface_hub parsed no eval results from model-index"]


# ---------------------------------------------------------------- manifest


def stage_params(lock: dict[str, Any], batch: str) -> dict[str, Any]:
    """The params each stage of ``batch`` (and each batch-independent stage) ran with, from dvc.lock.

    A profile's stages (its params.yaml an override, clap/params.py) record the keys they inherit under
    the file it extends (``../../params.yaml``, dotted keys) beside their own under ``params.yaml``:
    merged here, the override's winning, into the values the stage read."""
    used = {}
    for name, stage in sorted((lock.get("stages") or {}).items()):
        if "@" in name and not name.endswith(f"@{batch}"):
            continue
        files = stage.get("params") or {}
        values: dict[str, Any] = {}
        for file in sorted(files, key=lambda f: f == "params.yaml"):  # the stage's own params.yaml last
            for key, value in (files[file] or {}).items():
                *path, last = str(key).split(".")
                node = values
                for part in path:
                    node = node.setdefault(part, {})
                node[last] = value if not isinstance(value, dict) else _deep_update(node.get(last), value)
        if values:
            used[name] = values
    return used


def _deep_update(base: Any, over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in over.items():
        out[k] = _deep_update(out.get(k), v) if isinstance(v, dict) else v
    return out


def _seeds(params_used: dict[str, Any]) -> dict[str, Any]:
    seeds: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif prefix.rsplit(".", 1)[-1].endswith("seed"):
            seeds[prefix] = node

    for values in params_used.values():
        walk("", values)
    return dict(sorted(seeds.items()))


def _versions(packages: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _hardware(root: Path, batch: str) -> dict[str, Any]:
    import torch  # only here: the device of the machine making the release

    hw: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "torch_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    for stage in ("train", "eval"):
        hw[f"{stage}_device"] = stage_record(root, stage, batch).get("device")
    return hw


def reproducibility_manifest(
    root: Path, binding: Binding, commit: str, datasets: dict[str, str], packages: list[str]
) -> dict[str, Any]:
    """Everything needed to reproduce the released adapter from a clean checkout."""
    root = Path(root)
    used = stage_params(vcs.read_dvc_lock(root, MISSING_LOCK), binding.batch)
    base = _base_record(root)
    return {
        "batch": binding.batch,
        "decision": binding.decision,
        "git_commit": commit,
        "dvc_lock_sha256": io.sha256_file(root / "dvc.lock"),
        "artifacts": {
            **{k: v for k, v in dataclasses.asdict(binding).items() if k.endswith("sha256")},
            "base_weights_sha256": base.get("weights_sha256"),
        },
        "datasets_logical_hash": datasets,
        "python": platform.python_version(),
        "packages": _versions(packages),
        "seeds": _seeds(used),
        "hardware": _hardware(root, binding.batch),
        "params": used,
    }


def validate_manifest(m: dict[str, Any]) -> list[str]:
    """Completeness of a manifest; [] when complete."""
    problems = [
        f"{k} is empty"
        for k in ("git_commit", "dvc_lock_sha256", "params", "seeds", "packages")
        if not m.get(k)
    ]
    problems += [f"package {name} is not installed" for name, v in m.get("packages", {}).items() if v is None]
    problems += [f"artifact hash {k} is missing" for k, v in m.get("artifacts", {}).items() if not v]
    if not m.get("hardware", {}).get("train_device"):
        problems.append("hardware.train_device unknown (records/train/<batch>.json has no device)")
    return problems


# ---------------------------------------------------------------- cost


def _merged(metrics_path: Path) -> dict[str, Any]:
    """A metrics file merged with its record file (:func:`clap.io.record_path`); {} for what is missing."""
    out: dict[str, Any] = {}
    for part in (metrics_path, io.record_path(metrics_path)):
        if part.exists():
            out.update(io.read_json(part))
    return out


def stage_record(root: Path, stage: str, batch: str) -> dict[str, Any]:
    """A stage's flat record: ``metrics/<stage>/<batch>.json`` with ``records/<stage>/<batch>.json``
    (the device, hashes, versions live in the record file)."""
    return _merged(Path(root) / "metrics" / stage / f"{batch}.json")


def _base_record(root: Path) -> dict[str, Any]:
    """metrics/base.json (loud when missing) with records/base.json (the weights sha256, the source)."""
    path = Path(root) / "metrics" / "base.json"
    return {**io.read_json(path), **_merged(path)}


def _stage_cost(root: Path, stage: str, batch: str, p: CostParams) -> dict[str, Any]:
    path = Path(root) / "metrics" / stage / f"{batch}.json"
    record = stage_record(root, stage, batch)
    wall = record.get(p.wall_time_key)
    valid = (
        isinstance(wall, (int, float)) and not isinstance(wall, bool) and math.isfinite(wall) and wall >= 0
    )
    device = str(record.get(p.device_key) or "cpu")  # stages that record no device run on the CPU
    kind = "gpu" if device.startswith("cuda") else "cpu"
    hours = round(wall / 3600.0, 6) if valid else None
    estimate = record.get(p.estimate_key)
    if not (
        isinstance(estimate, (int, float)) and not isinstance(estimate, bool) and math.isfinite(estimate)
    ):
        estimate = None  # the stage made no estimate (eval; a batch not admitted)
    return {
        "wall_s": wall if valid else None,
        "estimate_s": estimate,
        "actual_over_estimate": round(wall / estimate, 4) if valid and estimate else None,
        "device": device,
        "kind": kind,
        "hours": hours,
        "source": f"metrics/{stage}/{batch}.json" if path.exists() else None,
    }


def cost_report(root: Path, batch: str, p: CostParams) -> dict[str, Any]:
    """Machine hours per stage (CPU or GPU by the device the stage records) against the budget.

    ``status`` is ``over`` when the known hours already exceed a budget, ``incomplete`` when
    a stage's wall time is missing (never counted as zero), ``within`` otherwise. Each stage has
    its ``estimate_s`` (params ``release.cost.estimate_key``: the train stage's pre-training
    estimate; None for a stage that made none) and ``actual_over_estimate``, its wall time over it.
    """
    stages = {s: _stage_cost(root, s, batch, p) for s in p.stages}
    missing = [s for s, c in stages.items() if c["hours"] is None]
    cpu = float(
        round(sum(c["hours"] for c in stages.values() if c["hours"] is not None and c["kind"] == "cpu"), 6)
    )
    gpu = float(
        round(sum(c["hours"] for c in stages.values() if c["hours"] is not None and c["kind"] == "gpu"), 6)
    )
    over = cpu > p.budget_cpu_hours or gpu > p.budget_gpu_hours
    status = "over" if over else ("incomplete" if missing else "within")
    return {
        "batch": batch,
        "stages": stages,
        "missing_wall_time": missing,
        "cpu_hours": cpu,
        "gpu_hours": gpu,
        "budget_cpu_hours": p.budget_cpu_hours,
        "budget_gpu_hours": p.budget_gpu_hours,
        "status": status,
        "over_budget_policy": p.over_budget,
        "estimate_batches": p.estimate_batches,
    }
