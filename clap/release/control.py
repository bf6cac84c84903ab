"""Release control: approve, release and roll back adapters through ``releases/`` in git.

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
both are undone and every file restored. A release or rollback made after such a revert first
records it in the history (``rollback`` events with ``reason: git revert``). A rollback restores the previous pointer from git
(the pointer as it was before the current release's commit), restores that adapter's
bytes with ``dvc checkout``/``dvc pull`` and verifies its sha256 before committing; it may act
on a batch's gate decision (``production_decision: rollback``, the incumbent failing on that
batch's items), and with no previous release it refuses unless params
``release.rollback_to_base`` lets production fall back to the base model.

Both also write the registry the way GTO (iterative/gto, read by DVC Studio) does, as
annotated git tags: the N-th release registers version ``clap-adapter@vN.0.0`` on its
release commit and assigns it the ``prod`` stage (``clap-adapter#prod#<counter>``); a
rollback unassigns ``prod`` from the current version (``clap-adapter#prod!#<counter>``) and
assigns it again to the version rolled back to (a new ``#prod#<counter>`` tag on that
version's commit). ``gto show`` / ``gto history`` list them. The tags are part
of the transaction: a tag that cannot be created undoes the commit, and an existing tag name
is refused, never moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clap import io, params, vcs
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE
from clap.params import bad_param, check_keys
from clap.release import canary as canary_mod
from clap.release.approval import (
    RELEASABLE,
    Binding,
    approver_of,
    check_binding,
    key_sha256,
    load_private_key,
    mint_token,
    verify_token,
)
from clap.release.handoff import (
    CARD,
    COST,
    MANIFEST,
    MISSING_LOCK,
    CardParams,
    CostParams,
    Handoff,
    build_handoff,
    write_handoff,
)
from clap.release.registry import (
    ADAPTER_CONFIG,
    HISTORY,
    LEDGER,
    POINTER,
    RELEASES,
    TRUSTED,
    read_history,
    read_trust,
    recorded_base_sha256,
    release_stack,
    reverted_above,
)
from clap.release.registry import read_jsonl as _read_jsonl
from clap.release.signing import PUBLIC_KEY as SIGNING_PUBLIC_KEY
from clap.release.signing import (
    SIGNATURE,
    ModelSignature,
    load_signing_key,
    require_covers,
    sign_adapter,
)
from clap.release.trust import PENDING, TRUST_LOG, propose, required, signers

HANDOFF = RELEASES / "handoff"

# The GTO registry (iterative/gto 1.10 tag format, gto/tag.py): one artifact, one stage.
GTO_ARTIFACT = "clap-adapter"
GTO_STAGE = "prod"


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


# ---------------------------------------------------------------- paths and records


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
    return {row["jti"] for row in _read_jsonl(Path(root) / LEDGER)}


def _was_used(root: Path, jti: str) -> bool:
    """In the ledger, or named by a release commit on any branch: a plain `git revert` of a
    release commit drops its ledger line, the commit log keeps the approval id."""
    if jti in used_approval_ids(root):
        return True
    subjects = vcs.git(root, "log", "--all", "--format=%s", "-F", f"--grep=(approval {jti})").splitlines()
    return any(s.startswith("release ") for s in subjects)


def _append_line(text: str, row: dict[str, Any]) -> str:
    return text + json.dumps(row, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def _appended(text: str, rows: list[dict[str, Any]]) -> str:
    for row in rows:
        text = _append_line(text, row)
    return text


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------- git


def _commit(root: Path, paths: list[Path], message: str) -> str:
    names = list(map(str, paths))
    vcs.git(root, "add", "--", *names)
    vcs.git(root, "commit", "-q", "-m", message, "--only", "--", *names)
    return vcs.head_commit(root)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One release-state change at a time on this clone (the lock file lives in .git)."""
    git_dir = Path(root) / vcs.git(root, "rev-parse", "--git-dir").strip()
    with open(git_dir / "clap-release.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise ClapError(
                "another clap release/rollback is running in this repository", rule="locked"
            ) from e
        yield


