"""Release control: approve and release adapters through ``releases/`` in git.

``releases/production.json`` is the pointer to what serves (batch, artifact hashes,
decision, approval id, source commit); ``history.jsonl`` is the append-only log of
release, hold and rollback events (a release event keeps its signed approval token, so every
reader re-verifies the pointer: :func:`clap.release.registry.verify_pointer`); ``approvals_used.jsonl`` is the ledger of consumed
approval ids; ``trusted_keys/<approver>.pub`` are the only keys a release trusts.

A release happens only when every check passes: a trusted, committed key signed the
token, which is unexpired, unused, for this batch, and bound to hashes equal to the files
on disk; the gate's current decision is promote or canary and equal to the token's; the
evaluation ran against the current production adapter and its records are committed; the
handoff artifacts validate and the cost is within budget. Then the adapter folder is signed
in the OpenSSF model-signing format with an EC P-256 key (:mod:`clap.release.signing`; the
signature must sign exactly the approved adapter and config bytes), and two commits are made:
the *ledger commit* (history, ledger, handoff files, signature and public key: every append-only
row) and the *pointer commit* (``releases/production.json`` alone), so that ``git revert`` of the
pointer commit is a rollback that loses no row (:mod:`clap.release.registry`); on any failure
both are undone and every file restored (:mod:`clap.release.transaction`). A release made after
such a revert first records it in the history (``rollback`` events with ``reason: git revert``:
:func:`clap.release.rollback.reverted_rollbacks`). The release registers the next GTO version and
assigns it ``prod`` (:mod:`clap.release.gto`).

The rest of release control: rolling back (:mod:`clap.release.rollback`), acting on the canary
analysis (:mod:`clap.release.canary_action`), keys and trust changes (:mod:`clap.release.keys`);
what they read is :mod:`clap.release.records`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clap import io, vcs
from clap.errors import ClapError
from clap.release import gto
from clap.release.approval import (
    RELEASABLE,
    Binding,
    approver_of,
    check_binding,
    load_private_key,
    mint_token,
    verify_token,
)
from clap.release.canary_action import (
    act_on_canary as act_on_canary,  # clap/chain/serve.py imports it from here
)
from clap.release.handoff import (
    CARD,
    COST,
    MANIFEST,
    MISSING_LOCK,
    CostParams,
    Handoff,
    build_handoff,
    write_handoff,
)
from clap.release.records import (
    HANDOFF,
    ReleaseParams,
    artifact_paths,
    current_binding,
    gate_decision,
    read_pointer,
    refuse_revoked,
    used_approval_ids,
)
from clap.release.registry import ADAPTER_CONFIG, HISTORY, LEDGER, POINTER, TRUSTED, read_history, read_trust
from clap.release.rollback import reverted_rollbacks
from clap.release.signing import PUBLIC_KEY as SIGNING_PUBLIC_KEY
from clap.release.signing import (
    SIGNATURE,
    ModelSignature,
    load_signing_key,
    require_covers,
    sign_adapter,
)
from clap.release.transaction import appended, commit_files, file_text, locked, transaction, utc_now
from clap.release.trust import TRUST_LOG, required


def _require_fresh_evaluation(root: Path, batch: str) -> None:
    """The gate must have compared the candidate with the adapter now in production.

    eval@<batch> depends on releases/production.json; dvc.lock records the md5 of the
    pointer it ran with. A different pointer now means the evidence is stale.
    """
    stage = (vcs.read_dvc_lock(root, MISSING_LOCK)["stages"]).get(f"eval@{batch}")
    if stage is None:
        raise ClapError(
            f"dvc.lock has no stage eval@{batch}: run `dvc repro` first",
            file="dvc.lock",
            rule="not_evaluated",
        )
    recorded = [d.get("md5") for d in stage.get("deps", []) if d.get("path") == str(POINTER)]
    if not recorded:
        raise ClapError(
            f"eval@{batch} in dvc.lock does not depend on {POINTER}", file="dvc.lock", rule="not_evaluated"
        )
    if recorded[0] != hashlib.md5((Path(root) / POINTER).read_bytes()).hexdigest():  # DVC 3 hashes raw bytes
        raise ClapError(
            f"batch {batch} was evaluated against a different production adapter than the current one: "
            f"run `dvc repro` to re-evaluate it, then approve again",
            rule="stale_evaluation",
        )


def _require_releasable_state(root: Path, binding: Binding) -> None:
    """Checks on repository state shared by approve and release (records committed, evaluation fresh)."""
    batch, paths = binding.batch, artifact_paths(binding.batch)
    vcs.require_committed(
        root,
        [paths["gate"], paths["evidence"], Path("dvc.lock")],
        f"the gate record, evidence bundle and dvc.lock of {batch} must be committed (a release names its commit)",
    )
    vcs.require_committed(
        root,
        [POINTER, HISTORY, LEDGER, TRUSTED, TRUST_LOG],
        "releases/ has uncommitted changes (trusted keys count only once committed)",
    )
    _require_fresh_evaluation(root, batch)
    _require_consistent_evidence(root, binding)


def _require_consistent_evidence(root: Path, binding: Binding) -> None:
    """The evidence bundle must describe exactly the artifacts on disk and the gate's decision."""
    path = Path(root) / artifact_paths(binding.batch)["evidence"]
    evidence = io.read_json(path)
    expected = {
        "decision": binding.decision,
        "adapter_sha256": binding.adapter_sha256,
        "eval_items_sha256": binding.eval_sha256,
    }
    bad = [f"{k}: evidence {evidence.get(k)!r} != {v!r}" for k, v in expected.items() if evidence.get(k) != v]
    if bad:
        raise ClapError(
            "the evidence bundle does not describe the artifacts on disk (re-run `dvc repro`): "
            + "; ".join(bad),
            file=path,
            rule="evidence_mismatch",
        )


