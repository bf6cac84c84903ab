"""Attacks on the release gate: each is refused and leaves releases/ and git HEAD byte-identical."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clap.errors import ClapError
from clap.release import control as R
from clap.release.approval import load_private_key, mint_token
from clap.release.keys import change_trust, keygen
from clap.release.records import current_binding, load_params, read_pointer

from .release_fixtures import (
    clean_git_env,
    copy_template,
    git,
    set_decision,
    signing_key,
    snapshot,
    template_base,
)

X, Y = "2026-01", "2026-02"


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    clean_git_env(monkeypatch)
    return copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)


def _key(repo):
    return load_private_key(repo.parent / "keys" / "alice.key")


def _mint(repo, batch=X, *, key=None, issuer="alice", now=None, ttl=600, **override):
    binding = dataclasses.replace(current_binding(repo, batch), **override)
    return mint_token(
        key or _key(repo),
        issuer,
        binding,
        audience="clap-release",
        ttl_s=ttl,
        now=int(time.time()) if now is None else now,
    )


def _b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def assert_refused(repo, batch, token, rule):
    before = snapshot(repo)
    with pytest.raises(ClapError) as err:
        R.release(repo, batch, token, load_params(repo), signing_key=signing_key(repo))
    assert err.value.rule == rule, str(err.value)
    assert snapshot(repo) == before
    return str(err.value)


def test_genuine_token_is_released(repo):
    """The control: the same setup the attacks start from does release."""
    event = R.release(repo, X, _mint(repo), load_params(repo), signing_key=signing_key(repo))
    assert event["event"] == "release" and read_pointer(repo)["batch"] == X


def test_forged_signature(repo):
    header, payload, sig = _mint(repo).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["adapter_sha256"] = "0" * 64  # the attacker rewrites a claim and keeps the signature
    assert_refused(repo, X, ".".join([header, _b64(claims), sig]), "bad_signature")


def test_unknown_key(repo):
    assert_refused(repo, X, _mint(repo, key=Ed25519PrivateKey.generate()), "bad_signature")


@pytest.mark.parametrize("alg", ["none", "HS256"])
def test_algorithm_confusion(repo, alg):
    """alg=none, or HS256 keyed with the (public) trusted key: the verifier only accepts EdDSA."""
    claims = json.loads(base64.urlsafe_b64decode(_mint(repo).split(".")[1] + "=="))
    signing_input = f"{_b64({'alg': alg, 'typ': 'JWT'})}.{_b64(claims)}"
    pub = (repo / "releases" / "trusted_keys" / "alice.pub").read_bytes()
    sig = b"" if alg == "none" else hmac.new(pub, signing_input.encode(), hashlib.sha256).digest()
    token = signing_input + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()
    assert "alg" in assert_refused(repo, X, token, "bad_token")


def test_replayed_token(repo):
    token = _mint(repo)
    R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    assert "already used" in assert_refused(repo, X, token, "replayed_token")


def test_replay_after_a_plain_git_revert_of_the_release(repo):
    """`git revert` of a release commit drops its ledger line; the commit log still names the approval."""
    token = _mint(repo)
    R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    git(repo, "revert", "--no-edit", "HEAD")
    assert_refused(repo, X, token, "replayed_token")


def test_expired_token(repo):
    token = _mint(repo, now=int(time.time()) - 3600, ttl=60)
    assert "expired" in assert_refused(repo, X, token, "bad_token")


def test_lifetime_over_the_maximum(repo):
    assert_refused(repo, X, _mint(repo, ttl=10 * 3600), "ttl_too_long")


def test_other_audience(repo):
    claims_token = mint_token(
        _key(repo),
        "alice",
        current_binding(repo, X),
        audience="another-service",
        ttl_s=600,
        now=int(time.time()),
    )
    assert_refused(repo, X, claims_token, "bad_token")


def test_issuer_is_not_the_signer(repo):
    assert_refused(repo, X, _mint(repo, issuer="bob"), "wrong_issuer")


def test_adapter_tampered_after_approval(repo):
    token = _mint(repo)
    weights = repo / "models" / "adapters" / X / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.unlink()  # never write through a possible cache link
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "adapter_sha256" in assert_refused(repo, X, token, "binding_mismatch")


def test_eval_record_tampered_after_approval(repo):
    token = _mint(repo)
    items = repo / "data" / "eval" / X / "items.parquet"
    data = items.read_bytes()
    items.unlink()
    items.write_bytes(data + b" ")
    assert "eval_sha256" in assert_refused(repo, X, token, "binding_mismatch")


@pytest.mark.parametrize("decision", ["hold", "reject"])
def test_token_for_a_hold_or_reject_decision(repo, decision):
    """Minted directly with the approver's key, bypassing `approve`'s refusal."""
    set_decision(repo, X, decision)
    assert decision in assert_refused(repo, X, _mint(repo, decision=decision), "not_releasable")


def test_gate_decision_changed_after_approval(repo):
    token = _mint(repo)
    set_decision(repo, X, "hold")
    assert_refused(repo, X, token, "not_releasable")


def test_token_claims_a_better_decision_than_the_gate(repo):
    set_decision(repo, X, "canary")
    assert "decision" in assert_refused(repo, X, _mint(repo, decision="promote"), "binding_mismatch")


def test_evidence_bundle_tampered_after_approval(repo):
    token = _mint(repo)
    evidence = repo / "reports" / "gate" / X / "evidence.json"
    evidence.write_text(evidence.read_text().replace("McNemar", "mcnemar"))
    git(repo, "commit", "-qam", "edit the evidence")  # even committed, the hash no longer matches
    assert "evidence_sha256" in assert_refused(repo, X, token, "binding_mismatch")


def test_token_for_another_batch(repo):
    assert_refused(repo, X, _mint(repo, batch=Y), "wrong_batch")


def test_one_committer_cannot_make_a_key_of_their_own_count(repo):
    """The one-committer attack: mallory (commit access, no trusted key) creates a key, commits its
    .pub, and signs her own key change; approving, releasing and the registry check all refuse."""
    from clap.release import trust
    from clap.release.registry import check_registry

    keygen(repo, "mallory", repo.parent / "keys")
    git(repo, "add", "releases/trusted_keys/mallory.pub")
    git(repo, "commit", "-q", "-m", "add mallory's key")
    mallory = load_private_key(repo.parent / "keys" / "mallory.key")
    with pytest.raises(ClapError) as err:
        R.approve(
            repo, X, repo.parent / "keys" / "mallory.key", None, load_params(repo), now=int(time.time())
        )
    assert err.value.rule == "untrusted_key"
    assert_refused(repo, X, _mint(repo, key=mallory, issuer="mallory"), "bad_signature")
    with pytest.raises(ClapError) as err:  # signing the change herself: she is no key in force
        change_trust(repo, "add", "mallory", repo.parent / "keys" / "mallory.key", load_params(repo))
    assert err.value.rule == "untrusted_key"
    # a hand-written event with her own signature: the replay counts only signatures of keys in force
    event = {"seq": 1, "action": "add", "name": "mallory", "key_sha256": trust.key_sha256(mallory.public_key()),
             "after_event": 0, "reason": "", "prev": ""}  # fmt: skip
    alice = trust.key_sha256(_key(repo).public_key())
    event["signatures"] = {event["key_sha256"]: trust.sign(event, mallory), alice: trust.sign(event, mallory)}
    (repo / "releases" / "trust.jsonl").write_text(json.dumps(event) + "\n")
    git(repo, "add", "releases/trust.jsonl")
    git(repo, "commit", "-q", "-m", "trust mallory")
    with pytest.raises(ClapError) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "trust_quorum" and "signed by ['alice', 'mallory']" not in str(err.value)
    assert_refused(repo, X, _mint(repo, key=mallory, issuer="mallory"), "trust_quorum")


def test_no_trust_root_pinned_verifies_nothing(repo, monkeypatch, tmp_path):
    from clap.release.trust import ROOT_ENV, ROOT_FILE_ENV

    monkeypatch.delenv(ROOT_ENV)
    monkeypatch.setenv(ROOT_FILE_ENV, str(tmp_path / "nowhere"))
    assert_refused(repo, X, _mint(repo), "no_trust_root")
    monkeypatch.setenv(ROOT_FILE_ENV, str(repo / "trust_root"))  # inside the repository: refused
    (repo / "trust_root").write_text("00" * 32 + "\n")
    assert_refused(repo, X, _mint(repo), "trust_root_in_repo")


def test_approve_refuses_hold_and_reject_and_says_why(repo):
    set_decision(repo, X, "reject")
    with pytest.raises(ClapError) as err:
        R.approve(repo, X, repo.parent / "keys" / "alice.key", None, load_params(repo), now=int(time.time()))
    message = str(err.value)
    assert (
        err.value.rule == "not_releasable"
        and "'reject'" in message
        and "McNemar" in message
        and "report.md" in message
    )


def test_approve_refuses_an_untrusted_key(repo, tmp_path):
    from clap.release.approval import generate_keypair

    priv, _ = generate_keypair("eve", tmp_path / "k", tmp_path / "pub")
    with pytest.raises(ClapError) as err:
        R.approve(repo, X, priv, None, load_params(repo), now=int(time.time()))
    assert err.value.rule == "untrusted_key"
