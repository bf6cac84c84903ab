"""The one check every reader of ``releases/`` makes: is the production pointer backed by an approval?

``releases/production.json`` is a file anyone with commit rights can edit; what makes it a
release is the signed approval behind it. :func:`verify_pointer` accepts the pointer only when

- ``releases/history.jsonl`` holds exactly one ``release`` event with the pointer's approval id,
  and that event's pointer is the production pointer, field for field;
- the approval tokens recorded with that event are signed by keys in force: established from the
  root pinned outside the repository through ``releases/trust.jsonl`` (:mod:`clap.release.trust`;
  a key file in ``releases/trusted_keys`` is key material, not trust) and not revoked there (by
  the key's fingerprint, so re-adding it under another name does not help), by
  ``min(release.approvals_required, keys in force)`` distinct approvers; each token's
  issuer is that key's owner, its audience is params ``release.audience`` and it was used (the ledger's
  ``used_at``) inside its validity window;
- ``releases/approvals_used.jsonl`` has exactly one entry for the approval id (single use);
- every hash the token binds (adapter, adapter config, evaluation record, evidence bundle, base
  model) equals the pointer's, and the adapter, its config and the base model being loaded
  equal the bound hashes;
- the pointer is the release in effect when ``history.jsonl`` is replayed (a release pushes
  its pointer, a rollback pops back to the previous one: a rolled-back-to pointer is accepted by
  the earlier release's own approval; a rollback of the only release in effect, with
  ``to_batch: null``, leaves nothing released: the base model, ``clap rollback`` under
  ``release.rollback_to_base``).

**Rollback is ``git revert`` of the pointer commit.** ``clap release`` commits twice: first the
*ledger commit* (``release <batch>: ledger (approval <id>)``: the release event in ``history.jsonl``,
the consumed approvals in ``approvals_used.jsonl``, the handoff files and the model signature: every
append-only row), then the *pointer commit* (``release <batch>: <decision> (approval <id>)``), which
changes ``releases/production.json`` alone. ``git revert <pointer commit>`` therefore restores the
previous pointer and removes no row: the approval stays spent (its ledger row is still there) and the
history keeps the release. Readers accept a pointer that is *any* release still on the stack (the one on
top, or one below it: the releases above were rolled back by reverting their pointer commits), and the
base model (``batch: null``) under ``release.rollback_to_base``; ``clap registry-check`` recognises
each commit that moves the pointer down the stack as a rollback (its target's key must not be revoked),
and refuses a commit that moves it *up* to a release that was in effect before (a revert of such a
revert, or of ``clap rollback``'s commit, which would also remove a row): bringing a rolled-back adapter
back needs fresh approvals and a new ``clap release``. The next ``clap release`` or ``clap rollback``
writes the rollbacks made by revert into ``history.jsonl`` (``reason: git revert``) before its own
event. ``clap serve`` and eval read the working tree only, so a revert of a revert that restores a pointer
still on the stack is caught by ``clap registry-check`` (CI), as every other history rewrite is.

A pointer with ``batch: null`` (nothing released) is valid. ``clap registry-check``
(:func:`check_registry`) replays the whole history with the same checks, commit by commit
through git (every commit that changed ``releases/``; history, ledger and trust log may only
grow), then the working tree; it also checks each release's model signature (the OpenSSF
model-signing bundle ``releases/handoff/<batch>/model.sig``, when the release recorded one) at the
commit that recorded it, and that no later commit replaced it.

This module imports only clap core, :mod:`clap.release.approval` and the adapter file name, so serve and eval can use
it without the release machinery (git, DVC, handoff).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt

from clap import io, params, vcs
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE
from clap.params import bad_param
from clap.release.approval import BINDING_CLAIMS, RELEASABLE, key_sha256, verify_token
from clap.release.trust import TRUST_LOG, Trust, required, signers
from clap.release.trust import replay as replay_trust

RELEASES = Path("releases")
POINTER = RELEASES / "production.json"
HISTORY = RELEASES / "history.jsonl"
LEDGER = RELEASES / "approvals_used.jsonl"
TRUSTED = RELEASES / "trusted_keys"
ADAPTERS = Path("models/adapters")
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class VerifiedRelease:
    """A production pointer whose approval verified: what may be served or compared against."""

    batch: str
    decision: str
    adapter_sha256: str
    adapter_config_sha256: str
    base_sha256: str
    approval_id: str
    approver: str
    adapter_dir: Path


# ---------------------------------------------------------------- reading releases/


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file ([] when it does not exist); a corrupt line is an error."""
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ClapError(f"not a JSON line: {e}", file=path, row=n, rule="corrupt_jsonl") from e
        if not isinstance(row, dict):
            raise ClapError("a line is not a JSON object", file=path, row=n, rule="corrupt_jsonl")
        rows.append(row)
    return rows


def read_history(root: Path) -> list[dict[str, Any]]:
    """All release/hold/rollback events, oldest first."""
    return read_jsonl(Path(root) / HISTORY)


def verified_history(root: Path | str) -> list[dict[str, Any]]:
    """history.jsonl after every release's approval is verified and the release/rollback sequence is
    replayed (:func:`_replay` with ``verify_each``): what a reader that trusts a past release must use.

    Raises:
        ClapError: the first event that does not verify.
    """
    root = Path(root)
    reg = _load(root)
    _replay(root, reg, None, verify_each=True)
    return reg.history


