"""clap.data.admission's GRPO perturbations and reward check for a value declared ``type: text``."""

from __future__ import annotations

import json

import pandas as pd
from conftest import TEXT_ANSWER

from clap.data.admission import next_different_values, perturbed_answers, reward_table
from clap.task.answer import gold_of, parse_answer_schema
from clap.task.scoring import ScoringParams, parse_answer, reward

ANSWER = parse_answer_schema(TEXT_ANSWER)
P = ScoringParams(0.001, 0.01, ANSWER)
KB = pd.DataFrame(
    {
        "doc_id": ["R-1", "R-2", "R-3"],
        "body": [
            "Contract types: Fixed Price and Time and Materials.",
            "Revenue was $1,496.5 million in 2019.",
            "The segment is called Government Services.",
        ],
    }
)
ITEMS = pd.DataFrame(
    [
        ("Q-0", "Contract type", "Contract types: Fixed Price", "Fixed Price", "none", "R-1"),
        ("Q-1", "Contract type", "Contract types: Fixed Price", "fixed price", "none", "R-1"),  # same, folded
        ("Q-2", "Revenue 2019", "Revenue was $1,496.5 million", "$1,496.5", "million", "R-2"),
        ("Q-3", "Segment", "The segment is called Government Services", "Government Services", "none", "R-3"),
    ],
    columns=["item_id", "row", "evidence", "value", "scale", "evidence_doc_id"],
).assign(context_doc_ids=json.dumps(["R-1", "R-2", "R-3"]))
BODIES = dict(zip(KB["doc_id"], KB["body"]))
DOMAIN = {"row": sorted(set(ITEMS["row"]))}


def test_the_wrong_value_is_the_next_items_different_value():
    assert next_different_values(list(ITEMS["value"])) == [
        "$1,496.5",  # Q-1 normalizes to the same text: skipped
        "$1,496.5",
        "Government Services",
        "Fixed Price",  # wraps around
    ]
    assert next_different_values(["A", "a ", "the A"]) == ["other"] * 3  # nothing differs


def test_each_text_perturbation_breaks_its_own_field():
    row = ITEMS.iloc[0].to_dict()
    out = perturbed_answers(row, ANSWER, DOMAIN, BODIES, None, "Government Services")
    assert list(out) == list(ANSWER.perturbations)
    assert not parse_answer(out.pop("unparseable"), ANSWER).ok
    gold = gold_of(row, ANSWER)
    fields = {name: parse_answer(text, ANSWER).fields for name, text in out.items()}
    for name, got in fields.items():
        changed = {k for k, v in got.items() if v != gold[k]}
        assert changed == {name.replace("wrong_", "").replace("other_doc_", "")}, name
    assert fields["wrong_value"]["value"] == "Government Services"
    assert "Fixed Price" not in fields["other_doc_evidence"]["evidence"]  # a document without the value


def test_reference_outranks_every_perturbation_under_the_text_reward():
    table = reward_table(ITEMS, KB, ANSWER, DOMAIN, None, lambda text, gold, ctx: reward(text, gold, ctx, P))
    assert list(table.columns) == ["item_id", "reference", *ANSWER.perturbations]
    assert (table["reference"] == 1.0).all()
    assert (table[list(ANSWER.perturbations)].max(axis=1) < table["reference"]).all()
