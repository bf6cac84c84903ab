"""Certification: the verdict over the controls, and the record's binding to the params it ran under."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clap.errors import ClapError
from clap.judge import certification as C

ROOT = Path(__file__).resolve().parents[3]


def _row(run: str, fault: str = "clean", **kw) -> dict:
    base = dict(
        run=run,
        fault=fault,
        learned=True,
        quality_detail="significant gain >= delta* (b=20, c=1, N=100)",
        released=False,
        decision="promote" if fault == "clean" else "reject",
        rule="all_checks_passed" if fault == "clean" else "quality",
        admitted=True,
        health="ok",
        b=20,
        c=1,
        pvalue=1e-5,
        delta=0.19,
        n_items=100,
        rule_power_at_delta_star=0.31,
    )
    return {**base, **kw}


CONTROLS = [
    _row("2026-01.relabel-1", "relabel", health="alarm", rule="training_health"),
    _row("2026-01.loss_on_prompt-1", "loss_on_prompt", rule="loss_masking"),
    _row("2026-01.clean-1"),
    _row("2026-02.clean-1"),
]


def test_every_positive_control_learned_and_every_fault_caught_is_certified():
    assert C.verdict(CONTROLS) == (C.CERTIFIED, [])
    assert [C.caught_by(r) for r in CONTROLS[:2]] == ["detector", "gate rule loss_masking"]
    assert C.caught_by({**CONTROLS[0], "admitted": False}) == "admission"


def test_a_clean_run_that_does_not_learn_fails_the_certification_naming_it():
    rows = [*CONTROLS[:3], _row("2026-02.clean-1", learned=False, quality_detail="gain below delta*")]
    v, failed = C.verdict(rows)
    assert v == C.UNCERTIFIED and failed == [
        "positive control 2026-02.clean-1 did not learn: gain below delta*"
    ]


def test_a_released_fault_or_a_missing_required_control_fails_it():
    released = {**CONTROLS[0], "released": True, "decision": "canary", "rule": "all_checks_passed"}
    v, failed = C.verdict([released, *CONTROLS[1:]])
    assert v == C.UNCERTIFIED and "negative control 2026-01.relabel-1 was canary" in failed[0]
    v, failed = C.verdict(CONTROLS[1:])  # no relabel fault ran
    assert failed == ["negative control relabel was not run (calibrate.faults)"]
    assert C.verdict(CONTROLS[:2])[1] == [
        "no positive control ran (calibrate.batches x calibrate.clean_seeds)"
    ]


WEIGHTS = b"weights"
SFT = "def train():\n    return 1\n"
DVC_YAML = {  # a tiny project's deciding stages: file, folder and templated deps, code and not
    "stages": {
        "admit": {
            "foreach": ["b1"],
            "do": {"cmd": "x", "deps": ["stages/admit.py", "clap/core.py", "data/raw/${item}"]},
        },
        "train": {
            "foreach": ["b1"],
            "do": {"cmd": "x", "deps": ["stages/train.py", "clap/train", "models/base"]},
        },
        "eval": {"cmd": "x", "deps": ["clap/core.py", "schemas/eval.py"]},
        "gate": {"cmd": "x", "deps": ["clap/core.py", "certification"]},
        "replay": {"cmd": "x", "deps": ["clap/replay.py"]},  # not a deciding stage: not bound
    }
}


def _project(root: Path, batches: tuple[str, ...] = ("b1",)) -> Path:
    """A tiny project folder: base weights and their record, raw and admitted batches, code deps, dvc.yaml."""
    files = {
        "models/base/model.safetensors": WEIGHTS,
        "models/base/config.json": b"{}",
        "records/base.json": json.dumps(
            {"weights_sha256": hashlib.sha256(WEIGHTS).hexdigest(), "source_sha256": "5" * 64}
        ).encode(),
        "stages/admit.py": b"admit\n",
        "stages/train.py": b"train\n",
        "clap/core.py": b"core\n",
        "clap/train/sft.py": SFT.encode(),
        "clap/train/__pycache__/sft.cpython-312.pyc": b"bytecode",
        "clap/replay.py": b"replay\n",
        "schemas/eval.py": b"schema\n",
        "dvc.yaml": yaml.safe_dump(DVC_YAML).encode(),
    }
    for b in batches:
        files[f"data/raw/{b}/tickets.csv"] = b"id,text\n1,a\n"
        files[f"data/admitted/{b}/admission.json"] = b'{"admitted": true}'
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _record(tmp_path: Path, params: Path, rows: list[dict]) -> Path:
    _project(tmp_path)
    rec = C.build_record(
        rows,
        {"runs": len(rows)},
        params_path=params,
        base_dir=tmp_path / "models" / "base",
        admitted={"b1": tmp_path / "data" / "admitted" / "b1"},
        commit="abc1234def",
        machine="x86_64-avx2-amd",
        date="2026-12-04",
    )
    path = tmp_path / "certification" / "record.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


@pytest.fixture
def certified(tmp_path) -> tuple[Path, Path, dict]:
    """(params, record, the parsed params) of a tiny project certified as it is."""
    params = tmp_path / "params.yaml"
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.write_text(yaml.safe_dump(raw))
    return params, _record(tmp_path, params, CONTROLS), raw


def test_the_record_binds_base_data_params_and_the_deciding_code(certified):
    params, record, _ = certified
    rec = json.loads(record.read_text())
    assert rec["verdict"] == C.CERTIFIED and rec["base_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert rec["base_source_sha256"] == "5" * 64 and set(rec["params_key_sha256"]) == set(C.BOUND_SECTIONS)
    assert set(rec["data_sha256"]) == set(rec["raw_sha256"]) == {"b1"}
    # the deciding stages' code deps, folders as their files; bytecode, data and replay's code are not bound
    assert rec["code_md5"] == {
        "clap/core.py": hashlib.md5(b"core\n").hexdigest(),
        "clap/train/sft.py": hashlib.md5(SFT.encode()).hexdigest(),
        "schemas/eval.py": hashlib.md5(b"schema\n").hexdigest(),
        "stages/admit.py": hashlib.md5(b"admit\n").hexdigest(),
        "stages/train.py": hashlib.md5(b"train\n").hexdigest(),
    }
    assert [c["caught_by"] for c in rec["negative_controls"]] == ["detector", "gate rule loss_masking"]


def test_an_untouched_project_stays_certified(certified):
    params, record, raw = certified
    s = C.status(params, record)
    assert s["certified"] and s["changed"] == [] and s["commit"] == "abc1234def"
    assert "certified" in C.status_line(s)
    # a comment, key order, a bytecode file or a non-deciding stage's code does not unbind it
    params.write_text("# a comment\n" + yaml.safe_dump(raw, sort_keys=True))
    (params.parent / "clap" / "train" / "__pycache__" / "sft.cpython-312.pyc").write_bytes(b"other")
    (params.parent / "clap" / "replay.py").write_text("changed\n")
    assert C.status(params, record)["certified"]


def test_a_changed_base_model_param_uncertifies_naming_it(certified):
    params, record, raw = certified
    raw["base"]["model"] = "pkg:another_model"
    params.write_text(yaml.safe_dump(raw))
    s = C.status(params, record)
    assert not s["certified"] and s["changed"] == ["params: base"]
    assert s["reason"] == "uncertified: params changed since commit abc1234: base; run `clap certify`"
    assert "UNCERTIFIED**: params changed since commit abc1234: base" in C.status_line(s)


def test_one_changed_byte_of_the_base_weights_uncertifies_naming_the_base(certified):
    params, record, _ = certified
    weights = params.parent / "models" / "base" / "model.safetensors"
    weights.write_bytes(b"W" + WEIGHTS[1:])
    new = hashlib.sha256(weights.read_bytes()).hexdigest()
    s = C.status(params, record)
    old = hashlib.sha256(WEIGHTS).hexdigest()
    assert s["reason"] == (
        f"uncertified: base changed since commit abc1234 (weights sha256 {old[:12]}…→{new[:12]}… "
        "(models/base)); run `clap certify`"
    )
    # without models/base checked out, the base stage's record is what is checked; without both, nothing
    shutil.rmtree(params.parent / "models" / "base")
    assert C.status(params, record)["certified"]
    base_record = params.parent / "records" / "base.json"
    base_record.write_text(json.dumps({"weights_sha256": old, "source_sha256": "6" * 64}))
    assert C.status(params, record)["changed"] == [
        f"base: source sha256 {'5' * 12}…→{'6' * 12}… (records/base.json)"
    ]
    base_record.unlink()
    s = C.status(params, record)
    assert not s["certified"] and "cannot verify the base: neither" in s["reason"]


def test_the_base_hash_is_the_model_packages(tmp_path):
    """certification hashes the weights as clap.model.base does (the gate imports no model code)."""
    from clap.model.base import base_sha256

    (tmp_path / "model.safetensors").write_bytes(WEIGHTS)
    (tmp_path / "config.json").write_text("{}")
    assert C.base_sha256(tmp_path) == base_sha256(tmp_path) == hashlib.sha256(WEIGHTS).hexdigest()
    (tmp_path / "model-00002.safetensors").write_bytes(b"shard")
    assert C.base_sha256(tmp_path) == base_sha256(tmp_path)


def test_a_changed_file_of_a_control_batch_uncertifies_naming_the_batch(certified):
    params, record, _ = certified
    admitted = params.parent / "data" / "admitted" / "b1" / "admission.json"
    admitted.write_text('{"admitted": false}')
    s = C.status(params, record)
    assert not s["certified"] and s["reason"].startswith(
        "uncertified: data changed since commit abc1234 (batch b1: data/admitted/b1 sha256 "
    )
    shutil.rmtree(
        admitted.parent
    )  # an admitted folder that is not here is not checked; the raw one always is
    assert C.status(params, record)["certified"]
    (params.parent / "data" / "raw" / "b1" / "tickets.csv").write_text("id,text\n1,b\n")
    s = C.status(params, record)
    assert not s["certified"] and "(batch b1: data/raw/b1 sha256 " in s["reason"]
    shutil.rmtree(params.parent / "data" / "raw" / "b1")
    assert C.status(params, record)["changed"] == ["data: batch b1: data/raw/b1 is missing"]


def test_a_changed_line_of_deciding_code_uncertifies_naming_the_file(certified):
    params, record, _ = certified
    sft = params.parent / "clap" / "train" / "sft.py"
    sft.write_text(SFT.replace("return 1", "return 2"))
    s = C.status(params, record)
    assert not s["certified"] and s["changed"] == ["code: clap/train/sft.py"]
    assert (
        s["reason"] == "uncertified: code changed since commit abc1234: clap/train/sft.py; run `clap certify`"
    )
    (params.parent / "clap" / "train" / "new.py").write_text("x = 1\n")
    (params.parent / "stages" / "admit.py").unlink()
    assert C.status(params, record)["changed"] == [
        "code: clap/train/new.py (added), clap/train/sft.py, stages/admit.py (removed)"
    ]


def test_every_mismatch_is_listed_in_order_and_the_first_named(certified):
    params, record, raw = certified
    (params.parent / "clap" / "core.py").write_text("changed\n")
    raw["gate"]["delta_star"] += 0.01
    params.write_text(yaml.safe_dump(raw))
    (params.parent / "models" / "base" / "model.safetensors").write_bytes(b"other")
    (params.parent / "data" / "raw" / "b1" / "tickets.csv").write_text("changed\n")
    s = C.status(params, record)
    assert [c.split(":")[0] for c in s["changed"]] == ["base", "data", "params", "code"]
    assert s["reason"].startswith("uncertified: base changed since commit abc1234 (weights sha256 ")
    assert s["reason"].endswith("; also changed: data, params, code; run `clap certify`")


def test_the_code_hash_is_the_one_dvc_writes_in_dvc_lock(tmp_path):
    """A file dep's md5 and a folder dep's .dir md5 (rebuilt from our per-file hashes) are dvc.lock's."""
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("a = 1\r\n")  # bytes as they are: no line-ending conversion
    (tmp_path / "pkg" / "sub").mkdir()
    (tmp_path / "pkg" / "sub" / "b.py").write_text("b = 2\n")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"bytecode")
    (tmp_path / "main.py").write_text("print('x')\n")
    (tmp_path / ".dvcignore").write_text((ROOT / ".dvcignore").read_text())
    stage = {
        "cmd": "echo done > out.txt",
        "deps": ["main.py", "pkg"],
        "outs": [{"out.txt": {"cache": False}}],
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}))
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["init", "--no-scm", "-q"], ["repro", "-q"]):
        subprocess.run([*dvc, *cmd], cwd=tmp_path, check=True, capture_output=True)
    locked = {
        d["path"]: d["md5"]
        for d in yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]["train"]["deps"]
    }
    ours = C.code_md5(tmp_path, ["main.py", "pkg"])
    assert ours["main.py"] == locked["main.py"]
    listing = [
        {"md5": md5, "relpath": f.removeprefix("pkg/")} for f, md5 in sorted(ours.items()) if f != "main.py"
    ]
    assert hashlib.md5(json.dumps(listing, sort_keys=True).encode()).hexdigest() + ".dir" == locked["pkg"]


