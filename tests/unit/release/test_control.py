"""Release, hold and rollback in a throw-away git + DVC repository with a miniature pipeline."""

from __future__ import annotations

import dataclasses
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clap import io
from clap.errors import ClapError
from clap.release import control as R
from clap.release.canary_action import run_canary
from clap.release.keys import keygen, signing_keygen
from clap.release.records import load_params, read_pointer
from clap.release.registry import check_registry, read_history, release_stack, verify_pointer
from clap.release.rollback import BASE_POINTER, rollback

from .release_fixtures import (
    BATCHES,
    ROOT,
    approve,
    clean_git_env,
    commit_all,
    copy_template,
    git,
    read_jsonl,
    refused,
    release_both,
    repro,
    set_decision,
    signing_key,
    template_base,
)

X, Y = BATCHES


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    clean_git_env(monkeypatch)
    return copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)


def test_a_bad_release_param_names_its_dotted_key(tmp_path):
    from clap.release.registry import release_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["release"]["approvals_required"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ClapError) as e:
        load_params(tmp_path)
    assert (e.value.rule, e.value.column) == ("bad_params", "release.approvals_required")
    raw["release"]["max_approval_ttl_s"] = "a day"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ClapError) as e:
        release_params(tmp_path / "params.yaml")
    assert (e.value.rule, e.value.column, e.value.file) == (
        "bad_params",
        "release.max_approval_ttl_s",
        tmp_path / "params.yaml",
    )


def adapter_sha(repo, batch):
    return io.sha256_file(repo / "models" / "adapters" / batch / "adapter_model.safetensors")


def set_release_params(repo, **cost):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["release"]["cost"].update(cost)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_release_commits_pointer_history_ledger_and_handoff(repo):
    token = approve(repo, X)
    event = R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    pointer = read_pointer(repo)
    assert (
        pointer == event["pointer"]
        and pointer["batch"] == X
        and pointer["adapter_sha256"] == adapter_sha(repo, X)
    )
    assert (
        git(repo, "log", "-1", "--format=%s").strip()
        == f"release {X}: promote (approval {pointer['approval_id']})"
    )
    assert set(git(repo, "show", "--name-only", "--format=", "HEAD").split()) == {"releases/production.json"}
    assert "`git revert` it to roll back" in git(repo, "log", "-1", "--format=%b")
    assert git(repo, "log", "-1", "--format=%s", "HEAD~1").strip() == (
        f"release {X}: ledger (approval {pointer['approval_id']})"
    )
    committed = set(git(repo, "show", "--name-only", "--format=", "HEAD~1").split())
    assert committed == {
        "releases/history.jsonl",
        "releases/approvals_used.jsonl",
        f"releases/handoff/{X}/README.md",
        f"releases/handoff/{X}/manifest.json",
        f"releases/handoff/{X}/cost.json",
        f"releases/handoff/{X}/model.sig",
        f"releases/handoff/{X}/model_signing.pub",
    }
    assert [r["jti"] for r in read_jsonl(repo / "releases" / "approvals_used.jsonl")] == [
        pointer["approval_id"]
    ]
    assert git(repo, "status", "--porcelain") == ""


def test_release_refuses_an_uncertified_scenario_unless_told_why(repo):
    set_decision(repo, X, "promote uncertified")
    token = approve(repo, X)
    msg = refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "uncertified_scenario",
    )
    assert "uncertified scenario (positive control x did not learn)" in msg and "--uncertified REASON" in msg
    event = R.release(
        repo, X, token, load_params(repo), signing_key=signing_key(repo), uncertified="hotfix, certify next"
    )
    assert event["uncertified_override"] == "hotfix, certify next"
    assert event["uncertified_because"] == "positive control x did not learn"
    assert read_history(repo)[-1]["uncertified_override"] == "hotfix, certify next"


def model_signing_verify(repo, batch, *extra):
    """docs/release.md's command for the standard verifier, run from the repository root."""
    script = Path(sys.executable).parent / "model_signing"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "model_signing"]
    return subprocess.run(
        [*cmd, "verify", "key", f"models/adapters/{batch}"]
        + ["--signature", f"releases/handoff/{batch}/model.sig"]
        + ["--public_key", f"releases/handoff/{batch}/model_signing.pub", *extra],
        cwd=repo,
        capture_output=True,
        text=True,
    )


