"""A batch's lineage in the release history: which released adapter its training starts from.

The rule and why it is stable: :mod:`clap.train.warm_start`. This module only reads ``releases/``
(the verified history and, for a batch never released, the production pointer verified against its
approval and the base weights the base stage recorded) and the base stage's record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clap.errors import ClapError
from clap.release.registry import recorded_base_sha256, release_stack, verified_history, verify_pointer
from clap.train.warm_start import MODES, WarmStart


def _first_release_replaced(history: list[dict[str, Any]], batch: str) -> tuple[bool, dict[str, Any] | None]:
    """(was ``batch`` ever released, the pointer its first release replaced or None): the release stack
    (:func:`clap.release.registry.release_stack`) just before that release."""
    for n, event in enumerate(history):
        pointer = event.get("pointer")
        if event.get("event") == "release" and isinstance(pointer, dict) and pointer.get("batch") == batch:
            stack = release_stack(history[:n])
            return True, (stack[-1] if stack else None)
    return False, None


def resolve(batch: str, mode: str, root: Path | str, adapters_dir: Path | str) -> WarmStart:
    """The starting point of ``batch`` under ``warm_start.mode`` (:mod:`clap.train.warm_start`: the rule).

    Args:
        batch: the batch being trained.
        mode: params ``warm_start.mode`` (fresh | incumbent).
        root: repository root (holds ``releases/`` and ``params.yaml``).
        adapters_dir: the folder of adapter folders (``models/adapters``).

    Raises:
        ClapError: an unknown mode, or a production pointer that does not verify.
    """
    if mode not in MODES:
        raise ClapError(
            f"warm_start.mode must be one of {', '.join(MODES)}, got {mode!r}",
            column="warm_start.mode",
            rule="bad_param",
        )
    if mode == "fresh":
        return WarmStart(batch, "", "", "warm_start.mode is fresh: fresh LoRA weights")
    # every past release verified (approvals, single use, order), as `clap serve` and eval verify the pointer
    released, replaced = _first_release_replaced(verified_history(Path(root)), batch)
    if released:
        if not replaced or not replaced.get("batch"):
            return WarmStart(
                batch, "", "", f"{batch}'s first release replaced no adapter: fresh LoRA weights"
            )
        return WarmStart(
            batch,
            str(replaced["batch"]),
            str(replaced.get("adapter_sha256", "")),
            f"{batch}'s first release replaced batch {replaced['batch']}: its adapter, then as now",
        )
    base = recorded_base_sha256(Path(root))
    if base is None and verify_pointer(Path(root), adapters_dir=adapters_dir) is not None:
        raise ClapError(
            "the base stage's record has no weights_sha256: the incumbent's adapter is bound to a base "
            "model's hash, which cannot be checked (run the base stage first)",
            file=Path(root) / "metrics" / "base.json",
            column="weights_sha256",
            rule="missing_base",
        )
    current = verify_pointer(Path(root), adapters_dir=adapters_dir, base_sha256=base)
    if current is None:
        return WarmStart(batch, "", "", "nothing is released: fresh LoRA weights")
    return WarmStart(
        batch,
        current.batch,
        current.adapter_sha256,
        f"the adapter in production (batch {current.batch}, approval {current.approval_id})",
    )
