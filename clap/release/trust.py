"""Which approver keys a release trusts: replayed from a root pinned outside the repository.

A public key in ``releases/trusted_keys/`` is key material, not trust: anyone with commit access
can add a file there. A key counts only when

- its fingerprint (sha256 of its raw bytes, :func:`clap.release.approval.key_sha256`) is pinned
  outside the working tree: ``$CLAP_TRUST_ROOT`` (fingerprints separated by commas or spaces), else
  the file ``$CLAP_TRUST_ROOT_FILE``, else ``~/.config/clap/trust_root`` (one per line, ``#``
  comments). A pin file inside the repository is refused: the repository cannot vouch for itself;
- or ``releases/trust.jsonl`` adds it by an event signed by a quorum of the keys trusted before
  it: ``min(release.key_quorum, keys in force)`` distinct keys.

Revoking a key takes the same quorum, so a key holder cannot revoke the others to approve alone.
Events form a hash chain (``prev``: sha256 of the previous line), are replayed in order and only
appended, each with its quorum of signatures: a change still collecting them waits in
``releases/trust_pending.json`` (one at a time; ``clap trust`` adds one signature per signer and
moves it into the log when the quorum is reached). Each event records ``after_event``, the
number of ``releases/history.jsonl`` events before it, so the keys in force at any point of the
history are known (a release needs ``min(release.approvals_required, keys in force)`` distinct
approvers then). A revoked key's ``.pub`` stays: the releases it approved before its revocation
still verify.

With one pinned key (a team of one) the quorum is 1: that person can add keys and approve alone,
which is weaker than separation of duties and said so (docs/release.md). Pinning two or more keys
makes every key change and every release need two people from the start.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from clap import io
from clap.errors import ClapError
from clap.release.approval import NAME_RE, key_sha256, load_trusted_keys

TRUST_LOG = Path("releases") / "trust.jsonl"
PENDING = Path("releases") / "trust_pending.json"
TRUSTED = Path("releases") / "trusted_keys"
ROOT_ENV, ROOT_FILE_ENV = "CLAP_TRUST_ROOT", "CLAP_TRUST_ROOT_FILE"
DEFAULT_ROOT_FILE = Path("~/.config/clap/trust_root")
ACTIONS = ("add", "revoke")
SIGNED_FIELDS = ("seq", "action", "name", "key_sha256", "after_event", "reason", "prev")


def _fingerprints(text: str, where: str) -> frozenset[str]:
    lines = (line.split("#", 1)[0] for line in text.replace(",", "\n").splitlines())
    pins = frozenset(word.lower() for line in lines for word in line.split())
    bad = sorted(p for p in pins if len(p) != 64 or any(c not in "0123456789abcdef" for c in p))
    if bad:
        raise ClapError(
            f"{where}: {bad[0]!r} is not a key fingerprint (64 hex digits: `clap keygen` prints it)",
            rule="bad_trust_root",
        )
    return pins


def pinned_roots(repo: Path | str) -> frozenset[str]:
    """The pinned root fingerprints (see the module docstring for where they are read).

    Raises:
        ClapError: nothing is pinned (rule ``no_trust_root``), a pin file lies inside ``repo``
            (``trust_root_in_repo``), or a pin is not 64 hex digits.
    """
    if os.environ.get(ROOT_ENV, "").strip():
        return _fingerprints(os.environ[ROOT_ENV], f"${ROOT_ENV}")
    path = Path(os.environ.get(ROOT_FILE_ENV) or DEFAULT_ROOT_FILE).expanduser().resolve()
    if path.is_relative_to(Path(repo).resolve()):
        raise ClapError(
            "the trust root must live outside the repository (whoever can commit could rewrite it)",
            file=path,
            rule="trust_root_in_repo",
        )
    if not path.is_file():
        raise ClapError(
            f"no trust root: pin the first approver's key fingerprint (printed by `clap keygen`) in ${ROOT_ENV} "
            f"or in {path} (docs/release.md, 'The root of trust')",
            rule="no_trust_root",
        )
    return _fingerprints(path.read_text(encoding="utf-8"), str(path))


def payload(event: Mapping[str, Any]) -> bytes:
    """The bytes a trust event's signatures sign: its signed fields as canonical JSON."""
    return json.dumps(
        {k: event.get(k) for k in SIGNED_FIELDS}, sort_keys=True, separators=(",", ":")
    ).encode()


def sign(event: Mapping[str, Any], key: Ed25519PrivateKey) -> str:
    """One signer's signature of ``event`` (base64url, no padding)."""
    return base64.urlsafe_b64encode(key.sign(payload(event))).rstrip(b"=").decode()


