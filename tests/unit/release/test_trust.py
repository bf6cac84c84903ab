"""No one approves alone: key changes and releases need a quorum of keys in force (clap/release/trust.py)."""

from __future__ import annotations

import json

import pytest

from clap.errors import ClapError
from clap.release import control as R
from clap.release.keys import change_trust, keygen
from clap.release.records import load_params
from clap.release.registry import check_registry, read_trust, verify_pointer
from clap.release.trust import PENDING, TRUST_LOG, pinned_roots

from .release_fixtures import (
    approve,
    clean_git_env,
    commit_all,
    copy_template,
    refused,
    repro,
    signing_key,
    template_base,
)

X = "2026-01"


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    clean_git_env(monkeypatch)
    return copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)


def _key(repo, name):
    return repo.parent / "keys" / f"{name}.key"


def new_key(repo, name):
    keygen(repo, name, repo.parent / "keys")
    commit_all(repo, f"key material of {name}")


def change(repo, action, name, signer, reason=""):
    return change_trust(repo, action, name, _key(repo, signer), load_params(repo), reason)


def add_bob(repo):
    """alice, the one pinned key, adds bob alone (a quorum of min(2, 1) = 1)."""
    new_key(repo, "bob")
    event = change(repo, "add", "bob", "alice")
    assert event["missing"] == 0 and event["signers"] == ["alice"]


def release(repo, tokens):
    return R.release(repo, X, tokens, load_params(repo), signing_key=signing_key(repo))


def test_a_team_of_two_releases_only_with_both_approvers(repo):
    add_bob(repo)
    by_alice = approve(repo, X, "alice")
    message = refused(repo, lambda: release(repo, [by_alice]), "approvals_required")
    assert "approved by ['alice']; 2 distinct approvers needed" in message
    refused(repo, lambda: release(repo, [by_alice, approve(repo, X, "alice")]), "approvals_required")
    event = release(repo, [by_alice, approve(repo, X, "bob")])
    assert event["pointer"]["approver"] == "alice" and len(event["co_tokens"]) == 1
    lines = []
    check_registry(repo, emit=lines.append)
    assert any("trust 1: add bob" in line and "signed by alice" in line for line in lines), lines
    assert verify_pointer(repo).batch == X


def test_a_release_stripped_of_its_second_approval_is_refused(repo):
    """Dropping a co-approval from history leaves one approver where two were needed."""
    add_bob(repo)
    release(repo, [approve(repo, X, "alice"), approve(repo, X, "bob")])
    history = repo / "releases" / "history.jsonl"
    event = json.loads(history.read_text())
    del event["co_tokens"]
    history.write_text(json.dumps(event, sort_keys=True) + "\n")
    with pytest.raises(ClapError) as err:
        verify_pointer(repo)
    assert err.value.rule == "approvals_required"


def test_with_two_keys_in_force_a_key_change_needs_both(repo):
    add_bob(repo)
    new_key(repo, "carol")
    first = change(repo, "add", "carol", "alice")
    assert first["missing"] == 1 and (repo / PENDING).exists()
    assert "carol" not in read_trust(repo).in_force()  # pending: not trusted yet
    with pytest.raises(ClapError) as err:  # one change at a time
        change(repo, "revoke", "bob", "alice", "left")
    assert err.value.rule == "trust_pending"
    second = change(repo, "add", "carol", "bob")
    assert second["missing"] == 0 and not (repo / PENDING).exists()
    assert sorted(read_trust(repo).in_force()) == ["alice", "bob", "carol"]
    # revoking takes the same quorum: alice cannot drop bob to approve alone
    assert change(repo, "revoke", "bob", "alice", "left the team")["missing"] == 1
    assert "bob" in read_trust(repo).in_force()
    assert change(repo, "revoke", "bob", "carol", "left the team")["missing"] == 0
    assert sorted(read_trust(repo).in_force()) == ["alice", "carol"]
    check_registry(repo, emit=lambda line: None)


def test_an_edited_trust_event_no_longer_counts(repo):
    add_bob(repo)
    log = repo / TRUST_LOG
    event = json.loads(log.read_text())
    event["name"] = "mallory"  # the signed fields changed: alice's signature no longer verifies
    log.write_text(json.dumps(event, sort_keys=True) + "\n")
    with pytest.raises(ClapError) as err:
        read_trust(repo)
    assert err.value.rule == "trust_quorum"


def test_the_trust_log_is_a_chain(repo):
    add_bob(repo)
    new_key(repo, "carol")
    change(repo, "add", "carol", "alice")
    change(repo, "add", "carol", "bob")
    log = repo / TRUST_LOG
    lines = log.read_text().splitlines()
    log.write_text(lines[1] + "\n" + lines[0] + "\n")  # reordered
    with pytest.raises(ClapError) as err:
        read_trust(repo)
    assert err.value.rule == "trust_chain"


def test_pins_are_read_from_outside_the_repository(repo, monkeypatch, tmp_path):
    from clap.release.trust import ROOT_ENV, ROOT_FILE_ENV

    monkeypatch.setenv(ROOT_ENV, f"{'ab' * 32}, {'CD' * 32}")
    assert pinned_roots(repo) == {"ab" * 32, "cd" * 32}
    monkeypatch.delenv(ROOT_ENV)
    pins = tmp_path / "pins"
    pins.write_text(f"# the release team\n{'ef' * 32}  # alice\n")
    monkeypatch.setenv(ROOT_FILE_ENV, str(pins))
    assert pinned_roots(repo) == {"ef" * 32}
    pins.write_text("not-a-fingerprint\n")
    with pytest.raises(ClapError) as err:
        pinned_roots(repo)
    assert err.value.rule == "bad_trust_root"


def _eval_changed(repo) -> list[str]:
    import contextlib

    from dvc.repo import Repo

    with contextlib.chdir(repo), Repo(str(repo)) as dvc:
        status = dvc.status(targets=[f"eval@{X}"])
    return [p for entry in status.get(f"eval@{X}", []) for p in entry.get("changed deps", {})]


def test_a_key_change_reruns_eval_and_a_pending_one_does_not(repo):
    """eval's incumbent verdict depends on the whole release state (releases/ is its dep), except what
    no reader reads: a key change still collecting signatures (.dvcignore)."""
    assert _eval_changed(repo) == []
    add_bob(repo)
    assert _eval_changed(repo) == ["releases"]
    new_key(repo, "carol")
    repro(repo)
    assert _eval_changed(repo) == []
    assert change(repo, "add", "carol", "alice")["missing"] == 1
    assert _eval_changed(repo) == []  # pending: nothing in force changed
    change(repo, "add", "carol", "bob")
    assert _eval_changed(repo) == ["releases"]
