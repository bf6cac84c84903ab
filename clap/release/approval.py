"""Signed, single-use release approvals: Ed25519 keys and EdDSA JWTs bound to artifact hashes.

The approver holds the private key; the release check holds only public keys
(``releases/trusted_keys/<approver>.pub``) and a ledger of used token ids, so it can verify
approvals but never mint one. A token names the batch, the gate decision and the sha256 of
every artifact the decision rests on; the verifier fixes the algorithm (never read from the
token header, RFC 8725 §2.1) and accepts a token only if a trusted key signed it, its
issuer is that key's owner and its lifetime is bounded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from clap import io
from clap.errors import ClapError

ALGORITHMS = ["EdDSA"]  # the only algorithm accepted, whatever a token's header says
RELEASABLE = ("promote", "canary")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
STANDARD_CLAIMS = ["exp", "iat", "nbf", "jti", "sub", "aud", "iss"]


@dataclass(frozen=True)
class Binding:
    """What an approval is bound to: the batch, the gate decision and the artifact hashes."""

    batch: str
    decision: str
    adapter_sha256: str
    adapter_config_sha256: str
    eval_sha256: str
    evidence_sha256: str
    base_sha256: (
        str  # the base model's weights (metrics/base.json's record): an adapter means nothing without it
    )


BINDING_CLAIMS = [f.name for f in dataclasses.fields(Binding)]


def _check_name(name: str) -> None:
    if not NAME_RE.match(name):
        raise ClapError(
            f"approver name {name!r} must match {NAME_RE.pattern} (lowercase letters, digits, . _ -)",
            rule="bad_approver_name",
        )


def generate_keypair(name: str, key_dir: Path, trusted_dir: Path) -> tuple[Path, Path]:
    """Create an Ed25519 key pair for approver ``name``.

    Args:
        name: the approver's name (becomes the token issuer and the public key's file name).
        key_dir: folder of the private key (must be outside git: the caller checks it is ignored).
        trusted_dir: ``releases/trusted_keys``; receives ``<name>.pub``.

    Returns:
        (private key path, public key path). The private key file has mode 0600.
    """
    _check_name(name)
    priv_path, pub_path = Path(key_dir) / f"{name}.key", Path(trusted_dir) / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists():
            raise ClapError(
                "refusing to overwrite an existing key (remove it first to rotate)", file=p, rule="key_exists"
            )
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    io.atomic_write_bytes(priv_path, priv)
    os.chmod(priv_path, 0o600)  # atomic_write's temp file is 0600 already; state it, do not rely on it
    io.atomic_write_bytes(pub_path, pub)
    os.chmod(pub_path, 0o644)
    return priv_path, pub_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Read an approver's PEM private key (Ed25519 only)."""
    path = Path(path)
    if not path.is_file():
        raise ClapError("private key file not found", file=path, rule="missing_key")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise ClapError(f"cannot read the private key: {e}", file=path, rule="bad_key") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ClapError("the private key is not an Ed25519 key", file=path, rule="bad_key")
    return key


def load_trusted_keys(trusted_dir: Path) -> dict[str, Ed25519PublicKey]:
    """All trusted public keys, by approver name (file stem); an unreadable key file is an error."""
    keys: dict[str, Ed25519PublicKey] = {}
    for path in sorted(Path(trusted_dir).glob("*.pub")):
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except ValueError as e:
            raise ClapError(f"cannot read a trusted public key: {e}", file=path, rule="bad_key") from e
        if not isinstance(key, Ed25519PublicKey):
            raise ClapError("a trusted key is not an Ed25519 public key", file=path, rule="bad_key")
        keys[path.stem] = key
    return keys


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_sha256(key: Ed25519PublicKey) -> str:
    """A public key's fingerprint: sha256 of its 32 raw bytes (what pins and ``releases/trust.jsonl`` name)."""
    return hashlib.sha256(_raw(key)).hexdigest()


def approver_of(key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]) -> str:
    """The approver name whose trusted public key matches ``key`` (error if none does)."""
    mine = _raw(key.public_key())
    names = [name for name, pub in trusted.items() if _raw(pub) == mine]
    if not names:
        raise ClapError(
            "this private key matches no public key in releases/trusted_keys/: an untrusted key cannot approve",
            rule="untrusted_key",
        )
    return names[0]