def release_stack(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Releases still in effect, oldest first: a release pushes its pointer, a rollback pops."""
    stack: list[dict[str, Any]] = []
    for n, event in enumerate(history, start=1):
        if event.get("event") == "release":
            stack.append(event.get("pointer"))
        elif event.get("event") == "rollback":
            if not stack:
                raise ClapError(
                    "a rollback with no release in effect", file=HISTORY, row=n, rule="inconsistent_releases"
                )
            stack.pop()
    return stack


def position_in_stack(stack: list[dict[str, Any]], pointer: dict[str, Any]) -> int | None:
    """Where ``pointer`` is in the releases in effect: its index, -1 for nothing released (the base
    model), None when it is none of them (never released, or taken out by a recorded rollback)."""
    if pointer.get("batch") is None:
        return -1
    return next((i for i, entry in enumerate(stack) if entry == pointer), None)


def reverted_above(stack: list[dict[str, Any]], pointer: dict[str, Any]) -> list[dict[str, Any]]:
    """The releases on the stack above ``pointer``: rolled back by a ``git revert`` of their pointer
    commits and not yet recorded in history.jsonl (newest first); [] when the pointer is on top.

    Raises:
        ClapError: the pointer is not on the stack at all.
    """
    at = position_in_stack(stack, pointer)
    if at is None:
        raise ClapError(
            f"releases/production.json names batch {pointer.get('batch')!r} (approval {pointer.get('approval_id')}), "
            "which is not a release in effect in history.jsonl",
            file=POINTER,
            rule="not_in_effect",
        )
    return list(reversed(stack[at + 1 :]))


def read_pointer_file(root: Path) -> dict[str, Any]:
    """The production pointer; a missing file means nothing is released (``{"batch": None}``)."""
    path = Path(root) / POINTER
    pointer = io.read_json(path) if path.exists() else {"batch": None}
    if not isinstance(pointer, dict) or "batch" not in pointer:
        raise ClapError("production pointer has no 'batch' key", file=path, rule="bad_pointer")
    return pointer


@dataclass(frozen=True)
class _Registry:
    """What a verification reads once: history, ledger, the replayed trust and the release params."""

    history: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    trust: Trust
    audience: str
    max_ttl_s: int
    approvals_required: (
        int  # params release.approvals_required: distinct approvers per release (capped by keys in force)
    )

    @property
    def trusted(self) -> dict:
        """Every key the trust log ever established, by name (revoked ones verify their past)."""
        return self.trust.keys

    @property
    def revoked(self) -> dict[str, dict[str, Any]]:
        """Revocations by key fingerprint: ``approver``, ``key_sha256``, ``after_event``, ``reason``."""
        return self.trust.revoked


def release_params(params_file: Path) -> dict[str, Any]:
    """What verifying approvals reads from params ``release``: audience, max_approval_ttl_s,
    key_quorum and approvals_required (each an error when missing)."""
    section = params.raw_section("release", params_file)
    out = {}
    for name, key, kind in (
        ("audience", "audience", str),
        ("max_ttl_s", "max_approval_ttl_s", int),
        ("key_quorum", "key_quorum", int),
        ("approvals_required", "approvals_required", int),
    ):
        try:
            out[name] = kind(section[key])
        except (KeyError, TypeError, ValueError) as e:
            raise bad_param(
                f"release.{key}",
                "params release needs audience, max_approval_ttl_s, key_quorum and approvals_required to verify approvals",
                params_file,
            ) from e
    return out


def read_trust(root: Path, params_root: Path | None = None, history_length: int | None = None) -> Trust:
    """The keys in force, replayed from the pinned root through ``releases/trust.jsonl``
    (:mod:`clap.release.trust`) under params ``release.key_quorum``."""
    params_file = Path(params_root if params_root is not None else root) / "params.yaml"
    return replay_trust(root, release_params(params_file)["key_quorum"], n_history=history_length)


def _load(root: Path, params_root: Path | None = None) -> _Registry:
    root = Path(root)
    rp = release_params(Path(params_root if params_root is not None else root) / "params.yaml")
    history = read_history(root)
    nothing_signed = not (root / TRUST_LOG).exists() and not any(e.get("event") == "release" for e in history)
    return _Registry(
        history,
        read_jsonl(root / LEDGER),
        # no release and no key change: nothing to verify, so no trust root is needed yet
        Trust({}, {}, {}, [], "")
        if nothing_signed
        else replay_trust(root, rp["key_quorum"], n_history=len(history)),
        rp["audience"],
        rp["max_ttl_s"],
        rp["approvals_required"],
    )


# ---------------------------------------------------------------- one release event


def _timestamp(text: Any) -> int | None:
    try:
        return int(datetime.fromisoformat(str(text)).timestamp())
    except ValueError:
        return None


def _diff(approved: dict[str, Any], other: dict[str, Any], other_name: str, keys: list[str]) -> list[str]:
    return [
        f"{k}: approved {approved.get(k)!r}, {other_name} {other.get(k)!r}"
        for k in keys
        if approved.get(k) != other.get(k)
    ]


def _verified_approval(
    token: Any, reg: _Registry, what: str, batch: str, position: int | None, index: int
) -> dict[str, Any]:
    """One approval token of a release: signed by a key in force at history event ``index`` (not
    revoked at all when ``position`` is None: the production pointer), used exactly once, for this
    batch, inside its validity; its claims."""
    if not isinstance(token, str) or not token:
        raise ClapError(
            f"no approval for {what}: history.jsonl records no signed approval token for it",
            file=HISTORY,
            rule="no_approval",
        )
    try:
        claims = verify_token(
            token, reg.trusted, audience=reg.audience, max_ttl_s=reg.max_ttl_s, check_clock=False
        )
    except ClapError as e:
        raise ClapError(
            f"{what}: {e.args[0]} (only keys the trust log established verify: releases/trust.jsonl)",
            file=HISTORY,
            rule=e.rule,
        ) from e
    revoked = reg.revoked.get(key_sha256(reg.trusted[claims["iss"]]))
    if revoked is not None and (position is None or position >= revoked["after_event"]):
        where = "the production pointer" if position is None else f"event {position + 1} of history.jsonl"
        raise ClapError(
            f"{what}: approved by {claims['iss']}'s key (sha256 {revoked['key_sha256'][:12]}…), revoked in "
            f"releases/trust.jsonl after event {revoked['after_event']} "
            f"({revoked.get('reason') or 'no reason given'}): it cannot back {where}",
            file=TRUST_LOG,
            rule="key_revoked",
        )
    if reg.trust.since[claims["iss"]] > index:
        raise ClapError(
            f"{what}: approved by {claims['iss']}, whose key the trust log adds only after history event "
            f"{reg.trust.since[claims['iss']]}",
            file=TRUST_LOG,
            rule="untrusted_key",
        )
    jti = claims["jti"]
    used = [row for row in reg.ledger if row.get("jti") == jti]
    if len(used) != 1:
        raise ClapError(
            f"{what}: approval {jti} has {len(used)} entries in approvals_used.jsonl, not exactly one "
            "(an approval is single-use and a release consumes it)",
            file=LEDGER,
            rule="not_single_use",
        )
    if used[0].get("batch") != batch:
        raise ClapError(
            f"{what}: the ledger consumed approval {jti} for batch {used[0].get('batch')!r}",
            file=LEDGER,
            rule="not_single_use",
        )
    at = _timestamp(used[0].get("used_at"))
    if at is None or not claims["nbf"] <= at <= claims["exp"]:
        raise ClapError(
            f"{what}: the approval was used at {used[0].get('used_at')!r}, outside its validity "
            f"(nbf {claims['nbf']}, exp {claims['exp']})",
            file=LEDGER,
            rule="bad_token",
        )
    return claims


def verify_release_event(
    event: dict[str, Any], reg: _Registry, position: int | None = None
) -> dict[str, Any]:
    """Check one ``release`` event of history.jsonl; return its first approval's verified claims.

    The event carries ``token`` (the approval its pointer names) and ``co_tokens`` (the others):
    together ``min(release.approvals_required, keys in force)`` approvals by distinct approvers,
    each verified alike and bound to the same hashes.

    Args:
        event: the release event.
        reg: what the registry holds.
        position: the event's 0-based index in history.jsonl, for replaying history: a release
            recorded before its key's revocation stays valid history. None (the production
            pointer) refuses any approval by a revoked key.

    Raises:
        ClapError: no token, a signature by no key in force or by a revoked one, a token not used
            exactly once, used outside its validity, bound to hashes other than the event's
            pointer, or fewer distinct approvers than required.
    """
    pointer = event.get("pointer")
    if not isinstance(pointer, dict) or not pointer.get("batch"):
        raise ClapError("a release event without a pointer", file=HISTORY, rule="inconsistent_releases")
    batch, jti = pointer["batch"], pointer.get("approval_id")
    what = f"release of batch {batch} (approval {jti})"
    index = position if position is not None else next(i for i, e in enumerate(reg.history) if e is event)
    claims = _verified_approval(event.get("token"), reg, what, batch, position, index)
    if claims["decision"] not in RELEASABLE:
        raise ClapError(
            f"{what}: the token approves decision {claims['decision']!r}", file=HISTORY, rule="not_releasable"
        )
    if claims["sub"] != f"sha256:{claims['adapter_sha256']}":
        raise ClapError(f"{what}: the token's sub does not name its adapter hash", rule="bad_token")
    bad = _diff(
        {**claims, "approval_id": claims["jti"], "approver": claims["iss"]},
        pointer,
        "pointer",
        ["approval_id", "approver", *BINDING_CLAIMS],
    )
    co = [_verified_approval(t, reg, what, batch, position, index) for t in event.get("co_tokens") or []]
    bad += [f"co-approval {c['jti']} by {c['iss']}: " + "; ".join(_diff(claims, c, "it", BINDING_CLAIMS))
            for c in co if _diff(claims, c, "it", BINDING_CLAIMS)]  # fmt: skip
    if bad:
        raise ClapError(
            f"{what}: the released pointer is not what the tokens approved: " + "; ".join(bad),
            file=HISTORY,
            rule="binding_mismatch",
        )
    approvers = [claims["iss"], *(c["iss"] for c in co)]
    need = required(reg.approvals_required, len(reg.trust.in_force(index)))
    if len(set(approvers)) < need or len(set(approvers)) < len(approvers):
        raise ClapError(
            f"{what}: approved by {approvers}; {need} distinct approvers needed (release.approvals_required "
            f"{reg.approvals_required}, {len(reg.trust.in_force(index))} keys in force)",
            file=HISTORY,
            rule="approvals_required",
        )
    return claims


def _releases_of(history: list[dict[str, Any]], jti: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in history
        if e.get("event") == "release"
        and isinstance(e.get("pointer"), dict)
        and e["pointer"].get("approval_id") == jti
    ]


# ---------------------------------------------------------------- the production pointer


def _check_file(path: Path, approved: str, what: str) -> None:
    if not path.is_file():
        raise ClapError(f"the approved {what} {path} is missing", file=path, rule="missing_adapter")
    actual = io.sha256_file(path)
    if actual != approved:
        raise ClapError(
            f"{what} {path} is not the approved one: sha256 approved {approved}, on disk {actual}",
            file=path,
            rule="binding_mismatch",
        )


def verify_pointer(
    root: Path | str, *, adapters_dir: Path | str | None = None, base_sha256: str | None = None
) -> VerifiedRelease | None:
    """The production release, verified against its approval; None when nothing is released.

    Args:
        root: repository root (holds ``releases/`` and ``params.yaml``).
        adapters_dir: the folder of adapter folders being loaded (default ``<root>/models/adapters``).
        base_sha256: the weights hash of the base model being loaded; None skips the base check
            (for callers that load no base model).

    Raises:
        ClapError: naming what does not match (which hash, approved vs actual) or
            "no approval for this pointer".
    """
    root = Path(root)
    pointer = read_pointer_file(root)
    if pointer["batch"] is None:
        return None
    reg = _load(root)
    batch, jti = pointer["batch"], pointer.get("approval_id")
    events = _releases_of(reg.history, jti) if jti else []
    if not events:
        raise ClapError(
            f"no approval for this pointer: releases/production.json names batch {batch!r} "
            f"(approval id {jti!r}), but no release in releases/history.jsonl carries that approval",
            file=root / POINTER,
            rule="no_approval",
        )
    if len(events) > 1:
        raise ClapError(
            f"approval {jti} is claimed by {len(events)} releases in history.jsonl (an approval is single-use)",
            file=root / HISTORY,
            rule="not_single_use",
        )
    approved = events[0]["pointer"]
    bad = _diff(approved, pointer, "pointer", sorted(set(approved) | set(pointer)))
    if bad:
        raise ClapError(
            f"releases/production.json is not the approved release of approval {jti}: " + "; ".join(bad),
            file=root / POINTER,
            rule="pointer_mismatch",
        )
    claims = verify_release_event(events[0], reg)
    stack = _replay(root, reg, None, verify_each=False)
    if position_in_stack(stack, pointer) is None:
        raise _rolled_back(pointer, stack, root / POINTER)
    adapter_dir = Path(adapters_dir if adapters_dir is not None else root / ADAPTERS) / str(batch)
    _check_file(adapter_dir / ADAPTER_FILE, claims["adapter_sha256"], "adapter")
    _check_file(adapter_dir / ADAPTER_CONFIG, claims["adapter_config_sha256"], "adapter config")
    if base_sha256 is not None and base_sha256 != claims["base_sha256"]:
        raise ClapError(
            f"the base model being loaded is not the approved one: base_sha256 approved {claims['base_sha256']}, "
            f"loaded {base_sha256}",
            rule="binding_mismatch",
        )
    return VerifiedRelease(
        batch=str(batch),
        decision=claims["decision"],
        adapter_sha256=claims["adapter_sha256"],
        adapter_config_sha256=claims["adapter_config_sha256"],
        base_sha256=claims["base_sha256"],
        approval_id=claims["jti"],
        approver=claims["iss"],
        adapter_dir=adapter_dir,
    )


def _rolled_back(pointer: dict[str, Any], stack: list[dict[str, Any]], file: Path | str) -> ClapError:
    """The refusal of a pointer that is a release no longer on the stack (a recorded rollback took it out)."""
    now = [str(entry.get("batch")) for entry in stack]
    return ClapError(
        f"the release of batch {pointer.get('batch')} (approval {pointer.get('approval_id')}) is not in effect in "
        f"history.jsonl (releases in effect: {', '.join(now) or 'none'}): it was rolled back, and bringing a "
        "rolled-back adapter back needs fresh approvals (`clap approve`, then `clap release`); a pointer can "
        "only go back down the stack (`git revert` of a pointer commit, or `clap rollback`)",
        file=file,
        rule="not_in_effect",
    )


def _require_base_allowed(params_root: Path, stack: list[dict[str, Any]]) -> None:
    """Nothing released while releases are in effect, by a revert of the first release's pointer
    commit: only under params ``release.rollback_to_base``, as for ``clap rollback``."""
    allowed = params.raw_section("release", Path(params_root) / "params.yaml").get("rollback_to_base")
    if not isinstance(allowed, bool):
        raise bad_param(
            "release.rollback_to_base", "must be true or false", Path(params_root) / "params.yaml"
        )
    if not allowed:
        raise ClapError(
            f"releases/production.json was reverted to nothing released while history.jsonl has batch "
            f"{stack[0].get('batch')} in effect: a revert of the first release's pointer commit falls back to "
            "the base model only when release.rollback_to_base is true",
            file=POINTER,
            rule="not_in_effect",
        )


# ---------------------------------------------------------------- clap registry-check


def _unverified_iat(token: Any) -> int:
    """A token's issue time for ordering only (its signature is verified elsewhere, or not trusted)."""
    try:
        iat = jwt.decode(str(token), options={"verify_signature": False}).get("iat")
    except jwt.PyJWTError:
        return 0
    return iat if isinstance(iat, int) else 0


