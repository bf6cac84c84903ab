"""What release control reads: the ``release`` params and the records a release is bound to.

The artifacts an approval binds (:func:`artifact_paths`, :func:`current_binding`: the gate record,
the adapter and its config, the eval items, the evidence bundle and the base model's hash), the
gate's decision, the production pointer, the ledger of consumed approval ids, and the rule that a
revoked key approves nothing. Shared by the release ceremony (:mod:`clap.release.control`),
rollback (:mod:`clap.release.rollback`), the canary's acting path (:mod:`clap.release.canary_action`)
and key changes (:mod:`clap.release.keys`); it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clap import io, params
from clap.errors import ClapError
from clap.params import bad_param, check_keys
from clap.release.approval import Binding, key_sha256
from clap.release.handoff import CardParams, CostParams
from clap.release.registry import LEDGER, POINTER, RELEASES, read_jsonl, read_trust, recorded_base_sha256
from clap.release.trust import TRUST_LOG

HANDOFF = RELEASES / "handoff"


@dataclass(frozen=True)
class ReleaseParams:
    """params ``release``."""

    audience: str
    approval_ttl_s: int
    max_approval_ttl_s: int
    rollback_to_base: bool  # the only release rolled back: the base model serves (else refused)
    key_quorum: int  # signatures of keys in force a key change needs (capped by the keys in force)
    approvals_required: int  # distinct approvers a release needs (capped by the keys in force)
    card: CardParams
    cost: CostParams

    def __post_init__(self) -> None:
        check_keys(
            {
                "release.key_quorum": isinstance(self.key_quorum, int) and self.key_quorum >= 1,
                "release.approvals_required": isinstance(self.approvals_required, int)
                and self.approvals_required >= 1,
            },
            "release.key_quorum and release.approvals_required must be integers >= 1",
        )
        if not isinstance(self.rollback_to_base, bool):
            raise bad_param(
                "release.rollback_to_base",
                f"release.rollback_to_base must be true or false, got {self.rollback_to_base!r}",
            )


def load_params(root: Path) -> ReleaseParams:
    """The ``release`` section of ``<root>/params.yaml``."""
    return params.section("release", ReleaseParams, Path(root) / "params.yaml")


def artifact_paths(batch: str) -> dict[str, Path]:
    """Repository-relative paths of everything an approval of ``batch`` is bound to."""
    return {
        "gate": Path("metrics/gate") / f"{batch}.json",
        "adapter": Path("models/adapters") / batch / "adapter_model.safetensors",
        "adapter_config": Path("models/adapters") / batch / "adapter_config.json",
        "eval": Path("data/eval") / batch / "items.parquet",
        "evidence": Path("reports/gate") / batch / "evidence.json",
    }


def base_weights_sha256(root: Path) -> str:
    """The base model's weights sha256 as the base stage recorded it (metrics/base.json's record)."""
    sha = recorded_base_sha256(root)
    if sha is None:
        raise ClapError(
            "the base stage's record has no weights_sha256: an approval binds the base model's hash",
            file=io.record_path(Path(root) / "metrics" / "base.json"),
            column="weights_sha256",
            rule="missing_base",
        )
    return sha


def gate_decision(root: Path, batch: str) -> dict[str, Any]:
    """The gate's flat decision record of ``batch`` (``decision`` must be a string)."""
    path = Path(root) / artifact_paths(batch)["gate"]
    record = io.read_json(path)
    if not isinstance(record.get("decision"), str):
        raise ClapError(
            "gate record has no string 'decision'", file=path, column="decision", rule="bad_gate_record"
        )
    return record


def current_binding(root: Path, batch: str) -> Binding:
    """The batch's current gate decision and the sha256 of each bound artifact, from disk."""
    root, paths = Path(root), artifact_paths(batch)
    return Binding(
        batch=batch,
        decision=gate_decision(root, batch)["decision"],
        adapter_sha256=io.sha256_file(root / paths["adapter"]),
        adapter_config_sha256=io.sha256_file(root / paths["adapter_config"]),
        eval_sha256=io.sha256_file(root / paths["eval"]),
        evidence_sha256=io.sha256_file(root / paths["evidence"]),
        base_sha256=base_weights_sha256(root),
    )


def read_pointer(root: Path) -> dict[str, Any]:
    """The production pointer (``batch`` is None when nothing is released)."""
    pointer = io.read_json(Path(root) / POINTER)
    if not isinstance(pointer, dict) or "batch" not in pointer:
        raise ClapError(
            "production pointer has no 'batch' key", file=Path(root) / POINTER, rule="bad_pointer"
        )
    return pointer


def used_approval_ids(root: Path) -> set[str]:
    """Every approval id (jti) ever consumed."""
    return {row["jti"] for row in read_jsonl(Path(root) / LEDGER)}


def refuse_revoked(root: Path, name: str, key: Any) -> None:
    """A key the trust log revoked approves nothing, under whatever name it is trusted."""
    row = read_trust(root).revoked.get(key_sha256(key))
    if row is not None:
        raise ClapError(
            f"approval refused: the key of {name!r} (sha256 {key_sha256(key)[:12]}…) was revoked "
            f"({row.get('reason') or 'no reason given'}, after history event {row['after_event']})",
            file=TRUST_LOG,
            rule="key_revoked",
        )
