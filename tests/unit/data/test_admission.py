"""clap.data.admission: seeded selection, static checks, GRPO reward check, label-shuffle canary."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clap import params
from clap.data.admission import AdmitParams, SplitSizes, admit_batch, perturbed_answers, select, select_splits
from clap.data.normalize import build_vocab, input_hash, normalize_params
from clap.errors import ClapError
from clap.task.answer import AnswerSchema, gold_of, load_answer_schema, parse_answer_schema
from clap.task.prompt import format_answer
from clap.task.scoring import ScoringParams, parse_answer, reward, scoring_params

ROOT = Path(__file__).resolve().parents[3]
VOCAB = build_vocab(normalize_params(ROOT / "params.yaml"))
ANSWER = load_answer_schema(ROOT / "params.yaml")
SP = scoring_params(ROOT / "params.yaml")
PERTURBATIONS = [
    "wrong_value",
    "wrong_metric",
    "wrong_line",
    "wrong_shift",
    "wrong_date",
    "other_doc_evidence",
    "unparseable",
]
P = AdmitParams(
    seed=7, min_sizes=SplitSizes(sft=20, grpo=5, eval=10, probe=5, replay=5), max_key_share={"metric": 0.4},
    min_distinct={"metric": 5}, min_coverage={"line": 1.0, "shift": 1.0}, min_evidence_verifiable_rate=1.0,
    min_rank_pass_rate=1.0, min_reward_margin=0.15, min_reward_variance=0.0, min_label_shuffle_changed=0.5,
)  # fmt: skip
SIZES = SplitSizes(sft=30, grpo=8, eval=20, probe=10, replay=10)
SENTENCES = {"scrap_rate": ("%", "Scrap rate was {v} %"), "oee": ("%", "OEE was {v} %"), "downtime": ("min", "Downtime was {v} minutes"),
             "scrap_count": ("pcs", "{v} pcs were scrapped"), "cycle_time": ("s", "Cycle time averaged {v} seconds"), "defect_rate": ("ppm", "Defect rate was {v} ppm")}  # fmt: skip


def real_reward(text, gold, ctx):
    return reward(text, gold, ctx, SP)


def make_pools(n_train: int = 60, n_eval: int = 40, n_replay: int = 15) -> dict[str, pd.DataFrame]:
    """Clean normalized pools: one fact and one KB document per item, context = own doc + a distractor."""
    n = n_train + n_eval + n_replay
    kb, items = [], []
    for k in range(n + 1):
        metric = sorted(SENTENCES)[k % 6]
        unit, sentence = SENTENCES[metric]
        line, shift, date, value = (
            f"L{k % 4 + 1}",
            "ABC"[k % 3],
            f"2026-03-{k % 28 + 1:02d}",
            round(10 + 1.7 * k, 1),
        )
        evidence = sentence.format(v=value)
        kb.append(
            {
                "doc_id": f"D{k:04d}",
                "system": "mes",
                "record_ref": f"SR-{k}",
                "title": f"Report {k}",
                "body": f"Report for line {line}, shift {shift}, {date}. {evidence}. No events.",
                "line": line,
                "shift": shift,
                "date": date,
            }
        )
        if k == n:
            break  # the last document is only a distractor
        split = "train" if k < n_train else "eval" if k < n_train + n_eval else "replay"
        question = f"What was the {metric} on {line}, shift {shift}, {date} (case {k})?"
        ctx = [] if split == "replay" else [f"D{k:04d}", f"D{k + 1:04d}"][:: 1 if k % 2 else -1]
        items.append({"item_id": f"Q{k:04d}", "split": split, "question": question, "question_type": "direct", "context_doc_ids": json.dumps(ctx),
                      "metric": metric, "value": value, "unit": unit, "line": line, "shift": shift, "date": date, "evidence": evidence,
                      "evidence_doc_id": f"D{k:04d}", "source_system": "mes", "input_hash": input_hash(question), "source_file": "question_log.jsonl", "source_line": k + 1})  # fmt: skip
    df = pd.DataFrame(items)
    pools = {
        name: df[df["split"] == split].reset_index(drop=True)
        for name, split in (("sft", "train"), ("eval", "eval"), ("replay", "replay"))
    }
    return {**pools, "grpo": pools["sft"].copy(), "kb": pd.DataFrame(kb)}


def admit(pools=None, sizes=SIZES, p=P, reward_fn=real_reward, schema=ANSWER):
    return admit_batch(pools or make_pools(), sizes, p, VOCAB, reward_fn, "test", schema)


def failed(result) -> set[str]:
    return {c["name"] for c in result.record["checks"] if not c["passed"]}


@pytest.fixture(scope="module")
def clean():
    return admit()


# --------------------------------------------------------------------------- selection


def test_selection_is_seeded_and_ignores_input_order():
    pool = make_pools()["sft"]
    a = select(pool, 10, np.random.default_rng(1))
    b = select(pool.sample(frac=1.0, random_state=5), 10, np.random.default_rng(1))
    c = select(pool, 10, np.random.default_rng(2))
    assert list(a["item_id"]) == list(b["item_id"]) != list(c["item_id"])


def test_probe_is_drawn_from_the_training_pool_and_never_trained_on():
    """The probe comes from the declared train split (the pool D_sft is drawn from), not from eval, and is
    disjoint from every other admitted split, also when the pools overlap (here: eval items leaked)."""
    pools = make_pools()
    pools["sft"] = pd.concat([pools["sft"], pools["eval"].iloc[:5]], ignore_index=True)
    out = select_splits(pools, SIZES, seed=3)
    assert len(out["probe"]) == SIZES.probe
    assert set(out["probe"]["split"]) == {"train"}  # the declared split D_sft is drawn from
    assert set(out["probe"]["item_id"]) <= set(pools["sft"]["item_id"])
    for other in ("sft", "grpo", "eval", "replay"):
        assert not set(out["probe"]["item_id"]) & set(out[other]["item_id"])
        assert not set(out["probe"]["input_hash"]) & set(out[other]["input_hash"])


def _position_z(sft_positions: np.ndarray, probe_positions: np.ndarray, pool: int) -> float:
    """z of the probe's mean pool position minus D_sft's: two disjoint random samples of the positions
    0..pool-1 differ in mean with variance S^2 (1/n1 + 1/n2), S^2 = pool (pool + 1) / 12."""
    var = pool * (pool + 1) / 12 * (1 / sft_positions.size + 1 / probe_positions.size)
    return float((probe_positions.mean() - sft_positions.mean()) / np.sqrt(var))


def test_probe_and_training_items_are_one_random_partition_of_the_pool():
    """Over admission seeds, D_sft and the probe are exchangeable draws of the training pool: every pool item is
    as likely to be a probe item as any other (chi-square), and the probe's position in the declared order (a
    date, a report) has the same mean as D_sft's. A probe taken by declared order fails the same test."""
    from scipy.stats import chisquare

    pools = make_pools(n_train=200)
    pool = pools["sft"]
    position = {item: k for k, item in enumerate(pool["item_id"])}
    seeds = range(400)
    hits = np.zeros(len(pool))
    zs = []
    for seed in seeds:
        out = select_splits(pools, SIZES, seed=seed)
        probe = np.array([position[i] for i in out["probe"]["item_id"]])
        hits[probe] += 1
        zs.append(_position_z(np.array([position[i] for i in out["sft"]["item_id"]]), probe, len(pool)))
    # each seed's probe excludes its D_grpo items, also a random draw: every item's share stays equal
    assert chisquare(hits).pvalue > 1e-3
    assert abs(np.mean(zs)) * np.sqrt(len(zs)) < 4  # mean position of probe minus sft: no drift
    by_order = _position_z(np.arange(SIZES.sft), np.arange(SIZES.sft, SIZES.sft + SIZES.probe), len(pool))
    assert (
        abs(by_order) * np.sqrt(len(zs)) > 4
    )  # the test has teeth: taking by declared order (every seed alike) fails