def _replay(
    root: Path,
    reg: _Registry,
    emit: Callable[[str], None] | None,
    *,
    verify_each: bool,
    first: int = 0,
    label: str = "",
) -> list[dict[str, Any]]:
    """Replay history.jsonl; return the releases in effect (oldest first); raise at the first problem.

    Every release must claim its approval alone, name the batch it replaced, and be approved no
    earlier than the release before it (token ``iat``: history cannot be reordered to bring an
    older release back without `clap rollback`); every rollback must return to the previous
    release. With ``verify_each`` every release's token is verified (:func:`verify_release_event`).
    ``emit`` gets one line, prefixed with ``label``, for each event after the ``first`` ones.
    """
    stack: list[dict[str, Any]] = []
    last_iat = 0
    for n, event in enumerate(reg.history, start=1):
        kind = event.get("event")
        shown = emit is not None and n > first
        if kind == "release":
            pointer = event.get("pointer") or {}
            claims, last_iat = _replayed_release(
                root, reg, n, event, stack, last_iat, verify_each=verify_each
            )
            stack.append(pointer)
            line = _release_line(pointer, claims) if shown else ""
        elif kind == "rollback":
            current, returned_to, to_base = _replayed_rollback(root, n, event, stack)
            stack.pop()
            line = _rollback_line(current, returned_to, to_base, event) if shown else ""
        elif kind == "hold":
            line = f"hold {event.get('batch')}: production unchanged ({event.get('reason', 'no reason')})"
        elif kind == "canary":
            line = (
                f"canary {event.get('batch')}: {event.get('decision')} by {event.get('canary_actor')} "
                f"(harm e-value {event.get('harm_e_value')}, non-inferiority e-value "
                f"{event.get('non_inferiority_e_value')}, at request {event.get('canary_decided_at_request')}): "
                "production unchanged, all traffic to it"
            )
        else:
            raise ClapError(f"unknown event {kind!r}", file=root / HISTORY, row=n, rule="corrupt_jsonl")
        if shown and emit is not None:
            emit(f"{label}{n}: {line}")
    return stack


