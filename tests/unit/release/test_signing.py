"""clap.release.signing: an adapter folder signed in the OpenSSF model-signing format, checked by
model-signing's own verifier (its Python API and its `model_signing` command), never by clap's."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import model_signing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clap import io
from clap.errors import ClapError
from clap.release import signing as S
from clap.release.approval import generate_keypair


def standard_verify_cli(
    adapter: Path, signature: Path, public_key: Path, *extra: str, cwd: Path | None = None
):
    """The standard verifier's command line, as docs/release.md gives it (the console script when installed)."""
    script = Path(sys.executable).parent / "model_signing"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "model_signing"]
    return subprocess.run(
        [*cmd, "verify", "key", str(adapter), "--signature", str(signature), "--public_key", str(public_key)]
        + list(extra),
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def standard_verify_api(adapter: Path, signature: Path, public_key: Path) -> None:
    """model-signing's public verification API with its defaults (hashing config read from the signature)."""
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(
        adapter, signature
    )


@pytest.fixture
def adapter(tmp_path) -> Path:
    folder = tmp_path / "models" / "adapters" / "2026-01"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 8)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


@pytest.fixture
def key(tmp_path) -> tuple[Path, Path]:
    return S.generate_signing_keypair("signer", tmp_path / "keys")


def write_signature(sig: S.ModelSignature, where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True, exist_ok=True)
    (where / S.SIGNATURE).write_bytes(sig.signature)
    (where / S.PUBLIC_KEY).write_bytes(sig.public_key)
    return where / S.SIGNATURE, where / S.PUBLIC_KEY


def flip_one_byte(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_keygen_writes_a_p256_pair_private_0600_and_never_overwrites(key):
    priv, pub = key
    loaded = serialization.load_pem_private_key(priv.read_bytes(), password=None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey) and loaded.curve.name == "secp256r1"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert pub.read_bytes() == S._public_pem(loaded.public_key())
    with pytest.raises(ClapError) as err:
        S.generate_signing_keypair("signer", priv.parent)
    assert err.value.rule == "key_exists"


def test_signature_verifies_with_model_signings_api_and_cli(adapter, key, tmp_path):
    sig = S.sign_adapter(adapter, key[0])
    signature, public_key = write_signature(sig, tmp_path / "handoff")
    assert public_key.read_bytes() == key[1].read_bytes()
    bundle = json.loads(sig.signature)
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["verificationMaterial"] == {  # key mode: no certificate, no transparency log entry
        "publicKey": {"hint": S.fingerprint(sig.public_key)},
        "tlogEntries": [],
    }
    assert sig.digests == {p.name: io.sha256_file(p) for p in adapter.iterdir()}  # every file, sha256
    standard_verify_api(adapter, signature, public_key)
    proc = standard_verify_cli(adapter, signature, public_key)
    assert proc.returncode == 0 and "Verification succeeded" in proc.stdout, proc.stderr
    S.verify_adapter(adapter, signature, public_key)


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "tokenizer.json"])
def test_one_flipped_byte_fails_model_signings_verifier(adapter, key, tmp_path, name):
    signature, public_key = write_signature(S.sign_adapter(adapter, key[0]), tmp_path / "handoff")
    flip_one_byte(adapter / name, at=5)
    with pytest.raises(ValueError, match="Hash mismatch for") as err:
        standard_verify_api(adapter, signature, public_key)
    assert name in str(err.value)
    proc = standard_verify_cli(adapter, signature, public_key)
    assert proc.returncode == 1 and "Verification failed" in proc.stderr and name in proc.stderr
    with pytest.raises(ClapError) as err:
        S.verify_adapter(adapter, signature, public_key)
    assert err.value.rule == "bad_model_signature" and name in str(err.value)


def test_an_added_file_or_another_key_fails_model_signings_verifier(adapter, key, tmp_path):
    signature, public_key = write_signature(S.sign_adapter(adapter, key[0]), tmp_path / "handoff")
    (adapter / "extra.bin").write_bytes(b"x")
    proc = standard_verify_cli(adapter, signature, public_key)
    assert proc.returncode == 1 and "extra.bin" in proc.stderr
    (adapter / "extra.bin").unlink()
    _, other_pub = S.generate_signing_keypair("other", tmp_path / "keys")
    proc = standard_verify_cli(adapter, signature, other_pub)
    assert proc.returncode == 1 and "Key mismatch" in proc.stderr
    assert standard_verify_cli(adapter, signature, public_key).returncode == 0