@contextlib.contextmanager
def _transaction(root: Path, paths: list[Path]) -> Iterator[None]:
    """Restore ``paths`` (bytes, and their index entries) and undo a commit made in the block
    (one whose registry tags failed) if the block raises: all or nothing."""
    saved = {p: ((Path(root) / p).read_bytes() if (Path(root) / p).exists() else None) for p in paths}
    head = vcs.head_commit(root)
    try:
        yield
    except BaseException:
        with contextlib.suppress(ClapError):  # a commit made inside the block is undone (its tags failed)
            if vcs.head_commit(root) != head:
                vcs.git(root, "reset", "-q", "--soft", head)
        for p, data in saved.items():
            if data is None:
                (Path(root) / p).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # a folder this transaction created goes too
                    (Path(root) / p).parent.rmdir()
            else:
                io.atomic_write_bytes(Path(root) / p, data)
        with contextlib.suppress(ClapError):
            vcs.git(root, "reset", "-q", "--", *map(str, paths))
        raise


# ---------------------------------------------------------------- GTO registry tags


def gto_version(ordinal: int) -> str:
    """The GTO version of the ``ordinal``-th release (1-based): ``v<ordinal>.0.0``.

    Every release is a new adapter that may change answers, so each one is a new major
    version; semver order is release order and the major number is the release count.
    """
    return f"v{ordinal}.0.0"


def _release_ordinal(history: list[dict[str, Any]], approval_id: str) -> int:
    """1-based position of the release of ``approval_id`` among the release events of ``history``."""
    ids = [e.get("pointer", {}).get("approval_id") for e in history if e.get("event") == "release"]
    if ids.count(approval_id) != 1:
        raise ClapError(
            f"history.jsonl has {ids.count(approval_id)} releases of approval {approval_id}, expected one",
            file=HISTORY,
            rule="inconsistent_releases",
        )
    return ids.index(approval_id) + 1


def _tag_commit(root: Path, name: str) -> str | None:
    """The commit tag ``name`` points to (peeled), or None when there is no such tag."""
    out = vcs.git(root, "for-each-ref", "--format=%(objectname) %(*objectname)", f"refs/tags/{name}").split()
    return out[-1] if out else None


def _gto_counter(root: Path) -> int:
    """GTO numbers an artifact's tags with one counter (gto/tag.py name_tag): the highest ``#<n>`` plus one."""
    names = vcs.git(root, "tag", "--list", f"{GTO_ARTIFACT}@*", f"{GTO_ARTIFACT}#*").split()
    return max((int(m[1]) for n in names if (m := re.search(r"#(\d+)$", n))), default=0) + 1


def _refuse_taken(root: Path, names: list[str]) -> None:
    taken = [n for n in names if _tag_commit(root, n) is not None]
    if taken:
        raise ClapError(
            f"git tag {', '.join(taken)} already exists: registry tags are never moved or overwritten "
            "(delete it by hand only if it is not a clap release)",
            rule="tag_exists",
        )


def _create_tags(root: Path, tags: list[tuple[str, str, str]]) -> list[str]:
    """Create the annotated tags ``(name, commit, message)``, all or none; an existing name is refused."""
    _refuse_taken(root, [name for name, _, _ in tags])
    created: list[str] = []
    try:
        for name, commit, message in tags:
            vcs.git(root, "tag", "-a", name, "-m", message, commit)  # no -f: git refuses an existing name
            created.append(name)
    except BaseException:
        for name in created:
            with contextlib.suppress(ClapError):
                vcs.git(root, "tag", "-d", name)
        raise
    return created


def _register_message(version: str, batch: str, approval_id: str) -> str:
    return (
        f"Registering artifact {GTO_ARTIFACT} version {version}\n\nbatch: {batch}\napproval: {approval_id}\n"
    )


def _assign_message(version: str, detail: str) -> str:
    return f"Assigning stage {GTO_STAGE} to artifact {GTO_ARTIFACT} version {version}\n\n{detail}\n"


# ---------------------------------------------------------------- checks shared by approve and release


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


