"""The canary: routing, the request log, the sequential test's error rates (simulated through analyze),
and a canary served over real HTTP beside its incumbent, rolled back when worse, promoted when better."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import numpy as np
import pytest

from clap.chain.chain import ChainAnswer, Retrieved
from clap.chain.serve import CanaryRoute, Served, ServeParams, create_app, serving
from clap.errors import ClapError
from clap.model.generate import Generation
from clap.release import canary as C
from clap.task.scoring import parse_answer, reference_free_checks, scoring_params

REPO = Path(__file__).resolve().parents[3]
P = C.CanaryParams(
    fraction=0.2,
    seed=0,
    log="logs/canary.jsonl",
    alpha=0.05,
    max_ratio=1.5,
    max_requests=10**6,
    watch_every=0,
)


def _rows(
    p_incumbent: float, p_canary: float, n: int, rng: random.Random, p: C.CanaryParams = P
) -> list[dict]:
    """A log of ``n`` requests routed as serve routes them, each failing with its arm's rate."""
    rows, seed = [], rng.randrange(2**31)
    for i in range(n):
        arm = "canary" if C.routes_to_canary(seed, i, p.fraction) else "incumbent"
        failed = rng.random() < (p_canary if arm == "canary" else p_incumbent)
        rows.append(
            {
                "n": i,
                "arm": arm,
                "failed": failed,
                "batch": arm,
                "latency_ms": 1.0,
                "parse_ok": True,
                "evidence_verbatim": not failed,
                "value_in_evidence": True,
            }
        )
    return rows


def test_routing_is_seeded_and_takes_the_fraction():
    draws = [C.routes_to_canary(7, n, 0.2) for n in range(20000)]
    assert draws == [C.routes_to_canary(7, n, 0.2) for n in range(20000)]
    assert abs(np.mean(draws) - 0.2) < 4 * np.sqrt(0.2 * 0.8 / 20000)
    assert draws != [C.routes_to_canary(8, n, 0.2) for n in range(20000)]
    assert not any(C.routes_to_canary(7, n, 0.0) for n in range(1000))


def test_e_process_equals_a_direct_product_of_bets():
    rng = np.random.default_rng(3)
    x = (rng.random(200) < 0.35).astype(int)
    for p0, upper in ((0.2, True), (0.6, False)):
        expected = []
        wealth = [1.0] * len(C.STAKES)
        for xi in x:
            for k, c in enumerate(C.STAKES):
                lam = c / p0 if upper else c / (1 - p0)
                wealth[k] *= 1 + lam * ((xi - p0) if upper else (p0 - xi))
            expected.append(sum(wealth) / len(wealth))
        assert np.allclose(C.e_process(x, p0, upper), expected, rtol=1e-9)


@pytest.mark.parametrize(
    ("p_incumbent", "ratio", "wrong"),
    [(0.2, 1.0, "rollback"), (0.05, 1.0, "rollback"), (0.2, 1.5, "promote"), (0.1, 1.5, "promote")],
    ids=["equal-rollback", "equal-rare-rollback", "margin-promote", "margin-rare-promote"],
)
def test_a_true_null_is_rejected_at_most_alpha_of_the_time(p_incumbent, ratio, wrong):
    """Ville's bound through the real analysis: with the canary exactly as bad as the null allows, the
    wrong verdict (rollback for an equal canary, promote for one max_ratio x as bad) comes at most alpha."""
    rng, runs = random.Random(11), 300
    wrongs = sum(
        C.analyze(_rows(p_incumbent, p_incumbent * ratio, 1500, rng), P)["decision"] == wrong
        for _ in range(runs)
    )
    assert wrongs / runs <= P.alpha, f"{wrongs}/{runs} wrong {wrong} verdicts"


@pytest.mark.parametrize(
    ("p_incumbent", "p_canary", "expected"),
    [(0.1, 0.5, "rollback"), (0.4, 0.05, "promote")],
    ids=["worse", "better"],
)
def test_a_clear_difference_is_decided_within_a_thousand_requests(p_incumbent, p_canary, expected):
    rng = random.Random(5)
    decisions = [C.analyze(_rows(p_incumbent, p_canary, 1000, rng), P) for _ in range(100)]
    assert sum(d["decision"] == expected for d in decisions) >= 95
    assert all(d["decided_at_request"] is not None for d in decisions if d["decision"] == expected)


def test_no_decision_by_max_requests_is_an_inconclusive_rollback():
    p = C.CanaryParams(**{**P.__dict__, "max_requests": 50})
    rows = [
        {
            "n": i,
            "arm": "incumbent" if i % 5 else "canary",
            "failed": False,
            "batch": "x",
            "latency_ms": 1.0,
            "parse_ok": True,
            "evidence_verbatim": True,
            "value_in_evidence": True,
        }
        for i in range(50)
    ]
    out = C.analyze(rows, p)
    assert out["decision"] == "rollback" and "inconclusive" in out["reason"]
    assert C.analyze(rows[:49], p)["decision"] == "continue"


def test_params_are_checked():
    with pytest.raises(ClapError, match="serve.canary"):
        C.CanaryParams(**{**P.__dict__, "max_ratio": 1.0})
    with pytest.raises(ClapError, match="no request was routed"):
        C.analyze([], C.CanaryParams(**{**P.__dict__, "fraction": 0.0}))