def test_release_signs_the_adapter_folder_for_the_standard_verifier(repo):
    event = R.release(repo, X, approve(repo, X), load_params(repo), signing_key=signing_key(repo))
    record = event["model_signature"]
    assert record["signature"] == f"releases/handoff/{X}/model.sig"
    assert record["public_key"] == f"releases/handoff/{X}/model_signing.pub"
    assert read_jsonl(repo / "releases" / "history.jsonl")[-1]["model_signature"] == record
    sig, pub = repo / record["signature"], repo / record["public_key"]
    assert (
        io.sha256_file(sig) == record["signature_sha256"]
        and io.sha256_file(pub) == record["public_key_sha256"]
    )
    assert pub.read_bytes() == signing_key(repo).with_suffix(".pub").read_bytes()
    assert git(repo, "show", f"HEAD:{record['signature']}").encode() == sig.read_bytes()  # committed
    assert "PRIVATE" not in git(repo, "show", f"HEAD:{record['public_key']}")
    proc = model_signing_verify(repo, X)
    assert proc.returncode == 0 and "Verification succeeded" in proc.stdout, proc.stderr
    weights = repo / "models" / "adapters" / X / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0x01
    weights.write_bytes(bytes(data))  # the fixture's DVC cache is a copy: the cache keeps the released bytes
    proc = model_signing_verify(repo, X)
    assert proc.returncode == 1 and "adapter_model.safetensors" in proc.stderr


def test_release_refuses_a_signing_key_that_is_not_p256_and_keeps_the_approval(repo):
    token = approve(repo, X)
    approver_key = repo.parent / "keys" / "alice.key"
    assert "EC P-256" in refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=approver_key),
        "bad_key",
    )
    refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=repo.parent / "keys" / "none.key"),
        "missing_key",
    )
    assert R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))["event"] == "release"


def test_release_refuses_a_signature_that_does_not_sign_the_approved_bytes(repo, monkeypatch):
    """The adapter is signed after its hashes were checked: bytes changed in between are refused."""
    from clap.release import signing

    token = approve(repo, X)
    real = signing.sign_adapter

    def sign_after_a_swap(folder, key):
        signed = real(folder, key)
        return dataclasses.replace(signed, digests={**signed.digests, "adapter_config.json": "0" * 64})

    monkeypatch.setattr(R, "sign_adapter", sign_after_a_swap)
    assert "adapter_config.json: approved" in refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "bad_model_signature",
    )


def test_signing_keygen_writes_p256_keys_in_an_ignored_folder(repo):
    keys = repo / "keys"  # the template ignores keys/
    priv, pub = signing_keygen(repo, "model-signing", keys)
    assert (priv, pub) == (keys / "model-signing.key", keys / "model-signing.pub")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600 and git(repo, "status", "--porcelain") == ""
    assert isinstance(serialization.load_pem_public_key(pub.read_bytes()), ec.EllipticCurvePublicKey)
    with pytest.raises(ClapError) as err:
        signing_keygen(repo, "model-signing", keys)
    assert err.value.rule == "key_exists"
    (repo / ".gitignore").write_text("")  # a repository that forgot to ignore private keys
    with pytest.raises(ClapError) as err:
        signing_keygen(repo, "model-signing", repo / "secrets")
    assert err.value.rule == "key_not_ignored" and not (repo / "secrets").exists()


def test_release_release_rollback_restores_previous_pointer_and_adapter(repo):
    t1, t2 = release_both(repo)
    first = read_jsonl(repo / "releases" / "history.jsonl")[0]["pointer"]
    shutil.rmtree(repo / "models" / "adapters" / X)  # e.g. a clone that only checked out what served
    event = rollback(repo)
    assert event["adapter_restored_by"] == "checkout"
    assert read_pointer(repo) == first and adapter_sha(repo, X) == first["adapter_sha256"]
    assert git(repo, "log", "-1", "--format=%s").strip().startswith(f"rollback {Y} -> {X}")
    assert [e["event"] for e in read_jsonl(repo / "releases" / "history.jsonl")] == [
        "release",
        "release",
        "rollback",
    ]
    assert (
        len(read_jsonl(repo / "releases" / "approvals_used.jsonl")) == 2
    )  # the ledger keeps the rolled-back approval
    refused(
        repo,
        lambda: R.release(repo, Y, t2, load_params(repo), signing_key=signing_key(repo)),
        "replayed_token",
    )
    refused(repo, lambda: rollback(repo), "no_previous_release")