def _refusal_of_decision(root: Path, batch: str, decision: str) -> ClapError:
    """The error for a hold/reject decision, carrying the gate's deciding rule and its detail."""
    rule = gate_decision(root, batch).get("rule", "")
    evidence_path = Path(root) / artifact_paths(batch)["evidence"]
    reasons = io.read_json(evidence_path).get("reasons", []) if evidence_path.exists() else []
    detail = next((r.get("detail") for r in reasons if isinstance(r, dict) and r.get("name") == rule), None)
    why = f"rule {rule}: {detail}" if detail else (f"rule {rule}" if rule else "no reason recorded")
    return ClapError(
        f"batch {batch}: the gate decided {decision!r} ({why}); only {' or '.join(RELEASABLE)} can be released. "
        f"Report: reports/gate/{batch}/report.md",
        rule="not_releasable",
    )


def approve(root: Path, batch: str, key_path: Path, ttl_s: int | None, p: ReleaseParams, *, now: int) -> str:
    """Sign a single-use approval of ``batch`` as it is on disk now.

    Args:
        root: repository root.
        batch: the batch to approve.
        key_path: the approver's private key (its public key must be in releases/trusted_keys).
        ttl_s: token lifetime in seconds; None takes ``release.approval_ttl_s``.
        p: release params.
        now: issue time (unix seconds).

    Returns:
        The token to pass to ``clap release``.

    Raises:
        ClapError: the gate decision is hold/reject (with the gate's reasons), the
            evaluation is stale, records are uncommitted, or the key is not trusted.
    """
    root = Path(root)
    binding = current_binding(root, batch)
    if binding.decision not in RELEASABLE:
        raise _refusal_of_decision(root, batch, binding.decision)
    ttl = p.approval_ttl_s if ttl_s is None else ttl_s
    if not 0 < ttl <= p.max_approval_ttl_s:
        raise ClapError(
            f"--ttl must be in (0, {p.max_approval_ttl_s}] seconds (release.max_approval_ttl_s)",
            rule="bad_ttl",
        )
    _require_releasable_state(root, binding)
    key = load_private_key(key_path)
    trusted = read_trust(root).keys
    issuer = approver_of(key, trusted)
    refuse_revoked(root, issuer, trusted[issuer])
    return mint_token(key, issuer, binding, audience=p.audience, ttl_s=ttl, now=now)


def _was_used(root: Path, jti: str) -> bool:
    """In the ledger, or named by a release commit on any branch: a plain `git revert` of a
    release commit drops its ledger line, the commit log keeps the approval id."""
    if jti in used_approval_ids(root):
        return True
    subjects = vcs.git(root, "log", "--all", "--format=%s", "-F", f"--grep=(approval {jti})").splitlines()
    return any(s.startswith("release ") for s in subjects)


