"""A text value through eval's scoring, and params ``eval.answer_metric``: TAT-QA's EM/F1 per item,
in eval's metrics (overall and per slice value) and in the gate report (present only when enabled)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TEXT_ANSWER

from clap import params
from clap.errors import ClapError
from clap.judge.evaluation import (
    EvalParams,
    ModelSpec,
    eval_params,
    flat_metrics,
    score_generations,
    tatqa_scale,
    with_answer_metric,
)
from clap.judge.gate_report import evidence_bundle, render_report
from clap.judge.gating import GateParams, run_gate
from clap.model.engine import EngineParams
from clap.model.generate import Generation
from clap.task.answer import parse_answer_schema
from clap.task.prompt import format_answer
from clap.task.scoring import ScoringParams, context_text
from schemas.eval import eval_items

ROOT = Path(__file__).resolve().parents[3]
ANSWER = parse_answer_schema(TEXT_ANSWER)
SP = ScoringParams(0.001, 0.01, ANSWER)
BODY = "Fixed Price contracts $1,496.5 million; Time and Materials contracts $812.0 million."
ITEMS = pd.DataFrame(
    [
        dict(
            item_id="Q-0",
            question_type="span",
            source_system="text",
            row="Contract type",
            evidence="Fixed Price contracts",
            value="Fixed Price",
            scale="none",
        ),
        dict(
            item_id="Q-1",
            question_type="arithmetic",
            source_system="table",
            row="Fixed Price revenue",
            evidence="Fixed Price contracts $1,496.5 million",
            value="$1,496.5",
            scale="million",
        ),
    ]
)
CTX = [context_text([("R-1", BODY)])] * 2


def gen(text: str) -> Generation:
    return Generation(text, 10, 50, 5.0, 10.0, 2, 0)


def answers(*pairs: tuple[str, str]) -> list[Generation]:
    """One generation per item: (value, scale) written as the model would."""
    rows = ITEMS.to_dict("records")
    return [gen(format_answer({**r, "value": v, "scale": s}, ANSWER)) for r, (v, s) in zip(rows, pairs)]


def scored_model(role: str, *pairs: tuple[str, str]) -> pd.DataFrame:
    return with_answer_metric(score_generations(role, ITEMS, answers(*pairs), CTX, SP), ITEMS, ANSWER)


def test_text_values_are_scored_into_text_columns():
    rows = score_generations(
        "candidate", ITEMS, answers(("fixed price", "none"), ("812.0", "million")), CTX, SP
    )
    eval_items(ANSWER).validate(rows, lazy=True)
    assert rows["gold_value"].tolist() == ["Fixed Price", "$1,496.5"]
    assert rows["pred_value"].tolist() == ["fixed price", "812.0"]
    assert rows["value_correct"].tolist() == [True, False] and rows["wrong_fact"].tolist() == [False, True]
    rows = score_generations("base", ITEMS, [gen("no idea"), gen("{}")], CTX, SP)
    assert rows["pred_value"].isna().all() and not rows["hallucination"].any()


def test_tatqa_scores_value_with_unit_as_scale():
    assert (tatqa_scale("none"), tatqa_scale("None"), tatqa_scale(None), tatqa_scale("million")) == (
        "",
        "",
        "",
        "million",
    )
    right = scored_model("candidate", ("fixed price", "none"), ("1496.5", "million"))
    assert right["em"].tolist() == [1.0, 1.0] and right["f1"].tolist() == [1.0, 1.0]
    scale = scored_model("candidate", ("Fixed", "none"), ("$1,496.5", "thousand"))
    assert scale["em"].tolist() == [0.0, 0.0]
    assert scale["f1"][0] == pytest.approx(2 / 3) and scale["f1"][1] == 0.0  # partial span; wrong scale
    junk = with_answer_metric(score_generations("base", ITEMS, [gen("x"), gen("{}")], CTX, SP), ITEMS, ANSWER)
    assert junk["em"].tolist() == [0.0, 0.0] and junk["f1"].tolist() == [0.0, 0.0]
    eval_items(ANSWER, answer_metric="tatqa").validate(right, lazy=True)
    bad_gold = ITEMS.assign(scale=["none", "pcs"])
    with pytest.raises(ClapError, match="Q-1"):
        with_answer_metric(
            score_generations("base", bad_gold, answers(("a", "none"), ("b", "none")), CTX, SP),
            bad_gold,
            ANSWER,
        )


def _timings(scored: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": scored["model"],
            "item_id": scored["item_id"],
            "latency_ms": 5.0,
            "batch_wall_ms": 10.0,
            "batch_size": 2,
            "batch_index": 0,
        }
    )


def test_eval_metrics_carry_em_and_f1_overall_and_per_slice_value():
    scored = pd.concat(
        [
            scored_model("base", ("Time and Materials", "none"), ("1496.5", "million")),
            scored_model("candidate", ("Fixed Price", "none"), ("1496.5", "million")),
        ],
        ignore_index=True,
    )
    specs = [ModelSpec("base", None, "", ""), ModelSpec("candidate", "a", "c" * 64, "b")]
    flat = flat_metrics(scored, _timings(scored), specs, ANSWER)
    assert (flat["base_em"], flat["base_f1"], flat["candidate_em"], flat["candidate_f1"]) == (
        0.5,
        0.5,
        1.0,
        1.0,
    )
    assert flat["base_em.question_type=span"] == 0.0 and flat["base_em.question_type=arithmetic"] == 1.0
    assert flat["base_f1.source_system=text"] == 0.0 and flat["candidate_f1.source_system=table"] == 1.0
    assert flat["n_items.question_type=span"] == 1 and flat["n_items.source_system=table"] == 1
    plain = flat_metrics(scored.drop(columns=["em", "f1"]), _timings(scored), specs, ANSWER)  # none
    assert not [k for k in plain if "_em" in k or "_f1" in k or k.startswith("n_items.")]
    assert set(flat) - set(plain) == {k for k in flat if "_em" in k or "_f1" in k or k.startswith("n_items.")}


def test_eval_params_require_the_answer_metric(tmp_path):
    assert eval_params(ROOT / "params.yaml").answer_metric == "none"  # the demo
    raw = params.load(ROOT / "params.yaml")
    del raw["eval"]["answer_metric"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ClapError) as e:
        eval_params(tmp_path / "params.yaml")
    assert (e.value.rule, e.value.column) == ("missing_param", "eval.answer_metric")
    with pytest.raises(ClapError, match="eval.answer_metric"):
        EvalParams(2, 4, "free", 0, "squad", EngineParams("torch", "f32"))


GATE = params.section("gate", GateParams, ROOT / "params.yaml")
META = {
    "models": [
        {"role": "base", "adapter_sha256": "", "batch": ""},
        {"role": "candidate", "adapter_sha256": "c" * 64, "batch": "b"},
    ],
    "datasets": {},
    "base_sha256": "0" * 64,
    "production": {},
}
TRAIN = {
    "trained": 1,
    "health": "ok",
    "masked_tokens_fraction": 0.6,
    "label_tokens": 1000,
    "prompt_tokens": 600,
}


def _gate_report(scored: pd.DataFrame) -> tuple[dict, str]:
    r = run_gate(scored, META, TRAIN, {"admitted": 1}, GATE, replay=None, slices=ANSWER.slices)
    ev = evidence_bundle(r, "reports-a", META, "f" * 64, {}, GATE)
    return ev, render_report(ev)


def test_gate_report_shows_em_f1_only_when_eval_scored_them():
    scored = pd.concat(
        [
            scored_model("base", ("Time and Materials", "none"), ("1496.5", "million")),
            scored_model("candidate", ("Fixed Price", "none"), ("1496.5", "million")),
        ],
        ignore_index=True,
    )
    ev, md = _gate_report(scored)
    rows = ev["answer_metric"]["rows"]
    assert [(r["slice"], r["value"], r["n"]) for r in rows] == [
        ("all", "", 2),
        ("question_type", "arithmetic", 1),
        ("question_type", "span", 1),
        ("source_system", "table", 1),
        ("source_system", "text", 1),
    ]
    assert (rows[0]["baseline_em"], rows[0]["candidate_em"]) == (0.5, 1.0)
    assert ev["numbers"]["candidate_f1"] == 1.0 and ev["numbers"]["baseline_f1"] == 0.5
    assert "TAT-QA exact match and numeracy-focused F1" in md
    assert "the gate's decision does not use them" in md
    assert "| all items | 2 | 0.500 | 1.000 | 0.500 | 1.000 |" in md
    assert "| question_type = span | 1 | 0.000 | 1.000 | 0.000 | 1.000 |" in md

    ev_none, md_none = _gate_report(scored.drop(columns=["em", "f1"]))  # eval.answer_metric: none
    assert "answer_metric" not in ev_none and "TAT-QA" not in md_none
    assert "candidate_em" not in ev_none["numbers"]
    # the decision and every check are the same with and without the answer metric
    assert (ev["decision"], ev["rule"], ev["reasons"]) == (
        ev_none["decision"],
        ev_none["rule"],
        ev_none["reasons"],
    )