# --------------------------------------------------------------------------- verdicts


def test_clean_batch_is_admitted(clean):
    rec = clean.record
    assert rec["verdict"] is True and rec["reasons"] == []
    assert {k: len(v) for k, v in clean.frames.items()} == {
        "sft": 30,
        "grpo": 8,
        "eval": 20,
        "probe": 10,
        "replay": 10,
        "kb": 116,
    }
    assert clean.metrics["admitted"] == 1 and clean.metrics["n_reasons"] == 0
    assert rec["grpo"]["rank_pass_rate"] == 1.0
    assert 0.15 < rec["grpo"]["reward_margin"] < 1.0
    json.dumps(rec, allow_nan=False)  # the record is plain JSON


def test_admission_is_deterministic(clean):
    assert admit().record == clean.record


def test_overlap_blocks_admission():
    pools = make_pools()
    leak = pools["eval"].iloc[[0]].assign(item_id="Q-leak")  # same question text, another id
    pools["sft"] = pd.concat([pools["sft"], leak], ignore_index=True)
    res = admit(pools)
    assert res.record["verdict"] is False and "pool_overlap" in failed(res)
    assert any("sft__eval=1" in r for r in res.record["reasons"])


def test_degenerate_labels_fail_the_canary():
    pools = make_pools()
    first = pools["sft"].iloc[0]
    for col in ("metric", "value", "unit", "line", "shift", "date"):
        pools["sft"][col] = first[col]
    res = admit(pools)
    assert res.record["canary"]["label_shuffle_changed"] == 0.0
    assert "label_shuffle_changed" in failed(res) and res.record["verdict"] is False