def test_a_record_lacking_the_code_and_data_bindings_is_uncertified_and_cannot_be_rebound(certified):
    params, record, _ = certified
    rec = json.loads(record.read_text())
    for key in ("code_md5", "raw_sha256", "params_key_sha256", "base_source_sha256", "deciding_stages"):
        rec.pop(key)
    record.write_text(json.dumps(rec))
    s = C.status(params, record)
    assert not s["certified"] and s["reason"] == (
        "uncertified: the record of commit abc1234 does not bind the code or the raw data its controls ran on "
        "(written by an older clap); run `clap certify` to re-certify"
    )
    with pytest.raises(ClapError, match="rebinding cannot show") as e:
        C.rebind(record, params, lambda p: Path(p).read_text(), "2026-12-07")
    assert e.value.rule == "recertify"
    (params.parent / "models" / "base" / "model.safetensors").write_bytes(b"other")  # still checked
    assert C.status(params, record)["reason"].startswith("uncertified: base changed since commit abc1234")


def test_the_committed_records_read_uncertified_until_re_certified_with_the_new_bindings():
    """The committed demo and TAT-QA records predate the code and raw-data bindings (the lead re-certifies)."""
    for folder in (ROOT, ROOT / "profiles" / "tatqa"):
        rec = json.loads((folder / "certification" / "record.json").read_text())
        s = C.status(folder / "params.yaml", folder / "certification" / "record.json")
        if "code_md5" in rec:  # re-certified since: the bindings are checked like any record's
            continue
        assert not s["certified"] and "run `clap certify`" in s["reason"]


