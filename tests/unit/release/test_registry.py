"""Every reader of releases/ (serve, eval's incumbent, `clap registry-check`) accepts only approved pointers."""

from __future__ import annotations

import json
import time

import pytest

from clap import cli, io
from clap.chain.serve import ServeParams, resolve_release
from clap.errors import ClapError
from clap.judge.evaluation import incumbent_spec
from clap.model.base import base_sha256
from clap.release import control as R
from clap.release.registry import check_registry, verify_pointer

from .release_fixtures import (
    BATCHES,
    ROOT,
    clean_git_env,
    commit_all,
    copy_template,
    hand_edited_pointer,
    release_both,
    repro,
    template_base,
)
from .release_fixtures import approve as approve_batch

X, Y = BATCHES
SP = ServeParams(host="127.0.0.1", port=0, unreleased="refuse", max_question_chars=200)


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    """The miniature repository with a (fake) base model whose weights hash metrics/base.json records."""
    clean_git_env(monkeypatch)
    repo = copy_template(template_base(tmp_path_factory), tmp_path)
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
    assert served.approval_id == R.read_pointer(repo)["approval_id"]
    spec = incumbent_spec(
        repo / "releases" / "production.json", repo / "models" / "adapters", repo / "models" / "base"
    )
    assert spec is not None and spec.batch == batch
    assert check_registry(repo, emit=lambda line: None) == len(R.read_history(repo))


def test_committed_registry_passes(capsys):
    """The project's own releases/ (nothing released yet) must verify: `make test` runs this."""
    assert cli.main(["registry-check", "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and out[-1].startswith("production:")


def test_release_and_rollback_pass_every_reader(repo, capsys):
    release_both(repo)
    assert_accepted_by_all(repo, Y)
    R.rollback(repo)
    assert_accepted_by_all(repo, X)  # by the first release's own approval
    assert cli.main(["registry-check", "--root", str(repo)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["1", "2", "3", "production"]
    assert f"release {X}" in lines[0] and f"release {Y}" in lines[1] and f"rollback {Y} -> {X}" in lines[2]
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
    pointer = R.read_pointer(repo)
    adapter = repo / "models" / "adapters" / X
    switched = {
        **pointer,
        "batch": X,
        "adapter_sha256": io.sha256_file(adapter / "adapter_model.safetensors"),
        "adapter_config_sha256": io.sha256_file(adapter / "adapter_config.json"),
    }
    io.write_json(repo / "releases" / "production.json", switched)  # Y's approval, X's adapter
    assert_refused_by_all(repo, "adapter_sha256: approved")


def test_earlier_release_restored_by_hand_is_refused(repo):
    """X's pointer was approved once, but Y replaced it: only `clap rollback` may bring X back."""
    release_both(repo)
    first = R.read_history(repo)[0]["pointer"]
    io.write_json(repo / "releases" / "production.json", first)
    for read in _readers(repo).values():
        with pytest.raises(ClapError, match="not the (one|release) in effect"):
            read()


def test_reordered_history_is_refused(repo):
    """Swapping the two releases (previous_batch edited to match) would bring X back without a rollback."""
    R.release(repo, X, approve_batch(repo, X), R.load_params(repo))
    repro(repo)
    time.sleep(1.1)  # token iat has one-second resolution: the second approval is strictly later
    R.release(repo, Y, approve_batch(repo, Y), R.load_params(repo))
    history = repo / "releases" / "history.jsonl"
    first, second = (json.loads(line) for line in history.read_text().splitlines())
    first["previous_batch"], second["previous_batch"] = Y, None
    history.write_text("".join(json.dumps(e) + "\n" for e in (second, first)))
    io.write_json(repo / "releases" / "production.json", first["pointer"])
    assert_refused_by_all(repo, "out of order")


def test_revoked_key_is_refused(repo):
    """An approval signed by a key no longer in releases/trusted_keys does not verify any more."""
    release_both(repo)
    R.keygen(repo, "bob", repo.parent / "keys")
    (repo / "releases" / "trusted_keys" / "alice.pub").unlink()
    assert_refused_by_all(repo, "no trusted key")


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
    event = R.release(repo, X, token, R.load_params(repo))
    assert event["pointer"]["base_sha256"] == base_sha256(repo / "models" / "base")
    assert event["token"] == token