def test_dominant_metric_fails_balance():
    pools = make_pools()
    pools["sft"] = pd.concat(
        [
            pools["sft"],
            *[
                pools["sft"][pools["sft"]["metric"] == "oee"].assign(
                    item_id=lambda d, i=i: d["item_id"] + f"x{i}",
                    input_hash=lambda d, i=i: d["input_hash"].str[:-4] + f"{i:04d}",
                )
                for i in range(6)
            ],
        ],
        ignore_index=True,
    )
    res = admit(pools)
    assert "max_metric_share" in failed(res) and res.record["verdict"] is False


def test_short_split_warns_but_only_the_minimum_blocks():
    pools = make_pools()
    res = admit(pools, sizes=dataclasses.replace(SIZES, replay=20))
    assert res.record["verdict"] is True and failed(res) == {"requested_replay"}
    assert any(r.startswith("warning: requested_replay") for r in res.record["reasons"])
    pools["replay"] = pools["replay"].iloc[:3]
    res = admit(pools)
    assert res.record["verdict"] is False and {"size_replay", "requested_replay"} <= failed(res)


def test_empty_eval_pool_is_refused_not_crashed():
    pools = make_pools()
    pools["eval"] = pools["eval"].iloc[:0]
    res = admit(pools)
    assert res.record["verdict"] is False and "size_eval" in failed(res) and "size_probe" not in failed(res)
    assert (
        len(res.frames["eval"]) == 0 and len(res.frames["probe"]) == SIZES.probe
    )  # the probe is the training pool's


def test_a_training_pool_too_small_for_the_probe_blocks():
    """D_sft is drawn first; the probe gets what the training pool has left, and too little blocks."""
    res = admit(sizes=dataclasses.replace(SIZES, sft=60))
    assert res.record["verdict"] is False and "size_probe" in failed(res) and "size_sft" not in failed(res)


def test_unverifiable_evidence_blocks():
    pools = make_pools()
    pools["sft"]["evidence"] = "No events"
    pools["grpo"]["evidence"] = "No events"
    res = admit(pools)
    assert "evidence_verifiable_rate" in failed(res)


# --------------------------------------------------------------------------- GRPO reward check


