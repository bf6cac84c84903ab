"""The base model's answers, kept and reused by a later run that would generate exactly the same ones.

Greedy generation on the CPU is a pure function of the model's files, the requests (prompts and, under
constrained decoding, each one's answer schema), the decoding settings (batch size: which prompts share
a padded batch changes float sums; answer budget; mode), the engine and its precision, the threads, the
CPU's instruction sets and the package versions and clap code that compute it (a re-run is
byte-identical: docs/reproducibility.md). A run that asks the same model the same requests under all of
these gets the same answers, so it may read them instead:

- TAT-QA's corrupted copy ``reports-b-wrongcell`` holds its clean twin's held-out items and replay cases:
  eval's base pass and replay's base conditions (A, C) are its twin's;
- a changed training knob re-runs eval and replay of every batch, whose base answers did not change.

Only the base model's answers are kept (an adapter is new with every training run) and only on the CPU
(CUDA runs agree within a tolerance, not byte for byte). A set of answers is stored under the sha256 of
everything listed above (:meth:`Memo.key`); anything else is a miss and generates. The store is
``.clap/answers/`` in the folder the stage runs in (the project or profile root): never committed or
pushed, and ``clap verify``'s clean checkout starts without one, so verification always generates. The
answers' latencies are those of the run that generated them; a stage's record names the key it read or
wrote (``<role>_answers_memo``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clap import determinism, io
from clap.model.generate import Generation

MEMO_DIR = Path(".clap") / "answers"
# the modules whose code decides a base model's answers once its requests are built
CODE = ("base.py", "constrain.py", "engine.py", "generate.py", "kv.py")
# packages whose arithmetic or tokenization the answers depend on
PACKAGES = ("torch", "openvino", "xgrammar", "transformers", "tokenizers", "safetensors", "numpy")


def _sha(obj: Any) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    ).hexdigest()


def cpu_fingerprint() -> str:
    """sha256 of the CPU's model name and instruction-set flags (AMX, AVX-512 and AVX2 machines of one vendor
    compute different kernels); "" where /proc/cpuinfo cannot be read."""
    try:
        text = determinism.CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    first = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        first.setdefault(name.strip(), value.strip())
    return _sha([first.get("model name", ""), sorted(first.get("flags", "").split())])


@dataclasses.dataclass(frozen=True)
class Memo:
    """Kept answers of one model on one machine (:func:`base_memo`).

    Attributes:
        identity: sha256 of the model's files and of what generation runs on (engine, threads, CPU,
            versions, code).
        folder: where answer sets are stored, one JSON file per key.
        log: ``<label>_answers_memo`` -> ``reused <key>`` | ``generated <key>``, per labelled
            :meth:`load` hit and :meth:`save` (what a stage's record states).
    """

    identity: str
    folder: Path
    log: dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

    def key(self, chats: Sequence[Any], schemas: Sequence[Any] | None, **settings: Any) -> str:
        """The key of answering ``chats`` (each with its answer schema under constrained decoding, else
        None) under ``settings`` (batch size, answer budget, decoding mode, ...)."""
        return _sha(
            {"identity": self.identity, "chats": list(chats), "schemas": schemas, "settings": settings}
        )

    def load(self, key: str, label: str = "") -> tuple[list[Generation], dict[str, Any]] | None:
        """The answers stored under ``key`` and their extras, or None (never stored)."""
        path = self.folder / f"{key}.json"
        if not path.exists():
            return None
        raw = io.read_json(path)
        if raw.get("key") != key:  # a file that is not what its name says is a miss, never an answer
            return None
        gens = [Generation(**{**g, "token_ids": tuple(g["token_ids"])}) for g in raw["generations"]]
        if label:
            self.log[f"{label}_answers_memo"] = f"reused {key}"
        return gens, raw.get("extra", {})

    def save(
        self, key: str, gens: Sequence[Generation], extra: Mapping[str, Any] | None = None, label: str = ""
    ) -> None:
        """Store ``gens`` under ``key`` (atomically: a killed run leaves no half-written set)."""
        io.write_json(
            self.folder / f"{key}.json",
            {"key": key, "generations": [dataclasses.asdict(g) for g in gens], "extra": dict(extra or {})},
        )
        if label:
            self.log[f"{label}_answers_memo"] = f"generated {key}"


def base_memo(base_dir: Path | str, engine: str, device: str) -> Memo | None:
    """The memo of the base model in ``base_dir`` generating on ``engine`` (its label, e.g.
    ``openvino-f32``) on ``device``, stored in :data:`MEMO_DIR`; None on CUDA (answers agree there
    within a tolerance only)."""
    import torch

    if device != "cpu":
        return None
    here = Path(__file__).parent
    identity = _sha(
        {
            "model": io.sha256_dir(base_dir),
            "engine": engine,
            "threads": torch.get_num_threads(),
            "hardware": determinism.hardware_class(device),
            "cpu": cpu_fingerprint(),
            "versions": determinism.versions(PACKAGES),
            "code": {name: io.sha256_file(here / name) for name in CODE},
        }
    )
    return Memo(identity, MEMO_DIR)