def _log_line(n: int, sha: str = "c" * 64, **extra) -> str:
    row = C.log_row(
        n,
        "canary",
        "b",
        sha,
        1.0,
        {"parse_ok": True, "evidence_verbatim": True, "value_in_evidence": True, "ok": True},
    )
    return json.dumps({**row, "canary_sha256": sha, **extra}) + "\n"


def test_read_log_keeps_this_canarys_rows_and_refuses_gaps_and_bad_lines(tmp_path):
    log = tmp_path / "canary.jsonl"
    log.write_text(_log_line(0) + _log_line(0, "d" * 64) + _log_line(1))
    assert [r["n"] for r in C.read_log(log, "c" * 64)] == [0, 1]
    log.write_text(_log_line(0) + _log_line(2))
    with pytest.raises(ClapError, match="not numbered") as e:
        C.read_log(log, "c" * 64)
    assert e.value.rule == "bad_canary_log"
    log.write_text(_log_line(0) + "{not json\n")
    with pytest.raises(ClapError) as e:
        C.read_log(log, "c" * 64)
    assert (e.value.row, e.value.rule) == (2, "bad_canary_log")
    log.write_text(json.dumps({"n": 0}) + "\n")
    with pytest.raises(ClapError, match="missing"):
        C.read_log(log, "c" * 64)


# ---------------------------------------------------------------- over HTTP, with chains of known quality

SCORING = scoring_params(REPO / "params.yaml")
DOC = ("doc-1", "Invoice 17 was paid on 2026-01-05 for 1250.00 EUR.")


class FakeChain:
    """A chain whose answer quotes its retrieved document (a good answer) or quotes text the context does
    not hold (a failed reference-free check), with a seeded failure rate."""

    def __init__(self, fail_rate: float, seed: int):
        self.fail_rate, self.rng = fail_rate, random.Random(seed)
        self.index, self.p = None, type("P", (), {"top_k": 1})()

    def answer(self, questions, *, rag, batch_size):
        bad = self.rng.random() < self.fail_rate
        quote = "paid on 2026-01-06 for 990.00 EUR" if bad else DOC[1]
        fields = {SCORING.answer.value: 1250.0, SCORING.answer.evidence: quote}
        text = json.dumps(fields)
        gen = Generation(text, 10, 20, 5.0, 5.0, 1, 0, ())
        return [
            ChainAnswer(q, True, Retrieved((DOC,), 0.1), DOC[1], gen, parse_answer(text, SCORING.answer))
            for q in questions
        ]


def test_reference_free_checks_of_the_fake_answers():
    good, bad = (
        FakeChain(0.0, 0).answer(["q"], rag=True, batch_size=1)[0],
        FakeChain(1.0, 0).answer(["q"], rag=True, batch_size=1)[0],
    )
    assert reference_free_checks(good.parsed, good.context, SCORING)["ok"]
    assert reference_free_checks(bad.parsed, bad.context, SCORING) == {
        "parse_ok": True,
        "evidence_verbatim": False,
        "value_in_evidence": False,
        "ok": False,
    }


def _served(batch, sha, decision):
    return Served("adapter", batch, "b2", sha, "0" * 64, decision, f"appr-{batch}", batch)


@pytest.mark.parametrize(
    ("canary_fail", "expected"), [(0.6, "rollback"), (0.02, "promote")], ids=["worse-canary", "better-canary"]
)
def test_a_canary_over_http_is_logged_per_arm_and_decided(tmp_path, canary_fail, expected):
    p = C.CanaryParams(
        fraction=0.3,
        seed=1,
        log="logs/canary.jsonl",
        alpha=0.05,
        max_ratio=1.5,
        max_requests=2000,
        watch_every=0,
    )
    sp = ServeParams("127.0.0.1", 0, "refuse", 200, p)
    canary_sha = "c" * 64
    route = CanaryRoute(
        FakeChain(0.25, 2),
        _served("b1", "a" * 64, "promote"),
        p,
        C.RequestLog(tmp_path / p.log, canary_sha),
        SCORING,
    )
    app = create_app(FakeChain(canary_fail, 3), _served("b2", canary_sha, "canary"), sp, route)
    arms = []
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").json()["canary"]["incumbent"]["batch"] == "b1"
        for i in range(300):
            body = client.post("/answer", json={"question": f"when was invoice {i} paid?"}).json()
            arms.append((body["arm"], body["batch"]))
            if (
                i % 20 == 19
                and C.analyze(C.read_log(tmp_path / p.log, canary_sha), p)["decision"] != "continue"
            ):
                break
    rows = C.read_log(tmp_path / p.log, canary_sha)
    assert [(r["arm"], r["batch"]) for r in rows] == arms
    assert [r["arm"] == "canary" for r in rows] == [C.routes_to_canary(1, n, 0.3) for n in range(len(rows))]
    rec = C.report(
        {"batch": "b2", "adapter_sha256": canary_sha, "approval_id": "appr-b2"}, tmp_path / p.log, rows, p
    )
    assert rec["decision"] == expected, rec
    assert f"# canary b2: {expected}" in C.render(rec)