def changed_fields(out: dict[str, str], gold: dict, schema: AnswerSchema) -> dict[str, set[str]]:
    """Per perturbation, the answer fields whose parsed value differs from the reference's."""
    ref = json.loads(format_answer(gold, schema))
    return {
        name: {k for k, v in parse_answer(text, schema).fields.items() if v != ref[k]}
        for name, text in out.items()
    }


def test_perturbations_each_break_their_own_field():
    pools = make_pools()
    row = pools["grpo"].iloc[3].to_dict()
    bodies = dict(zip(pools["kb"]["doc_id"], pools["kb"]["body"]))
    domain = {"metric": sorted(SENTENCES), "line": ["L1", "L2", "L3", "L4"], "shift": ["A", "B", "C"]}
    out = perturbed_answers(row, ANSWER, domain, bodies, VOCAB)
    assert list(out) == PERTURBATIONS
    assert not parse_answer(out.pop("unparseable"), ANSWER).ok
    for name, changed in changed_fields(out, gold_of(row, ANSWER), ANSWER).items():
        assert changed == {name.replace("wrong_", "").replace("other_doc_", "")}, name


def test_declared_answer_gives_the_clap_perturbations(clean):
    assert ANSWER.perturbations == tuple(PERTURBATIONS)
    assert clean.record["selection"]["perturbations"] == PERTURBATIONS
    assert {f"reward_mean_{n}" for n in PERTURBATIONS} <= set(clean.record["grpo"])


def test_reward_blind_to_fields_fails_rank_pass():
    res = admit(reward_fn=lambda text, gold, ctx: float(parse_answer(text, ANSWER).ok))
    assert res.record["grpo"]["rank_pass_rate"] == 0.0
    assert {"rank_pass_rate", "reward_margin"} <= failed(res)


def test_constant_reward_has_no_variance():
    res = admit(reward_fn=lambda text, gold, ctx: 0.5)
    assert res.record["grpo"]["reward_variance_min"] == 0.0 and "reward_variance_min" in failed(res)


@pytest.mark.parametrize("where", ["max_key_share", "min_distinct", "min_coverage"])
def test_balance_on_a_field_that_is_no_key_is_a_params_error(where):
    raw = {**params.raw_section("admit", ROOT / "params.yaml"), where: {"colour": 1.0}}
    p = dataclasses.replace(params.build(AdmitParams, raw, where="admit"), min_sizes=P.min_sizes)
    with pytest.raises(ClapError) as e:
        admit(p=p)
    assert e.value.rule == "bad_params" and e.value.column == f"admit.{where}.colour"
    assert "colour" in str(e.value) and f"admit.{where}" in str(e.value)


# --------------------------------------------------------------------------- a second declared answer

REPORT = parse_answer_schema(
    {
        "instruction": "Answer from the report only, as one JSON object with keys",
        "answer": {
            "row": {"role": "key", "type": "text", "weight": 1.0},
            "period": {"role": "key", "type": "date", "weight": 1.0},
            "evidence": {"role": "evidence", "weight": 2.0},
            "value": {"role": "value", "type": "number", "weight": 2.0},
            "scale": {"role": "unit", "type": "vocabulary", "weight": 1.0},
        },
        "slice_columns": [],
        "show_doc_ids": True,
        "context": {"docs": 0, "cues": []},
    }
)
REPORT_SP = ScoringParams(0.001, 0.01, REPORT)


def report_reward(text, gold, ctx):
    return reward(text, gold, ctx, REPORT_SP)


ROWS = {"cycle_time": "Revenue", "defect_rate": "Cost of sales", "downtime": "Gross profit",
        "oee": "Operating income", "scrap_count": "Net income", "scrap_rate": "Total assets"}  # fmt: skip
SCALES = {"%": "percent", "min": "thousand", "pcs": "million", "s": "thousand", "ppm": "million"}


def report_pools() -> dict[str, pd.DataFrame]:
    """make_pools with the report's answer: row/period/scale instead of metric/line/shift/date/unit."""
    pools = make_pools()

    def items(df: pd.DataFrame) -> pd.DataFrame:
        out = df.assign(row=df["metric"].map(ROWS), period=df["date"], scale=df["unit"].map(SCALES))
        return out.drop(columns=["metric", "line", "shift", "date", "unit"])

    kb = pools["kb"].rename(columns={"date": "period"}).drop(columns=["line", "shift"])
    return {**{k: items(v) for k, v in pools.items() if k != "kb"}, "kb": kb}