def test_rollback_pulls_the_adapter_from_the_remote_when_the_cache_lacks_it(repo):
    from dvc.repo import Repo

    release_both(repo)
    with Repo(str(repo)) as r:
        r.push()
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "models" / "adapters" / X)
    event = rollback(repo)
    assert (
        event["adapter_restored_by"] == "pull"
        and adapter_sha(repo, X) == read_pointer(repo)["adapter_sha256"]
    )


def test_rollback_refused_when_the_adapter_is_in_neither_cache_nor_remote(repo):
    release_both(repo)
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "models" / "adapters" / X)
    message = refused(repo, lambda: rollback(repo), "adapter_unavailable")
    assert X in message and read_pointer(repo)["batch"] == Y


def test_rollback_refused_without_a_previous_release(repo):
    refused(repo, lambda: rollback(repo), "nothing_released")
    R.release(repo, X, approve(repo, X), load_params(repo), signing_key=signing_key(repo))
    message = refused(repo, lambda: rollback(repo), "no_previous_release")
    assert "release.rollback_to_base is false" in message


def set_rollback_to_base(repo, value: bool) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["release"]["rollback_to_base"] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit_all(repo, f"release.rollback_to_base: {value}")


def write_gate_rollback(repo, batch: str, judged_sha: str, production: str = "rollback") -> None:
    """A committed gate record + evidence of ``batch`` whose incumbent verdict (about the adapter with
    ``judged_sha``) is rollback, and whose decision for production is ``production``."""
    io.write_json(
        repo / "metrics" / "gate" / f"{batch}.json",
        {
            "decision": "reject",
            "decision_code": 0,
            "rule": "quality",
            "production_decision": production,
            "production_rule": "incumbent_quality",
            "incumbent_decision": "rollback",
            "incumbent_rule": "incumbent_quality",
        },
    )
    io.write_json(
        repo / "reports" / "gate" / batch / "evidence.json",
        {
            "decision": "reject",
            "production_decision": production,
            "incumbent_verdict": {
                "decision": "rollback",
                "rule": "incumbent_quality",
                "adapter": {"batch": "?", "adapter_sha256": judged_sha},
            },
        },
    )
    commit_all(repo, f"gate {batch}")


def test_rollback_acts_on_the_gate_decision_of_a_batch(repo):
    release_both(repo)
    z = "2026-03"  # a new batch on which the production adapter (Y) fails
    write_gate_rollback(repo, z, adapter_sha(repo, Y), production="reject")
    message = refused(repo, lambda: rollback(repo, z), "not_a_rollback")
    assert "'reject', not 'rollback'" in message
    write_gate_rollback(repo, z, adapter_sha(repo, X))  # the gate judged another adapter than production's
    refused(repo, lambda: rollback(repo, z), "stale_evaluation")
    write_gate_rollback(repo, z, adapter_sha(repo, Y))
    (repo / "reports" / "gate" / z / "evidence.json").write_text("{}")
    refused(repo, lambda: rollback(repo, z), "uncommitted")
    git(repo, "checkout", "--", f"reports/gate/{z}/evidence.json")
    event = rollback(repo, z)
    assert (event["from_batch"], event["to_batch"]) == (Y, X) and read_pointer(repo)["batch"] == X
    assert event["gate_batch"] == z and event["reason"] == f"gate {z}: incumbent_quality"
    assert event["gate_evidence_sha256"] == io.sha256_file(repo / "reports" / "gate" / z / "evidence.json")
    assert read_jsonl(repo / "releases" / "history.jsonl")[-1]["gate_batch"] == z
    assert check_registry(repo, emit=lambda line: None) == 3