def _verified_claims(
    root: Path, batch: str, tokens: Sequence[str], p: ReleaseParams
) -> tuple[list[dict[str, Any]], Binding]:
    """Every check on the tokens and the artifacts: each token verified, unused and bound to the
    artifacts on disk, by ``min(release.approvals_required, keys in force)`` distinct approvers;
    returns their claims (in the order given) and the current binding."""
    trust = read_trust(root)
    in_force = trust.in_force()
    all_claims = []
    for token in tokens:
        claims = verify_token(token.strip(), trust.keys, audience=p.audience, max_ttl_s=p.max_approval_ttl_s)
        refuse_revoked(root, claims["iss"], trust.keys[claims["iss"]])
        if claims["batch"] != batch:
            raise ClapError(
                f"approval token refused: it approves batch {claims['batch']!r}, not {batch!r}",
                rule="wrong_batch",
            )
        if _was_used(root, claims["jti"]):
            raise ClapError(
                f"approval token refused: approval {claims['jti']} was already used (tokens are single-use)",
                rule="replayed_token",
            )
        all_claims.append(claims)
    approvers = [c["iss"] for c in all_claims]
    need = required(p.approvals_required, len(in_force))
    if len(set(approvers)) < len(approvers) or len(approvers) < need:
        raise ClapError(
            f"release of {batch} refused: approved by {approvers or 'nobody'}; {need} distinct approvers needed "
            f"(release.approvals_required {p.approvals_required}, {len(in_force)} keys in force: "
            f"{', '.join(sorted(in_force))}). Each approver runs `clap approve {batch} --key <their key>`; "
            "pass every token with --token",
            rule="approvals_required",
        )
    binding = current_binding(root, batch)
    if binding.decision not in RELEASABLE:
        raise _refusal_of_decision(root, batch, binding.decision)
    for claims in all_claims:
        check_binding(claims, binding)
    _require_releasable_state(root, binding)
    return all_claims, binding


def _require_certified(
    root: Path, batch: str, uncertified: str, scenario: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The batch's gate decision must have been made in a certified scenario (its gate record's
    ``certified``) that is still certified now (``scenario``: :func:`clap.judge.certification.status`
    read at release time, when given: the base, data, params or code may have changed since the gate
    ran), or the releaser says why it ships anyway (``uncertified``: recorded in the event)."""
    gate = gate_decision(root, batch)
    if gate.get("certified") == 1 and (scenario is None or scenario["certified"]):
        return {}
    if gate.get("certified") == 1:
        why = f"no longer certified since its gate ran: {scenario['reason']}"
    else:
        why = gate.get("certification", "the gate recorded no certification status (re-run the gate)")
    if not uncertified.strip():
        raise ClapError(
            f"batch {batch} was decided in an uncertified scenario ({why}): run `clap certify` and the gate "
            f"again, or release with --uncertified REASON (recorded in releases/history.jsonl)",
            file=Path(root) / "metrics" / "gate" / f"{batch}.json",
            column="certified",
            rule="uncertified_scenario",
        )
    return {"uncertified_override": uncertified.strip(), "uncertified_because": why}


def release(
    root: Path,
    batch: str,
    tokens: str | Sequence[str],
    p: ReleaseParams,
    *,
    signing_key: Path,
    uncertified: str = "",
    scenario: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Release ``batch`` under the approval ``tokens`` and commit ``releases/``.

    Args:
        root: repository root (a git repository).
        batch: the batch to put in production.
        tokens: the approvals from ``clap approve``, one per approver:
            ``min(release.approvals_required, keys in force)`` distinct ones. The first is the
            one the pointer names (``approval_id``, ``approver``).
        p: release params.
        signing_key: the EC P-256 private key (PEM) that signs the adapter folder in the
            OpenSSF model-signing format (:mod:`clap.release.signing`); the signature and the
            public key are committed as ``releases/handoff/<batch>/model.sig`` and
            ``model_signing.pub`` and the event records their sha256.
        uncertified: why a batch decided in an uncertified scenario ships anyway; empty: such a
            batch is refused (:mod:`clap.judge.certification`).
        scenario: the scenario's certification status now (``clap release`` reads it); a batch whose
            gate said certified is refused when it no longer is. None: the gate's word is taken.

    Returns:
        The history event written (plus ``release_commit``): ``event`` is ``release``, or
        ``hold`` when the cost report is over budget or incomplete and
        ``release.cost.over_budget`` is ``hold`` (the pointer is then unchanged, the
        approval is not consumed and nothing is signed).

    Raises:
        ClapError: why the release is refused; releases/ and git are then unchanged.
    """
    root = Path(root)
    load_signing_key(signing_key)  # a missing or wrong key is refused before anything else
    with locked(root):
        tokens = [tokens] if isinstance(tokens, str) else list(tokens)
        change = _plan_release(root, batch, tokens, p, signing_key, uncertified, scenario)
        return _record(root, change)


