"""Determinism: set the knobs that make a re-run byte-identical, and record what a re-run must match.

Seeds and thread counts live in each stage's own params section (``train.seed``,
``train.torch_threads``, ``admit.seed``, ...); this module adds what is common to every
model stage (params section ``determinism``): deterministic torch algorithms, the cuBLAS
workspace setting they need on CUDA, and the record every training, eval and gate record
carries: the setting, the installed versions of the packages that change output bytes, and
whether a re-run is expected to be byte-identical (``determinism: bytes``, CPU) or equal
within a tolerance (``determinism: tolerance``, CUDA: kernels and atomics reorder float
sums, so adapter bytes can differ between runs; the record then carries a logical hash of
the weights rounded to ``logical_decimals`` and the tolerance ``clap verify`` applies).

Byte-identity also stops at the hardware: torch picks its CPU kernels by instruction set
(AVX-512 and AVX2 kernels sum floats in another order), so every training and eval record
carries ``hardware`` (:func:`hardware_class`), and ``clap verify`` compares a re-run on another
hardware class within the tolerances of params ``verify`` instead of by bytes.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from clap import io


@dataclasses.dataclass(frozen=True)
class DeterminismParams:
    """Params section ``determinism`` (see the comments there)."""

    deterministic_algorithms: bool
    cublas_workspace_config: str
    packages: Sequence[str]
    adapter_abs_tol: float
    logical_decimals: int


def apply(p: DeterminismParams) -> None:
    """Switch torch to deterministic algorithms (before any CUDA work) when params ask for it."""
    import torch

    if p.deterministic_algorithms:
        os.environ.setdefault(
            "CUBLAS_WORKSPACE_CONFIG", p.cublas_workspace_config
        )  # read when cuBLAS initialises
    # warn_only: an op without a deterministic kernel warns instead of failing the run; the
    # record says `tolerance` on CUDA anyway, so such an op cannot pass as byte-identical.
    torch.use_deterministic_algorithms(p.deterministic_algorithms, warn_only=True)


def world() -> tuple[int, int]:
    """(rank, world size) from the torchrun environment (0, 1 when not distributed)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def seed_everything(seed: int, torch_threads: int) -> None:
    """Seeds (python, numpy, torch) and CPU threads: two runs on the same CPU give identical adapters."""
    import random

    import numpy as np
    import torch

    torch.set_num_threads(torch_threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def versions(packages: Sequence[str]) -> dict[str, str]:
    """``<package>_version`` of each installed package ("missing" when not installed)."""
    out = {}
    for name in packages:
        try:
            out[f"{name}_version"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[f"{name}_version"] = "missing"
    return out


def mode(device: str) -> str:
    """'bytes' where a re-run is byte-identical (CPU), 'tolerance' where it is not (CUDA)."""
    return "tolerance" if device.startswith("cuda") else "bytes"


# instruction-set classes, widest first: (class, the /proc/cpuinfo flag that has it)
ISA_CLASSES: dict[str, tuple[tuple[str, str], ...]] = {
    "x86_64": (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx")),
    "aarch64": (("sve", "sve"), ("neon", "asimd")),
}
CPU_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
CPUINFO = Path("/proc/cpuinfo")


def cpu_class(machine: str, cpuinfo: str) -> str:
    """``<arch>-<isa>[-<vendor>]`` from ``platform.machine()`` and the text of /proc/cpuinfo.

    The ISA class is the widest vector extension the first CPU's flags list (``x86_64-avx512``,
    ``x86_64-avx2``, ``aarch64-neon``; ``base`` when none, ``unknown`` when there is no flags
    line, e.g. no /proc/cpuinfo); the vendor (``intel``, ``amd``, else ``vendor_id`` lowercased)
    is appended when cpuinfo names one.
    """
    flags: set[str] | None = None
    vendor = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and flags is None:
            flags = set(value.split())
        elif key == "vendor_id" and not vendor:
            vendor = value.strip()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower()) or "unknown"
    if flags is None:
        isa = "unknown"
    else:
        isa = next((name for name, flag in ISA_CLASSES.get(arch, ()) if flag in flags), "base")
    vendor = CPU_VENDORS.get(vendor, vendor.lower().replace(" ", "_"))
    return f"{arch}-{isa}-{vendor}" if vendor else f"{arch}-{isa}"


def hardware_class(device: str) -> str:
    """The class of hardware a run's floats depend on: ``cuda:<device name>`` on CUDA, else the
    CPU's :func:`cpu_class` (e.g. ``x86_64-avx512-intel``, ``x86_64-avx2-amd``). Two runs of
    one class are expected byte-identical (CPU); across classes only within a tolerance."""
    if device.startswith("cuda"):
        import torch

        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    try:
        cpuinfo = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: the class says so (`unknown`) rather than guessing
        cpuinfo = ""
    return cpu_class(platform.machine(), cpuinfo)


def record(p: DeterminismParams, device: str) -> dict[str, Any]:
    """The flat determinism record merged into training and eval records."""
    import torch

    return {
        "deterministic_algorithms": int(torch.are_deterministic_algorithms_enabled()),
        "determinism": mode(device),
        "hardware": hardware_class(device),
        "adapter_abs_tol": p.adapter_abs_tol if mode(device) == "tolerance" else 0.0,
        **versions(p.packages),
    }


def frame_hashes(folder: Path | str, frames: Mapping[str, pd.DataFrame]) -> dict[str, str]:
    """Flat file and logical hashes of parquet files written from ``frames`` into ``folder``.

    ``sha256_<name>`` is the file hash (changes with pyarrow/pandas versions and platform);
    ``logical_sha256_<name>`` is :func:`clap.io.logical_hash` of the rows (content only), so a
    library upgrade that changes bytes but not content is recognizable.
    """
    folder = Path(folder)
    out = {}
    for name, df in sorted(frames.items()):
        out[f"sha256_{name}"] = io.sha256_file(folder / f"{name}.parquet")
        out[f"logical_sha256_{name}"] = io.logical_hash(df)
    return out


def adapter_logical_hash(weights: Path | str, decimals: int) -> str:
    """sha256 over the adapter's tensors (sorted names, shapes, values rounded to ``decimals``).

    Independent of safetensors serialization; with rounding it names the content of a CUDA
    run whose low bits vary (a value on a rounding boundary can still flip it: ``clap verify``
    decides CUDA adapters by the tolerance, not by this hash).
    """
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(weights))
    lines = []
    for name in sorted(tensors):
        t = tensors[name].float().cpu()
        rounded = t.mul(10.0**decimals).round().to(torch.int64)
        lines.append(f"{name}\t{list(t.shape)}\t{io.sha256_bytes(rounded.numpy().tobytes())}\n")
    return io.sha256_bytes("".join(lines).encode())


def gate_record(train: Mapping[str, Any], p: DeterminismParams) -> dict[str, Any]:
    """What the gate's decision rests on, for its flat record (all of it lands in records/gate/<b>.json):
    the installed versions and the training run's seed, threads and determinism (``train_`` prefix;
    -1/"" when not trained; ``train`` is the merged metrics+record, :func:`clap.io.read_flat`)."""
    keys = {
        "seed": -1,
        "torch_threads": -1,
        "deterministic_algorithms": -1,
        "determinism": "",
        "hardware": "",
    }
    return {**versions(p.packages), **{f"train_{k}": train.get(k, default) for k, default in keys.items()}}
