"""What a batch's adapter starts from: fresh LoRA weights, or the released adapter (warm start).

``warm_start.mode: fresh`` trains every batch's adapter from fresh LoRA weights on the base model:
each candidate is what its own batch teaches. ``warm_start.mode: incumbent`` continues from the adapter in
production (continual fine-tuning, the loop a company lives): the next batch's candidate starts from
what users are served today, and the gate then asks whether the new data made it better.

Which release a batch starts from must not change under its feet. The rule:

- a batch that has been released starts from the release its *first* release replaced (the
  pointer in effect just before it in ``releases/history.jsonl``; nothing: fresh weights). After
  its own release, or a later one, or a rollback, it is still the adapter it was trained, approved
  and released as; it never retrains from itself or from a release trained from it;
- any other batch starts from the release in effect now (its approval verified as eval verifies
  the incumbent); nothing released: fresh weights.

Stage ``warm_start`` resolves it (:func:`clap.release.lineage.resolve`) into ``records/warm_start/<batch>.json``, and ``train``
depends on that file, not on ``releases/`` or the mode: a release (or a switch of mode) re-runs the
cheap resolution of every batch, and only a batch whose starting point really changed trains again.
The file holds the resolution alone (batch, from_batch, adapter_sha256); why is printed by the stage. The adapter's bytes are
checked against the recorded sha256 when training loads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clap import io
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE

MODES = ("fresh", "incumbent")


@dataclass(frozen=True)
class WarmStartParams:
    """params.yaml ``warm_start``."""

    mode: str  # fresh | incumbent


@dataclass(frozen=True)
class WarmStart:
    """A batch's starting point. ``from_batch`` empty: fresh LoRA weights."""

    batch: str
    from_batch: str
    adapter_sha256: str
    why: str = field(
        default="", compare=False
    )  # for people: printed, never written (the record is what train depends on)

    @property
    def fresh(self) -> bool:
        return not self.from_batch

    def record(self) -> dict[str, Any]:
        return {"batch": self.batch, "from_batch": self.from_batch, "adapter_sha256": self.adapter_sha256}


def read(path: Path | str, batch: str) -> WarmStart:
    """The resolution ``warm_start`` wrote for ``batch``; a record of another batch is an error."""
    raw = io.read_json(Path(path))
    try:
        ws = WarmStart(**raw)
    except TypeError as e:
        raise ClapError(f"not a warm-start record: {e}", file=path, rule="bad_warm_start") from e
    if ws.batch != batch:
        raise ClapError(
            f"the warm-start record is for batch {ws.batch!r}, not {batch!r}",
            file=path,
            column="batch",
            rule="bad_warm_start",
        )
    return ws


def adapter_dir(ws: WarmStart, adapters_dir: Path | str) -> Path:
    """The folder of the adapter ``ws`` starts from, its weights checked against the record.

    Raises:
        ClapError: the adapter is missing or its bytes are not the recorded ones (``dvc checkout``).
    """
    folder = Path(adapters_dir) / ws.from_batch
    weights = folder / ADAPTER_FILE
    if not weights.exists():
        raise ClapError(
            f"batch {ws.batch} starts from the adapter of batch {ws.from_batch}, which is not here "
            "(run `dvc checkout` or `dvc pull`)",
            file=weights,
            rule="warm_start_missing",
        )
    actual = io.sha256_file(weights)
    if actual != ws.adapter_sha256:
        raise ClapError(
            f"batch {ws.batch} starts from batch {ws.from_batch}'s adapter sha256 {ws.adapter_sha256}, "
            f"the file has {actual} (run `dvc checkout`)",
            file=weights,
            rule="warm_start_hash_mismatch",
        )
    return folder
