"""Profiles: a profile's dvc.yaml is the root one re-rendered (they cannot drift), and the TAT-QA profile's
declaration reads its real batches through assetize -> normalize -> admit with no code of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clap import params
from clap.data.admission import AdmitParams, SplitSizes, admit_batch
from clap.data.assetize import AssetizeParams, assetize_batch, batch_metrics
from clap.data.normalize import build_vocab, normalize_batch, normalize_params
from clap.task.scoring import reward, scoring_params
from schemas.admitted import admitted_items
from schemas.normalized import normalized_schemas, validate_frame

ROOT = Path(__file__).resolve().parents[2]
TATQA = ROOT / "profiles" / "tatqa"


def test_root_plot_sources_follow_the_root_batches(tmp_path):
    """`make demo` re-lists the root dvc.yaml's per-batch plot sources from params `batches` (`.`): the
    committed file is current, and a batch added to `batches` appears without a hand edit."""
    run = subprocess.run(
        [sys.executable, "profiles/render_dvc_yaml.py", ".", "--check"], cwd=ROOT, capture_output=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, str(ROOT / "profiles"))
    try:
        import render_dvc_yaml as R
    finally:
        sys.path.pop(0)
    text = R.plot_sources((ROOT / "dvc.yaml").read_text(encoding="utf-8"), ["2026-01", "2026-02", "2026-03"])
    plots = {k: v for entry in yaml.safe_load(text)["plots"] for k, v in entry.items()}
    assert list(plots["detector_log_e"]["y"]) == [f"plots/train/2026-0{m}.csv" for m in (1, 2, 3)]
    assert yaml.safe_load(text)["stages"] == yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_profile_dvc_yaml_is_the_rendered_root_dvc_yaml():
    run = subprocess.run(
        [sys.executable, "profiles/render_dvc_yaml.py", "profiles/tatqa", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    text = (TATQA / "dvc.yaml").read_text(encoding="utf-8")
    assert "cmd: python ../../stages/train.py" in text and "- ../../clap/data" in text
    assert "- data/raw/${item}" in text  # data paths stay the profile's own


def test_profile_params_set_every_knob_of_the_demo():
    """Merged onto the root's, the override is a whole params file: every knob of the demo (but the demo
    generator's own section) and nothing else."""
    demo = params.load(ROOT / "params.yaml")
    demo.pop("demo")  # the demo data generator's own section: the profile deletes it (demo: null)
    profile = params.load(TATQA / "params.yaml")
    assert list(profile) == list(demo)
    for name in demo:
        if isinstance(demo[name], dict):
            assert profile[name].keys() >= demo[name].keys() or name in {"assetize", "normalize", "task"}, (
                name
            )


def _leaves(tree, prefix=()):
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from _leaves(v, (*prefix, k))
    else:
        yield prefix, tree


def test_profile_params_hold_only_overrides():
    """No value of the override equals the root's at the same key (a copy would hide a later root change),
    except inside a mapping it replaces whole (its own data: sources, vocabularies, the answer)."""
    override = params.chain(TATQA / "params.yaml")[0]
    assert override.data and override.replace
    root = params.load(ROOT / "params.yaml")
    copies = []
    for path, value in _leaves(override.data):
        if any(path[: len(r)] == r for r in override.replace):
            continue
        node = root
        for part in path:
            node = node.get(part, object()) if isinstance(node, dict) else object()
        if node == value:
            copies.append(".".join(map(str, path)))
    assert copies == []