def _refuse_revoked(root: Path, name: str, key: Any) -> None:
    """A key the trust log revoked approves nothing, under whatever name it is trusted."""
    row = read_trust(root).revoked.get(key_sha256(key))
    if row is not None:
        raise ClapError(
            f"approval refused: the key of {name!r} (sha256 {key_sha256(key)[:12]}…) was revoked "
            f"({row.get('reason') or 'no reason given'}, after history event {row['after_event']})",
            file=TRUST_LOG,
            rule="key_revoked",
        )


# ---------------------------------------------------------------- approve


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
    _refuse_revoked(root, issuer, trusted[issuer])
    return mint_token(key, issuer, binding, audience=p.audience, ttl_s=ttl, now=now)


# ---------------------------------------------------------------- release


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
        _refuse_revoked(root, claims["iss"], trust.keys[claims["iss"]])
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
    with _locked(root):
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
            "at": _now(),
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
        "at": _now(),
    }
    return event, {sig_path: signature.signature, pub_path: signature.public_key}


def _release_tags(root: Path, batch: str, approval_id: str) -> list[tuple[str, str]]:
    """GTO's registration of the next version and its assignment to ``prod`` (name, message); a tag
    name already taken is refused."""
    history = read_history(root)
    version = gto_version(sum(e.get("event") == "release" for e in history) + 1)
    detail = f"batch: {batch}\napproval: {approval_id}"
    tags = [
        (f"{GTO_ARTIFACT}@{version}", _register_message(version, batch, approval_id)),
        (f"{GTO_ARTIFACT}#{GTO_STAGE}#{_gto_counter(root)}", _assign_message(version, detail)),
    ]
    _refuse_taken(root, [name for name, _ in tags])
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
    with _transaction(root, paths):
        write_handoff(change.handoff, root / out_dir)
        for path, data in files.items():
            io.atomic_write_bytes(root / path, data)
        io.atomic_write_text(
            root / HISTORY, _appended(_text(root / HISTORY), [*(change.reverted or []), event])
        )
        if not change.used:  # a hold: production unchanged, one commit
            commit = _commit(root, [HISTORY, *rows], change.message)
            return {**event, "release_commit": commit}
        io.atomic_write_text(root / LEDGER, _appended(_text(root / LEDGER), change.used))
        jti = event["pointer"]["approval_id"]
        ledger_commit = _commit(root, [HISTORY, LEDGER, *rows], f"release {batch}: ledger (approval {jti})")
        io.write_json(root / POINTER, event["pointer"])
        commit = _commit(root, [POINTER], change.message + POINTER_COMMIT_BODY)
        created = _create_tags(root, [(name, commit, text) for name, text in change.tags or []])
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
                "at": _now(),
            }
        )
    return events


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


# ---------------------------------------------------------------- rollback


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


def commit_canary_promotion(root: Path, pointer: dict[str, Any], rec: dict[str, Any]) -> str:
    """Commit the canary analysis that promotes the release in production (it then serves all
    traffic) with a ``canary`` event in history.jsonl (decision, e-values, who acted); the commit id."""
    paths = [p for p in canary_mod.report_paths(str(pointer["batch"])) if (root / p).exists()]
    with _locked(root):
        vcs.require_committed(root, [POINTER, HISTORY, LEDGER], "releases/ has uncommitted changes")
        event = canary_mod.promotion_event(root, pointer, rec, _now())
        with _transaction(root, [HISTORY, *paths]):
            io.atomic_write_text(root / HISTORY, _append_line(_text(root / HISTORY), event))
            return _commit(root, [HISTORY, *paths], f"canary {pointer['batch']}: promote (all traffic)")


def run_canary(root: Path, apply: bool, *, actor: str = "clap canary") -> dict[str, Any]:
    """Analyze the log of the canary in production and write its record and report; with ``apply``,
    act on the verdict (:func:`act_on_canary`). ``clap canary`` by hand; ``clap serve``'s watcher
    calls :func:`act_on_canary` itself.

    Returns:
        The analysis record, with ``applied`` (the rollback event, the promote commit, or None).

    Raises:
        ClapError: nothing in production is a canary, the log is missing or malformed.
    """
    root = Path(root)
    p = canary_mod.params_of(root)
    pointer = read_pointer(root)
    if pointer.get("decision") != "canary":
        raise ClapError(
            f"production serves batch {pointer.get('batch')!r} as {pointer.get('decision')!r}, not as a canary: "
            "nothing to analyze",
            file=root / POINTER,
            column="decision",
            rule="no_canary",
        )
    log = root / p.log
    if not log.exists():
        raise ClapError(
            "no canary log: `clap serve` writes one while a canary is served", file=log, rule="no_canary_log"
        )
    rec = {
        **canary_mod.report(pointer, log, canary_mod.read_log(log, pointer["adapter_sha256"]), p),
        "actor": actor,
    }
    canary_mod.write_report(root, rec)
    applied = act_on_canary(root, pointer, rec) if apply else None
    return {**rec, "applied": applied}