def test_release_refuses_a_batch_whose_scenario_is_no_longer_certified_naming_why(certified):
    """`clap release` reads the gate's record and the scenario's status now (clap.cli._scenario_now)."""
    from clap import cli
    from clap.release import control

    params, record, raw = certified
    root = params.parent
    raw["calibrate"]["record"] = "certification/record.json"
    params.write_text(yaml.safe_dump(raw))
    (root / "metrics" / "gate").mkdir(parents=True)
    gate = root / "metrics" / "gate" / "b1.json"
    gate.write_text(
        json.dumps({"decision": "promote", "certified": 1, "certification": "certified at commit abc"})
    )
    assert control._require_certified(root, "b1", "", cli._scenario_now(root)) == {}
    (root / "clap" / "train" / "sft.py").write_text("changed\n")
    why = "code changed since commit abc1234: clap/train/sft.py"
    with pytest.raises(ClapError, match="uncertified scenario") as e:
        control._require_certified(root, "b1", "", cli._scenario_now(root))
    assert (
        e.value.rule == "uncertified_scenario"
        and why in str(e.value)
        and "no longer certified" in str(e.value)
    )
    # a gate that ran after the change recorded the reason: the release names it
    s = C.status(params, record)
    gate.write_text(
        json.dumps({"decision": "promote", "certified": int(s["certified"]), "certification": s["reason"]})
    )
    with pytest.raises(ClapError, match=f"uncertified scenario \\(uncertified: {why}"):
        control._require_certified(root, "b1", "", None)
    override = control._require_certified(root, "b1", "hotfix", cli._scenario_now(root))
    assert why in override["uncertified_because"]