def test_profile_stage_params_cover_what_they_inherit():
    """Each stage of the profile's dvc.yaml lists, per params file, keys that file holds; together they
    cover every value of the keys the root's stage reads, each under the file that decides it (the
    override, or the root for what it inherits), and nothing the stage does not read: a stage re-runs when
    an inherited root value changes, not when an unrelated root section does (DVC tracks each file's
    own keys)."""
    import yaml

    layers = params.chain(TATQA / "params.yaml")
    files = {"params.yaml": layers[0], "../../params.yaml": layers[1]}
    root_stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    prof_stages = yaml.safe_load((TATQA / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    merged = params.load(TATQA / "params.yaml")

    def owner(path):  # the first file (the override first) that decides the value at ``path``
        for name, layer in files.items():
            node = layer.data
            for i, part in enumerate(path):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
                if path[: i + 1] in layer.replace or not isinstance(node, dict) or i == len(path) - 1:
                    return name
        raise AssertionError(path)

    for name, stage in root_stages.items():
        reads = [tuple(k.split(".")) for k in (stage.get("do") or stage).get("params", [])]
        listed = {}
        for entry in (prof_stages[name].get("do") or prof_stages[name])["params"]:
            ((file, keys),) = entry.items()
            listed[file] = [tuple(k.split(".")) for k in keys]
            for key in listed[file]:  # DVC fails on a key absent from the file it names
                node = files[file].data
                for part in key:
                    node = node[part]
                assert any(key[: len(r)] == r for r in reads), (name, file, key)  # nothing it does not read
        for read in reads:
            node = merged
            for part in read:
                node = node[part]
            for path, _ in _leaves(node, read):
                file = owner(path)
                assert any(path[: len(k)] == k for k in listed.get(file, [])), (name, path, file)
                if file == "params.yaml":  # an overridden value: the root's key is not listed
                    assert not any(path[: len(k)] == k for k in listed.get("../../params.yaml", [])), (
                        name,
                        path,
                    )


@pytest.mark.parametrize("params_file", [ROOT / "params.yaml", TATQA / "params.yaml"], ids=["demo", "tatqa"])
def test_every_profile_checks_its_training_often_enough_to_alarm(params_file):
    """The probe pool follows from the run: one fresh draw per optimizer step where the pool holds enough
    items (else one per check, spread over the run, never two at one step), and at least as many checks
    as the pre-registered constants need to alarm at all, also for a batch admitted with the fewest probe
    items admission accepts (docs/detector.md, "Sample size")."""
    import math

    from clap.train import detector as det
    from clap.train.sft import TrainParams

    sizes = params.section("sizes", SplitSizes, params_file)
    tp = params.section("train", TrainParams, params_file)
    dp = params.section("detector", det.DetectorParams, params_file)
    steps = math.ceil(sizes.sft / (tp.batch_size * tp.grad_accum)) * int(tp.epochs)
    checks = det.check_steps(steps, sizes.probe, dp.probe_draw)
    assert len(checks) == len(set(checks)) == min(steps, sizes.probe // dp.probe_draw)
    assert checks == sorted(checks) and 1 <= checks[0] and checks[-1] <= steps
    assert len(checks) >= det.min_checks_to_alarm(dp)
    floor = params.section("admit", AdmitParams, params_file).min_sizes.probe  # a batch admitted at the floor
    assert floor // dp.probe_draw >= det.min_checks_to_alarm(dp)


def test_render_check_fails_on_drift(tmp_path):
    sys.path.insert(0, str(ROOT / "profiles"))
    try:
        import render_dvc_yaml as R
    finally:
        sys.path.pop(0)
    root = (
        "stages:\n  a:\n    cmd: python stages/a.py x\n    deps:\n      - clap/data\n      - data/x\n"
        "plots:\n  - p:\n      y:\n        plots/train/2026-01.csv: [loss]\n        plots/train/2026-03.csv: [loss]\n"
    )
    rendered = R.render(root, 2, ["r-a", "r-b", "r-c"])
    assert "cmd: python ../../stages/a.py x" in rendered and "- ../../clap/data" in rendered
    assert "- data/x" in rendered and "../../data" not in rendered
    assert rendered.endswith(
        "        plots/train/r-a.csv: [loss]\n        plots/train/r-b.csv: [loss]\n        plots/train/r-c.csv: [loss]\n"
    )


@pytest.fixture(scope="module")
def reports_b(tmp_path_factory):
    p = TATQA / "params.yaml"
    answer = normalize_params(p).answer
    res = assetize_batch(
        TATQA / "data" / "raw" / "reports-b", params.section("assetize", AssetizeParams, p), answer
    )
    return p, res, normalize_batch(res.assets, normalize_params(p))


def test_tatqa_questions_become_items_with_located_evidence(reports_b):
    p, res, norm = reports_b
    m = batch_metrics(res)
    assert m["conservation_ok"]
    rejects = res.assets["rejects"]
    # every non-span question is an `excluded` reject (834 questions, 350 single spans in reports-b)
    assert (rejects["rule"] == "excluded").sum() == 834 - 350
    assert set(rejects.loc[rejects["rule"] == "excluded", "column"]) == {"answer_type"}
    vocab = build_vocab(normalize_params(p))
    for name, df in {**norm.frames, "rejects": norm.rejects}.items():
        validate_frame(normalized_schemas(vocab)[name], df, name)
    sft = norm.frames["sft"]
    assert list(sft.columns[:8]) == [
        "item_id",
        "split",
        "question",
        "question_type",
        "context_doc_ids",
        "value",
        "scale",
        "evidence",
    ]
    assert set(sft["scale"]) <= {"none", "thousand", "million", "billion", "percent"}
    for row in sft.itertuples():  # the located quote is a sentence of a context document and carries the span
        assert row.value.casefold().rstrip(".") in row.evidence.casefold()
        assert row.evidence_doc_id in row.context_doc_ids
    kept = sum(norm.metrics[f"{n}_rows_out"] for n in ("sft", "eval", "replay"))
    located = sum(norm.metrics[f"{n}_evidence_located"] for n in ("sft", "eval", "replay"))
    deduplicated = sum(  # every rule (duplicate input, overlap with a held-out split, ...)
        v
        for k, v in norm.metrics.items()
        if k.startswith(("sft_deduplicated_", "eval_deduplicated_", "replay_deduplicated_"))
    )
    assert located == kept + deduplicated  # located before dedup


def test_tatqa_batch_is_admitted_under_its_own_params(reports_b):
    p, _, norm = reports_b
    sp = scoring_params(p)
    vocab = build_vocab(normalize_params(p))
    pools = {n: norm.frames[n] for n in ("sft", "grpo", "eval", "replay", "kb")}
    adm = admit_batch(
        pools,
        params.section("sizes", SplitSizes, p),
        params.section("admit", AdmitParams, p),
        vocab,
        lambda t, g, c: reward(t, g, c, sp),
        "reports-b",
        sp.answer,
    )
    assert adm.record["verdict"] is True, adm.record["reasons"]
    assert adm.record["grpo"]["rank_pass_rate"] == 1.0
    validate_frame(admitted_items(vocab), adm.frames["eval"], "eval.parquet")


@pytest.mark.slow
def test_dvc_reruns_a_profile_stage_only_for_a_root_value_it_inherits(tmp_path):
    """DVC itself, on a rendered profile: a stage is stale after a change to a root value it inherits,
    and not after one to a value the profile overrides or to a key the stage does not read."""
    import shutil

    sys.path.insert(0, str(ROOT / "profiles"))
    try:
        import render_dvc_yaml as R
    finally:
        sys.path.pop(0)
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    root_params = "batches: [r]\na: {x: 1, y: 2, m: {p: 1}}\nb: {x: 1, z: 1}\nc: {q: 1}\n"
    (tmp_path / "params.yaml").write_text(root_params)
    prof = tmp_path / "profiles" / "p"
    prof.mkdir(parents=True)
    (prof / "params.yaml").write_text("extends: ../../params.yaml\nbatches: [p1]\na: {y: 3}\n")
    root_dvc = (
        "stages:\n  s:\n    foreach: ${batches}\n    do:\n      cmd: echo ${item} > out_${item}.txt\n"
        "      params:\n        - a\n        - b.x\n      outs:\n        - out_${item}.txt\n"
    )
    rendered = R.render(root_dvc, 2, ["p1"], params.chain(prof / "params.yaml"))
    assert "- params.yaml: [a]\n" in rendered and "- ../../params.yaml: [a.x, a.m, b.x]\n" in rendered
    (prof / "dvc.yaml").write_text(rendered)

    def run(*args, cwd=prof):
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("git", "init", "-q", cwd=tmp_path)
    run(dvc, "init", "-q", cwd=tmp_path)
    run(dvc, "repro", "-q")

    def stale_after(old, new):
        text = (tmp_path / "params.yaml").read_text()
        (tmp_path / "params.yaml").write_text(text.replace(old, new))
        return "s@p1" in run(dvc, "status")

    assert not stale_after("c: {q: 1}", "c: {q: 2}")  # a section the stage does not read
    assert not stale_after("b: {x: 1, z: 1}", "b: {x: 1, z: 2}")  # a key of it the stage does not read
    assert not stale_after("y: 2", "y: 5")  # a value the profile overrides
    assert stale_after("p: 1", "p: 2")  # an inherited value, deep
    run(dvc, "repro", "-q")
    assert stale_after("x: 1, y", "x: 7, y")