def act_on_canary(root: Path, pointer: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any] | str | None:
    """Act on the canary analysis ``rec`` (already written by :func:`clap.release.canary.write_report`)
    of the release ``pointer``: ``rollback`` through :func:`rollback` (previous adapter restored and
    hash-checked, a ``rollback`` event with the decision and its e-values, the analysis committed with
    it), ``promote`` through :func:`commit_canary_promotion`; ``continue``: nothing (None).

    Who acts signs nothing: neither action can put an unapproved adapter in production (a rollback
    only moves down the stack to a release approved before; a promotion leaves the pointer, approved
    as a canary, as it is), and the decision is a function of the committed analysis and the
    pre-registered params; ``canary_actor`` records who made it.
    """
    if rec["decision"] == "rollback":
        return rollback(root, canary=True)
    if rec["decision"] == "promote":
        return commit_canary_promotion(root, pointer, rec)
    return None


def _unassign_tag(
    root: Path, approval_id: str, reverted: str, counter: int, detail: str
) -> list[tuple[str, str, str]]:
    """GTO's unassignment of ``prod`` from the rolled-back version (when its registration tag is on the
    reverted release commit)."""
    current = gto_version(_release_ordinal(read_history(root), approval_id))
    if _tag_commit(root, f"{GTO_ARTIFACT}@{current}") != reverted:
        return []
    return [
        (
            f"{GTO_ARTIFACT}#{GTO_STAGE}!#{counter}",
            reverted,
            f"Unassigning stage {GTO_STAGE} from artifact {GTO_ARTIFACT} version {current}\n\n{detail}\n",
        )
    ]


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
    with _locked(root):
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
            _refuse_revoked(root, str(previous.get("approver")), target_key)
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
    version = gto_version(_release_ordinal(read_history(root), previous["approval_id"]))
    registration = f"{GTO_ARTIFACT}@{version}"
    registered_at = _tag_commit(root, registration)
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
            (registration, target, _register_message(version, previous["batch"], previous["approval_id"]))
        ]
    )
    detail = f"rollback {pointer['batch']} -> {previous['batch']}\napproval: {previous['approval_id']}"
    counter = _gto_counter(root)
    unassign = _unassign_tag(root, pointer["approval_id"], reverted, counter, detail)
    tags += unassign  # prod leaves the rolled-back version
    counter += len(unassign)
    tags.append((f"{GTO_ARTIFACT}#{GTO_STAGE}#{counter}", target, _assign_message(version, detail)))
    _refuse_taken(root, [name for name, _, _ in tags])
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
        "at": _now(),
    }
    with _transaction(root, [POINTER, HISTORY, *evidence]):
        io.atomic_write_text(root / POINTER, plan.restored)
        io.atomic_write_text(root / HISTORY, _appended(_text(root / HISTORY), [*by_revert, event]))
        commit = _commit(
            root,
            [POINTER, HISTORY, *evidence],
            f"rollback {plan.pointer['batch']} -> {plan.previous['batch']} (revert of {plan.reverted[:12]})",
        )
        return {**event, "release_commit": commit, "tags": _create_tags(root, plan.tags)}


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
    tags = _unassign_tag(root, pointer["approval_id"], reverted, _gto_counter(root), detail)
    _refuse_taken(root, [name for name, _, _ in tags])
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
        "at": _now(),
    }
    with _transaction(root, [POINTER, HISTORY, *evidence]):
        io.write_json(root / POINTER, BASE_POINTER)
        io.atomic_write_text(root / HISTORY, _appended(_text(root / HISTORY), [*by_revert, event]))
        commit = _commit(
            root,
            [POINTER, HISTORY, *evidence],
            f"rollback {pointer['batch']} -> base (revert of {reverted[:12]})",
        )
        return {**event, "release_commit": commit, "tags": _create_tags(root, tags)}