def test_rollback_to_base_only_when_the_policy_says_so(repo, capsys):
    import sys

    R.release(repo, X, approve(repo, X), load_params(repo), signing_key=signing_key(repo))
    write_gate_rollback(repo, "2026-03", adapter_sha(repo, X))
    message = refused(repo, lambda: rollback(repo, "2026-03"), "no_previous_release")
    assert "set it to true to fall back to the base model" in message
    set_rollback_to_base(repo, True)
    done = subprocess.run(
        [sys.executable, "-m", "clap.cli", "rollback", "--batch", "2026-03"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"rolled back {X} -> base model (release.rollback_to_base) on the gate decision"
    )
    pointer = read_pointer(repo)
    assert pointer["batch"] is None and pointer == BASE_POINTER
    event = read_jsonl(repo / "releases" / "history.jsonl")[-1]
    assert event["event"] == "rollback" and (event["from_batch"], event["to_batch"], event["to"]) == (
        X,
        None,
        "base",
    )
    assert event["adapter_sha256"] is None and event["policy"] == "release.rollback_to_base"
    assert git(repo, "log", "-1", "--format=%s").strip().startswith(f"rollback {X} -> base")
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "tag", "-l", "clap-adapter#prod*").split() == [  # GTO: prod unassigned, assigned to none
        "clap-adapter#prod!#2",
        "clap-adapter#prod#1",
    ]
    assert verify_pointer(repo) is None  # serve and eval: nothing released
    lines: list[str] = []
    assert check_registry(repo, emit=lines.append) == 2
    assert any(f"rollback {X} -> base" in line for line in lines)
    refused(repo, lambda: rollback(repo), "nothing_released")
    # production can be released again from base: the next release replaces nothing
    repro(repo)
    again = R.release(repo, Y, approve(repo, Y), load_params(repo), signing_key=signing_key(repo))
    assert again["previous_batch"] is None and check_registry(repo, emit=lambda line: None) == 3


def test_evaluation_against_an_older_incumbent_is_refused(repo):
    token_y = approve(repo, Y)  # approved while nothing was in production
    R.release(repo, X, approve(repo, X), load_params(repo), signing_key=signing_key(repo))
    message = refused(
        repo,
        lambda: R.release(repo, Y, token_y, load_params(repo), signing_key=signing_key(repo)),
        "stale_evaluation",
    )
    assert "dvc repro" in message


def test_uncommitted_evidence_is_refused(repo):
    token = approve(repo, X)
    with open(repo / "dvc.lock", "a") as f:
        f.write("\n")
    refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "uncommitted",
    )


def test_adapter_replaced_after_the_gate_cannot_be_approved(repo):
    weights = repo / "models" / "adapters" / X / "adapter_model.safetensors"
    weights.unlink()
    weights.write_bytes(b"retrained by hand, never evaluated")
    with pytest.raises(ClapError) as err:
        approve(repo, X)
    assert err.value.rule == "evidence_mismatch" and "adapter_sha256" in str(err.value)


def test_invalid_handoff_is_refused(repo):
    token = approve(repo, X)
    io.write_metrics_and_record(
        repo / "metrics" / "base.json", None, {"weights_sha256": "ab" * 32}
    )  # same weights, no source: the card has no base_model
    assert "base_model" in refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "invalid_handoff",
    )


def test_changed_base_model_is_refused(repo):
    """The approval binds the base model's weights hash: another base after approval is refused."""
    token = approve(repo, X)
    io.write_metrics_and_record(
        repo / "metrics" / "base.json",
        None,
        {"source": "HuggingFaceTB/SmolLM2-135M-Instruct", "weights_sha256": "cd" * 32},
    )
    assert "base_sha256" in refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "binding_mismatch",
    )


def test_over_budget_is_refused_or_held_by_policy(repo):
    token = approve(repo, X)
    set_release_params(repo, budget_cpu_hours=0.1)
    refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "over_budget",
    )
    set_release_params(repo, over_budget="hold")
    head = git(repo, "rev-parse", "HEAD")
    event = R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))
    assert event["event"] == "hold" and read_pointer(repo)["batch"] is None
    assert "model_signature" not in event and not (repo / "releases" / "handoff" / X / "model.sig").exists()
    assert (
        git(repo, "rev-parse", "HEAD^") == head
        and read_jsonl(repo / "releases" / "approvals_used.jsonl") == []
    )
    assert io.read_json(repo / "releases" / "handoff" / X / "cost.json")["status"] == "over"
    set_release_params(repo, budget_cpu_hours=2.0, over_budget="refuse")
    assert (
        R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo))["event"] == "release"
    )  # a hold does not consume the approval


