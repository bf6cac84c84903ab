"""Rollback: return production to the release before the current one (``clap rollback``), and
record the rollbacks made by ``git revert`` of a pointer commit.

A rollback restores the previous pointer from git (the pointer as it was before the current
release's commit), restores that adapter's bytes with ``dvc checkout``/``dvc pull`` and verifies
its sha256 before committing; the ledger keeps every used approval, so the rolled-back approval can
never be replayed. It may act on a batch's gate decision (``production_decision: rollback``, the
incumbent failing on that batch's items: :func:`gate_rollback`) or on the canary analysis of the
release in production (:func:`canary_rollback`), and with no previous release it refuses unless
params ``release.rollback_to_base`` lets production fall back to the base model. GTO's ``prod`` is
unassigned from the current version and assigned again to the version rolled back to
(:mod:`clap.release.gto`).

A ``git revert`` of a release's pointer commit is a rollback too: the next release or rollback
records it first in the history (:func:`reverted_rollbacks`: ``rollback`` events with
``reason: git revert``).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clap import io, vcs
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE
from clap.release import canary as canary_mod
from clap.release import gto
from clap.release.records import artifact_paths, gate_decision, load_params, read_pointer, refuse_revoked
from clap.release.registry import (
    HISTORY,
    LEDGER,
    POINTER,
    read_history,
    read_trust,
    release_stack,
    reverted_above,
)
from clap.release.transaction import appended, commit_files, file_text, locked, transaction, utc_now


def rollback(root: Path, batch: str | None = None, *, canary: bool = False) -> dict[str, Any]:
    """Return production to the release before the current one and commit ``releases/``.

    The pointer is restored from git (its content before the current release's commit);
    the history gets a ``rollback`` event and the ledger keeps every used approval, so the
    rolled-back approval can never be replayed. The previous adapter is restored with
    ``dvc checkout`` (or ``dvc pull``) and its sha256 verified before anything is written.

    With ``batch`` the rollback acts on that batch's gate decision (:func:`gate_rollback`): it must
    be ``rollback`` for production, about the adapter in production now; the event records it.
    With ``canary`` it acts on the canary analysis of the release in production
    (:func:`clap.release.canary.rollback_evidence`: its verdict must be rollback, about this adapter);
    the event records it and the analysis is committed with the rollback.
    Without either, it is an operator's rollback (``reason: manual``).

    When the current release is the first one there is nothing to roll back to: refused, unless
    params ``release.rollback_to_base`` is true; then production falls back to the base model
    (pointer ``batch: null``, a ``rollback`` event with ``to_batch: null``).

    Returns:
        The rollback event written.

    Raises:
        ClapError: nothing to roll back to, inconsistent records, a gate decision that is not a
            rollback (or is stale), or the previous adapter cannot be restored; releases/ and git
            are then unchanged.
    """
    root = Path(root)
    p = load_params(root)
    with locked(root):
        pointer, stack, by_revert = _releases_in_effect(root)
        evidence: list[Path] = []
        if batch is not None:
            why = gate_rollback(root, batch, pointer)
        elif canary:
            why, evidence = canary_rollback(root, pointer)
        else:
            why = {"reason": "manual"}
        if len(stack) < 2:
            if not p.rollback_to_base:
                raise ClapError(
                    f"batch {pointer['batch']} is the first release: there is no previous release to roll back to "
                    "(release.rollback_to_base is false, so production stays on it; set it to true to fall back "
                    "to the base model)",
                    rule="no_previous_release",
                )
            return _rollback_to_base(root, pointer, why, evidence, by_revert)
        return _apply_rollback(root, _plan_rollback(root, pointer, stack[-2], why), evidence, by_revert)


def _releases_in_effect(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The production pointer, the releases in effect up to it (oldest first) and the rollback events
    of the releases above it (their pointer commits reverted in git, recorded with this rollback):
    something must be in production, and it must be on the stack."""
    vcs.require_committed(root, [POINTER, HISTORY, LEDGER], "releases/ has uncommitted changes")
    pointer, stack = read_pointer(root), release_stack(read_history(root))
    if pointer.get("batch") is None or not stack:
        raise ClapError("nothing is in production: there is nothing to roll back", rule="nothing_released")
    try:
        reverted = reverted_rollbacks(root, pointer, "clap rollback")
    except ClapError as e:
        raise ClapError(
            f"{e.args[0]}: releases/production.json does not match history.jsonl, fix by hand",
            rule="inconsistent_releases",
        ) from e
    return pointer, stack[: len(stack) - len(reverted)], reverted


@dataclass(frozen=True)
class _Rollback:
    """A rollback to the previous release, decided (every check made) before anything is written."""

    pointer: dict[str, Any]  # the release in production now
    previous: dict[str, Any]  # the release before it: production after the rollback
    reverted: str  # the commit that released ``pointer``
    restored: str  # the pointer file as it was before that commit
    tags: list[tuple[str, str, str]]  # GTO tags (name, commit, message)
    why: dict[str, Any]  # the reason (manual, or the gate decision acted on)


def _plan_rollback(
    root: Path, pointer: dict[str, Any], previous: dict[str, Any], why: dict[str, Any]
) -> _Rollback:
    """Check that production can go back to ``previous`` (its approver's key not revoked, the pointer
    before the current release's commit is it) and decide the GTO tags. Writes nothing."""
    target_key = read_trust(root).keys.get(str(previous.get("approver")))
    if target_key is not None:  # a removed key fails verify_pointer after the rollback anyway
        try:
            refuse_revoked(root, str(previous.get("approver")), target_key)
        except ClapError as e:
            raise ClapError(
                f"cannot roll back to batch {previous['batch']}: {e.args[0]}; serve and eval would refuse it. "
                "Release a batch approved by a trusted key instead",
                file=e.file,
                rule=e.rule,
            ) from e
    reverted = _release_commit(root, pointer["approval_id"])
    restored = vcs.git(root, "show", f"{reverted}^:{POINTER}")
    if json.loads(restored) != previous:
        raise ClapError(
            f"the pointer before commit {reverted[:12]} is not the previous release in history.jsonl",
            rule="inconsistent_releases",
        )
    tags = _rollback_tags(root, pointer, previous, reverted)
    return _Rollback(pointer, previous, reverted, restored, tags, why)


def _rollback_tags(
    root: Path, pointer: dict[str, Any], previous: dict[str, Any], reverted: str
) -> list[tuple[str, str, str]]:
    """GTO's tags of a rollback (name, commit, message): ``previous``'s version registered if it was
    released before clap wrote tags, ``prod`` unassigned from the current version and assigned to
    ``previous``'s; a tag name already taken, or a registration on another commit, is refused."""
    target = _release_commit(root, previous["approval_id"])
    version = gto.gto_version(gto.release_ordinal(read_history(root), previous["approval_id"]))
    registration = f"{gto.GTO_ARTIFACT}@{version}"
    registered_at = gto.tag_commit(root, registration)
    if registered_at not in (None, target):
        raise ClapError(
            f"git tag {registration} points to {registered_at[:12]}, not to the release commit "
            f"{target[:12]} of batch {previous['batch']}",
            rule="tag_exists",
        )
    tags = (
        []
        if registered_at
        else [  # a release made before clap wrote tags is registered now
            (registration, target, gto.register_message(version, previous["batch"], previous["approval_id"]))
        ]
    )
    detail = f"rollback {pointer['batch']} -> {previous['batch']}\napproval: {previous['approval_id']}"
    counter = gto.next_counter(root)
    unassign = gto.unassign_tag(root, pointer["approval_id"], reverted, counter, detail)
    tags += unassign  # prod leaves the rolled-back version
    counter += len(unassign)
    tags.append(
        (f"{gto.GTO_ARTIFACT}#{gto.GTO_STAGE}#{counter}", target, gto.assign_message(version, detail))
    )
    gto.refuse_taken(root, [name for name, _, _ in tags])
    return tags


def _apply_rollback(
    root: Path, plan: _Rollback, evidence: list[Path], by_revert: list[dict[str, Any]]
) -> dict[str, Any]:
    """Restore the previous adapter's bytes (sha256 verified), then write the pointer and the event,
    commit them (with the ``evidence`` files the rollback acts on) and create the tags, all or nothing."""
    how = restore_adapter(root, plan.previous["batch"], plan.previous["adapter_sha256"])
    event = {
        "event": "rollback",
        "from_batch": plan.pointer["batch"],
        "to_batch": plan.previous["batch"],
        "reverted_commit": plan.reverted,
        "adapter_sha256": plan.previous["adapter_sha256"],
        "adapter_restored_by": how,
        **plan.why,
        "at": utc_now(),
    }
    with transaction(root, [POINTER, HISTORY, *evidence]):
        io.atomic_write_text(root / POINTER, plan.restored)
        io.atomic_write_text(root / HISTORY, appended(file_text(root / HISTORY), [*by_revert, event]))
        commit = commit_files(
            root,
            [POINTER, HISTORY, *evidence],
            f"rollback {plan.pointer['batch']} -> {plan.previous['batch']} (revert of {plan.reverted[:12]})",
        )
        return {**event, "release_commit": commit, "tags": gto.create_tags(root, plan.tags)}


BASE_POINTER = {
    "batch": None,
    "note": "rolled back to the base model (release.rollback_to_base): no adapter in production",
}


def _rollback_to_base(
    root: Path,
    pointer: dict[str, Any],
    why: dict[str, Any],
    evidence: list[Path],
    by_revert: list[dict[str, Any]],
) -> dict[str, Any]:
    """Take the first (and only) release in effect out of production: the base model serves.

    The pointer before the release's commit must have named no batch; GTO's ``prod`` is
    unassigned from the version and assigned to none."""
    reverted = _release_commit(root, pointer["approval_id"])
    try:
        before = json.loads(vcs.git(root, "show", f"{reverted}^:{POINTER}"))
    except ClapError:  # no pointer file before the first release
        before = {"batch": None}
    if not isinstance(before, dict) or before.get("batch") is not None:
        raise ClapError(
            f"the pointer before commit {reverted[:12]} names batch {before.get('batch')!r}, but history.jsonl "
            "has no release in effect before it",
            rule="inconsistent_releases",
        )
    detail = f"rollback {pointer['batch']} -> base\npolicy: release.rollback_to_base"
    tags = gto.unassign_tag(root, pointer["approval_id"], reverted, gto.next_counter(root), detail)
    gto.refuse_taken(root, [name for name, _, _ in tags])
    event = {
        "event": "rollback",
        "from_batch": pointer["batch"],
        "to_batch": None,
        "to": "base",
        "reverted_commit": reverted,
        "adapter_sha256": None,
        "adapter_restored_by": None,
        "policy": "release.rollback_to_base",
        **why,
        "at": utc_now(),
    }
    with transaction(root, [POINTER, HISTORY, *evidence]):
        io.write_json(root / POINTER, BASE_POINTER)
        io.atomic_write_text(root / HISTORY, appended(file_text(root / HISTORY), [*by_revert, event]))
        commit = commit_files(
            root,
            [POINTER, HISTORY, *evidence],
            f"rollback {pointer['batch']} -> base (revert of {reverted[:12]})",
        )
        return {**event, "release_commit": commit, "tags": gto.create_tags(root, tags)}


def _release_commit(root: Path, approval_id: str) -> str:
    """The commit that released approval ``approval_id`` (found by its message)."""
    lines = vcs.git(
        root, "log", "--format=%H %s", "-F", f"--grep=(approval {approval_id})", "--", str(POINTER)
    ).splitlines()
    shas = [line.split(" ", 1)[0] for line in lines if line.split(" ", 1)[-1].startswith("release ")]
    if len(shas) != 1:
        raise ClapError(
            f"cannot find the one commit that released approval {approval_id} (found {len(shas)})",
            rule="no_release_commit",
        )
    return shas[0]


def restore_adapter(root: Path, batch: str, expected_sha256: str) -> str:
    """Make ``models/adapters/<batch>`` hold the adapter with ``expected_sha256``.

    Tries, in order: the bytes already there, ``dvc checkout`` (local cache), ``dvc pull``
    (remote). Returns which one worked.

    Raises:
        ClapError: the adapter is in neither the cache nor the remote, or dvc.lock tracks
            a different adapter for this batch than the released one.
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    target = Path(root).resolve() / "models" / "adapters" / batch
    weights = target / ADAPTER_FILE

    def ok() -> bool:
        return weights.is_file() and io.sha256_file(weights) == expected_sha256

    if ok():
        return "present"
    errors = []
    for how in ("checkout", "pull"):
        try:
            with (
                contextlib.chdir(target.parents[2]),
                Repo(str(target.parents[2])) as repo,
            ):  # DVC resolves against the cwd
                getattr(repo, how)(targets=[str(target)])
        except DvcException as e:
            errors.append(f"dvc {how}: {e}")
            continue
        if ok():
            return how
        errors.append(
            f"dvc {how}: restored bytes do not have the released sha256 (dvc.lock tracks another adapter for {batch})"
        )
    raise ClapError(
        f"cannot restore the adapter of batch {batch} (sha256 {expected_sha256[:12]}…): " + "; ".join(errors),
        rule="adapter_unavailable",
    )


def gate_rollback(root: Path, batch: str, pointer: dict[str, Any]) -> dict[str, Any]:
    """What a rollback on the gate decision of ``batch`` records: the batch, its rule and its evidence's sha256.

    Raises:
        ClapError: the gate record or evidence is not committed; the gate's decision for production
            is not ``rollback``; or the gate judged another adapter than the one in production now.
    """
    paths = artifact_paths(batch)
    vcs.require_committed(
        root,
        [paths["gate"], paths["evidence"]],
        f"the gate record and evidence bundle of {batch} must be committed (a rollback names the decision it acts on)",
    )
    record = gate_decision(root, batch)
    production = record.get("production_decision")
    if production != "rollback":
        raise ClapError(
            f"batch {batch}: the gate's decision for production is {production!r}, not 'rollback' (incumbent "
            f"verdict {record.get('incumbent_decision')!r}); `clap rollback` without --batch rolls back by hand",
            file=root / paths["gate"],
            column="production_decision",
            rule="not_a_rollback",
        )
    evidence = io.read_json(root / paths["evidence"])
    judged = (evidence.get("incumbent_verdict") or {}).get("adapter") or {}
    if judged.get("adapter_sha256") != pointer.get("adapter_sha256"):
        raise ClapError(
            f"batch {batch}'s gate judged the adapter of batch {judged.get('batch')!r} "
            f"(sha256 {str(judged.get('adapter_sha256'))[:12]}), but production serves batch {pointer.get('batch')!r} "
            f"(sha256 {str(pointer.get('adapter_sha256'))[:12]}): run `dvc repro` and let the gate decide again",
            file=root / paths["evidence"],
            rule="stale_evaluation",
        )
    return {
        "reason": f"gate {batch}: {record.get('production_rule')}",
        "gate_batch": batch,
        "gate_evidence_sha256": io.sha256_file(root / paths["evidence"]),
    }


def canary_rollback(root: Path, pointer: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """What a rollback on the canary analysis of the release in production records, and the analysis
    files it commits (:func:`clap.release.canary.rollback_evidence`)."""
    return canary_mod.rollback_evidence(root, pointer), [
        p for p in canary_mod.report_paths(str(pointer["batch"])) if (root / p).exists()
    ]


def reverted_rollbacks(root: Path, pointer: dict[str, Any], by: str) -> list[dict[str, Any]]:
    """The rollback events of the releases above ``pointer`` on the stack (their pointer commits
    reverted in git, not yet in history.jsonl), oldest rollback first, for ``by`` to record."""
    stack = release_stack(read_history(root))
    above = reverted_above(stack, pointer)
    if not above:
        return []
    moved = vcs.git(root, "log", "-1", "--format=%H", "--", str(POINTER)).strip()
    events = []
    for n, gone in enumerate(above):
        below = stack[len(stack) - n - 2] if len(stack) - n >= 2 else {"batch": None, "adapter_sha256": None}
        events.append(
            {
                "event": "rollback",
                "from_batch": gone.get("batch"),
                "to_batch": below.get("batch"),
                "adapter_sha256": below.get("adapter_sha256"),
                "reason": "git revert",
                "pointer_commit": moved,  # the last commit that changed the pointer
                "recorded_by": by,
                **(
                    {"to": "base", "policy": "release.rollback_to_base"} if below.get("batch") is None else {}
                ),
                "at": utc_now(),
            }
        )
    return events