# ---------------------------------------------------------------- keygen, revoke and handoff


def change_trust(
    root: Path, action: str, name: str, key_path: Path, p: ReleaseParams, reason: str = ""
) -> dict[str, Any]:
    """Sign the key change ``action`` (``add`` or ``revoke``) of approver ``name`` with the private
    key at ``key_path`` and commit it (:mod:`clap.release.trust`).

    A change needs ``min(release.key_quorum, keys in force)`` signatures of keys in force; until it
    has them it waits in ``releases/trust_pending.json`` (each signer runs this command, or
    ``clap trust``, in turn), then it is appended to ``releases/trust.jsonl``. A revoked key's
    ``.pub`` stays in ``trusted_keys`` so the history it signed still verifies; nothing it signed
    is accepted after the revocation (``after_event``) or as the production pointer, whatever
    name it is filed under.

    Returns:
        The event, plus ``missing`` (signatures still needed; 0: in force) and ``commit``.
    """
    root = Path(root)
    if action == "revoke" and not reason.strip():
        raise ClapError("say why the key is revoked (--reason)", rule="bad_reason")
    with _locked(root):
        vcs.require_committed(
            root, [POINTER, HISTORY, LEDGER, TRUSTED, TRUST_LOG, PENDING], "releases/ has uncommitted changes"
        )
        changes, event, missing = propose(
            root,
            action,
            name,
            load_private_key(key_path),
            p.key_quorum,
            n_history=len(read_history(root)),
            reason=reason.strip(),
        )
        files = {path: text for path, text in changes.items() if text is not None or (root / path).exists()}
        signer = signers(event, read_trust(root).keys)
        state = f"{missing} more signature(s) needed" if missing else "in force"
        with _transaction(root, list(files)):
            for path, text in files.items():
                if text is None:
                    (root / path).unlink(missing_ok=True)
                else:
                    io.atomic_write_text(root / path, text)
            commit = _commit(
                root, list(files), f"trust: {action} {name} (signed by {', '.join(signer)}; {state})"
            )
        return {**event, "signers": signer, "missing": missing, "commit": commit}


def _require_ignored(root: Path, probe: Path) -> None:
    """A private key inside the repository must land in a path git ignores."""
    rel = (
        probe.resolve().relative_to(root.resolve())
        if probe.resolve().is_relative_to(root.resolve())
        else None
    )
    if rel is not None and not vcs.is_ignored(root, rel):
        raise ClapError(
            f"{rel} would not be ignored by git: keep private keys in a git-ignored folder (keys/)",
            rule="key_not_ignored",
        )


def keygen(root: Path, name: str, key_dir: Path) -> tuple[Path, Path]:
    """Create approver ``name``'s key pair; the private key must land in a git-ignored path."""
    from clap.release.approval import generate_keypair

    root = Path(root)
    _require_ignored(root, Path(key_dir) / f"{name}.key")
    return generate_keypair(name, Path(key_dir), root / TRUSTED)


def signing_keygen(root: Path, name: str, key_dir: Path) -> tuple[Path, Path]:
    """Create an EC P-256 model-signing key pair (``<key_dir>/<name>.key`` and ``.pub``) for
    ``clap release --signing-key``; the private key must land in a git-ignored path (a release
    commits a copy of the public key next to each signature)."""
    from clap.release.signing import generate_signing_keypair

    root = Path(root)
    _require_ignored(root, Path(key_dir) / f"{name}.key")
    return generate_signing_keypair(name, Path(key_dir))


def handoff(root: Path, batch: str, out_dir: Path | None, p: ReleaseParams) -> list[str]:
    """Build the handoff artifacts of ``batch`` as it is on disk now, write them, return the problems."""
    root = Path(root)
    h = build_handoff(root, current_binding(root, batch), vcs.head_commit(root), p.card, p.cost)
    write_handoff(h, out_dir if out_dir is not None else root / HANDOFF / batch)
    return h.problems