def _replayed_release(
    root: Path,
    reg: _Registry,
    n: int,
    event: dict[str, Any],
    stack: list[dict[str, Any]],
    last_iat: int,
    *,
    verify_each: bool,
) -> tuple[dict[str, Any], int]:
    """Check the release event on line ``n`` against the releases in effect before it (``stack``, the
    last one approved at ``last_iat``); return its verified claims (empty unless ``verify_each``) and
    its approval's issue time."""
    pointer = event.get("pointer") or {}
    if len(_releases_of(reg.history, pointer.get("approval_id"))) != 1:
        raise ClapError(
            f"approval {pointer.get('approval_id')} is claimed by more than one release (single use)",
            file=root / HISTORY,
            row=n,
            rule="not_single_use",
        )
    claims: dict[str, Any] = {}
    if verify_each:
        try:
            claims = verify_release_event(event, reg, n - 1)
        except ClapError as e:
            raise ClapError(e.args[0], file=root / HISTORY, row=n, rule=e.rule) from e
    iat = claims.get("iat", _unverified_iat(event.get("token")))
    if iat < last_iat:
        raise ClapError(
            f"release of {pointer.get('batch')} was approved before the release above it: "
            "history.jsonl is out of order",
            file=root / HISTORY,
            row=n,
            rule="inconsistent_releases",
        )
    previous = stack[-1].get("batch") if stack else None
    if event.get("previous_batch") != previous:
        raise ClapError(
            f"release of {pointer.get('batch')} says it replaced {event.get('previous_batch')!r}, "
            f"but {previous!r} was in effect",
            file=root / HISTORY,
            row=n,
            rule="inconsistent_releases",
        )
    return claims, iat


