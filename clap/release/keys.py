"""Keys: create approver and model-signing key pairs, and change which approver keys are trusted.

``clap keygen`` and ``clap signing-keygen`` refuse a private key that would land in a path git does not
ignore; ``clap trust add|revoke`` signs a key change and commits it once it has its quorum
(:mod:`clap.release.trust`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clap import io, vcs
from clap.errors import ClapError
from clap.release.approval import load_private_key
from clap.release.records import ReleaseParams
from clap.release.registry import HISTORY, LEDGER, POINTER, TRUSTED, read_history, read_trust
from clap.release.transaction import commit_files, locked, transaction
from clap.release.trust import PENDING, TRUST_LOG, propose, signers


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
    with locked(root):
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
        with transaction(root, list(files)):
            for path, text in files.items():
                if text is None:
                    (root / path).unlink(missing_ok=True)
                else:
                    io.atomic_write_text(root / path, text)
            commit = commit_files(
                root, list(files), f"trust: {action} {name} (signed by {', '.join(signer)}; {state})"
            )
        return {**event, "signers": signer, "missing": missing, "commit": commit}