def _verifies(pub: Ed25519PublicKey, signature: Any, data: bytes) -> bool:
    if not isinstance(signature, str):
        return False
    try:
        pub.verify(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)), data)
    except (InvalidSignature, ValueError):
        return False
    return True


def line_sha256(line: str) -> str:
    """What the next event's ``prev`` names: the sha256 of this event's line (without its newline)."""
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Trust:
    """The replayed trust state.

    ``keys``: every key ever trusted, by name (a revoked one stays, so its history verifies).
    ``since``: the history position from which each key is in force (pinned roots: 0).
    ``revoked``: by fingerprint, ``{approver, key_sha256, after_event, reason}``.
    ``events``: the log's events, ``last_line``: its last line (the next ``prev``).
    """

    keys: dict[str, Ed25519PublicKey]
    since: dict[str, int]
    revoked: dict[str, dict[str, Any]]
    events: list[dict[str, Any]]
    last_line: str

    def in_force(self, position: int | None = None) -> dict[str, Ed25519PublicKey]:
        """Keys in force at history ``position`` (None: now, after every event)."""

        def counts(name: str) -> bool:
            row = self.revoked.get(key_sha256(self.keys[name]))
            if position is None:
                return row is None
            return self.since[name] <= position and (row is None or position < row["after_event"])

        return {n: k for n, k in self.keys.items() if counts(n)}


def required(quorum: int, in_force: int) -> int:
    """Signatures a key change (or approvals a release) needs: ``min(quorum, in_force)``, at least 1."""
    return max(1, min(quorum, in_force))


def signers(event: Mapping[str, Any], keys: Mapping[str, Ed25519PublicKey]) -> list[str]:
    """The names among ``keys`` whose signature on ``event`` verifies (signatures are filed by
    the signing key's fingerprint, so renaming a key file changes nothing)."""
    sigs = event.get("signatures")
    if not isinstance(sigs, dict):
        return []
    data = payload(event)
    return sorted(n for n, k in keys.items() if _verifies(k, sigs.get(key_sha256(k)), data))


def _bad(row: int, message: str, rule: str = "bad_trust_event") -> ClapError:
    return ClapError(message, file=TRUST_LOG, row=row, rule=rule)


def _check_shape(event: dict[str, Any], row: int, prev: str, n_history: int | None) -> None:
    if event.get("seq") != row or event.get("prev") != prev:
        raise _bad(row, f"event out of order: seq {event.get('seq')!r} prev {event.get('prev')!r} "
                        f"(expected seq {row}, prev {prev[:12] or 'empty'}): the log is append-only", "trust_chain")  # fmt: skip
    if event.get("action") not in ACTIONS or not NAME_RE.match(str(event.get("name", ""))):
        raise _bad(row, f"action must be one of {ACTIONS} and name an approver name")
    after = event.get("after_event")
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise _bad(row, "after_event must be an integer >= 0")
    if n_history is not None and after > n_history:
        raise _bad(row, f"after_event {after} is beyond history.jsonl's {n_history} events")


def _apply(trust: Trust, event: dict[str, Any], row: int, files: Mapping[str, Ed25519PublicKey]) -> None:
    name, sha, after = event["name"], event.get("key_sha256"), event["after_event"]
    if event["action"] == "add":
        if name in trust.keys:
            raise _bad(row, f"approver {name!r} is already trusted (a new key needs a new name)")
        if name not in files or key_sha256(files[name]) != sha:
            raise _bad(row, f"releases/trusted_keys/{name}.pub is missing or is not the key this event adds "
                            f"(sha256 {str(sha)[:12]}…)", "trust_key_mismatch")  # fmt: skip
        trust.keys[name], trust.since[name] = files[name], after
        return
    if not any(
        key_sha256(k) == sha for k in trust.in_force().values()
    ):  # by fingerprint: a renamed file is the same key
        raise _bad(row, f"approver {name!r} (sha256 {str(sha)[:12]}…) has no key in force to revoke")
    trust.revoked[sha] = {
        "approver": name,
        "key_sha256": sha,
        "after_event": after,
        "reason": event.get("reason"),
    }


