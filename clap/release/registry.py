"""The one check every reader of ``releases/`` makes: is the production pointer backed by an approval?

``releases/production.json`` is a file anyone with commit rights can edit; what makes it a
release is the signed approval behind it. :func:`verify_pointer` accepts the pointer only when

- ``releases/history.jsonl`` holds exactly one ``release`` event with the pointer's approval id,
  and that event's pointer is the production pointer, field for field;
- the approval token recorded with that event is signed by a key in ``releases/trusted_keys``
  (a key removed from there is revoked: its approvals no longer verify), its issuer is that
  key's owner, its audience is params ``release.audience`` and it was used (the ledger's
  ``used_at``) inside its validity window;
- ``releases/approvals_used.jsonl`` has exactly one entry for the approval id (single use);
- every hash the token binds (adapter, adapter config, evaluation record, evidence bundle, base
  model) equals the pointer's, and the adapter, its config and the base model being loaded
  equal the bound hashes;
- the pointer is the release in effect when ``history.jsonl`` is replayed (a release pushes
  its pointer, a rollback pops back to the previous one: a rolled-back-to pointer is accepted by
  the earlier release's own approval).

A pointer with ``batch: null`` (nothing released) is valid. ``clap registry-check``
(:func:`check_registry`) replays the whole history with the same checks.

This module imports only clap core, :mod:`clap.release.approval` and the adapter file name, so serve and eval can use
it without the release machinery (git, DVC, handoff).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt

from clap import io, params
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE
from clap.release.approval import BINDING_CLAIMS, RELEASABLE, load_trusted_keys, verify_token

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


def read_pointer_file(root: Path) -> dict[str, Any]:
    """The production pointer; a missing file means nothing is released (``{"batch": None}``)."""
    path = Path(root) / POINTER
    pointer = io.read_json(path) if path.exists() else {"batch": None}
    if not isinstance(pointer, dict) or "batch" not in pointer:
        raise ClapError("production pointer has no 'batch' key", file=path, rule="bad_pointer")
    return pointer


@dataclass(frozen=True)
class _Registry:
    """What a verification reads once: history, ledger, trusted keys and the release params."""

    history: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    trusted: dict
    audience: str
    max_ttl_s: int


def _load(root: Path) -> _Registry:
    root = Path(root)
    section = params.raw_section("release", root / "params.yaml")
    try:
        audience, max_ttl = section["audience"], int(section["max_approval_ttl_s"])
    except (KeyError, TypeError, ValueError) as e:
        raise ClapError(
            "params release needs audience and max_approval_ttl_s to verify approvals",
            file=root / "params.yaml",
            column="release",
            rule="bad_params",
        ) from e
    return _Registry(
        read_history(root), read_jsonl(root / LEDGER), load_trusted_keys(root / TRUSTED), audience, max_ttl
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


def verify_release_event(event: dict[str, Any], reg: _Registry) -> dict[str, Any]:
    """Check one ``release`` event of history.jsonl; return its verified token claims.

    Raises:
        ClapError: no token, a signature by no trusted key, a token not used exactly once, used
            outside its validity, or bound to hashes other than the event's pointer.
    """
    pointer = event.get("pointer")
    if not isinstance(pointer, dict) or not pointer.get("batch"):
        raise ClapError("a release event without a pointer", file=HISTORY, rule="inconsistent_releases")
    batch, jti = pointer["batch"], pointer.get("approval_id")
    what = f"release of batch {batch} (approval {jti})"
    token = event.get("token")
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
            f"{what}: {e.args[0]} (a key removed from releases/trusted_keys is revoked)",
            file=HISTORY,
            rule=e.rule,
        ) from e
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
    if bad:
        raise ClapError(
            f"{what}: the released pointer is not what the token approved: " + "; ".join(bad),
            file=HISTORY,
            rule="binding_mismatch",
        )
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
    if not stack or stack[-1] != pointer:
        now = stack[-1].get("batch") if stack and isinstance(stack[-1], dict) else None
        raise ClapError(
            f"the release of batch {batch} (approval {jti}) is not the one in effect in history.jsonl "
            f"(in effect: {now!r}); a pointer can only be restored by `clap rollback`",
            file=root / POINTER,
            rule="not_in_effect",
        )
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


# ---------------------------------------------------------------- clap registry-check


def _unverified_iat(token: Any) -> int:
    """A token's issue time for ordering only (its signature is verified elsewhere, or not trusted)."""
    try:
        iat = jwt.decode(str(token), options={"verify_signature": False}).get("iat")
    except jwt.PyJWTError:
        return 0
    return iat if isinstance(iat, int) else 0