@dataclass(frozen=True)
class _Change:
    """What one release or hold writes and commits, decided before anything is written
    (:func:`_record` applies it: all or nothing)."""

    event: dict[str, Any]
    handoff: Handoff
    message: str  # the commit message
    used: list[dict[str, Any]] | None = None  # ledger rows (a release consumes its approvals)
    tags: list[tuple[str, str]] | None = None  # GTO tags (name, message) put on the commit
    files: dict[Path, bytes] | None = None  # more files to commit (the model signature)
    reverted: list[dict[str, Any]] | None = None  # rollbacks made by `git revert`, recorded first


def _plan_release(
    root: Path,
    batch: str,
    tokens: list[str],
    p: ReleaseParams,
    signing_key: Path,
    uncertified: str,
    scenario: Mapping[str, Any] | None = None,
) -> _Change:
    """Every check of a release, then what it writes: a hold when the cost is over budget and
    policy holds, else the release (new pointer, signed adapter, consumed approvals, GTO tags).
    Writes nothing; raises why the release is refused."""
    every, binding = _verified_claims(root, batch, tokens, p)
    claims = every[0]
    override = _require_certified(root, batch, uncertified, scenario)
    pointer = read_pointer(root)
    if pointer.get("batch") == batch and pointer.get("adapter_sha256") == binding.adapter_sha256:
        raise ClapError(f"batch {batch} with this adapter is already in production", rule="already_released")
    commit = vcs.head_commit(root)
    handoff = build_handoff(root, binding, commit, p.card, p.cost)
    if handoff.problems:
        raise ClapError(
            "handoff artifacts fail validation:\n  " + "\n  ".join(handoff.problems),
            rule="invalid_handoff",
        )
    if _over_budget(handoff.cost, p.cost):
        event = {
            "event": "hold",
            "batch": batch,
            "approval_id": claims["jti"],
            "approver": claims["iss"],
            "reason": f"cost report {handoff.cost['status']}",
            "at": utc_now(),
        }
        return _Change(
            event, handoff, f"hold {batch}: cost {handoff.cost['status']} (approval {claims['jti']})"
        )
    event, files = _release_event(root, binding, claims, commit, tokens, pointer, signing_key, override)
    tags = _release_tags(root, batch, claims["jti"])
    used = [
        {"jti": c["jti"], "batch": batch, "approver": c["iss"], "exp": c["exp"], "used_at": event["at"]}
        for c in every
    ]
    return _Change(
        event,
        handoff,
        f"release {batch}: {binding.decision} (approval {claims['jti']})",
        used=used,
        tags=tags,
        files=files,
        reverted=reverted_rollbacks(root, pointer, "clap release"),
    )


def _release_event(
    root: Path,
    binding: Binding,
    claims: dict[str, Any],
    commit: str,
    tokens: list[str],
    pointer: dict[str, Any],
    signing_key: Path,
    override: dict[str, str],
) -> tuple[dict[str, Any], dict[Path, bytes]]:
    """The release event (the new pointer, the signed approvals that readers re-verify, the model
    signature of the adapter) and the signature files committed with it: repository path -> bytes."""
    new_pointer = {
        **dataclasses.asdict(binding),
        "approval_id": claims["jti"],
        "approver": claims["iss"],
        "commit": commit,
    }
    signature = _sign_adapter(root, binding, signing_key)
    sig_path, pub_path = HANDOFF / binding.batch / SIGNATURE, HANDOFF / binding.batch / SIGNING_PUBLIC_KEY
    event = {
        "event": "release",
        "pointer": new_pointer,
        "previous_batch": pointer.get("batch"),
        "token": tokens[0].strip(),  # the signed approvals: readers of releases/ re-verify them (registry.py)
        **({"co_tokens": [t.strip() for t in tokens[1:]]} if len(tokens) > 1 else {}),
        # which bytes were released, signed in the OpenSSF model-signing format (registry.py checks it)
        "model_signature": signature.record(sig_path, pub_path),
        **override,
        "at": utc_now(),
    }
    return event, {sig_path: signature.signature, pub_path: signature.public_key}


