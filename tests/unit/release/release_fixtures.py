"""A throw-away git + DVC repository with a miniature pipeline, for the release tests.

The miniature pipeline has the real one's shape and paths: ``train@b`` writes
``models/adapters/<b>`` (DVC-cached) and the admitted sets, ``eval@b`` depends on
``releases/production.json`` and writes ``data/eval/<b>/items.parquet``, ``gate@b`` writes
``metrics/gate/<b>.json`` and ``reports/gate/<b>/evidence.json`` (in git). Its stages are
stdlib-only scripts, so ``dvc repro`` takes well under a second. Nothing here touches the
real repository: every git/DVC call runs inside the temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from clap import io
from clap.params import raw_section
from clap.release.keys import keygen, signing_keygen
from clap.release.records import load_params

BATCHES = ("2026-01", "2026-02")
ROOT = Path(__file__).resolve().parents[3]

STAGE_SCRIPT = r"""
import hashlib, json, shutil, sys
from pathlib import Path

stage, b = sys.argv[1], sys.argv[2]
def write(path, text):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
if stage == "train":
    seed = Path(f"src/{b}.seed").read_text()
    out = Path(f"models/adapters/{b}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_model.safetensors").write_bytes(hashlib.sha256(seed.encode()).digest() * 64)
    write(out / "adapter_config.json", json.dumps({"r": 4, "peft_type": "LORA"}))
    for split in ("sft", "eval"):
        Path(f"data/admitted/{b}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f"src/{split}.parquet", f"data/admitted/{b}/{split}.parquet")
    write(f"metrics/train/{b}.json", json.dumps({"trained": 1, "wall_s": 1800.0, "device": "cpu"}))
elif stage == "eval":
    pointer = Path("releases/production.json").read_bytes()
    Path(f"data/eval/{b}").mkdir(parents=True, exist_ok=True)
    # stands in for parquet: the release only hashes it; the incumbent changes its bytes
    Path(f"data/eval/{b}/items.parquet").write_bytes(b"items of " + b.encode() + b" vs " + pointer)
    write(f"metrics/eval/{b}.json", json.dumps({"candidate_pass_rate": 0.8, "base_pass_rate": 0.25, "n_items": 40, "wall_s": 600.0}))
elif stage == "gate":
    decision, *flags = Path(f"src/{b}.decision").read_text().split()  # "promote uncertified": an uncertified scenario
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
    rule = "quality" if decision in ("hold", "reject") else ""
    write(f"metrics/gate/{b}.json", json.dumps({"decision": decision, "decision_code": ["reject", "hold", "canary", "promote"].index(decision), "rule": rule,
          "certified": int("uncertified" not in flags),
          "certification": "positive control x did not learn" if "uncertified" in flags else "certified at commit fixture"}))
    write(f"reports/gate/{b}/evidence.json", json.dumps({"decision": decision, "eval_items_sha256": sha(f"data/eval/{b}/items.parquet"),
          "adapter_sha256": sha(f"models/adapters/{b}/adapter_model.safetensors"),
          "reasons": [{"name": "quality", "cap": decision, "detail": "McNemar p=0.21 >= alpha 0.05"}]}))
    write(f"reports/gate/{b}/report.md", f"# gate {b}: {decision}\n")
"""

TASK_PARAMS = raw_section(
    "task", Path(__file__).resolve().parents[3] / "params.yaml"
)  # the model card names its fields
RELEASE_PARAMS = {
    "audience": "clap-release",
    "approval_ttl_s": 600,
    "max_approval_ttl_s": 3600,
    "rollback_to_base": False,
    "key_quorum": 2,
    "approvals_required": 2,
    "card": {
        "license": "apache-2.0",
        "task": "question answering (JSON)",
        "summary": "answers questions",
        "tags": ["clap", "lora"],
        "packages": ["pandas", "pyarrow", "dvc", "pyjwt"],
    },
    "cost": {
        "over_budget": "refuse",
        "budget_cpu_hours": 2.0,
        "budget_gpu_hours": 1.0,
        "estimate_batches": 2,
        "stages": ["train", "eval"],
        "wall_time_key": "wall_s",
        "estimate_key": "cost_estimate_s",
        "device_key": "device",
    },
}


def _dvc_yaml(py: str) -> dict:
    def stage(
        name: str, deps: list[str], outs: list, metrics: list | None = None, params: list | None = None
    ) -> dict:
        body = {"cmd": f"{py} stage.py {name} ${{item}}", "deps": ["stage.py", *deps], "outs": outs}
        if metrics:
            body["metrics"] = metrics
        if params:
            body["params"] = params
        return {"foreach": list(BATCHES), "do": body}

    nocache = {"cache": False}
    return {
        "stages": {
            "train": stage(
                "train",
                ["src/${item}.seed", "src/sft.parquet", "src/eval.parquet"],
                ["models/adapters/${item}", "data/admitted/${item}"],
                [{"metrics/train/${item}.json": nocache}],
                ["train"],
            ),
            "eval": stage(
                "eval",
                ["models/adapters/${item}", "releases", "releases/production.json"],
                ["data/eval/${item}"],
                [{"metrics/eval/${item}.json": nocache}],
            ),
            "gate": stage(
                "gate",
                ["data/eval/${item}", "models/adapters/${item}", "src/${item}.decision"],
                [{"reports/gate/${item}": nocache}],
                [{"metrics/gate/${item}.json": nocache}],
            ),
        }
    }


def run(cwd: Path, *cmd: str) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout


def git(repo: Path, *args: str) -> str:
    return run(repo, "git", *args)


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def repro(repo: Path) -> None:
    """`dvc repro` in-process, then commit what it changed (as a PR merge would)."""
    from dvc.repo import Repo

    with contextlib.chdir(repo), Repo(str(repo)) as r:  # DVC resolves targets against the cwd
        r.reproduce()
    commit_all(repo, "repro")


def build_template(base: Path) -> Path:
    """Create ``base/repo`` (reproduced and committed, nothing released), ``base/keys/alice.key`` (approver),
    ``base/keys/signer.key`` (model signing), ``base/remote``."""
    from dvc.repo import Repo

    repo = base / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for k, v in {"user.email": "t@clap.invalid", "user.name": "clap test", "commit.gpgsign": "false"}.items():
        git(repo, "config", k, v)
    Repo.init(str(repo))
    # copies, not links: a test that rewrites a workspace file must never reach the cache
    (repo / ".dvc" / "config").write_text(
        "[core]\n    analytics = false\n    remote = local\n[cache]\n    type = copy\n"
        "['remote \"local\"']\n    url = ../../remote\n"
    )
    (repo / ".gitignore").write_text("*.key\n*.pem\nkeys/\n")
    (repo / ".dvcignore").write_text((ROOT / ".dvcignore").read_text())
    (repo / "stage.py").write_text(STAGE_SCRIPT)
    (repo / "dvc.yaml").write_text(yaml.safe_dump(_dvc_yaml(sys.executable), sort_keys=False))
    (repo / "params.yaml").write_text(
        yaml.safe_dump(
            {"train": {"seed": 42, "lr": 1e-4}, "release": RELEASE_PARAMS, "task": TASK_PARAMS},
            sort_keys=False,
        )
    )
    frame = pd.DataFrame({"item_id": ["a", "b"], "question": ["q1", "q2"], "value": [1.5, 2.0]})
    io.write_parquet(repo / "src" / "sft.parquet", frame)
    io.write_parquet(repo / "src" / "eval.parquet", frame.assign(value=[3.0, 4.5]))
    for b in BATCHES:
        io.atomic_write_text(repo / "src" / f"{b}.seed", f"seed {b}\n")
        io.atomic_write_text(repo / "src" / f"{b}.decision", "promote\n")
    io.write_metrics_and_record(
        repo / "metrics" / "base.json",
        None,
        {"source": "HuggingFaceTB/SmolLM2-135M-Instruct", "weights_sha256": "ab" * 32},
    )
    io.write_json(repo / "releases" / "production.json", {"batch": None})
    (base / "remote").mkdir()
    keygen(repo, "alice", base / "keys")
    signing_keygen(repo, "signer", base / "keys")  # EC P-256: signs the released adapter folder
    commit_all(repo, "init")
    repro(repo)
    return repo


def copy_template(template_base: Path, dest_base: Path, monkeypatch=None) -> Path:
    """A private copy of the template (repo, keys, remote); returns the repo path. With
    ``monkeypatch``, alice's key is pinned as the trust root ($CLAP_TRUST_ROOT)."""
    shutil.copytree(template_base, dest_base, symlinks=True, dirs_exist_ok=True)
    if monkeypatch is not None:
        pin_root(monkeypatch, dest_base / "repo", "alice")
    return dest_base / "repo"


def fingerprint(repo: Path, name: str) -> str:
    """The key fingerprint of approver ``name`` (releases/trusted_keys/<name>.pub)."""
    from clap.release.approval import key_sha256, load_trusted_keys

    return key_sha256(load_trusted_keys(repo / "releases" / "trusted_keys")[name])


def pin_root(monkeypatch, repo: Path, *names: str) -> None:
    """Pin ``names``' keys as the trust root, as CI pins it outside the repository."""
    from clap.release.trust import ROOT_ENV

    monkeypatch.setenv(ROOT_ENV, ",".join(fingerprint(repo, n) for n in names))


def snapshot(repo: Path) -> dict:
    """Bytes of every file under releases/, git HEAD, status and tags: equal before/after a refused action."""
    files = {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted((repo / "releases").rglob("*"))
        if p.is_file()
    }
    return {
        "files": files,
        "head": git(repo, "rev-parse", "HEAD"),
        "status": git(repo, "status", "--porcelain"),
        "tags": git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/tags"),
    }


def refused(repo: Path, fn, rule: str) -> str:
    """``fn()`` raises ClapError with ``rule`` and leaves releases/, HEAD, status and tags unchanged; its message."""
    import pytest

    from clap.errors import ClapError

    before = snapshot(repo)
    with pytest.raises(ClapError) as err:
        fn()
    assert err.value.rule == rule, str(err.value)
    assert snapshot(repo) == before
    return str(err.value)


def set_decision(repo: Path, batch: str, decision: str) -> None:
    """Change what the gate decides for ``batch`` and re-run the pipeline."""
    io.atomic_write_text(repo / "src" / f"{batch}.decision", decision + "\n")
    repro(repo)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


_TEMPLATE: list[Path] = []


def template_base(tmp_path_factory) -> Path:
    """The template's base folder, built once per test session."""
    if not _TEMPLATE:
        base = tmp_path_factory.mktemp("release_template")
        build_template(base)
        _TEMPLATE.append(base)
    return _TEMPLATE[0]


def clean_git_env(monkeypatch) -> None:
    """Make sure no inherited GIT_* variable can point git at another repository."""
    for var in (
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_CEILING_DIRECTORIES",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")


def approve(repo: Path, batch: str, key: str = "alice") -> str:
    import time

    from clap.release import control as R

    return R.approve(
        repo, batch, repo.parent / "keys" / f"{key}.key", None, load_params(repo), now=int(time.time())
    )


def signing_key(repo: Path) -> Path:
    """The template's model-signing private key (EC P-256, outside the repository)."""
    return repo.parent / "keys" / "signer.key"


def release_both(repo: Path) -> tuple[str, str]:
    """Release the first batch, re-run the pipeline against it, release the second: returns both tokens."""
    from clap.release import control as R

    first, second = BATCHES
    t1 = approve(repo, first)
    R.release(repo, first, t1, load_params(repo), signing_key=signing_key(repo))
    repro(repo)  # production changed: eval/gate re-run against the new incumbent
    t2 = approve(repo, second)
    R.release(repo, second, t2, load_params(repo), signing_key=signing_key(repo))
    return t1, t2


def sign_release(
    root: Path,
    batch: str,
    key_dir: Path,
    base_sha256: str,
    *,
    adapters_dir: Path | None = None,
    approver: str = "alice",
    decision: str = "promote",
) -> dict:
    """Record a release of ``batch`` in ``root/releases`` as `clap release` does (pointer, history event with
    the signed token, ledger entry), without git or a pipeline: for the tests of readers of releases/.

    The approver's key pair is created under ``key_dir`` (public key in ``root/releases/trusted_keys``)
    when it does not exist; the audience is ``root/params.yaml``'s ``release.audience``. The eval
    and evidence hashes are stand-ins (readers check them against the token, not the disk).
    """
    import dataclasses
    import time
    from datetime import UTC, datetime

    import jwt

    from clap import params
    from clap.release.approval import (
        Binding,
        generate_keypair,
        key_sha256,
        load_private_key,
        load_trusted_keys,
        mint_token,
    )
    from clap.release.trust import ROOT_FILE_ENV

    releases = root / "releases"
    key_path = key_dir / f"{approver}.key"
    if not key_path.exists():
        key_dir.mkdir(parents=True, exist_ok=True)
        (releases / "trusted_keys").mkdir(parents=True, exist_ok=True)
        _, pub = generate_keypair(approver, key_dir, releases / "trusted_keys")
        pin = os.environ.get(ROOT_FILE_ENV)  # the session's pin file (tests/conftest.py)
        if pin:
            with open(pin, "a", encoding="utf-8") as f:
                f.write(key_sha256(load_trusted_keys(pub.parent)[approver]) + "\n")
    adapter = (adapters_dir if adapters_dir is not None else root / "models" / "adapters") / batch
    binding = Binding(
        batch=batch,
        decision=decision,
        adapter_sha256=io.sha256_file(adapter / "adapter_model.safetensors"),
        adapter_config_sha256=io.sha256_file(adapter / "adapter_config.json"),
        eval_sha256="e" * 64,
        evidence_sha256="f" * 64,
        base_sha256=base_sha256,
    )
    now = int(time.time())
    audience = params.raw_section("release", root / "params.yaml")["audience"]
    token = mint_token(load_private_key(key_path), approver, binding, audience=audience, ttl_s=600, now=now)
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    pointer = {**dataclasses.asdict(binding), "approval_id": jti, "approver": approver, "commit": "c0ffee"}
    previous = io.read_json(releases / "production.json") if (releases / "production.json").exists() else {}
    at = datetime.now(UTC).isoformat(timespec="seconds")
    event = {
        "event": "release",
        "pointer": pointer,
        "previous_batch": previous.get("batch"),
        "token": token,
        "at": at,
    }
    used = {"jti": jti, "batch": batch, "approver": approver, "exp": now + 600, "used_at": at}
    for name, row in (("history.jsonl", event), ("approvals_used.jsonl", used)):
        with open(releases / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    io.write_json(releases / "production.json", pointer)
    return pointer


def hand_edited_pointer(root: Path, batch: str, adapters_dir: Path | None = None) -> dict:
    """A pointer naming ``batch`` with its adapter's real hashes, written by hand: no approval behind it."""
    adapter = (adapters_dir if adapters_dir is not None else root / "models" / "adapters") / batch
    pointer = {
        "batch": batch,
        "decision": "promote",
        "approval_id": "appr-1",
        "approver": "alice",
        "commit": "c0ffee",
        "adapter_sha256": io.sha256_file(adapter / "adapter_model.safetensors"),
        "adapter_config_sha256": io.sha256_file(adapter / "adapter_config.json"),
    }
    io.write_json(root / "releases" / "production.json", pointer)
    return pointer