def test_an_uncertified_record_or_none_is_uncertified_and_says_why(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    missing = C.status(params, tmp_path / "certification" / "record.json")
    assert not missing["certified"] and "run `clap certify`" in missing["reason"]
    rows = [*CONTROLS[:3], _row("2026-02.clean-1", learned=False, quality_detail="gain below delta*")]
    s = C.status(params, _record(tmp_path, params, rows))
    assert (
        not s["certified"]
        and s["reason"] == "positive control 2026-02.clean-1 did not learn: gain below delta*"
    )


def test_clap_certify_prepares_a_batch_from_raw_and_writes_the_bound_record(tmp_path, monkeypatch, capsys):
    """`clap certify` takes an admitted batch from --data, runs one that is not there through the
    assetize/normalize/admit stage scripts, and writes the record even when the verdict fails."""
    from clap import cli
    from clap.judge import calibrate as cal

    monkeypatch.chdir(ROOT)  # the stage scripts read data/raw/<batch> and params.yaml from here
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    record = tmp_path / "cert" / "record.json"
    raw["calibrate"].update(batches=["2026-01", "2026-02"], record=str(record))
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    (tmp_path / "admitted" / "2026-01").mkdir(parents=True)
    (tmp_path / "admitted" / "2026-01" / "admission.json").write_text('{"admitted": true}')
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "model.safetensors").write_bytes(b"w")
    _project(tmp_path, ("2026-01", "2026-02"))  # the params' folder: its raw batches, dvc.yaml and code
    seen = []

    def fake_calibrate(dirs, *a, **k):
        seen.extend(dirs)
        rows = [*CONTROLS[:2], _row("2026-02.clean-1", learned=False, quality_detail="gain below delta*")]
        return cal.CalibrationResult(rows, {}, {"runs": 3})

    monkeypatch.setattr(cal, "calibrate", fake_calibrate)
    monkeypatch.setattr(cal, "write_outputs", lambda *a, **k: None)
    status = cli.main(
        [
            "certify",
            "--data",
            str(tmp_path / "admitted"),
            "--base",
            str(tmp_path / "base"),
            "--params",
            str(params),
        ]
        + ["--report-dir", str(tmp_path / "rep"), "--metrics", str(tmp_path / "m.json")]
    )
    assert (
        status == 1
        and "UNCERTIFIED: positive control 2026-02.clean-1 did not learn" in capsys.readouterr().err
    )
    assert seen[0] == tmp_path / "admitted" / "2026-01" and seen[1].name == "2026-02"
    rec = json.loads(record.read_text())
    assert rec["verdict"] == C.UNCERTIFIED and set(rec["data_sha256"]) == {"2026-01", "2026-02"}
    assert rec["params_sha256"] == C.params_sha256(params) and rec["summary"]["runs"] == 3
    assert set(rec["raw_sha256"]) == {"2026-01", "2026-02"} and "clap/train/sft.py" in rec["code_md5"]
    assert rec["base_sha256"] == hashlib.sha256(b"w").hexdigest() and rec["base_source_sha256"] == ""