REPORT_P = dataclasses.replace(
    P, max_key_share={"row": 0.4}, min_distinct={"row": 5}, min_coverage={"row": 1.0}
)


def test_a_second_declared_answer_is_admitted_with_its_own_perturbations():
    names = ["wrong_value", "wrong_row", "wrong_period", "other_doc_evidence", "unparseable"]
    assert REPORT.perturbations == tuple(names)
    pools = report_pools()
    res = admit(pools, p=REPORT_P, reward_fn=report_reward, schema=REPORT)
    rec = res.record
    assert rec["verdict"] is True and rec["reasons"] == []
    assert rec["selection"]["perturbations"] == names
    assert rec["grpo"]["rank_pass_rate"] == 1.0 and 0.15 < rec["grpo"]["reward_margin"] < 1.0
    assert {f"reward_mean_{n}" for n in names} <= set(rec["grpo"])
    assert {"max_row_share", "distinct_rows", "row_coverage"} <= {c["name"] for c in rec["checks"]}
    assert not {c["name"] for c in rec["checks"]} & {"max_metric_share", "distinct_metrics", "line_coverage"}
    assert rec["canary"]["evidence_in_context_rate_real"] == 1.0  # the kb carries the period key

    row = pools["grpo"].iloc[3].to_dict()
    bodies = dict(zip(pools["kb"]["doc_id"], pools["kb"]["body"]))
    batch_rows = sorted(set(ROWS.values()))
    out = perturbed_answers(row, REPORT, {"row": batch_rows}, bodies, VOCAB)
    assert list(out) == names
    assert not parse_answer(out.pop("unparseable"), REPORT).ok
    gold = gold_of(row, REPORT)
    for name, changed in changed_fields(out, gold, REPORT).items():
        assert changed == {name.replace("wrong_", "").replace("other_doc_", "")}, name
    fields = {name: parse_answer(text, REPORT).fields for name, text in out.items()}
    assert (
        fields["wrong_period"]["period"]
        == (dt.date.fromisoformat(gold["period"]) + dt.timedelta(days=1)).isoformat()
    )
    assert fields["wrong_row"]["row"] in batch_rows and fields["wrong_row"]["row"] != gold["row"]
    assert fields["wrong_value"]["value"] != gold["value"]


def test_a_second_declared_answer_checks_balance_on_its_own_keys():
    pools = report_pools()
    pools["sft"]["row"] = "Revenue"  # one row dominates D_sft, and held-out rows are not trained on
    res = admit(pools, p=REPORT_P, reward_fn=report_reward, schema=REPORT)
    assert res.record["verdict"] is False
    assert {"max_row_share", "distinct_rows", "row_coverage"} <= failed(res)
    with pytest.raises(ClapError) as e:
        admit(pools, p=P, schema=REPORT)  # the demo's balance keys are no keys of the report's answer
    assert e.value.rule == "bad_params" and e.value.column == "admit.max_key_share.metric"


# --------------------------------------------------------------------------- canary and the corrupted batch