def _replay(
    root: Path, reg: _Registry, emit: Callable[[str], None] | None, *, verify_each: bool
) -> list[dict[str, Any]]:
    """Replay history.jsonl; return the releases in effect (oldest first); raise at the first problem.

    Every release must claim its approval alone, name the batch it replaced, and be approved no
    earlier than the release before it (token ``iat``: history cannot be reordered to bring an
    older release back without `clap rollback`); every rollback must return to the previous
    release. With ``verify_each`` every release's token is verified (:func:`verify_release_event`).
    """
    stack: list[dict[str, Any]] = []
    last_iat = 0
    for n, event in enumerate(reg.history, start=1):
        kind = event.get("event")
        if kind == "release":
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
                    claims = verify_release_event(event, reg)
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
            last_iat = iat
            previous = stack[-1].get("batch") if stack else None
            if event.get("previous_batch") != previous:
                raise ClapError(
                    f"release of {pointer.get('batch')} says it replaced {event.get('previous_batch')!r}, "
                    f"but {previous!r} was in effect",
                    file=root / HISTORY,
                    row=n,
                    rule="inconsistent_releases",
                )
            stack.append(pointer)
            if emit is not None:
                emit(
                    f"{n}: release {pointer['batch']} ({claims['decision']}) approval {claims['jti']} by "
                    f"{claims['iss']}: signature trusted, used once, hashes bound "
                    "(adapter, config, eval, evidence, base)"
                )
        elif kind == "rollback":
            if len(stack) < 2:
                raise ClapError(
                    "a rollback with no previous release to return to",
                    file=root / HISTORY,
                    row=n,
                    rule="inconsistent_releases",
                )
            current, previous_release = stack[-1], stack[-2]
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
            stack.pop()
            if emit is not None:
                emit(
                    f"{n}: rollback {current.get('batch')} -> {previous_release.get('batch')}: restores the "
                    f"release of approval {previous_release.get('approval_id')} (verified above)"
                )
        elif kind == "hold":
            if emit is not None:
                emit(
                    f"{n}: hold {event.get('batch')}: production unchanged ({event.get('reason', 'no reason')})"
                )
        else:
            raise ClapError(f"unknown event {kind!r}", file=root / HISTORY, row=n, rule="corrupt_jsonl")
    return stack


def check_registry(root: Path | str, emit: Callable[[str], None] = print) -> int:
    """Replay ``releases/history.jsonl``, verifying every release and rollback; return the entries checked.

    Each verified entry is reported with one line through ``emit``; the first problem raises.
    Finally the production pointer must be the release in effect (or null with none in effect).

    Raises:
        ClapError: the first entry (or the pointer) that does not verify, naming why.
    """
    root = Path(root)
    reg = _load(root)
    stack = _replay(root, reg, emit, verify_each=True)
    pointer = read_pointer_file(root)
    if pointer["batch"] is None:
        if stack:
            raise ClapError(
                f"releases/production.json says nothing is released, but history.jsonl has batch "
                f"{stack[-1].get('batch')} in effect",
                file=root / POINTER,
                rule="not_in_effect",
            )
        emit("production: nothing released (batch null)")
        return len(reg.history)
    if not stack or not _releases_of(reg.history, pointer.get("approval_id")):
        raise ClapError(
            f"no approval for this pointer: releases/production.json names batch {pointer['batch']!r} "
            f"(approval id {pointer.get('approval_id')!r}), but no release in releases/history.jsonl carries that approval",
            file=root / POINTER,
            rule="no_approval",
        )
    bad = _diff(stack[-1], pointer, "pointer", sorted(set(stack[-1]) | set(pointer)))
    if bad:
        raise ClapError(
            "releases/production.json is not the release in effect in history.jsonl: " + "; ".join(bad),
            file=root / POINTER,
            rule="pointer_mismatch",
        )
    emit(
        f"production: batch {pointer['batch']} (approval {pointer.get('approval_id')}) is the release in effect"
    )
    return len(reg.history)