def _older(record: Path, params: Path) -> dict:
    """The record as a clap that bound only the whole sections (no chain keys) wrote it."""
    rec = json.loads(record.read_text())
    old = [k for k in C.BOUND_SECTIONS if "." not in k]
    per_key = {k: v for k, v in rec["params_key_sha256"].items() if k in old}
    rec.update(bound_sections=old, params_sha256=C.params_sha256(params, old), params_key_sha256=per_key)
    record.write_text(json.dumps(rec))
    return rec


def test_a_record_that_does_not_bind_every_key_is_uncertified_until_rebound(tmp_path):
    params = tmp_path / "params.yaml"
    text = (ROOT / "params.yaml").read_text()
    params.write_text(text)
    record = _record(tmp_path, params, CONTROLS)
    rec = _older(record, params)
    s = C.status(params, record)
    assert not s["certified"] and "does not bind ['chain.max_new_tokens'" in s["reason"]
    assert "clap certify --rebind" in s["reason"]
    new = C.rebind(record, params, lambda p: Path(p).read_text(), "2026-12-07")
    assert new["rebound"] == {
        "keys": ["chain.max_new_tokens", "chain.decoding", "chain.engine"],
        "checked_at_commit": "abc1234def",
        "date": "2026-12-07",
    }
    assert new["verdict"] == rec["verdict"] and new["positive_controls"] == rec["positive_controls"]
    record.write_text(json.dumps(new))
    assert C.status(params, record)["certified"]
    assert C.rebind(record, params, lambda p: Path(p).read_text(), "2026-12-08") == new  # nothing to add
    # a bound key's change now unbinds it
    raw = yaml.safe_load(text)
    raw["chain"]["max_new_tokens"] += 1
    params.write_text(yaml.safe_dump(raw))
    assert "params changed" in C.status(params, record)["reason"]


