"""The released adapter folder, signed in the OpenSSF model-signing format (``model-signing`` on PyPI).

A release signs ``models/adapters/<batch>`` (every file in it) with an EC P-256 private key
(``clap release --signing-key``; never in the repository) through model-signing's own key
signer, and commits the signature and the public key next to the handoff bundle
(``releases/handoff/<batch>/model.sig`` and ``model_signing.pub``). The signature is a
Sigstore bundle (JSON) holding a DSSE envelope whose in-toto payload lists the sha256 of each
file, so anyone can check the bytes with the standard verifier and no clap installed::

    model_signing verify key models/adapters/<batch> \\
        --signature releases/handoff/<batch>/model.sig \\
        --public_key releases/handoff/<batch>/model_signing.pub

The approval token stays the authorization step: this signature says which bytes were
released, not that they may be. :func:`signed_digests` checks a signature with the public key
alone (no adapter bytes) and returns the digests it signs, so ``clap registry-check`` can tie
each recorded signature to the hashes the approval bound.

model_signing (and its sigstore dependencies) is imported inside the functions, so importing
this module costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clap import io
from clap.errors import ClapError

SIGNATURE = "model.sig"  # in releases/handoff/<batch>/: the Sigstore bundle
PUBLIC_KEY = "model_signing.pub"  # in releases/handoff/<batch>/: the PEM public key that verifies it
CURVE = "secp256r1"  # EC P-256: model-signing's key mode; the approvers' Ed25519 keys cannot sign models
FORMAT = "model_signing 1.1.1, key (ECDSA P-256): Sigstore bundle v0.3, DSSE in-toto statement"


@dataclass(frozen=True)
class ModelSignature:
    """A signature of an adapter folder, not yet written: its bytes, the public key's and what it signs."""

    signature: bytes  # the Sigstore bundle (JSON)
    public_key: bytes  # PEM, SubjectPublicKeyInfo
    digests: dict[str, str]  # file path in the folder -> sha256 hex, as signed

    def record(self, signature_path: Path, public_key_path: Path) -> dict[str, str]:
        """What a release event records about it (paths repository-relative)."""
        return {
            "format": FORMAT,
            "signature": signature_path.as_posix(),
            "signature_sha256": io.sha256_bytes(self.signature),
            "public_key": public_key_path.as_posix(),
            "public_key_sha256": fingerprint(self.public_key),
        }


# ---------------------------------------------------------------- keys


def generate_signing_keypair(name: str, key_dir: Path) -> tuple[Path, Path]:
    """Create an EC P-256 key pair for model signing: ``<key_dir>/<name>.key`` (PKCS#8 PEM, mode
    0600) and ``<key_dir>/<name>.pub`` (PEM; a release commits a copy next to each signature).

    Raises:
        ClapError: a file of that name exists (a key is never overwritten).
    """
    from clap.release.approval import _check_name

    _check_name(name)
    priv_path, pub_path = Path(key_dir) / f"{name}.key", Path(key_dir) / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists():
            raise ClapError(
                "refusing to overwrite an existing key (remove it first to rotate)", file=p, rule="key_exists"
            )
    key = ec.generate_private_key(ec.SECP256R1())
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    io.atomic_write_bytes(priv_path, priv)
    os.chmod(priv_path, 0o600)
    io.atomic_write_bytes(pub_path, _public_pem(key.public_key()))
    os.chmod(pub_path, 0o644)
    return priv_path, pub_path


def _public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """Read the model-signing private key (PEM, unencrypted, EC P-256 only)."""
    path = Path(path)
    if not path.is_file():
        raise ClapError("model-signing private key file not found", file=path, rule="missing_key")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise ClapError(
            f"cannot read the model-signing private key (PEM, unencrypted): {e}", file=path, rule="bad_key"
        ) from e
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != CURVE:
        kind = (
            f"EC {key.curve.name}"
            if isinstance(key, ec.EllipticCurvePrivateKey)
            else type(key).__name__.removeprefix("_").removesuffix("PrivateKey")
        )
        raise ClapError(
            f"the model-signing key must be an EC P-256 ({CURVE}) private key, not {kind} "
            "(an approver's Ed25519 key signs approvals, not models): create one with `clap signing-keygen`",
            file=path,
            rule="bad_key",
        )
    return key


# ---------------------------------------------------------------- sign and verify


def _hashing_config():
    import model_signing

    # model-signing's defaults (sha256 per file; .git* paths ignored), following symlinks: a DVC
    # cache of type symlink links the adapter's files, and what is signed is what is loaded
    return model_signing.hashing.Config().set_allow_symlinks(True)


