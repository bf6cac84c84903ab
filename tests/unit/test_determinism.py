"""clap.determinism: records, frame and adapter hashes."""

from __future__ import annotations

import pandas as pd
import torch
from safetensors.torch import save_file

from clap import determinism as det
from clap import io

P = det.DeterminismParams(
    deterministic_algorithms=True,
    cublas_workspace_config=":4096:8",
    packages=["pyarrow", "pandas", "no-such-package"],
    adapter_abs_tol=1e-4,
    logical_decimals=4,
)


def test_record_says_bytes_on_cpu_and_tolerance_on_cuda():
    det.apply(P)
    try:
        cpu, cuda = det.record(P, "cpu"), det.record(P, "cuda:0")
    finally:
        torch.use_deterministic_algorithms(False)
    assert (
        cpu["deterministic_algorithms"] == 1
        and cpu["determinism"] == "bytes"
        and cpu["adapter_abs_tol"] == 0.0
    )
    assert cuda["determinism"] == "tolerance" and cuda["adapter_abs_tol"] == 1e-4
    assert (
        cpu["pyarrow_version"] == __import__("pyarrow").__version__
        and cpu["no-such-package_version"] == "missing"
    )


def test_frame_hashes_pair_file_and_logical_hash(tmp_path):
    df = pd.DataFrame({"id": ["a", "b"], "v": [1.0, 2.0]})
    io.write_parquet(tmp_path / "sft.parquet", df)
    assert det.frame_hashes(tmp_path, {"sft": df}) == {
        "sha256_sft": io.sha256_file(tmp_path / "sft.parquet"),
        "logical_sha256_sft": io.logical_hash(df),
    }


def test_adapter_logical_hash_ignores_noise_below_its_decimals(tmp_path):
    w = torch.tensor([[0.12344, 0.5], [1.0, -2.0]])
    save_file({"b": w, "a": w.clone()}, tmp_path / "x.safetensors")
    save_file({"a": w + 1e-7, "b": w}, tmp_path / "y.safetensors")
    save_file({"a": w + 1e-3, "b": w}, tmp_path / "z.safetensors")
    x, y, z = (det.adapter_logical_hash(tmp_path / f"{n}.safetensors", 4) for n in "xyz")
    assert x == y != z


def test_gate_record_copies_the_training_run_settings():
    rec = det.gate_record(
        {"seed": 7, "torch_threads": 2, "deterministic_algorithms": 1, "determinism": "bytes"}, P
    )
    assert (rec["train_seed"], rec["train_torch_threads"], rec["train_determinism"]) == (
        7,
        2,
        "bytes",
    ) and "pandas_version" in rec
    assert det.gate_record({}, P)["train_seed"] == -1