def _replayed_rollback(
    root: Path, n: int, event: dict[str, Any], stack: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """Check the rollback event on line ``n`` against the releases in effect before it (``stack``):
    it must return to the previous release, or take the only one out (to the base model). Returns the
    release it ends, the one it returns to and whether that is the base model."""
    to_base = len(stack) == 1 and event.get("to_batch") is None
    if len(stack) < 2 and not to_base:
        raise ClapError(
            "a rollback with no previous release to return to",
            file=root / HISTORY,
            row=n,
            rule="inconsistent_releases",
        )
    current = stack[-1]
    previous_release = stack[-2] if not to_base else {"batch": None, "adapter_sha256": None}
    expected = {
        "from_batch": current.get("batch"),
        "to_batch": previous_release.get("batch"),
        "adapter_sha256": previous_release.get("adapter_sha256"),
    }
    bad = _diff(expected, event, "rollback event", list(expected))
    if bad:
        raise ClapError(
            "rollback does not return to the previous release: " + "; ".join(bad),
            file=root / HISTORY,
            row=n,
            rule="inconsistent_releases",
        )
    return current, previous_release, to_base


def _release_line(pointer: dict[str, Any], claims: dict[str, Any]) -> str:
    """What `clap registry-check` says of a verified release."""
    return (
        f"release {pointer['batch']} ({claims['decision']}) approval {claims['jti']} by "
        f"{claims['iss']}: signature trusted, used once, hashes bound "
        "(adapter, config, eval, evidence, base)"
    )


def _rollback_line(
    current: dict[str, Any], returned_to: dict[str, Any], to_base: bool, event: dict[str, Any]
) -> str:
    """What `clap registry-check` says of a rollback that returns to the previous release (or the base model)."""
    if to_base:
        return (
            f"rollback {current.get('batch')} -> base: the only release in effect taken out "
            f"of production ({event.get('policy', 'no policy recorded')})"
        )
    return (
        f"rollback {current.get('batch')} -> {returned_to.get('batch')}: restores the "
        f"release of approval {returned_to.get('approval_id')} (verified above)"
    )


def _check_state(
    root: Path,
    params_root: Path,
    emit: Callable[[str], None] | None,
    *,
    first: int = 0,
    first_trust: int = 0,
    label: str = "",
    current: bool = True,
) -> tuple[_Registry, dict[str, Any], list[dict[str, Any]]]:
    """Replay the ``releases/`` under ``root`` with every check; return what was read, the pointer and
    the releases on the stack (the pointer is one of them, or null).

    Every release is verified (:func:`verify_release_event`) and every rollback must return to the
    previous release; the production pointer must be a release on the stack (the top one, or one
    below it: those above were reverted in git), or null with none in effect (or under
    ``release.rollback_to_base``). When ``current`` (the state serve and eval read now), its approval's key must not be
    revoked at all; a past commit's production pointer is held to the revocations of its time
    (the commit that revokes the key behind production is history, not a fault).
    """
    reg = _load(root, params_root)
    for event in reg.trust.events[first_trust:] if emit is not None else []:
        signed = ", ".join(signers(event, reg.trust.keys))
        emit(f"{label}trust {event['seq']}: {event['action']} {event['name']} (sha256 {event['key_sha256'][:12]}…) "
             f"after history event {event['after_event']}, signed by {signed}")  # fmt: skip
    stack = _replay(root, reg, emit, verify_each=True, first=first, label=label)
    pointer = read_pointer_file(root)
    if pointer["batch"] is None:  # always valid here; reverted to from a release: _check_pointer_move
        return reg, pointer, stack
    events = _releases_of(reg.history, pointer.get("approval_id"))
    if not stack or not events:
        raise ClapError(
            f"no approval for this pointer: releases/production.json names batch {pointer['batch']!r} "
            f"(approval id {pointer.get('approval_id')!r}), but no release in releases/history.jsonl carries that approval",
            file=POINTER,
            rule="no_approval",
        )
    approved = events[0]["pointer"]
    bad = _diff(approved, pointer, "pointer", sorted(set(approved) | set(pointer)))
    if bad:
        raise ClapError(
            "releases/production.json is not the release in effect in history.jsonl: " + "; ".join(bad),
            file=POINTER,
            rule="pointer_mismatch",
        )
    if position_in_stack(stack, pointer) is None:
        raise _rolled_back(pointer, stack, POINTER)
    if current:
        verify_release_event(events[0], reg)  # as the production pointer now: no revoked key at all
    return reg, pointer, stack


def recorded_base_sha256(root: Path) -> str | None:
    """The base model's weights sha256 as the base stage recorded it (``metrics/base.json`` and its
    record); None when the base stage has not run here."""
    path = Path(root) / "metrics" / "base.json"
    if not path.exists():
        return None
    record = {**io.read_json(path)}
    if io.record_path(path).exists():
        record.update(io.read_json(io.record_path(path)))
    sha = record.get("weights_sha256")
    return sha if isinstance(sha, str) and sha else None


# ---------------------------------------------------------------- git: releases/ commit by commit

REGISTRY_FILES = (POINTER, HISTORY, LEDGER, TRUST_LOG)
APPEND_ONLY = (HISTORY, LEDGER, TRUST_LOG)


def _blob(root: Path, commit: str, path: Path) -> bytes | None:
    """``path`` as committed in ``commit``; None when it is not there."""
    proc = vcs.git_run(root, "cat-file", "blob", f"{commit}:./{path.as_posix()}")  # ./: relative to root
    return proc.stdout if proc.returncode == 0 else None


def _materialize(root: Path, commit: str, dest: Path) -> None:
    """Write ``releases/`` as of ``commit`` (the registry files and trusted keys) under ``dest``."""
    names = vcs.git(root, "ls-tree", "-r", "--name-only", commit, "--", f"{TRUSTED.as_posix()}/").split("\n")
    paths = [*REGISTRY_FILES, *(Path(n) for n in names if n.endswith(".pub"))]
    (dest / TRUSTED).mkdir(parents=True, exist_ok=True)
    for path in paths:
        data = _blob(root, commit, path)
        if data is not None:
            io.atomic_write_bytes(dest / path, data)


def _rows(data: bytes | None, where: str, path: Path) -> list[Any]:
    rows = []
    for n, line in enumerate((data or b"").decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ClapError(f"{where}: not a JSON line: {e}", file=path, row=n, rule="corrupt_jsonl") from e
    return rows


def _require_append_only(
    parent_rows: dict[Path, list[Any]], child_rows: dict[Path, list[Any]], parent_name: str
) -> None:
    """history, ledger and trust log only grow: every row of the parent stays, in place."""
    for path in APPEND_ONLY:
        before, after = parent_rows[path], child_rows[path]
        if after[: len(before)] != before:
            n = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), len(after))
            raise ClapError(
                f"{path} is append-only, but row {n + 1} of {parent_name} was removed or rewritten "
                f"({_removed_row_hint(before[n])})",
                file=path,
                row=n + 1,
                rule="rewritten_history",
            )
    history_before = len(parent_rows[HISTORY])
    for n, row in enumerate(
        child_rows[TRUST_LOG][len(parent_rows[TRUST_LOG]) :], start=len(parent_rows[TRUST_LOG]) + 1
    ):
        after = row.get("after_event") if isinstance(row, dict) else None
        if isinstance(after, int) and after > history_before:
            raise ClapError(
                f"a key change dated after_event {after}, but {parent_name} had {history_before} events: "
                "a key change cannot vouch for releases recorded with it or later",
                file=TRUST_LOG,
                row=n,
                column="after_event",
                rule="rewritten_history",
            )