def test_signed_digests_check_the_signature_without_the_adapter(adapter, key, tmp_path):
    sig = S.sign_adapter(adapter, key[0])
    assert S.signed_digests(sig.signature, sig.public_key) == sig.digests
    _, other_pub = S.generate_signing_keypair("other", tmp_path / "keys")
    with pytest.raises(ClapError) as err:
        S.signed_digests(sig.signature, other_pub.read_bytes())
    assert err.value.rule == "bad_model_signature" and "Key mismatch" in str(err.value)
    bundle = json.loads(sig.signature)
    envelope = bundle["dsseEnvelope"]
    envelope["signatures"][0]["sig"] = envelope["signatures"][0]["sig"][::-1]  # a mangled signature
    with pytest.raises(ClapError) as err:
        S.signed_digests(json.dumps(bundle).encode(), sig.public_key)
    assert err.value.rule == "bad_model_signature"


def test_payload_swapped_under_the_signature_is_refused(adapter, key):
    """A bundle whose signed statement was replaced (new digests, old signature) does not verify."""
    import base64

    sig = S.sign_adapter(adapter, key[0])
    bundle = json.loads(sig.signature)
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    for resource in statement["predicate"]["resources"]:
        resource["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(ClapError) as err:
        S.signed_digests(json.dumps(bundle).encode(), sig.public_key)
    assert err.value.rule == "bad_model_signature"


def test_require_covers_names_each_file_not_signed_as_approved():
    digests = {"adapter_model.safetensors": "a" * 64, "adapter_config.json": "b" * 64}
    S.require_covers(digests, {"adapter_model.safetensors": "a" * 64}, "batch x")
    with pytest.raises(ClapError) as err:
        S.require_covers(
            digests, {"adapter_model.safetensors": "c" * 64, "missing.json": "d" * 64}, "batch x"
        )
    assert err.value.rule == "bad_model_signature"
    assert "adapter_model.safetensors: approved cccc" in str(err.value) and "missing.json" in str(err.value)


def test_the_approvers_ed25519_key_or_another_curve_cannot_sign(adapter, tmp_path):
    approver, _ = generate_keypair("alice", tmp_path / "keys", tmp_path / "trusted")
    with pytest.raises(ClapError) as err:
        S.sign_adapter(adapter, approver)
    assert err.value.rule == "bad_key" and "EC P-256" in str(err.value) and "Ed25519" in str(err.value)
    p384 = tmp_path / "keys" / "p384.key"
    p384.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(ClapError) as err:
        S.sign_adapter(adapter, p384)
    assert err.value.rule == "bad_key" and "secp384r1" in str(err.value)
    with pytest.raises(ClapError) as err:
        S.sign_adapter(adapter, tmp_path / "keys" / "absent.key")
    assert err.value.rule == "missing_key"


def test_a_missing_or_empty_adapter_folder_is_refused(key, tmp_path):
    for folder in (tmp_path / "absent", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        with pytest.raises(ClapError) as err:
            S.sign_adapter(folder, key[0])
        assert err.value.rule == "missing_adapter"


def test_a_symlinked_file_is_signed_by_its_content(adapter, key, tmp_path):
    """A DVC cache of type symlink links the adapter's files: what is signed is what is loaded. The
    standard verifier then needs --allow_symlinks (model-signing 1.1.1 does not take it from the
    signature: its verifier resets it to False), as docs/release.md says."""
    target = tmp_path / "cache" / "weights"
    target.parent.mkdir()
    (adapter / "adapter_model.safetensors").rename(target)
    (adapter / "adapter_model.safetensors").symlink_to(target)
    sig = S.sign_adapter(adapter, key[0])
    assert sig.digests["adapter_model.safetensors"] == io.sha256_file(target)
    signature, public_key = write_signature(sig, tmp_path / "handoff")
    S.verify_adapter(adapter, signature, public_key)
    refused = standard_verify_cli(adapter, signature, public_key)
    assert refused.returncode == 1 and "symlink" in refused.stderr
    proc = standard_verify_cli(adapter, signature, public_key, "--allow_symlinks")
    assert proc.returncode == 0, proc.stderr