def corrupt(pools: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The demo's 2026-03 corruption: answers rotated among train items of a metric, cited doc swapped into the context."""
    sft = pools["sft"].copy()
    answer = ["value", "evidence", "evidence_doc_id", "line", "shift", "date"]
    for _, idx in sft.groupby("metric").groups.items():
        idx = list(idx)
        donors = sft.loc[idx[1:] + idx[:1], answer].to_numpy()
        for i, donor in zip(idx, donors):
            own = f"D{int(sft.at[i, 'item_id'][1:]):04d}"
            sft.at[i, "context_doc_ids"] = json.dumps(
                [donor[2] if d == own else d for d in json.loads(sft.at[i, "context_doc_ids"])]
            )
        sft.loc[idx, answer] = donors
    return {**pools, "sft": sft, "grpo": sft.copy()}


def test_corrupted_labels_pass_static_admission():
    """The point of the paper: static checks passing is no proof of learnability."""
    res = admit(corrupt(make_pools()))
    assert res.record["verdict"] is True
    assert res.record["grpo"]["rank_pass_rate"] == 1.0


def test_evidence_in_context_is_recorded_as_a_diagnostic_only(clean):
    canary = clean.record["canary"]
    assert canary["evidence_in_context_rate_real"] == 1.0
    assert canary["evidence_in_context_rate_shuffled"] < 0.2
    assert not any(c["name"].startswith("evidence_in_context") for c in clean.record["checks"])


def _earlier(pools: dict[str, pd.DataFrame], take: dict[str, int]) -> pd.DataFrame:
    """An earlier batch's training pool holding copies of the first ``take[split]`` items of each split."""
    rows = pd.concat([pools[s].iloc[:n] for s, n in take.items()]).assign(split="train")
    return rows.assign(item_id="earlier-" + rows["item_id"]).reset_index(drop=True)


@pytest.mark.parametrize("warm", [True, False])
def test_items_an_earlier_batch_trained_on_are_excluded_and_counted(warm):
    """Eval and replay judge the incumbent (an earlier batch's adapter) too: they lose the seen items
    always; grpo and the probe concern the candidate alone: only a warm-started one trained on them."""
    from clap.data.admission import seen_in_training

    pools = make_pools()
    earlier = _earlier(pools, {"eval": 5, "replay": 3, "sft": 40})  # grpo's pool is the training pool
    seen = seen_in_training({"2025-12": earlier}, ANSWER)
    result = admit_batch(pools, SIZES, P, VOCAB, real_reward, "test", ANSWER, seen, warm=warm)
    excluded = result.record["seen_in_training"]["excluded"]
    assert excluded["eval"] == {"input_hash": 5, "question_answer": 0}
    assert excluded["replay"]["input_hash"] == 3
    assert result.metrics["excluded_seen_in_training_eval"] == 5
    assert (result.metrics["excluded_seen_in_training_grpo"] > 0) is warm
    probe = result.metrics["excluded_seen_in_training_probe"]
    assert probe == excluded["probe"]["input_hash"] and (probe > 0) is warm
    for name in ("grpo", "eval", "probe", "replay") if warm else ("eval", "replay"):
        assert not result.frames[name]["input_hash"].isin(seen.input_hash).any(), name
    if not warm:  # a fresh candidate's probe and grpo are drawn as if nothing were seen
        for name in ("grpo", "probe"):
            assert result.frames[name].equals(admit(pools).frames[name]), name
    # D_sft is what it was without the earlier batch: re-training on an item is no leak
    assert result.frames["sft"]["item_id"].tolist() == admit(pools).frames["sft"]["item_id"].tolist()


def test_the_same_question_reworded_with_the_same_answer_is_seen():
    from clap.data.admission import question_answer_key, seen_in_training, seen_rule

    pools = make_pools()
    earlier = _earlier(pools, {"eval": 1})
    earlier["question"] = earlier["question"].str.upper().str.rstrip("?") + " ?!"
    earlier["input_hash"] = earlier["question"].map(input_hash)
    seen = seen_in_training({"2025-12": earlier}, ANSWER)
    assert seen_rule(pools["eval"].iloc[:2], seen, ANSWER).tolist() == ["question_answer", ""]
    other_answer = pools["eval"].iloc[:1].copy()
    other_answer[ANSWER.value] = other_answer[ANSWER.value].astype(float) + 1
    assert question_answer_key(other_answer.iloc[0], ANSWER) not in seen.question_answer


def test_nothing_seen_changes_nothing(clean):
    assert all(
        clean.metrics[f"excluded_seen_in_training_{s}"] == 0 for s in ("grpo", "eval", "probe", "replay")
    )
    assert clean.record["seen_in_training"]["earlier_batches"] == []