def sign_adapter(adapter_dir: Path, private_key: Path) -> ModelSignature:
    """Sign every file of ``adapter_dir`` with the EC P-256 key at ``private_key`` (model-signing's key signer).

    Raises:
        ClapError: the key is not an EC P-256 private key, the folder is missing or empty, or
            model-signing fails (its message included).
    """
    import model_signing

    adapter_dir, key = Path(adapter_dir), load_signing_key(private_key)
    if not adapter_dir.is_dir() or not any(adapter_dir.iterdir()):
        raise ClapError(
            "the adapter folder to sign is missing or empty", file=adapter_dir, rule="missing_adapter"
        )
    with tempfile.TemporaryDirectory(prefix="clap-model-sig-") as tmp:
        sig_path = Path(tmp) / SIGNATURE
        try:
            model_signing.signing.Config().use_elliptic_key_signer(
                private_key=private_key
            ).set_hashing_config(_hashing_config()).sign(adapter_dir, sig_path)
        except Exception as e:  # model-signing raises ValueError, OSError, ...: name it, keep the cause
            raise ClapError(
                f"model-signing could not sign the adapter folder: {type(e).__name__}: {e}",
                file=adapter_dir,
                rule="model_signing_failed",
            ) from e
        signature = sig_path.read_bytes()
    public_key = _public_pem(key.public_key())
    return ModelSignature(signature, public_key, _digests_of(signature, public_key, adapter_dir))


def _verifier(public_key: bytes, tmp: Path):
    from model_signing._signing import sign_ec_key

    pub_path = tmp / PUBLIC_KEY
    pub_path.write_bytes(public_key)
    return sign_ec_key.Verifier(pub_path)


def signed_digests(signature: bytes, public_key: bytes) -> dict[str, str]:
    """Verify ``signature`` (a model-signing Sigstore bundle) with ``public_key`` (PEM) alone, without
    the model's bytes; return the sha256 it signs for each file (path in the folder -> hex).

    Uses model-signing's own key verifier (``model_signing._signing.sign_ec_key.Verifier``: the
    public ``verifying.Config`` verifies only together with the model folder).

    Raises:
        ClapError: the public key is not an EC key model-signing supports, the signature is malformed, does not verify
            with this key, or signs something other than sha256 per file.
    """
    return _digests_of(signature, public_key, None)


def _digests_of(signature: bytes, public_key: bytes, where: Path | None) -> dict[str, str]:
    from model_signing._signing import sign_sigstore_pb

    with tempfile.TemporaryDirectory(prefix="clap-model-sig-") as tmp:
        sig_path = Path(tmp) / SIGNATURE
        sig_path.write_bytes(signature)
        try:
            manifest = _verifier(public_key, Path(tmp)).verify(sign_sigstore_pb.Signature.read(sig_path))
        except Exception as e:  # ValueError, InvalidSignature, KeyError on a malformed bundle, ...
            raise ClapError(
                f"the model signature does not verify with the public key: {type(e).__name__}: {e}",
                file=where,
                rule="bad_model_signature",
            ) from e
    params = manifest.serialization_type
    if params.get("method") != "files" or params.get("hash_type") != "sha256":
        raise ClapError(
            f"the model signature signs {params.get('method')}/{params.get('hash_type')} digests, "
            "not sha256 per file: the release hashes cannot be compared with it",
            file=where,
            rule="bad_model_signature",
        )
    return {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}


def verify_adapter(adapter_dir: Path, signature: Path, public_key: Path) -> None:
    """Check ``adapter_dir`` against ``signature`` with ``public_key``, exactly as model-signing's
    verifier does (every signed file present with its signed sha256, no file added).

    Raises:
        ClapError: naming model-signing's reason (key mismatch, hash mismatch, extra or missing files).
    """
    import model_signing

    try:
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key).set_hashing_config(
            _hashing_config()
        ).verify(Path(adapter_dir), Path(signature))
    except Exception as e:
        raise ClapError(
            f"the adapter folder does not match its model signature {signature}: {type(e).__name__}: {e}",
            file=adapter_dir,
            rule="bad_model_signature",
        ) from e


def require_covers(digests: dict[str, str], approved: dict[str, str], what: str) -> None:
    """Every approved file (name in the folder -> sha256) must be signed with exactly that sha256.

    Raises:
        ClapError: naming each file that is unsigned or signed with another hash.
    """
    bad = [
        f"{name}: approved {sha}, signed {digests.get(name)}"
        for name, sha in approved.items()
        if digests.get(name) != sha
    ]
    if bad:
        raise ClapError(
            f"{what}: the model signature does not sign the approved bytes: " + "; ".join(bad),
            rule="bad_model_signature",
        )


def fingerprint(public_key: bytes) -> str:
    """sha256 of the public key's PEM bytes: what model-signing puts in the bundle's key hint."""
    return hashlib.sha256(public_key).hexdigest()