def _removed_row_hint(row: Any) -> str:
    """What removing ``row`` from an append-only file means, and what to do instead."""
    kind = row.get("event") if isinstance(row, dict) else None
    if kind == "rollback":
        return (
            f"the rollback {row.get('from_batch')} -> {row.get('to_batch') or 'base'}: reverting a rollback is "
            f"refused; bringing {row.get('from_batch')} back needs fresh approvals (`clap approve`, then "
            "`clap release`)"
        )
    if kind == "release" or (isinstance(row, dict) and "jti" in row and "used_at" in row):
        return (
            "a release's ledger rows: to roll back, `git revert` the release's pointer commit "
            "(`release <batch>: <decision> (approval <id>)`, which changes only releases/production.json), "
            "or run `clap rollback`; a revert of its ledger commit, or of a release committed in one commit "
            "before releases split into two, would free the approval"
        )
    return "history, ledger and trust log can only grow: a rewrite around a key change is refused"


def _committed_rows(root: Path, commit: str | None) -> dict[Path, list[Any]]:
    where = f"commit {commit[:12]}" if commit else "no commit"
    return {p: _rows(_blob(root, commit, p) if commit else None, where, p) for p in APPEND_ONLY}


def _worktree_rows(root: Path) -> dict[Path, list[Any]]:
    return {
        p: _rows((root / p).read_bytes() if (root / p).exists() else None, "working tree", p)
        for p in APPEND_ONLY
    }


def _registry_commits(root: Path, rev: str) -> list[tuple[str, list[str], str]]:
    """(commit, parents, subject) of every commit that changed ``releases/``, oldest first (merges too)."""
    if vcs.git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        raise ClapError(
            "this clone is shallow: the registry check replays every commit that changed releases/ "
            "(fetch the full history, e.g. actions/checkout with fetch-depth: 0)",
            rule="shallow_clone",
        )
    out = vcs.git(
        root,
        "log",
        "--reverse",
        "--topo-order",
        "--full-history",
        "--format=%H%x00%P%x00%s",
        rev,
        "--",
        "releases",
    )
    commits = []
    for line in out.splitlines():
        sha, parents, subject = line.split("\0", 2)
        commits.append((sha, parents.split(), subject))
    return commits


