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


def test_record_says_bytes_on_cpu_and_tolerance_on_cuda(monkeypatch):
    real = det.hardware_class
    monkeypatch.setattr(
        det, "hardware_class", lambda d: "cuda:NVIDIA H200" if d.startswith("cuda") else real(d)
    )
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
    assert cuda["hardware"] == "cuda:NVIDIA H200" and cpu["hardware"] == real("cpu")
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


INTEL_AVX512 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw\n\nprocessor\t: 1\n"
AMD_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\nCPU implementer\t: 0x41\n"


def test_cpu_class_is_architecture_widest_vector_isa_and_vendor():
    assert det.cpu_class("x86_64", INTEL_AVX512) == "x86_64-avx512-intel"
    assert det.cpu_class("x86_64", AMD_AVX2) == "x86_64-avx2-amd"
    assert det.cpu_class("AMD64", AMD_AVX2.replace(" avx avx2", "")) == "x86_64-base-amd"
    assert det.cpu_class("aarch64", ARM) == "aarch64-neon"
    assert det.cpu_class("arm64", "") == "aarch64-unknown"  # no /proc/cpuinfo: said, not guessed


def test_records_carry_the_hardware_class_and_the_gate_copies_the_training_one():
    rec = det.record(P, "cpu")
    assert rec["hardware"] == det.hardware_class("cpu") and rec["hardware"].count("-") >= 1
    assert det.gate_record({"hardware": "x86_64-avx2-amd"}, P)["train_hardware"] == "x86_64-avx2-amd"
    assert det.gate_record({}, P)["train_hardware"] == ""
