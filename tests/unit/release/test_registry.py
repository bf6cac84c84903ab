"""Every reader of releases/ (serve, eval's incumbent, `clap registry-check`) accepts only approved pointers."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime

import jwt
import pytest
import yaml

from clap import cli, io
from clap.chain.serve import ServeParams, resolve_release
from clap.errors import ClapError
from clap.judge.evaluation import incumbent_spec
from clap.model.base import base_sha256
from clap.release import control as R
from clap.release.approval import BINDING_CLAIMS, load_private_key
from clap.release.canary import CanaryParams
from clap.release.keys import change_trust, keygen
from clap.release.records import current_binding, load_params, read_pointer
from clap.release.registry import check_registry, read_history, read_jsonl, verify_pointer
from clap.release.rollback import rollback

from .release_fixtures import (
    BATCHES,
    ROOT,
    clean_git_env,
    commit_all,
    copy_template,
    git,
    hand_edited_pointer,
    release_both,
    repro,
    signing_key,
    template_base,
)
from .release_fixtures import approve as approve_batch

X, Y = BATCHES
NO_CANARY = CanaryParams(
    fraction=0.0, seed=0, log="logs/canary.jsonl", alpha=0.05, max_ratio=1.5, max_requests=100, watch_every=0
)
SP = ServeParams(host="127.0.0.1", port=0, unreleased="refuse", max_question_chars=200, canary=NO_CANARY)


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    """The miniature repository with a (fake) base model whose weights hash metrics/base.json records."""
    clean_git_env(monkeypatch)
    repo = copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)
    base = repo / "models" / "base"
    base.mkdir(parents=True)
    (base / "model.safetensors").write_bytes(b"tiny base weights")
    io.write_metrics_and_record(
        repo / "metrics" / "base.json",
        None,
        {"source": "HuggingFaceTB/SmolLM2-135M-Instruct", "weights_sha256": base_sha256(base)},
    )
    commit_all(repo, "base model")
    return repo


def revoke_alice(repo):
    """alice, the one key in force, revokes her own key (a quorum of 1)."""
    change_trust(
        repo, "revoke", "alice", repo.parent / "keys" / "alice.key", load_params(repo), "laptop stolen"
    )


def _readers(repo):
    return {
        "serve": lambda: resolve_release(repo, SP),
        "eval": lambda: incumbent_spec(
            repo / "releases" / "production.json", repo / "models" / "adapters", repo / "models" / "base"
        ),
        "registry-check": lambda: check_registry(repo, emit=lambda line: None),
    }


def assert_refused_by_all(repo, pattern: str, capsys=None) -> None:
    for name, read in _readers(repo).items():
        with pytest.raises(ClapError, match=pattern) as err:
            read()
        assert err.value.rule, name
    if capsys is not None:
        capsys.readouterr()
        assert cli.main(["registry-check", "--root", str(repo)]) == 2
        assert "error:" in capsys.readouterr().err


def assert_accepted_by_all(repo, batch: str) -> None:
    served, adapter_dir = resolve_release(repo, SP)
    assert served.batch == batch and adapter_dir == repo / "models" / "adapters" / batch
    assert served.approval_id == read_pointer(repo)["approval_id"]
    spec = incumbent_spec(
        repo / "releases" / "production.json", repo / "models" / "adapters", repo / "models" / "base"
    )
    assert spec is not None and spec.batch == batch
    assert check_registry(repo, emit=lambda line: None) == len(read_history(repo))


def test_committed_registry_passes(capsys):
    """The project's own releases/, replayed through its git history, must verify: `make test` runs this."""
    assert cli.main(["registry-check", "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and out[-1].startswith("production:") and "replayed" in out[-1]


def test_release_and_rollback_pass_every_reader(repo, capsys):
    release_both(repo)
    assert_accepted_by_all(repo, Y)
    rollback(repo)
    assert_accepted_by_all(repo, X)  # by the first release's own approval
    assert cli.main(["registry-check", "--root", str(repo)]) == 0
    out = capsys.readouterr().out.splitlines()
    signed = [line for line in out if ": model signature " in line]
    lines = [line for line in out if line not in signed]
    commits = git(repo, "log", "--reverse", "--format=%H", "--", "releases/history.jsonl").split()
    assert [line.split(":")[0] for line in lines[:-1]] == [f"{c[:12]} {n}" for n, c in enumerate(commits, 1)]
    assert f"release {X}" in lines[0] and f"release {Y}" in lines[1] and f"rollback {Y} -> {X}" in lines[2]
    assert [line.split(":")[0] for line in signed] == [f"{c[:12]} {n}" for n, c in enumerate(commits[:2], 1)]
    assert f"releases/handoff/{X}/model.sig of {X}: verifies" in signed[0] and f"/{Y}/" in signed[1]
    assert lines[-1].startswith(f"production: batch {X}")
    verified = verify_pointer(repo, base_sha256=base_sha256(repo / "models" / "base"))
    assert verified is not None and verified.batch == X and verified.approver == "alice"


def test_hand_edited_pointer_is_refused(repo, capsys):
    """The adapter's real bytes and sha256, an approval id, but no approval behind it."""
    hand_edited_pointer(repo, X)
    assert_refused_by_all(repo, "no approval for this pointer", capsys)


def test_hand_edited_pointer_beside_a_real_release_is_refused(repo):
    release_both(repo)
    forged = hand_edited_pointer(repo, X)
    assert forged["approval_id"] == "appr-1"
    assert_refused_by_all(repo, "no approval for this pointer")


def test_pointer_switched_to_another_batch_is_refused(repo):
    release_both(repo)
    pointer = read_pointer(repo)
    adapter = repo / "models" / "adapters" / X
    switched = {
        **pointer,
        "batch": X,
        "adapter_sha256": io.sha256_file(adapter / "adapter_model.safetensors"),
        "adapter_config_sha256": io.sha256_file(adapter / "adapter_config.json"),
    }
    io.write_json(repo / "releases" / "production.json", switched)  # Y's approval, X's adapter
    assert_refused_by_all(repo, "adapter_sha256: approved")


def test_rolled_back_release_restored_by_hand_is_refused(repo):
    """Y was rolled back (a rollback event): putting its pointer back by hand needs fresh approvals."""
    release_both(repo)
    second = read_history(repo)[1]["pointer"]
    rollback(repo)
    io.write_json(repo / "releases" / "production.json", second)
    for read in _readers(repo).values():
        with pytest.raises(ClapError, match="not in effect .*rolled back.*fresh approvals"):
            read()


def test_reordered_history_is_refused(repo):
    """Swapping the two releases (previous_batch edited to match) would bring X back without a rollback."""
    R.release(repo, X, approve_batch(repo, X), load_params(repo), signing_key=signing_key(repo))
    repro(repo)
    time.sleep(1.1)  # token iat has one-second resolution: the second approval is strictly later
    R.release(repo, Y, approve_batch(repo, Y), load_params(repo), signing_key=signing_key(repo))
    history = repo / "releases" / "history.jsonl"
    first, second = (json.loads(line) for line in history.read_text().splitlines())
    first["previous_batch"], second["previous_batch"] = Y, None
    history.write_text("".join(json.dumps(e) + "\n" for e in (second, first)))
    io.write_json(repo / "releases" / "production.json", first["pointer"])
    assert_refused_by_all(repo, "out of order")


def test_revoked_key_is_refused(repo):
    """An approval signed by a key no longer in releases/trusted_keys does not verify any more."""
    release_both(repo)
    keygen(repo, "bob", repo.parent / "keys")
    (repo / "releases" / "trusted_keys" / "alice.pub").unlink()
    assert_refused_by_all(repo, "pinned trust root fingerprint\\(s\\) is a key in releases/trusted_keys")


def test_replayed_ledger_entry_is_refused(repo):
    release_both(repo)
    ledger = repo / "releases" / "approvals_used.jsonl"
    first = ledger.read_text().splitlines()[0]
    ledger.write_text(ledger.read_text() + first + "\n")  # the first approval consumed twice
    with pytest.raises(ClapError, match="not exactly one"):
        check_registry(repo, emit=lambda line: None)
    ledger.write_text("".join(line + "\n" for line in ledger.read_text().splitlines()[:1]))  # Y's entry gone
    assert_refused_by_all(repo, "0 entries in approvals_used.jsonl")


def test_release_without_recorded_token_is_refused(repo):
    release_both(repo)
    history = repo / "releases" / "history.jsonl"
    events = [json.loads(line) for line in history.read_text().splitlines()]
    events[-1].pop("token")
    history.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert_refused_by_all(repo, "no signed approval token")


def test_another_base_model_is_refused(repo):
    """The approval binds the base model: serving or comparing on other base weights is refused."""
    release_both(repo)
    (repo / "models" / "base" / "model.safetensors").write_bytes(b"another base")
    for name in ("serve", "eval"):
        with pytest.raises(ClapError, match="base_sha256 approved"):
            _readers(repo)[name]()
    check_registry(repo, emit=lambda line: None)  # the registry itself is intact


def test_approval_binds_the_base_model(repo):
    token = approve_batch(repo, X)
    event = R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    assert event["pointer"]["base_sha256"] == base_sha256(repo / "models" / "base")
    assert event["token"] == token


# ---------------------------------------------------------------- history through git, reuse, base, revocation


def _append(path, row) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _forge_release(repo, batch, *, key="alice", issuer=None, binding=None, drop=()) -> dict:
    """A release recorded by hand as `clap release` would, with a token signed by ``key`` (as ``issuer``)."""
    claims = {**dataclasses.asdict(binding or current_binding(repo, batch))}
    now = int(time.time())
    claims.update(
        iss=issuer or key,
        aud="clap-release",
        sub=f"sha256:{claims['adapter_sha256']}",
        iat=now,
        nbf=now,
        exp=now + 600,
        jti=f"forged-{batch}-{now}",
    )
    for claim in drop:
        claims.pop(claim)
    token = jwt.encode(claims, load_private_key(repo.parent / "keys" / f"{key}.key"), algorithm="EdDSA")
    pointer = {k: claims[k] for k in BINDING_CLAIMS if k in claims}
    pointer.update(approval_id=claims["jti"], approver=claims["iss"], commit=_head(repo))
    previous = read_pointer(repo).get("batch")
    at = datetime.now(UTC).isoformat(timespec="seconds")
    releases = repo / "releases"
    _append(
        releases / "history.jsonl",
        {"event": "release", "pointer": pointer, "previous_batch": previous, "token": token, "at": at},
    )
    _append(
        releases / "approvals_used.jsonl",
        {
            "jti": claims["jti"],
            "batch": batch,
            "approver": claims["iss"],
            "exp": claims["exp"],
            "used_at": at,
        },
    )
    io.write_json(releases / "production.json", pointer)
    return pointer


def _head(repo) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def test_hand_edited_pointer_committed_then_restored_is_refused(repo, capsys):
    """The working tree is clean again, but the history shows a commit that put an unapproved adapter in production."""
    hand_edited_pointer(repo, X)
    commit_all(repo, "point production at 2026-01")
    forged = _head(repo)
    io.write_json(repo / "releases" / "production.json", {"batch": None})
    commit_all(repo, "undo")
    with pytest.raises(
        ClapError, match=f"commit {forged[:12]} \\(point production at 2026-01\\): no approval"
    ):
        check_registry(repo, emit=lambda line: None)
    assert cli.main(["registry-check", "--root", str(repo)]) == 2
    assert forged[:12] in capsys.readouterr().err


def test_reverted_ledger_commit_is_refused(repo):
    """A revert of a release's ledger commit drops its history and ledger rows (the ledger is what makes a
    token single-use): refused, naming the pointer commit to revert instead."""
    R.release(repo, X, approve_batch(repo, X), load_params(repo), signing_key=signing_key(repo))
    assert git(repo, "log", "-1", "--format=%s", "HEAD~1").startswith(f"release {X}: ledger (approval ")
    git(repo, "revert", "--no-edit", "HEAD~1")
    with pytest.raises(
        ClapError, match=f"commit {_head(repo)[:12]} .*append-only.*revert.*pointer commit"
    ) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "rewritten_history"


# ---------------------------------------------------------------- `git revert` of a pointer commit is a rollback


def _rows(repo) -> dict[str, list]:
    return {
        n: read_jsonl(repo / "releases" / n) for n in ("history.jsonl", "approvals_used.jsonl", "trust.jsonl")
    }


def _pointer_commit(repo, batch: str) -> str:
    """The commit of `clap release` that changed releases/production.json alone."""
    for line in git(repo, "log", "--format=%H %s", "--", "releases/production.json").splitlines():
        sha, subject = line.split(" ", 1)
        if subject.startswith(f"release {batch}: "):
            changed = git(repo, "show", "--format=", "--name-only", sha).split()
            assert changed == ["releases/production.json"], changed
            return sha
    raise AssertionError(f"no pointer commit of {batch}")


def test_git_revert_of_a_release_is_a_rollback(repo, capsys):
    """X, then Y; `git revert` of Y's pointer commit: production is X for every reader, no row is lost and
    Y's approval stays spent."""
    t1, t2 = release_both(repo)
    rows = _rows(repo)
    git(repo, "revert", "--no-edit", _pointer_commit(repo, Y))
    assert read_pointer(repo) == read_history(repo)[0]["pointer"]
    assert _rows(repo) == rows  # history, ledger and trust log untouched
    assert_accepted_by_all(repo, X)
    assert cli.main(["registry-check", "--root", str(repo)]) == 0
    out = capsys.readouterr().out
    assert f"{_head(repo)[:12]} pointer: rollback {Y} -> {X} by reverting the pointer commit" in out
    assert out.splitlines()[-1].startswith(f"production: batch {X}")
    for batch, token in ((Y, t2), (X, t1)):  # neither approval can be used again
        with pytest.raises(ClapError, match="already used") as err:
            R.release(repo, batch, token, load_params(repo), signing_key=signing_key(repo))
        assert err.value.rule == "replayed_token"


def test_reverting_each_release_in_order_reaches_the_base_only_by_policy(repo):
    """Y's pointer commit reverted, then X's: nothing released, accepted only under release.rollback_to_base."""
    release_both(repo)
    git(repo, "revert", "--no-edit", _pointer_commit(repo, Y))
    git(repo, "revert", "--no-edit", _pointer_commit(repo, X))
    assert read_pointer(repo)["batch"] is None
    with pytest.raises(ClapError, match="rollback_to_base is true") as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "not_in_effect"
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["release"]["rollback_to_base"] = True
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit_all(repo, "release.rollback_to_base: true")
    lines: list[str] = []
    assert check_registry(repo, emit=lines.append) == 2
    assert any(f"pointer: rollback {X} -> base by reverting" in line for line in lines)
    assert lines[-1].startswith("production: nothing released")


def test_clap_rollback_after_a_git_revert_records_it_first(repo):
    """Y reverted in git, then `clap rollback` from X (to the base model by policy): both in the history."""
    release_both(repo)
    git(repo, "revert", "--no-edit", _pointer_commit(repo, Y))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["release"]["rollback_to_base"] = True
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit_all(repo, "release.rollback_to_base: true")
    rollback(repo)
    history = read_history(repo)
    assert [(e["event"], e.get("from_batch"), e.get("to_batch"), e.get("reason")) for e in history[2:]] == [
        ("rollback", Y, X, "git revert"),
        ("rollback", X, None, "manual"),
    ]
    assert read_pointer(repo)["batch"] is None
    assert check_registry(repo, emit=lambda line: None) == 4


def test_revert_of_a_revert_needs_fresh_approvals(repo):
    """Reverting the rollback brings Y back on its spent approval: refused; a fresh approval releases it."""
    release_both(repo)
    git(repo, "revert", "--no-edit", _pointer_commit(repo, Y))
    git(repo, "revert", "--no-edit", "HEAD")
    with pytest.raises(
        ClapError, match=f"commit {_head(repo)[:12]} .*brings back batch {Y} .*fresh approvals"
    ) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "rolled_back_release"
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    repro(repo)  # production changed: re-evaluate against X
    event = R.release(repo, Y, approve_batch(repo, Y), load_params(repo), signing_key=signing_key(repo))
    history = read_history(repo)
    assert [e["event"] for e in history] == ["release", "release", "rollback", "release"]
    assert history[2]["reason"] == "git revert" and (history[2]["from_batch"], history[2]["to_batch"]) == (
        Y,
        X,
    )
    assert event["previous_batch"] == X
    assert_accepted_by_all(repo, Y)


def test_revert_of_a_clap_rollback_needs_fresh_approvals(repo):
    release_both(repo)
    rollback(repo)
    git(repo, "revert", "--no-edit", "HEAD")
    with pytest.raises(
        ClapError, match=f"rollback {Y} -> {X}: reverting a rollback is refused.*fresh approvals"
    ) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "rewritten_history"


def test_reused_token_is_refused(repo):
    """The first release's token, recorded again (with a second ledger entry) to bring its batch back."""
    release_both(repo)
    first = read_history(repo)[0]
    _append(repo / "releases" / "history.jsonl", {**first, "previous_batch": Y})
    _append(
        repo / "releases" / "approvals_used.jsonl",
        read_jsonl(repo / "releases" / "approvals_used.jsonl")[0],
    )
    io.write_json(repo / "releases" / "production.json", first["pointer"])
    assert_refused_by_all(repo, "claimed by")
    with pytest.raises(ClapError, match="already used"):
        R.release(repo, X, first["token"], load_params(repo), signing_key=signing_key(repo))


def test_token_bound_to_another_base_is_refused(repo):
    """The base stage now records (and loads) another base than the one the release's token binds."""
    release_both(repo)
    base = repo / "models" / "base"
    (base / "model.safetensors").write_bytes(b"a newer base")
    io.write_metrics_and_record(repo / "metrics" / "base.json", None, {"weights_sha256": base_sha256(base)})
    commit_all(repo, "new base")
    assert_refused_by_all(repo, "base_sha256 approved")


def test_token_without_base_hash_fails_clearly(repo):
    """A token minted before approvals bound the base model never verifies, and says why."""
    _forge_release(repo, X, drop=("base_sha256",))
    assert_refused_by_all(repo, "binds no base_sha256: it was signed before approvals bound the base")


def test_revoked_key_refuses_production_and_new_approvals(repo, monkeypatch, capsys):
    release_both(repo)
    repro(repo)  # 2026-01 re-evaluated against production (2026-02)
    pending = approve_batch(repo, X)  # approved before the revocation, not yet used
    monkeypatch.chdir(repo)
    key = str(repo.parent / "keys" / "alice.key")
    assert cli.main(["trust", "revoke", "alice", "--key", key, "--reason", "laptop stolen"]) == 0
    assert "revoke alice" in capsys.readouterr().out
    row = read_jsonl(repo / "releases" / "trust.jsonl")[0]
    assert row["after_event"] == 2 and row["name"] == "alice" and row["action"] == "revoke"
    assert_refused_by_all(repo, "revoked in releases/trust.jsonl after event 2 \\(laptop stolen\\)", capsys)
    with pytest.raises(ClapError, match="was revoked") as err:
        R.release(repo, X, pending, load_params(repo), signing_key=signing_key(repo))
    assert err.value.rule == "key_revoked"
    with pytest.raises(ClapError, match="was revoked"):
        approve_batch(repo, X)
    with pytest.raises(ClapError, match="cannot roll back to batch 2026-01: .*was revoked"):
        rollback(repo)  # the release before it was approved by the same key


def test_revoked_key_trusted_again_under_another_name_is_refused(repo):
    """The stolen key's alice.pub renamed to mallory.pub signs a new release: revocation is by fingerprint."""
    release_both(repo)
    revoke_alice(repo)
    trusted = repo / "releases" / "trusted_keys"
    (trusted / "alice.pub").rename(trusted / "mallory.pub")
    _forge_release(repo, X, issuer="mallory")
    commit_all(repo, "release 2026-01")
    for name in ("serve", "eval"):
        with pytest.raises(ClapError, match="approved by mallory's key .*revoked") as err:
            _readers(repo)[name]()
        assert err.value.rule == "key_revoked"
    with pytest.raises(ClapError, match=f"commit {_head(repo)[:12]} .*release of batch {X} .*refused"):
        check_registry(repo, emit=lambda line: None)  # alice's own releases no longer verify either


def test_history_rewritten_around_a_revoked_key_is_refused(repo):
    """With the stolen key, the last release is replaced by a forged one placed before the revocation point."""
    release_both(repo)
    revoke_alice(repo)
    releases = repo / "releases"
    history, ledger = (read_jsonl(releases / n) for n in ("history.jsonl", "approvals_used.jsonl"))
    for name, rows in (("history.jsonl", history[:1]), ("approvals_used.jsonl", ledger[:1])):
        (releases / name).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    io.write_json(releases / "production.json", history[0]["pointer"])
    _forge_release(repo, X)  # event 2: before after_event 2, so only its being production gives it away
    assert_refused_by_all(repo, "revoked")
    commit_all(repo, "release 2026-01 again")
    with pytest.raises(ClapError, match=f"commit {_head(repo)[:12]} .*history.jsonl is append-only"):
        check_registry(repo, emit=lambda line: None)


def test_dropped_revocation_is_refused_by_the_registry_check(repo):
    """Deleting the revocation row puts the key back in the working tree; the git history still shows it.

    serve and eval read the working tree only: this rewrite is `clap registry-check`'s (CI's) to catch.
    """
    release_both(repo)
    revoke_alice(repo)
    (repo / "releases" / "trust.jsonl").write_text("")
    commit_all(repo, "tidy releases/")
    with pytest.raises(
        ClapError,
        match=f"commit {_head(repo)[:12]} \\(tidy releases/\\): .*trust.jsonl is append-only",
    ):
        check_registry(repo, emit=lambda line: None)


def test_release_not_matching_its_commit_is_refused_by_the_registry_check(repo):
    """A correctly signed release whose evidence hash is not the evidence committed where it was released from.

    serve and eval check the adapter and base they load; the evaluation record and evidence bundle
    are checked against git, where they were committed, by `clap registry-check`.
    """
    binding = dataclasses.replace(current_binding(repo, X), evidence_sha256="0" * 64)
    _forge_release(repo, X, binding=binding)
    commit_all(repo, "release 2026-01")
    with pytest.raises(ClapError, match="evidence_sha256: approved '0000.*committed in") as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "binding_mismatch" and _head(repo)[:12] in str(err.value)


def test_hand_edit_on_a_merged_side_branch_is_refused(repo):
    """A side branch points production at an unapproved adapter, undoes it, and is merged: main's tree never
    shows it, the branch's commits do."""
    git(repo, "checkout", "-q", "-b", "side")
    hand_edited_pointer(repo, X)
    commit_all(repo, "side: point production at 2026-01")
    forged = _head(repo)
    io.write_json(repo / "releases" / "production.json", {"batch": None})
    commit_all(repo, "side: undo")
    git(repo, "checkout", "-q", "main")
    (repo / "notes.txt").write_text("main moves on\n")
    commit_all(repo, "main: notes")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    with pytest.raises(ClapError, match=f"commit {forged[:12]} .*no approval for this pointer"):
        check_registry(repo, emit=lambda line: None)


# ---------------------------------------------------------------- the model signature (OpenSSF model-signing)


def _resign(repo, batch, folder, key_name="other") -> dict:
    """Sign ``folder`` with a fresh P-256 key into releases/handoff/<batch>/ (as a forger would); the new record."""
    from clap.release import signing as S

    keys = repo.parent / "keys"
    priv = keys / f"{key_name}.key"
    if not priv.exists():
        S.generate_signing_keypair(key_name, keys)
    sig = S.sign_adapter(folder, priv)
    out = repo / "releases" / "handoff" / batch
    (out / S.SIGNATURE).write_bytes(sig.signature)
    (out / S.PUBLIC_KEY).write_bytes(sig.public_key)
    return sig.record((out / S.SIGNATURE).relative_to(repo), (out / S.PUBLIC_KEY).relative_to(repo))


def test_signature_swapped_in_a_later_commit_is_refused(repo, capsys):
    """Another key's signature of the same bytes passes the standard verifier with the swapped public key:
    only the registry, which recorded the release's own signature, can tell."""
    R.release(repo, X, approve_batch(repo, X), load_params(repo), signing_key=signing_key(repo))
    assert check_registry(repo, emit=lambda line: None) == 1
    _resign(repo, X, repo / "models" / "adapters" / X)
    with pytest.raises(
        ClapError, match=f"working tree .*model.sig is not the model signature .*batch {X}"
    ) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "bad_model_signature"
    commit_all(repo, "refresh the handoff")
    swapped = _head(repo)
    with pytest.raises(
        ClapError, match=f"commit {swapped[:12]} \\(refresh the handoff\\): .*model.sig"
    ) as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "bad_model_signature"
    assert cli.main(["registry-check", "--root", str(repo)]) == 2
    assert "bad_model_signature" in capsys.readouterr().err


def test_release_whose_signature_signs_other_bytes_is_refused(repo):
    """A release commit rewritten so that its recorded signature (hashes consistent) signs another adapter."""
    R.release(repo, X, approve_batch(repo, X), load_params(repo), signing_key=signing_key(repo))
    record = _resign(repo, X, repo / "models" / "adapters" / Y, key_name="signer-2")
    history = read_history(repo)
    history[-1]["model_signature"] = record
    io.write_jsonl(repo / "releases" / "history.jsonl", history)
    git(repo, "reset", "-q", "--soft", "HEAD~2")  # ledger and pointer commits rewritten as one
    git(repo, "commit", "-q", "-a", "-m", f"release {X}")
    with pytest.raises(ClapError, match="does not sign the approved bytes: adapter_model.safetensors") as err:
        check_registry(repo, emit=lambda line: None)
    assert err.value.rule == "bad_model_signature" and _head(repo)[:12] in str(err.value)


def test_release_without_a_model_signature_still_verifies(repo):
    """Releases recorded before clap signed adapters carry no model_signature: history stays valid."""
    _forge_release(repo, X)
    commit_all(repo, "release 2026-01 (before model signing)")
    lines: list[str] = []
    assert check_registry(repo, emit=lines.append) == 1
    assert not any("model signature" in line for line in lines)
