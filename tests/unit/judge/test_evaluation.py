"""clap.judge.evaluation: models, pairing, scoring rows and flat metrics (tiny model, in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import make_tiny_adapter, write_tiny_admitted

from clap import io
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.errors import ClapError
from clap.judge.evaluation import (
    EvalParams,
    ModelSpec,
    evaluate,
    flat_metrics,
    gold_over_budget,
    incumbent_spec,
    manifest,
    model_specs,
    score_generations,
)
from clap.judge.scored import check_pairing
from clap.model.base import ADAPTER_FILE, base_sha256
from clap.model.engine import EngineParams
from clap.model.generate import Generation
from clap.task.answer import load_answer_schema
from clap.task.prompt import format_answer
from clap.task.scoring import ScoringParams
from schemas.eval import EvalTimings, eval_items

from ..release.release_fixtures import sign_release

REPO = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(REPO / "params.yaml")
SP = ScoringParams(0.001, 0.01, ANSWER)
SPACE = answer_space(normalize_params(REPO / "params.yaml"), ANSWER)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def batch(tiny_base, tmp_path_factory):
    root = tmp_path_factory.mktemp("evalbatch")
    admitted = write_tiny_admitted(root / "admitted" / "2026-01", n_sft=4, n_probe=5, seed=3)
    adapters = root / "adapters"
    make_tiny_adapter(tiny_base, adapters / "2026-01", seed=1)
    make_tiny_adapter(tiny_base, adapters / "2025-12", seed=2)
    return {"admitted": admitted, "adapters": adapters, "base": tiny_base, "root": root}


def _pointer(path: Path, batch: str | None, sha: str | None) -> Path:
    io.write_json(path, {"batch": batch, "adapter_sha256": sha})
    return path


def _released(batch, tmp_path: Path, name: str) -> Path:
    """A repository root whose releases/ records a signed release of ``name``; returns its pointer path."""
    root = tmp_path / f"repo-{name}"
    root.mkdir()
    io.atomic_write_text(root / "params.yaml", (REPO / "params.yaml").read_text(encoding="utf-8"))
    sign_release(
        root, name, tmp_path / f"keys-{name}", base_sha256(batch["base"]), adapters_dir=batch["adapters"]
    )
    return root / "releases" / "production.json"


def test_incumbent_resolution(batch, tmp_path):
    adapters = batch["adapters"]
    sha = io.sha256_file(adapters / "2025-12" / ADAPTER_FILE)
    assert incumbent_spec(tmp_path / "absent.json", adapters) is None
    assert incumbent_spec(_pointer(tmp_path / "none.json", None, None), adapters) is None
    spec = incumbent_spec(_released(batch, tmp_path, "2025-12"), adapters, batch["base"])
    assert spec == ModelSpec("incumbent", str(adapters / "2025-12"), sha, "2025-12")
    with pytest.raises(ClapError, match="sha256"):
        incumbent_spec(_pointer(tmp_path / "bad.json", "2025-12", "0" * 64), adapters)
    with pytest.raises(ClapError):
        incumbent_spec(_pointer(tmp_path / "gone.json", "2024-01", sha), adapters)
    io.atomic_write_text(tmp_path / "params.yaml", (REPO / "params.yaml").read_text(encoding="utf-8"))
    with pytest.raises(ClapError, match="no approval for this pointer"):  # right bytes, no approval
        incumbent_spec(_pointer(tmp_path / "releases" / "production.json", "2025-12", sha), adapters)
    (tmp_path / "corrupt.json").write_text("{not json")
    with pytest.raises(ClapError):
        incumbent_spec(tmp_path / "corrupt.json", adapters)


def test_model_specs_skip_missing_candidate_and_self_incumbent(batch, tmp_path):
    adapters = batch["adapters"]
    cand = incumbent_spec(_released(batch, tmp_path, "2026-01"), adapters)
    assert [s.role for s in model_specs(adapters / "2026-01", cand)] == [
        "base",
        "candidate",
    ]  # the candidate is in production
    assert [s.role for s in model_specs(adapters / "2026-09", None)] == ["base"]  # not trained
    # not trained, something in production: base and incumbent still answer the same items (the
    # gate's incumbent verdict pairs them)
    assert [s.role for s in model_specs(adapters / "2026-09", cand)] == ["base", "incumbent"]


def test_evaluate_pairs_every_model_on_the_same_items(batch):
    adapters = batch["adapters"]
    inc = ModelSpec(
        "incumbent", str(adapters / "2025-12"), io.sha256_file(adapters / "2025-12" / ADAPTER_FILE), "2025-12"
    )
    specs = model_specs(adapters / "2026-01", inc)
    items, kb = (
        io.read_parquet(batch["admitted"] / "eval.parquet"),
        io.read_parquet(batch["admitted"] / "kb.parquet"),
    )
    scored, timings, diagnostics = evaluate(
        specs,
        batch["base"],
        items,
        kb,
        EvalParams(
            batch_size=2,
            max_new_tokens=6,
            decoding="free",
            free_diagnostic_items=0,
            answer_metric="none",
            engine=EngineParams("openvino", "f32"),  # the product default
        ),
        SP,
        SPACE,
    )
    eval_items(ANSWER).validate(scored, lazy=True)
    EvalTimings.validate(timings, lazy=True)
    assert len(scored) == 3 * len(items) and list(scored["model"].unique()) == [
        "base",
        "candidate",
        "incumbent",
    ]
    check_pairing(scored)
    assert diagnostics["gold_over_budget"] == len(items)  # 6 tokens hold no gold answer
    for _, rows in scored.groupby("model"):
        assert list(rows.sort_values("position")["item_id"]) == list(items["item_id"])
    assert (
        not scored["parse_ok"].any() and (scored["overall"] == 0).all()
    )  # random models: counted wrong, not dropped
    flat = flat_metrics(scored, timings, specs, ANSWER)
    assert flat["has_candidate"] == 1 and flat["has_incumbent"] == 1 and flat["incumbent_batch"] == "2025-12"
    assert flat["candidate_pass_rate"] == 0.0 and flat["base_parse_rate"] == 0.0
    assert (
        flat["base_p95_latency_ms"] >= flat["base_p50_latency_ms"] > 0 and flat["incumbent_items_per_s"] > 0
    )
    meta = manifest(specs, inc, batch["base"], batch["admitted"], len(items))
    assert (
        set(meta["datasets"]) >= {"eval.parquet", "kb.parquet", "sft.parquet"}
        and meta["production"]["batch"] == "2025-12"
    )


def test_gold_answers_longer_than_the_answer_budget_are_counted(batch):
    from clap.model.base import load_tokenizer
    from clap.task.answer import gold_of

    items = io.read_parquet(batch["admitted"] / "eval.parquet")
    tok = load_tokenizer(batch["base"], padding_side="left")
    need = sorted(  # the gold answer's tokens and the end of the turn
        len(tok(format_answer(gold_of(r, ANSWER), ANSWER), add_special_tokens=False)["input_ids"]) + 1
        for r in items.to_dict("records")
    )
    assert gold_over_budget(items, batch["base"], ANSWER, need[-1]) == 0
    assert gold_over_budget(items, batch["base"], ANSWER, need[-1] - 1) == need.count(need[-1])
    assert gold_over_budget(items, batch["base"], ANSWER, need[0] - 1) == len(items)


def test_score_generations_keeps_unparseable_and_scores_right_answers(batch):
    items = io.read_parquet(batch["admitted"] / "eval.parquet").head(2)
    first = items.iloc[0]
    good = format_answer(
        {k: first[k] for k in ("metric", "value", "unit", "line", "shift", "date", "evidence")}, ANSWER
    )
    gens = [Generation(good, 20, 50, 5.0, 10.0, 2, 0), Generation("no idea", 3, 50, 5.0, 10.0, 2, 0)]
    contexts = [first["evidence"], ""]
    rows = score_generations("candidate", items, gens, contexts, SP)
    eval_items(ANSWER).validate(rows, lazy=True)
    assert rows["pass"].tolist() == [True, False] and rows["parse_ok"].tolist() == [True, False]
    assert rows.loc[0, "pred_value"] == pytest.approx(first["value"]) and pd.isna(rows.loc[1, "pred_value"])


def test_pairing_violation_is_loud():
    frame = pd.DataFrame(
        {
            "model": ["base", "base", "candidate", "candidate"],
            "position": [0, 1, 0, 1],
            "item_id": ["a", "b", "b", "a"],
        }
    )
    with pytest.raises(ClapError, match="same items"):
        check_pairing(frame)


def test_empty_eval_set_needs_no_model(tmp_path):
    scored, timings, _ = evaluate(
        [ModelSpec("base", None, "", "")],
        tmp_path / "no-model",
        pd.DataFrame(columns=["item_id"]),
        pd.DataFrame(),
        EvalParams(2, 4, "free", 0, "none", EngineParams("torch", "f32")),
        SP,
        SPACE,
    )
    assert scored.empty and timings.empty
    assert flat_metrics(scored, timings, [ModelSpec("base", None, "", "")], ANSWER) == {
        "has_candidate": 0,
        "has_incumbent": 0,
        "n_items": 0,
        "incumbent_batch": "",
    }
    assert json.dumps(flat_metrics(scored, timings, [], ANSWER))  # flat and serializable


@pytest.mark.parametrize(
    "change, column",
    [
        ({"batch_size": 0}, "eval.batch_size"),
        ({"max_new_tokens": 0}, "chain.max_new_tokens"),  # eval decodes within the chain's answer budget
        ({"free_diagnostic_items": -1}, "eval.free_diagnostic_items"),
        ({"answer_metric": "bleu"}, "eval.answer_metric"),
        ({"decoding": "greedy"}, "chain.decoding"),
    ],
)
def test_a_bad_eval_value_names_its_dotted_key(change, column):
    good = {
        "batch_size": 2,
        "max_new_tokens": 4,
        "decoding": "free",
        "free_diagnostic_items": 0,
        "answer_metric": "none",
        "engine": EngineParams("torch", "f32"),
    }
    with pytest.raises(ClapError) as e:
        EvalParams(**{**good, **change})
    assert (e.value.rule, e.value.column) == ("bad_params", column)