def replay(repo: Path | str, quorum: int, *, n_history: int | None = None) -> Trust:
    """The trust state of ``repo``: pinned roots, then every event of ``releases/trust.jsonl``.

    Args:
        repo: the repository root (holds ``releases/``); the pins are read from outside it.
        quorum: params ``release.key_quorum``.
        n_history: the number of history events (bounds ``after_event``); None skips that check.

    Raises:
        ClapError: no pinned key is in ``releases/trusted_keys``, or an event is malformed, out
            of chain, or signed by fewer keys in force than its quorum.
    """
    repo = Path(repo)
    files = load_trusted_keys(repo / TRUSTED)
    roots = pinned_roots(repo)
    keys = {n: k for n, k in files.items() if key_sha256(k) in roots}
    if not keys:
        raise ClapError(
            f"none of the {len(roots)} pinned trust root fingerprint(s) is a key in releases/trusted_keys/: "
            "nothing can be verified",
            file=repo / TRUSTED,
            rule="no_trusted_keys",
        )
    trust = Trust(keys, dict.fromkeys(keys, 0), {}, [], "")
    path = repo / TRUST_LOG
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for row, line in enumerate(lines, start=1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(row, f"not JSON: {e}", "corrupt_jsonl") from e
        _check_shape(event, row, line_sha256(trust.last_line) if row > 1 else "", n_history)
        voters = trust.in_force()
        need, got = required(quorum, len(voters)), signers(event, voters)
        if len(got) < need:
            raise _bad(row, f"{event['action']} {event['name']}: signed by {got or 'no key in force'}, {need} "
                            f"needed (release.key_quorum {quorum}, {len(voters)} keys in force)", "trust_quorum")  # fmt: skip
        trust.events.append(event)
        trust.last_line = line
        _apply(trust, event, row, files)
    return trust


def propose(
    repo: Path | str,
    action: str,
    name: str,
    key: Ed25519PrivateKey,
    quorum: int,
    *,
    n_history: int,
    reason: str = "",
) -> tuple[dict[Path, str | None], dict[str, Any], int]:
    """Sign the key change ``action name`` with ``key``.

    The change waits in ``releases/trust_pending.json`` until ``min(key_quorum, keys in force)``
    keys in force have signed it, then is appended to ``releases/trust.jsonl`` (and the pending
    file removed). A pending change of another key, or one proposed before history moved on
    (its ``after_event`` is stale), is refused; withdraw it by deleting the pending file.

    Returns:
        (files to write: repository path -> text, None to delete; the event; signatures still needed).

    Raises:
        ClapError: ``key`` is no key in force, another change is pending, or the change is invalid.
    """
    repo = Path(repo)
    trust = replay(repo, quorum, n_history=n_history)
    voters = trust.in_force()
    me = next((n for n, k in voters.items() if key_sha256(k) == key_sha256(key.public_key())), None)
    if me is None:
        raise ClapError(
            "this private key is no key in force: it cannot sign a trust change", rule="untrusted_key"
        )
    seq, prev = len(trust.events) + 1, line_sha256(trust.last_line) if trust.events else ""
    pending = io.read_json(repo / PENDING) if (repo / PENDING).exists() else None
    if pending is not None:
        same = (pending.get("action"), pending.get("name"), pending.get("seq"), pending.get("prev"))
        if same != (action, name, seq, prev) or pending.get("after_event") != n_history:
            raise ClapError(
                f"another key change is pending ({pending.get('action')} {pending.get('name')}, proposed after "
                f"history event {pending.get('after_event')}): finish it, or delete {PENDING} to withdraw it",
                file=PENDING,
                rule="trust_pending",
            )
        event = pending
    else:
        files = load_trusted_keys(repo / TRUSTED)
        target = files.get(name) if action == "add" else trust.keys.get(name)
        if target is None:
            raise ClapError(f"no key releases/trusted_keys/{name}.pub", rule="missing_key")
        event = {"seq": seq, "action": action, "name": name, "key_sha256": key_sha256(target),
                 "after_event": n_history, "reason": reason, "prev": prev, "signatures": {}}  # fmt: skip
        scratch = dataclasses.replace(
            trust, keys=dict(trust.keys), since=dict(trust.since), revoked=dict(trust.revoked)
        )
        _apply(scratch, event, seq, files)  # the change is valid before anyone signs it
    mine = {key_sha256(key.public_key()): sign(event, key)}
    event = {**event, "signatures": {**event.get("signatures", {}), **mine}}
    missing = max(0, required(quorum, len(voters)) - len(signers(event, voters)))
    if missing:
        return {PENDING: json.dumps(event, indent=1, sort_keys=True) + "\n"}, event, missing
    log = (repo / TRUST_LOG).read_text(encoding="utf-8") if (repo / TRUST_LOG).exists() else ""
    return {TRUST_LOG: log + json.dumps(event, sort_keys=True) + "\n", PENDING: None}, event, 0
