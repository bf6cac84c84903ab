"""A third company, declared end to end: its exports (xlsx facts, parquet documents, a nested JSON
question export), its own key fields (a measure from a vocabulary, a site and a period as text, a
currency unit) go through assetize -> normalize -> admit with no code change, and the admitted data
passes the schemas built from that declaration."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from clap.data import assetize as A
from clap.data.admission import AdmitParams, SplitSizes, admit_batch
from clap.data.normalize import NormalizeParams, build_vocab, normalize_batch
from clap.task.scoring import ScoringParams, reward
from schemas.admitted import admitted_items, admitted_kb
from schemas.normalized import normalized_schemas, validate_frame
from tests.unit.data.test_sources import THIRD, THIRD_ANSWER, params

SITES = ["Hamburg", "Bremen", "Kiel", "Lübeck", "Rostock", "Emden"]
PERIODS = ["2026-Q1", "2026-Q2", "2026-Q3", "2026-Q4"]
MEASURES = {
    "Revenue": "revenue",
    "Net Sales": "revenue",
    "Opex": "operating_cost",
    "Operating cost": "operating_cost",
}

NORMALIZE = NormalizeParams(
    keys={
        "measure": {
            "kind": "vocabulary",
            "strip_value_affixes": False,
            "words": {
                "revenue": {"unit": "EUR", "labels": ["net sales", "sales"]},
                "operating_cost": {"unit": "EUR", "labels": ["opex", "operating cost"]},
            },
        },
        "site": {"kind": "text"},
        "period": {"kind": "text"},
    },
    units={"EUR": ["EUR", 1], "€": ["EUR", 1], "TEUR": ["EUR", 1000]},
    date_formats=["%Y-%m-%d"],
    evidence="given",
    value_decimals=6,
    value_rel_tol=1e-6,
    value_abs_tol=1e-9,
    duplicate_system_priority=["erp"],
    answer=THIRD_ANSWER,
)
ADMIT = AdmitParams(
    seed=7,
    min_sizes=SplitSizes(sft=16, grpo=6, eval=8, probe=4, replay=4),
    max_key_share={"measure": 0.8},
    min_distinct={"site": 4},
    min_coverage={"measure": 1.0},
    min_evidence_verifiable_rate=1.0,
    min_rank_pass_rate=1.0,
    min_reward_margin=0.15,
    min_reward_variance=0.0,
    min_label_shuffle_changed=0.5,
)
SIZES = SplitSizes(sft=20, grpo=8, eval=10, probe=5, replay=5)  # 28 train items: D_sft, then the probe


def write_company(batch: Path) -> int:
    """48 facts (6 sites x 4 periods x 2 measures), a document each, a question each; returns the raw rows."""
    from openpyxl import Workbook

    (batch / "erp").mkdir(parents=True)
    wb = Workbook()
    ws = wb.active
    ws.title = "Facts"
    ws.append(["Fact No", "Site", "Period", "Measure", "Amount", "Currency", "Comment"])
    docs, items = [], []
    labels = list(MEASURES)
    for i, (site, period, k) in enumerate((s, p, k) for s in SITES for p in PERIODS for k in range(2)):
        label = labels[(i + k) % len(labels)]
        amount = f"{1000 + 37 * i},{i % 10}"  # decimal comma, as the sheet is declared
        fid = f"F-{i}"
        ws.append([fid, site, period, label, amount, "TEUR" if i % 7 == 0 else "EUR", None])
        quote = f"{site} booked {label.lower()} of {amount} {'TEUR' if i % 7 == 0 else 'EUR'} in {period}"
        docs.append((f"D-{fid}", fid, site, quote + "."))
        split = ["train", "train", "train", "eval", "replay"][i % 5] if i < 40 else ["eval", "train"][i % 2]
        items.append({
            "ref": f"X-{i}", "use": split, "q": {"text": f"{label} of {site} in {period}?"}, "cites": [f"D-{fid}"],
            "a": {"measure": label, "amount": amount, "currency": "TEUR" if i % 7 == 0 else "EUR", "site": site,
                  "period": period, "quote": quote, "fact": fid},
        })  # fmt: skip
    wb.save(batch / "erp" / "facts.xlsx")
    keys, facts, heads, bodies = zip(*docs)
    table = pa.table(
        {"key": list(keys), "fact": list(facts), "heading": list(heads), "content": list(bodies)}
    )
    pq.write_table(table, batch / "docs.parquet")
    (batch / "questions.json").write_text(json.dumps({"data": {"items": items}}), encoding="utf-8")
    return 3 * len(docs)


def test_a_third_company_goes_through_assetize_normalize_admit_with_no_code(tmp_path):
    rows = write_company(tmp_path / "b")
    assetized = A.assetize_batch(tmp_path / "b", params(THIRD), THIRD_ANSWER)
    m = A.batch_metrics(assetized)
    assert m["conservation_ok"] and m["rows_in"] == rows and m["rows_rejected"] == 0

    result = normalize_batch(assetized.assets, NORMALIZE)
    vocab = build_vocab(NORMALIZE)
    frames = {**result.frames, "rejects": result.rejects}
    for name, df in frames.items():
        validate_frame(normalized_schemas(vocab)[name], df, f"{name}.parquet")
    sft = result.frames["sft"]
    assert set(sft["measure"]) == {"revenue", "operating_cost"}  # "Net Sales" and "Opex" canonicalized
    assert set(sft.columns) >= {"measure", "site", "period", "value", "unit"} and "line" not in sft.columns
    teur = sft[sft["item_id"] == "X-0"].iloc[0]
    assert (teur["unit"], teur["value"]) == ("EUR", 1000000.0)  # 1000,0 TEUR -> EUR x1000
    kb = result.frames["kb"].set_index("doc_id")
    assert kb.loc["D-F-1", "site"] == "Hamburg"  # the document carries its record's keys
    assert result.metrics["total_rejected"] == 0

    sp = ScoringParams(0.001, 0.01, THIRD_ANSWER)
    pools = {n: result.frames[n] for n in ("sft", "grpo", "eval", "replay", "kb")}
    adm = admit_batch(pools, SIZES, ADMIT, vocab, lambda t, g, c: reward(t, g, c, sp), "third", THIRD_ANSWER)
    assert adm.record["verdict"] is True, adm.record["reasons"]
    assert {n: len(df) for n, df in adm.frames.items() if n != "kb"} == {
        "sft": 20, "grpo": 8, "eval": 10, "probe": 5, "replay": 5,
    }  # fmt: skip
    for name, df in adm.frames.items():
        validate_frame(admitted_kb(vocab) if name == "kb" else admitted_items(vocab), df, f"{name}.parquet")
    checks = {c["name"] for c in adm.record["checks"]}
    assert {"max_measure_share", "distinct_sites", "measure_coverage"} <= checks
    assert {"wrong_measure", "wrong_site", "wrong_period", "wrong_value"} <= set(THIRD_ANSWER.perturbations)