def _json_blob(root: Path, commit: str, path: Path) -> dict[str, Any] | None:
    data = _blob(root, commit, path)
    try:
        value = json.loads(data) if data is not None else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _check_released_from(root: Path, event: dict[str, Any], recorded_in: str) -> None:
    """A release event against the commit it names as released from (``pointer.commit``).

    That commit must be an ancestor of ``recorded_in`` (the commit recording the release), and
    what it committed must be what the token binds: the evidence bundle's sha256, the evidence's
    decision, adapter and eval-record hashes, and the base model's weights hash that the base
    stage recorded there (``metrics/base.json`` and its record).
    """
    pointer = event.get("pointer") or {}
    batch, commit = pointer.get("batch"), pointer.get("commit")
    what = f"release of batch {batch} (approval {pointer.get('approval_id')})"
    if (
        not isinstance(commit, str)
        or vcs.git_run(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0
    ):
        raise ClapError(
            f"{what}: the commit it was released from, {commit!r}, is not in this repository",
            file=HISTORY,
            rule="missing_commit",
        )
    if vcs.git_run(root, "merge-base", "--is-ancestor", commit, recorded_in).returncode != 0:
        raise ClapError(
            f"{what}: it was released from {commit[:12]}, which is not an ancestor of the commit recording it",
            file=HISTORY,
            rule="missing_commit",
        )
    evidence_path = Path("reports/gate") / str(batch) / "evidence.json"
    data = _blob(root, commit, evidence_path)
    if data is None:
        raise ClapError(
            f"{what}: {commit[:12]} has no {evidence_path.as_posix()}",
            file=evidence_path,
            rule="missing_evidence",
        )
    evidence = _json_blob(root, commit, evidence_path) or {}
    base = {
        **(_json_blob(root, commit, Path("metrics/base.json")) or {}),
        **(_json_blob(root, commit, Path("records/base.json")) or {}),
    }
    committed = {
        "evidence_sha256": hashlib.sha256(data).hexdigest(),
        "decision": evidence.get("decision"),
        "adapter_sha256": evidence.get("adapter_sha256"),
        "eval_sha256": evidence.get("eval_items_sha256"),
        "base_sha256": base.get("weights_sha256"),
    }
    bad = _diff(pointer, committed, f"committed in {commit[:12]}", list(committed))
    if bad:
        raise ClapError(
            f"{what}: the approval does not match what was committed where it was released from "
            f"({evidence_path.as_posix()}, metrics/base.json): " + "; ".join(bad),
            file=HISTORY,
            rule="binding_mismatch",
        )


def _signature_paths(batch: Any) -> dict[str, Path]:
    """Where `clap release` commits a batch's model signature and its public key."""
    from clap.release.signing import PUBLIC_KEY, SIGNATURE

    folder = RELEASES / "handoff" / str(batch)
    return {"signature": folder / SIGNATURE, "public_key": folder / PUBLIC_KEY}


def _check_model_signature(
    event: dict[str, Any], read: Callable[[Path], bytes | None], emit: Callable[[str], None], label: str
) -> None:
    """A release event's model signature (``model_signature``, recorded since releases sign the
    adapter folder; an event without one was released before and is not checked): the signature
    and public key it names must be the ones committed with it (path and sha256), the signature must
    verify with that key (model-signing's verifier, no adapter bytes needed) and sign exactly the
    adapter and config hashes the approval bound."""
    record = event.get("model_signature")
    if record is None:
        return
    from clap.release.signing import PUBLIC_KEY, fingerprint, require_covers, signed_digests

    pointer = event.get("pointer") or {}
    what = f"release of batch {pointer.get('batch')} (approval {pointer.get('approval_id')})"
    if not isinstance(record, dict):
        raise ClapError(f"{what}: model_signature is not an object", file=HISTORY, rule="bad_model_signature")
    paths = _signature_paths(pointer.get("batch"))
    data: dict[str, bytes] = {}
    for kind, expected in paths.items():
        path, sha = record.get(kind), record.get(f"{kind}_sha256")
        if path != expected.as_posix():
            raise ClapError(
                f"{what}: its model {kind} is recorded at {path!r}, not {expected.as_posix()}",
                file=HISTORY,
                rule="bad_model_signature",
            )
        blob = read(expected)
        if blob is None:
            raise ClapError(
                f"{what}: its model {kind} {expected.as_posix()} was not committed with it",
                file=expected,
                rule="bad_model_signature",
            )
        if hashlib.sha256(blob).hexdigest() != sha:
            raise ClapError(
                f"{what}: {expected.as_posix()} is not the recorded model {kind}: sha256 recorded {sha}, "
                f"committed {hashlib.sha256(blob).hexdigest()}",
                file=expected,
                rule="bad_model_signature",
            )
        data[kind] = blob
    try:
        digests = signed_digests(data["signature"], data["public_key"])
        require_covers(
            digests,
            {
                ADAPTER_FILE: pointer.get("adapter_sha256"),
                ADAPTER_CONFIG: pointer.get("adapter_config_sha256"),
            },
            what,
        )
    except ClapError as e:
        raise ClapError(
            e.args[0] if e.args[0].startswith(what) else f"{what}: {e.args[0]}",
            file=paths["signature"],
            rule=e.rule,
        ) from e
    emit(
        f"{label}model signature {paths['signature'].as_posix()} of {pointer.get('batch')}: verifies with "
        f"{PUBLIC_KEY} (sha256 {fingerprint(data['public_key'])[:12]}…) and signs the approved adapter "
        f"and config among {len(digests)} file(s)"
    )


def _check_new_releases(
    root: Path,
    history: list[dict[str, Any]],
    first: int,
    recorded_in: str,
    read: Callable[[Path], bytes | None],
    emit: Callable[[str], None],
    label: str,
) -> None:
    for n, event in enumerate(history[first:], start=first + 1):
        if event.get("event") == "release":
            _check_released_from(root, event, recorded_in)
            _check_model_signature(event, read, emit, f"{label}{n}: ")
    _check_current_signatures(history, read)


def _check_current_signatures(history: list[dict[str, Any]], read: Callable[[Path], bytes | None]) -> None:
    """Only `clap release` writes a model signature: each batch's ``model.sig`` and ``model_signing.pub``
    must still be the ones its last release recorded (a later commit cannot swap in another key's
    signature, which the standard verifier would accept with the swapped public key)."""
    last: dict[str, dict[str, Any]] = {}
    for event in history:
        if event.get("event") == "release" and isinstance(event.get("pointer"), dict):
            last[str(event["pointer"].get("batch"))] = event
    for batch, event in last.items():
        record = event.get("model_signature")
        if not isinstance(record, dict):
            continue  # released before releases were signed (or malformed: _check_model_signature refuses it)
        for kind, path in _signature_paths(batch).items():
            sha = record.get(f"{kind}_sha256")
            blob = read(path)
            actual = hashlib.sha256(blob).hexdigest() if blob is not None else None
            if actual != sha:
                raise ClapError(
                    f"{path.as_posix()} is not the model {kind} that the last release of batch {batch} "
                    f"(approval {event['pointer'].get('approval_id')}) recorded: sha256 recorded {sha}, "
                    f"here {actual or 'missing'} (only `clap release` writes it)",
                    file=path,
                    rule="bad_model_signature",
                )


def _check_pointer_move(
    root: Path,
    parent: str | None,
    pointer: dict[str, Any],
    stack: list[dict[str, Any]],
    reg: _Registry,
    emit: Callable[[str], None],
    label: str,
) -> None:
    """How the production pointer moved from ``parent``'s to this state's (``stack``: the releases on
    this state's stack). Down the stack is a rollback (a ``git revert`` of pointer commits, or ``clap
    rollback``): its release must not be approved by a revoked key. Up the stack it may only go to the
    top, to a release that was never the production pointer before: one that was (a revert of a
    rollback) needs fresh approvals."""
    before = (_json_blob(root, parent, POINTER) if parent else None) or {"batch": None}
    if before == pointer:
        return
    at = position_in_stack(stack, pointer)
    was = position_in_stack(stack, before)
    was = len(stack) if was is None else was  # taken out by a rollback this state records
    if at is None:
        raise _rolled_back(pointer, stack, POINTER)
    if at == was:  # the same release (or nothing released, noted differently)
        return
    if at < was:
        if at >= 0:
            verify_release_event(_releases_of(reg.history, pointer["approval_id"])[0], reg)  # not revoked now
        if was < len(stack):  # no rollback event: the pointer commit(s) above were reverted
            if at < 0:
                _require_base_allowed(root, stack)
            gone = ", ".join(str(e.get("batch")) for e in reversed(stack[at + 1 : was + 1]))
            emit(
                f"{label}pointer: rollback {gone} -> {pointer.get('batch') or 'base'} by reverting the pointer "
                "commit(s) (releases/production.json only; history and ledger keep every row, the approvals "
                "stay spent)"
            )
        return
    jti = pointer.get("approval_id")
    ever = vcs.git(root, "log", "--format=%h %s", "-S", str(jti), parent, "--", POINTER) if parent else ""
    if at != len(stack) - 1 or ever.strip():
        first = ever.strip().splitlines()[-1] if ever.strip() else "an earlier commit"
        raise ClapError(
            f"releases/production.json brings back batch {pointer.get('batch')} (approval {jti}), which was "
            f"rolled back after it was in production (first in effect at {first}): reverting a rollback is "
            "refused, bringing a rolled-back adapter back needs fresh approvals (`dvc repro`, `clap approve` "
            "by the approvers, then `clap release`)",
            file=POINTER,
            rule="rolled_back_release",
        )


def _in_commit(commit: str, subject: str, e: ClapError, tmp: str) -> ClapError:
    """``e`` as found in ``commit``, its file named ``<commit>:<path in the repository>``."""
    file = str(e.file).removeprefix(tmp).lstrip("/") if e.file is not None else None
    return ClapError(
        f"commit {commit[:12]} ({subject}): {e.args[0]}",
        file=f"{commit[:12]}:{file}" if file is not None else None,
        row=e.row,
        column=e.column,
        rule=e.rule,
    )


def check_registry(root: Path | str, emit: Callable[[str], None] = print, *, rev: str = "HEAD") -> int:
    """Verify ``releases/`` through its git history, then as it is in the working tree.

    Every commit that changed ``releases/`` (merges and side branches included) is replayed:
    its history must verify as :func:`_check_state` says (each release signed by a trusted,
    unrevoked key, used once, hashes bound; each rollback back to the previous release; the
    pointer the release in effect) and its history, ledger and trust log must extend each
    parent's; each new release's model signature must be the one committed with it, verify with its
    public key and sign the approved adapter and config, and each batch's signature files must stay
    those of its last release. One line per release, rollback, hold and model signature, prefixed
    with the commit that recorded it; then the working tree (what serve and eval read) the same way,
    and one line for production.

    Args:
        root: the repository root (a git checkout with its full history).
        emit: receives each line.
        rev: the commit whose history is replayed.

    Returns:
        The number of events in the working tree's history.jsonl.

    Raises:
        ClapError: the first commit (or the working tree) that does not verify, naming the commit and why.
    """
    root = Path(root)
    if vcs.git_run(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
        raise ClapError(
            f"{root} is not a git checkout with a commit {rev}: the registry check replays releases/ through git",
            rule="not_a_repository",
        )
    commits = _registry_commits(root, rev)
    for sha, parents, subject in commits:
        _check_commit(root, sha, parents, subject, emit)
    reg, pointer = _check_worktree(root, rev, emit)
    _require_approved_base(root, pointer)
    if pointer["batch"] is None:
        emit(f"production: nothing released (batch null); {len(commits)} commit(s) of releases/ replayed")
    else:
        emit(
            f"production: batch {pointer['batch']} (approval {pointer.get('approval_id')}) is the release in effect; "
            f"{len(commits)} commit(s) of releases/ replayed"
        )
    return len(reg.history)


def _check_commit(
    root: Path, sha: str, parents: list[str], subject: str, emit: Callable[[str], None]
) -> None:
    """Replay ``releases/`` as commit ``sha`` has it (in a temporary folder) with every check; its new
    releases against what they were released from, and its append-only files against each parent's."""
    with tempfile.TemporaryDirectory(prefix="clap-registry-") as tmp:
        try:
            child = _committed_rows(root, sha)
            for parent_sha in parents or [None]:  # first: a removed row says more than its consequences
                _require_append_only(
                    _committed_rows(root, parent_sha),
                    child,
                    f"parent {parent_sha[:12]}" if parent_sha else "the empty registry",
                )
            _materialize(root, sha, Path(tmp))
            parent = _committed_rows(root, parents[0]) if parents else None
            before = len(parent[HISTORY]) if parent else 0
            reg, pointer, stack = _check_state(
                Path(tmp),
                root,
                emit,
                first=before,
                first_trust=len(parent[TRUST_LOG]) if parent else 0,
                label=f"{sha[:12]} ",
                current=False,
            )
            for parent_sha in parents or [None]:
                _check_pointer_move(root, parent_sha, pointer, stack, reg, emit, f"{sha[:12]} ")
            _check_new_releases(
                root,
                reg.history,
                before,
                sha,
                lambda path, sha=sha: _blob(root, sha, path),
                emit,
                f"{sha[:12]} ",
            )
        except ClapError as e:
            raise _in_commit(sha, subject, e, tmp) from e


def _check_worktree(root: Path, rev: str, emit: Callable[[str], None]) -> tuple[_Registry, dict[str, Any]]:
    """Replay ``releases/`` as the working tree has it (what serve and eval read) with every check,
    its uncommitted events after those of ``rev``; return what was read and the production pointer."""
    head = _committed_rows(root, vcs.git(root, "rev-parse", rev).strip())
    try:
        reg, pointer, stack = _check_state(
            root,
            root,
            emit,
            first=len(head[HISTORY]),
            first_trust=len(head[TRUST_LOG]),
            label="working tree ",
        )
        _check_pointer_move(
            root, vcs.git(root, "rev-parse", rev).strip(), pointer, stack, reg, emit, "working tree "
        )
        _check_new_releases(
            root,
            reg.history,
            len(head[HISTORY]),
            rev,
            lambda path: (root / path).read_bytes() if (root / path).is_file() else None,
            emit,
            "working tree ",
        )
        _require_append_only(head, _worktree_rows(root), rev)
    except ClapError as e:
        raise ClapError(
            f"working tree (uncommitted releases/): {e.args[0]}",
            file=root / e.file if e.file is not None else None,
            row=e.row,
            column=e.column,
            rule=e.rule,
        ) from e
    return reg, pointer


def _require_approved_base(root: Path, pointer: dict[str, Any]) -> None:
    """The production release must have been approved on the base model the base stage recorded here."""
    base = recorded_base_sha256(root)
    if pointer["batch"] is not None and base is not None and base != pointer.get("base_sha256"):
        raise ClapError(
            f"the production release of batch {pointer['batch']} was approved on another base model: "
            f"base_sha256 approved {pointer.get('base_sha256')}, recorded by the base stage {base} "
            "(metrics/base.json): serve and eval would load an unapproved combination; approve and release again",
            file=root / POINTER,
            column="base_sha256",
            rule="binding_mismatch",
        )