def mint_token(
    key: Ed25519PrivateKey, issuer: str, binding: Binding, *, audience: str, ttl_s: int, now: int
) -> str:
    """Sign a single-use approval for ``binding``.

    Args:
        key: the approver's private key.
        issuer: the approver's name (must be the key's name in trusted_keys for verification).
        binding: batch, decision and artifact hashes the approval covers.
        audience: the ``aud`` claim (params ``release.audience``).
        ttl_s: seconds until expiry.
        now: issue time (unix seconds).

    Returns:
        The compact JWT.
    """
    claims = {
        "iss": issuer,
        "aud": audience,
        "sub": f"sha256:{binding.adapter_sha256}",
        "iat": now,
        "nbf": now,
        "exp": now + ttl_s,
        "jti": uuid.uuid4().hex,
        **dataclasses.asdict(binding),
    }
    return jwt.encode(claims, key, algorithm=ALGORITHMS[0])


def verify_token(
    token: str,
    trusted: dict[str, Ed25519PublicKey],
    *,
    audience: str,
    max_ttl_s: int,
    check_clock: bool = True,
) -> dict:
    """Verify a token's signature and claims against the trusted keys; return its claims.

    Each trusted key is tried; the one whose signature verifies must belong to the token's
    issuer. Expiry, not-before and issued-at (against the system clock, no leeway),
    audience and the presence of every binding claim are checked, and a lifetime longer
    than ``max_ttl_s`` is refused. Single use and the hash binding are the caller's checks
    (:func:`check_binding`, the ledger).

    ``check_clock=False`` is for re-verifying a token that was already used (a release
    recorded in ``releases/``): the signature, issuer, audience and claims are checked as
    always, but not against today's clock; the caller checks the recorded time of use
    against ``nbf``/``exp`` instead.

    Raises:
        ClapError: naming why the token is refused.
    """
    if not trusted:
        raise ClapError(
            "no trusted public keys in releases/trusted_keys/: nothing can be verified",
            rule="no_trusted_keys",
        )
    for name, pub in trusted.items():
        try:
            claims = jwt.decode(
                token,
                pub,
                algorithms=ALGORITHMS,
                audience=audience,
                leeway=0,
                options={
                    "require": STANDARD_CLAIMS + BINDING_CLAIMS,
                    "verify_exp": check_clock,
                    "verify_nbf": check_clock,
                    "verify_iat": check_clock,
                },
            )
        except jwt.InvalidSignatureError:
            continue  # not this key: try the next one
        except jwt.PyJWTError as e:
            raise ClapError(f"approval token refused: {_why(e)}", rule="bad_token") from e
        _check_issuer_and_lifetime(claims, name, max_ttl_s)
        return claims
    raise ClapError(
        "approval token refused: its signature matches no trusted key (forged, altered, or signed by an unknown key)",
        rule="bad_signature",
    )


def _why(e: jwt.PyJWTError) -> str:
    if isinstance(e, jwt.ExpiredSignatureError):
        return "the token has expired (ask the approver for a new one)"
    if isinstance(e, jwt.MissingRequiredClaimError) and e.claim == "base_sha256":
        return (
            "it binds no base_sha256: it was signed before approvals bound the base model's hash, "
            "so it cannot approve what is loaded now (ask the approver for a new one)"
        )
    return f"{type(e).__name__}: {e}"


def _check_issuer_and_lifetime(claims: dict, key_name: str, max_ttl_s: int) -> None:
    if claims["iss"] != key_name:
        raise ClapError(
            f"approval token refused: issuer {claims['iss']!r} did not sign it (key of {key_name!r} did)",
            rule="wrong_issuer",
        )
    if not all(isinstance(claims[c], int) for c in ("exp", "nbf", "iat")):
        raise ClapError("approval token refused: exp/nbf/iat must be integers", rule="bad_token")
    if claims["exp"] - claims["nbf"] > max_ttl_s:
        raise ClapError(
            f"approval token refused: valid for {claims['exp'] - claims['nbf']} s, more than release.max_approval_ttl_s={max_ttl_s}",
            rule="ttl_too_long",
        )


def check_binding(claims: dict, expected: Binding) -> None:
    """Refuse unless every bound claim equals the value recomputed from the files on disk.

    Raises:
        ClapError: listing each mismatching claim (token value vs. current value).
    """
    if claims["decision"] not in RELEASABLE:
        raise ClapError(
            f"approval token refused: it approves decision {claims['decision']!r}; only {'/'.join(RELEASABLE)} can be released",
            rule="not_releasable",
        )
    if claims["sub"] != f"sha256:{claims['adapter_sha256']}":
        raise ClapError("approval token refused: sub does not name the adapter hash", rule="bad_token")
    current = dataclasses.asdict(expected)
    bad = [
        f"{k}: token {claims[k]!r} != current {current[k]!r}"
        for k in BINDING_CLAIMS
        if claims[k] != current[k]
    ]
    if bad:
        raise ClapError(
            "approval token does not match the artifacts on disk (changed after approval?): "
            + "; ".join(bad),
            rule="binding_mismatch",
        )
