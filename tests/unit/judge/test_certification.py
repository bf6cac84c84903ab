"""Certification: the verdict over the controls, and the record's binding to the params it ran under."""

from __future__ import annotations

import json
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


def _record(tmp_path: Path, params: Path, rows: list[dict]) -> Path:
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    (base / "model.safetensors").write_bytes(b"weights")
    batch = tmp_path / "admitted" / "b1"
    batch.mkdir(parents=True, exist_ok=True)
    (batch / "admission.json").write_text("{}")
    rec = C.build_record(
        rows,
        {"runs": len(rows)},
        params_path=params,
        base_dir=base,
        admitted={"b1": batch},
        commit="abc1234",
        machine="x86_64-avx2-amd",
        date="2026-12-04",
    )
    path = tmp_path / "certification" / "record.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def test_the_status_holds_only_for_the_params_it_was_certified_under(tmp_path):
    params = tmp_path / "params.yaml"
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params.write_text(yaml.safe_dump(raw))
    record = _record(tmp_path, params, CONTROLS)
    rec = json.loads(record.read_text())
    assert rec["verdict"] == C.CERTIFIED and rec["data_sha256"]["b1"] and len(rec["base_sha256"]) == 64
    assert [c["caught_by"] for c in rec["negative_controls"]] == ["detector", "gate rule loss_masking"]
    s = C.status(params, record)
    assert s["certified"] and s["commit"] == "abc1234" and "certified" in C.status_line(s)
    # a comment or key order does not unbind it; a changed value does
    params.write_text("# a comment\n" + yaml.safe_dump(raw, sort_keys=True))
    assert C.status(params, record)["certified"]
    raw["gate"]["delta_star"] = raw["gate"]["delta_star"] + 0.01
    params.write_text(yaml.safe_dump(raw))
    s = C.status(params, record)
    assert not s["certified"] and "params changed since the certification of commit abc1234" in s["reason"]
    assert "UNCERTIFIED" in C.status_line(s)


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


def _older(record: Path, params: Path) -> dict:
    """The record as a clap that bound only the whole sections (no chain keys) wrote it."""
    rec = json.loads(record.read_text())
    old = [k for k in C.BOUND_SECTIONS if "." not in k]
    rec.update(bound_sections=old, params_sha256=C.params_sha256(params, old))
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
        "checked_at_commit": "abc1234",
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
        base_dir=path.parent,
        admitted={},
        commit=commit,
        machine="m",
        date="d",
    )
    path.write_text(json.dumps(rec))
    return path