def _release_tags(root: Path, batch: str, approval_id: str) -> list[tuple[str, str]]:
    """GTO's registration of the next version and its assignment to ``prod`` (name, message); a tag
    name already taken is refused."""
    history = read_history(root)
    version = gto.gto_version(sum(e.get("event") == "release" for e in history) + 1)
    detail = f"batch: {batch}\napproval: {approval_id}"
    tags = [
        (f"{gto.GTO_ARTIFACT}@{version}", gto.register_message(version, batch, approval_id)),
        (f"{gto.GTO_ARTIFACT}#{gto.GTO_STAGE}#{gto.next_counter(root)}", gto.assign_message(version, detail)),
    ]
    gto.refuse_taken(root, [name for name, _ in tags])
    return tags


def _sign_adapter(root: Path, binding: Binding, signing_key: Path) -> ModelSignature:
    """Sign the adapter folder of ``binding.batch``; the signature must sign exactly the approved
    adapter and config bytes (a file changed since the binding was checked is refused)."""
    adapter = artifact_paths(binding.batch)["adapter"]
    signature = sign_adapter(Path(root) / adapter.parent, signing_key)
    require_covers(
        signature.digests,
        {adapter.name: binding.adapter_sha256, ADAPTER_CONFIG: binding.adapter_config_sha256},
        f"batch {binding.batch}",
    )
    return signature


def _over_budget(cost: dict[str, Any], p: CostParams) -> bool:
    """True to hold; raises to refuse; False when the cost is within budget."""
    if cost["status"] == "within":
        return False
    if p.over_budget == "hold":
        return True
    raise ClapError(
        f"cost report is {cost['status']} (cpu {cost['cpu_hours']} h of {p.budget_cpu_hours}, gpu {cost['gpu_hours']} h "
        f"of {p.budget_gpu_hours}, wall time missing for {cost['missing_wall_time']}); release.cost.over_budget is refuse",
        rule="over_budget",
    )


def _record(root: Path, change: _Change) -> dict[str, Any]:
    """Write the handoff files (and ``change.files``: repository path -> bytes) and the event, all
    or nothing. A hold is one commit. A release is two: the ledger commit (the rollbacks made by
    revert, the release event, the consumed approvals, handoff and signature: every append-only
    row) and the pointer commit (``releases/production.json`` alone, carrying the GTO tags): a
    ``git revert`` of the pointer commit is then a rollback that removes no row."""
    event = change.event
    batch = event.get("batch") or event["pointer"]["batch"]
    out_dir = HANDOFF / batch
    files = change.files or {}
    rows = [*_handoff_files(out_dir), *files]
    paths = [HISTORY, *rows] + ([LEDGER, POINTER] if change.used else [])
    with transaction(root, paths):
        write_handoff(change.handoff, root / out_dir)
        for path, data in files.items():
            io.atomic_write_bytes(root / path, data)
        io.atomic_write_text(
            root / HISTORY, appended(file_text(root / HISTORY), [*(change.reverted or []), event])
        )
        if not change.used:  # a hold: production unchanged, one commit
            commit = commit_files(root, [HISTORY, *rows], change.message)
            return {**event, "release_commit": commit}
        io.atomic_write_text(root / LEDGER, appended(file_text(root / LEDGER), change.used))
        jti = event["pointer"]["approval_id"]
        ledger_commit = commit_files(
            root, [HISTORY, LEDGER, *rows], f"release {batch}: ledger (approval {jti})"
        )
        io.write_json(root / POINTER, event["pointer"])
        commit = commit_files(root, [POINTER], change.message + POINTER_COMMIT_BODY)
        created = gto.create_tags(root, [(name, commit, text) for name, text in change.tags or []])
        return {
            **event,
            "release_commit": commit,
            "ledger_commit": ledger_commit,
            **({"tags": created} if created else {}),
        }


POINTER_COMMIT_BODY = (
    "\n\nThis commit changes only releases/production.json: `git revert` it to roll back"
    "\n(the approval stays spent; `clap registry-check` accepts the revert as a rollback)."
)


def _handoff_files(out_dir: Path) -> list[Path]:
    """The handoff files a release or hold writes under ``out_dir``."""
    return [out_dir / CARD, out_dir / MANIFEST, out_dir / COST]


def handoff(root: Path, batch: str, out_dir: Path | None, p: ReleaseParams) -> list[str]:
    """Build the handoff artifacts of ``batch`` as it is on disk now, write them, return the problems."""
    root = Path(root)
    h = build_handoff(root, current_binding(root, batch), vcs.head_commit(root), p.card, p.cost)
    write_handoff(h, out_dir if out_dir is not None else root / HANDOFF / batch)
    return h.problems