def test_a_failed_commit_changes_nothing(repo):
    token = approve(repo, X)
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    refused(
        repo,
        lambda: R.release(repo, X, token, load_params(repo), signing_key=signing_key(repo)),
        "git_failed",
    )


def test_keygen_keeps_the_private_key_private(repo):
    keys = repo.parent / "keys"
    priv, pub = keygen(repo, "bob", keys)
    assert (
        stat.S_IMODE(priv.stat().st_mode) == 0o600 and pub == repo / "releases" / "trusted_keys" / "bob.pub"
    )
    assert b"PRIVATE" not in pub.read_bytes()
    serialization.load_pem_public_key(pub.read_bytes())
    with pytest.raises(ClapError, match="overwrite"):
        keygen(repo, "bob", keys)
    (repo / ".gitignore").write_text("")  # a repository that forgot to ignore private keys
    with pytest.raises(ClapError) as err:
        keygen(repo, "carol", repo / "secrets")
    assert err.value.rule == "key_not_ignored" and not (repo / "secrets").exists()


def test_real_repo_tracks_only_public_keys():
    files = subprocess.run(
        ["git", "ls-files", "releases/trusted_keys"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if name.endswith(".pub"):
            serialization.load_pem_public_key(
                (ROOT / name).read_bytes()
            )  # raises on anything but a public key
        else:
            assert name.endswith(".gitkeep"), name
    ignored = subprocess.run(["git", "check-ignore", "-q", "keys/approver.key"], cwd=ROOT)
    assert ignored.returncode == 0, "keys/ must be git-ignored"


def test_real_params_release_section_loads():
    p = load_params(ROOT)
    assert p.cost.over_budget in ("refuse", "hold") and 0 < p.approval_ttl_s <= p.max_approval_ttl_s


def test_release_stack_pushes_releases_and_pops_rollbacks():
    events = [
        {"event": "release", "pointer": {"batch": "a"}},
        {"event": "hold", "batch": "b"},
        {"event": "release", "pointer": {"batch": "c"}},
        {"event": "rollback"},
        {"event": "release", "pointer": {"batch": "d"}},
    ]
    assert [p["batch"] for p in release_stack(events)] == ["a", "d"]


def test_cli_prints_the_token_refuses_with_exit_2_and_releases_signed(repo):
    def clap(*args, input=None):
        return subprocess.run(
            [sys.executable, "-m", "clap.cli", *args], cwd=repo, capture_output=True, text=True, input=input
        )

    approved = clap("approve", X, "--key", str(repo.parent / "keys" / "alice.key"))
    assert approved.returncode == 0 and approved.stdout.count(".") == 2, approved.stderr
    refusal = clap("release", Y, "--token", approved.stdout.strip(), "--signing-key", str(signing_key(repo)))
    assert (
        refusal.returncode == 2 and refusal.stderr.startswith("error: ") and "wrong_batch" in refusal.stderr
    )
    assert "Traceback" not in refusal.stderr
    released = clap(
        "release", X, "--token", "-", "--signing-key", str(signing_key(repo)), input=approved.stdout
    )
    assert released.returncode == 0, released.stderr
    assert f"signed models/adapters/{X}: releases/handoff/{X}/model.sig" in released.stdout
    assert model_signing_verify(repo, X).returncode == 0
    keygen = clap("signing-keygen")
    assert keygen.returncode == 0 and "keys/model-signing.key" in keygen.stdout, keygen.stderr


def _canary_in_production(repo, fail_canary: float, fail_incumbent: float, n: int = 600) -> None:
    """X released, then Y released as a canary; a request log as `clap serve` writes it (seeded failures)."""
    import random

    from clap.release import canary as C

    release_X = approve(repo, X)
    R.release(repo, X, release_X, load_params(repo), signing_key=signing_key(repo))
    repro(repo)
    set_decision(repo, Y, "canary")
    R.release(repo, Y, approve(repo, Y), load_params(repo), signing_key=signing_key(repo))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["serve"] = yaml.safe_load((ROOT / "params.yaml").read_text())["serve"]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit_all(repo, "serve params")
    p, rng = C.CanaryParams(**params["serve"]["canary"]), random.Random(4)
    log = C.RequestLog(repo / p.log, adapter_sha(repo, Y))
    for _ in range(n):
        i = log.take()
        arm = "canary" if C.routes_to_canary(p.seed, i, p.fraction) else "incumbent"
        ok = rng.random() >= (fail_canary if arm == "canary" else fail_incumbent)
        checks = {"parse_ok": True, "evidence_verbatim": ok, "value_in_evidence": ok, "ok": ok}
        log.append(C.log_row(i, arm, Y if arm == "canary" else X, "sha", 900.0, checks))


def test_a_canary_breach_rolls_back_through_the_signed_path_with_its_analysis(repo):

    _canary_in_production(repo, fail_canary=0.5, fail_incumbent=0.1)
    first = read_jsonl(repo / "releases" / "history.jsonl")[0]["pointer"]
    refused(repo, lambda: rollback(repo, canary=True), "no_canary_analysis")
    rec = run_canary(repo, apply=True)
    assert rec["decision"] == "rollback" and rec["decided_at_request"] < 600
    event = rec["applied"]
    assert read_pointer(repo) == first and event["to_batch"] == X
    assert event["reason"].startswith(f"canary {Y}: harm e-value")
    assert event["canary_record_sha256"] == io.sha256_file(repo / "reports" / "canary" / f"{Y}.json")
    committed = git(repo, "show", "--name-only", "--format=", "HEAD").split()
    assert sorted(committed) == sorted(
        [
            "releases/history.jsonl",
            "releases/production.json",
            f"reports/canary/{Y}.json",
            f"reports/canary/{Y}.md",
        ]
    )
    assert check_registry(repo, emit=lambda _line: None) == 3  # release, release (canary), rollback: verified


def test_a_promoted_canary_is_committed_and_is_not_a_rollback(repo):
    from clap.release import canary as C

    _canary_in_production(repo, fail_canary=0.02, fail_incumbent=0.4)
    rec = run_canary(repo, apply=True)
    assert rec["decision"] == "promote"
    assert git(repo, "log", "-1", "--format=%s").strip() == f"canary {Y}: promote (all traffic)"
    assert C.promoted(repo, read_pointer(repo))
    refused(repo, lambda: rollback(repo, canary=True), "not_a_rollback")


# ---------------------------------------------------------------- the canary watched by `clap serve`, over HTTP


class _StubChain:
    """Answers every question at once; a seeded share of its answers fail the reference-free checks."""

    def __init__(self, fail: float, seed: int):
        import random

        from clap.task.scoring import scoring_params

        self.rng, self.fail = random.Random(seed), fail
        self.schema = scoring_params(ROOT / "params.yaml").answer
        self.index, self.p = None, type("P", (), {"top_k": 1})()

    def answer(self, questions, rag, batch_size):
        from types import SimpleNamespace as NS

        ok = self.rng.random() >= self.fail
        quote = "the value was 85.0 on line L3"
        value = "85.0" if self.schema.value_is_text else 85.0
        fields = {self.schema.evidence: quote if ok else "not in the context", self.schema.value: value}
        parsed = NS(ok=True, fields=fields, error=None)
        return [NS(parsed=parsed, context=quote, latency_ms=1.0, valid=True, generation=NS(text="{}"),
                   retrieved=NS(doc_ids=["d1"], retrieval_ms=0.0))]  # fmt: skip


def _watched_canary(repo, fail_canary: float, fail_incumbent: float, max_requests: int = 400) -> dict:
    """X released, Y released as a canary; `clap serve`'s app over real HTTP with the watcher on
    (params serve.canary.watch_every: 1): requests until the watcher has acted. What it saw."""
    import httpx

    from clap.chain.serve import CanaryRoute, Served, ServeParams, create_app, serving, watcher_of
    from clap.release import canary as C
    from clap.task.scoring import scoring_params

    R.release(repo, X, approve(repo, X), load_params(repo), signing_key=signing_key(repo))
    repro(repo)
    set_decision(repo, Y, "canary")
    R.release(repo, Y, approve(repo, Y), load_params(repo), signing_key=signing_key(repo))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["serve"] = yaml.safe_load((ROOT / "params.yaml").read_text())["serve"]
    assert params["serve"]["canary"]["watch_every"] == 1  # the project's own setting
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "logs/\n")
    commit_all(repo, "serve params")
    sp = ServeParams(**{**params["serve"], "canary": C.CanaryParams(**params["serve"]["canary"])})
    pointer = read_pointer(repo)
    canary = Served(
        "adapter", Y, Y, pointer["adapter_sha256"], "b", "canary", pointer["approval_id"], "canary"
    )
    incumbent = Served("adapter", X, Y, adapter_sha(repo, X), "b", "promote", None, "incumbent")
    watcher = watcher_of(repo)
    route = CanaryRoute(
        _StubChain(fail_incumbent, 1),
        incumbent,
        sp.canary,
        C.RequestLog(repo / sp.canary.log, pointer["adapter_sha256"]),
        scoring_params(ROOT / "params.yaml"),
        watcher,
    )
    answered = []
    with (
        serving(create_app(_StubChain(fail_canary, 2), canary, sp, route)) as url,
        httpx.Client(base_url=url) as client,
    ):
        for _ in range(max_requests):
            answered.append(client.post("/answer", json={"question": "OEE on L3?"}).json())
            if watcher.decision is not None:
                break
        assert watcher.done.wait(60), "the watcher did not act"
        after = client.post("/answer", json={"question": "OEE on L3?"}).json()
        health = client.get("/health").json()["canary"]["watcher"]
    assert watcher.error is None, watcher.error
    return {"watcher": watcher, "answered": answered, "after": after, "health": health}


def test_serve_rolls_a_worse_canary_back_with_no_command(repo):
    first = read_jsonl(repo / "releases" / "history.jsonl")
    seen = _watched_canary(repo, fail_canary=0.6, fail_incumbent=0.1)
    rec = seen["watcher"].record
    assert rec["decision"] == "rollback" and rec["actor"] == "clap serve" and rec["harm_e_value"] >= 20
    history = read_jsonl(repo / "releases" / "history.jsonl")
    assert not first and read_pointer(repo) == history[0]["pointer"]  # back on X
    event = history[-1]
    assert (event["event"], event["from_batch"], event["to_batch"], event["canary_actor"]) == (
        "rollback", Y, X, "clap serve",
    )  # fmt: skip
    assert (
        event["harm_e_value"] == rec["harm_e_value"]
        and event["canary_decided_at_request"] == rec["decided_at_request"]
    )
    assert (seen["after"]["arm"], seen["after"]["batch"]) == ("production", X)
    assert (
        seen["health"]["decision"] == "rollback"
        and seen["health"]["applied"] == seen["watcher"].applied["release_commit"]
    )
    assert git(repo, "status", "--porcelain") == ""
    assert check_registry(repo, emit=lambda _line: None) == 3


def test_serve_promotes_a_better_canary_with_no_command(repo):
    from clap.release import canary as C

    seen = _watched_canary(repo, fail_canary=0.02, fail_incumbent=0.4)
    rec = seen["watcher"].record
    assert rec["decision"] == "promote" and rec["non_inferiority_e_value"] >= 20
    assert git(repo, "log", "-1", "--format=%s").strip() == f"canary {Y}: promote (all traffic)"
    event = read_jsonl(repo / "releases" / "history.jsonl")[-1]
    assert (event["event"], event["decision"], event["canary_actor"]) == ("canary", "promote", "clap serve")
    assert event["non_inferiority_e_value"] == rec["non_inferiority_e_value"]
    assert C.promoted(repo, read_pointer(repo)) and read_pointer(repo)["batch"] == Y
    assert (seen["after"]["arm"], seen["after"]["batch"]) == ("production", Y)
    assert git(repo, "status", "--porcelain") == ""
    lines: list[str] = []
    assert check_registry(repo, emit=lines.append) == 3
    assert any(f"canary {Y}: promote by clap serve" in line for line in lines)
