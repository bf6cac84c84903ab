"""clap.release.lineage: what a batch's training starts from, through releases and rollbacks."""

from __future__ import annotations

import json

import pytest

from clap.errors import ClapError
from clap.release.lineage import _first_release_replaced, resolve
from clap.release.records import read_pointer
from clap.release.registry import read_history
from clap.release.rollback import rollback

from .release_fixtures import BATCHES, clean_git_env, copy_template, release_both, template_base

X, Y = BATCHES
Z = "2026-03"  # a batch never released


@pytest.fixture
def repo(tmp_path_factory, tmp_path, monkeypatch):
    clean_git_env(monkeypatch)
    return copy_template(template_base(tmp_path_factory), tmp_path, monkeypatch)


def _start(repo, batch, mode="incumbent"):
    ws = resolve(batch, mode, repo, repo / "models" / "adapters")
    return ws.from_batch, ws.adapter_sha256


def test_released_batches_keep_their_start_through_later_releases_and_rollback(repo):
    assert _start(repo, X) == ("", "") and _start(repo, Z) == ("", "")  # nothing released: fresh weights
    release_both(repo)  # X replaced nothing; Y replaced X
    x_sha = read_history(repo)[0]["pointer"]["adapter_sha256"]
    y_sha = read_pointer(repo)["adapter_sha256"]
    assert _start(repo, X) == ("", "")  # never from Y (trained from X) nor from itself
    assert _start(repo, Y) == (X, x_sha)  # the release it replaced, not itself
    assert _start(repo, Z) == (Y, y_sha)  # never released: today's production
    rollback(repo)
    assert _start(repo, Y) == (X, x_sha)  # unchanged by the rollback
    assert _start(repo, Z) == (X, x_sha)
    assert all(_start(repo, b, mode="fresh") == ("", "") for b in (X, Y, Z))


def test_a_hand_edited_pointer_is_refused(repo):
    release_both(repo)
    pointer = read_pointer(repo)
    pointer["adapter_sha256"] = "0" * 64
    (repo / "releases" / "production.json").write_text(json.dumps(pointer))
    with pytest.raises(ClapError) as err:
        resolve(Z, "incumbent", repo, repo / "models" / "adapters")
    assert err.value.rule


def test_a_forged_past_release_is_refused_for_the_batch_it_released(repo):
    """A released batch's start comes from history.jsonl: every release there is verified first, so a
    hand-edited past event (here: the adapter it replaced) is refused, not trusted."""
    release_both(repo)
    history = read_history(repo)
    history[0]["pointer"]["adapter_sha256"] = "0" * 64  # X's release, which Y's start reads
    (repo / "releases" / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history))
    with pytest.raises(ClapError) as err:
        resolve(Y, "incumbent", repo, repo / "models" / "adapters")
    assert err.value.rule


def test_an_incumbent_approved_on_another_base_is_refused(repo):
    release_both(repo)
    base = repo / "metrics" / "base.json"
    record = json.loads(base.read_text())
    record["weights_sha256"] = "1" * 64  # the base stage now records other weights than were approved
    base.write_text(json.dumps(record))
    (repo / "records" / "base.json").unlink(missing_ok=True)
    with pytest.raises(ClapError) as err:
        resolve(Z, "incumbent", repo, repo / "models" / "adapters")
    assert "base" in str(err.value)


def test_unknown_mode_is_refused(repo):
    with pytest.raises(ClapError, match="warm_start.mode must be one of fresh, incumbent"):
        resolve(X, "latest", repo, repo / "models" / "adapters")


def test_first_release_replaced_reads_the_stack_at_the_first_release():
    p = {b: {"batch": b, "adapter_sha256": b * 2} for b in ("a", "b", "c")}
    history = [
        {"event": "release", "pointer": p["a"]},
        {"event": "release", "pointer": p["b"]},
        {"event": "rollback"},
        {"event": "release", "pointer": p["c"]},
        {"event": "release", "pointer": p["b"]},  # b again, later: its first release counts
    ]
    assert _first_release_replaced(history, "a") == (True, None)
    assert _first_release_replaced(history, "b") == (True, p["a"])
    assert _first_release_replaced(history, "c") == (True, p["a"])
    assert _first_release_replaced(history, "d") == (False, None)