def test_rebind_refuses_a_key_that_differs_from_the_records_commit_or_changed_params(tmp_path):
    params = tmp_path / "params.yaml"
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.write_text(yaml.safe_dump(raw))
    record = _record(tmp_path, params, CONTROLS)
    _older(record, params)
    then = {**raw, "chain": {**raw["chain"], "engine": {**raw["chain"]["engine"], "precision": "int8"}}}
    with pytest.raises(
        ClapError, match=r"\['chain.engine'\] differ from their values at commit abc1234"
    ) as e:
        C.rebind(record, params, lambda p: yaml.safe_dump(then), "2026-12-07")
    assert e.value.rule == "params_changed"
    raw["gate"]["alpha"] = 0.1  # a key the record binds changed since: no rebinding can vouch for it
    params.write_text(yaml.safe_dump(raw))
    with pytest.raises(ClapError, match="params changed since the certification of commit abc1234"):
        C.rebind(record, params, lambda p: params.read_text(), "2026-12-07")


def test_clap_certify_rebind_reads_the_params_of_the_records_commit_from_git(tmp_path, monkeypatch, capsys):
    """A profile's params extend the root's: both files are read as the record's commit had them."""
    from clap import cli
    from clap.vcs import git

    profile = tmp_path / "profiles" / "p"
    profile.mkdir(parents=True)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    record = profile / "certification" / "record.json"
    override = {"extends": "../../params.yaml", "calibrate": {"record": "certification/record.json"}}
    (profile / "params.yaml").write_text(yaml.safe_dump(override))
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x", "--allow-empty")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "params")
    commit = git(tmp_path, "rev-parse", "HEAD").strip()
    monkeypatch.chdir(profile)
    _project(profile)
    record.parent.mkdir()
    _older(_record_at(record, Path("params.yaml"), commit), Path("params.yaml"))
    assert cli.main(["certify", "--rebind"]) == 0
    assert "bound certification/record.json to ['chain.max_new_tokens'" in capsys.readouterr().out
    assert C.status("params.yaml", record)["certified"]
    raw["chain"]["decoding"] = "free"  # the root changed after the record's commit: its runs did not use this
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    _older(record, Path("params.yaml"))
    assert cli.main(["certify", "--rebind"]) != 0
    assert "['chain.decoding'] differ from their values at commit" in capsys.readouterr().err
    assert not C.status("params.yaml", record)["certified"]


def _record_at(path: Path, params: Path, commit: str) -> Path:
    rec = C.build_record(
        CONTROLS,
        {},
        params_path=params,
        base_dir=params.parent / "models" / "base",
        admitted={},
        commit=commit,
        machine="m",
        date="d",
    )
    path.write_text(json.dumps(rec))
    return path
