"""clap.model.memo: the base model's answers reused only where generation would give exactly them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import make_tiny_adapter, tiny_retrieval, write_tiny_admitted

from clap import io
from clap.chain.chain import ChainParams
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.judge.evaluation import EvalParams, ModelSpec, evaluate
from clap.judge.replay import LatencyParams, run_conditions
from clap.model import memo
from clap.model.base import ADAPTER_FILE
from clap.model.engine import EngineParams
from clap.model.generate import Generation
from clap.task.answer import load_answer_schema
from clap.task.scoring import ScoringParams

REPO = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(REPO / "params.yaml")
SP = ScoringParams(0.001, 0.01, ANSWER)
SPACE = answer_space(normalize_params(REPO / "params.yaml"), ANSWER)
GEN = Generation("{}", 2, 9, 1.5, 3.0, 2, 0, (5, 6))

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_key_changes_with_every_input_and_only_with_them(tmp_path):
    m = memo.Memo("a" * 64, tmp_path)
    key = m.key([["chat"]], [{"s": 1}], batch_size=2, max_new_tokens=8)
    assert key == memo.Memo("a" * 64, tmp_path / "elsewhere").key(
        [["chat"]], [{"s": 1}], batch_size=2, max_new_tokens=8
    )
    others = [
        memo.Memo("b" * 64, tmp_path).key([["chat"]], [{"s": 1}], batch_size=2, max_new_tokens=8),
        m.key([["chat", "x"]], [{"s": 1}], batch_size=2, max_new_tokens=8),
        m.key([["chat"]], [{"s": 2}], batch_size=2, max_new_tokens=8),
        m.key([["chat"]], None, batch_size=2, max_new_tokens=8),
        m.key([["chat"]], [{"s": 1}], batch_size=4, max_new_tokens=8),
        m.key([["chat"]], [{"s": 1}], batch_size=2, max_new_tokens=9),
    ]
    assert len({key, *others}) == 1 + len(others)


def test_saved_answers_load_back_equal_and_the_log_says_which(tmp_path):
    m = memo.Memo("a" * 64, tmp_path)
    key = m.key(["c"], None)
    assert m.load(key, "base") is None and not m.log
    m.save(key, [GEN], {"free_rate": 0.5}, "base")
    assert m.log == {"base_answers_memo": f"generated {key}"}
    gens, extra = m.load(key, "base")
    assert gens == [GEN] and extra == {"free_rate": 0.5}
    assert m.log == {"base_answers_memo": f"reused {key}"}


def test_a_file_that_is_not_its_key_is_a_miss(tmp_path):
    m = memo.Memo("a" * 64, tmp_path)
    k1, k2 = m.key(["one"], None), m.key(["two"], None)
    m.save(k1, [GEN])
    shutil.copy(tmp_path / f"{k1}.json", tmp_path / f"{k2}.json")
    assert m.load(k2) is None


def test_identity_covers_the_model_files_engine_and_threads(tiny_base, tmp_path):
    import torch

    before = memo.base_memo(tiny_base, "openvino-f32", "cpu").identity
    assert memo.base_memo(tiny_base, "openvino-f32", "cpu").identity == before
    assert memo.base_memo(tiny_base, "torch-f32", "cpu").identity != before
    copy = tmp_path / "base"
    shutil.copytree(tiny_base, copy)
    assert memo.base_memo(copy, "openvino-f32", "cpu").identity == before  # the bytes, not the path
    (copy / "generation_config.json").write_text('{"eos_token_id": 2}')
    assert memo.base_memo(copy, "openvino-f32", "cpu").identity != before
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert memo.base_memo(tiny_base, "openvino-f32", "cpu").identity != before
    finally:
        torch.set_num_threads(threads)
    assert memo.base_memo(tiny_base, "torch-bf16", "cuda") is None  # CUDA: no byte-identical re-run


@pytest.fixture(scope="module")
def admitted(tmp_path_factory):
    return write_tiny_admitted(
        tmp_path_factory.mktemp("memo") / "admitted" / "2026-01", n_sft=4, n_probe=5, seed=3
    )


def _evaluate(tiny_base, admitted, specs):
    p = EvalParams(
        batch_size=2,
        max_new_tokens=6,
        decoding="constrained",
        free_diagnostic_items=2,
        answer_metric="none",
        engine=EngineParams("openvino", "f32"),
    )
    items, kb = io.read_parquet(admitted / "eval.parquet"), io.read_parquet(admitted / "kb.parquet")
    return evaluate(specs, tiny_base, items, kb, p, SP, SPACE)


def test_eval_reuses_the_base_answers_exactly_as_generation_gives_them(
    tiny_base, admitted, tmp_path, monkeypatch
):
    adapter = tmp_path / "adapters" / "2026-01"
    make_tiny_adapter(tiny_base, adapter, seed=1)
    specs = [
        ModelSpec("base", None, "", ""),
        ModelSpec("candidate", str(adapter), io.sha256_file(Path(adapter) / ADAPTER_FILE), "2026-01"),
    ]
    first, _, d1 = _evaluate(tiny_base, admitted, specs)
    assert d1["base_answers_memo"].startswith("generated ") and "candidate_answers_memo" not in d1

    def no_base_load(base_dir, adapter_dir, p):
        assert adapter_dir is not None, "the base model was loaded although its answers were kept"
        return real(base_dir, adapter_dir, p)

    from clap.model import engine

    real = engine.load_generator
    monkeypatch.setattr(engine, "load_generator", no_base_load)
    second, _, d2 = _evaluate(tiny_base, admitted, specs)
    assert d2["base_answers_memo"] == d1["base_answers_memo"].replace("generated", "reused")
    assert d2["base_free_parse_rate"] == d1["base_free_parse_rate"]
    assert second.equals(first)
    monkeypatch.setattr(engine, "load_generator", real)
    monkeypatch.setattr(memo, "MEMO_DIR", tmp_path / "empty")  # nothing kept: generated again, the same
    third, _, d3 = _evaluate(tiny_base, admitted, specs)
    assert d3["base_answers_memo"] == d1["base_answers_memo"] and third.equals(first)


def test_changed_requests_are_generated_not_reused(tiny_base, admitted):
    base = [ModelSpec("base", None, "", "")]
    _, _, d1 = _evaluate(tiny_base, admitted, base)
    items = io.read_parquet(admitted / "eval.parquet")
    fewer = admitted.parent / "fewer"
    shutil.copytree(admitted, fewer)
    io.write_parquet(fewer / "eval.parquet", items.iloc[:-1])
    _, _, d2 = _evaluate(tiny_base, fewer, base)
    assert (
        d2["base_answers_memo"].startswith("generated ")
        and d2["base_answers_memo"] != d1["base_answers_memo"]
    )


def test_replay_reuses_the_base_conditions_and_times_requests_anew(tiny_base, admitted, tmp_path):
    cp = ChainParams(
        top_k=1,
        max_new_tokens=6,
        decoding="constrained",
        engine=EngineParams("openvino", "f32"),
        retrieval=tiny_retrieval(),
    )
    rp = EvalParams(2, 6, "constrained", 0, "none", EngineParams("openvino", "f32"))
    lp = LatencyParams(requests=2, warmup=1, seed=1)
    items, kb = io.read_parquet(admitted / "replay.parquet"), io.read_parquet(admitted / "kb.parquet")
    log1: dict[str, str] = {}
    a1, r1 = run_conditions(items, kb, tiny_base, None, cp, rp, lp, SPACE, log1)
    log2: dict[str, str] = {}
    a2, r2 = run_conditions(items, kb, tiny_base, None, cp, rp, lp, SPACE, log2)
    assert sorted(log1) == ["A_answers_memo", "C_answers_memo"]
    assert all(v.startswith("generated ") for v in log1.values())
    assert log2 == {k: v.replace("generated", "reused") for k, v in log1.items()}
    assert [x.generation for x in a2["A"]] == [x.generation for x in a1["A"]]
    assert [x.parsed for x in a2["C"]] == [x.parsed for x in a1["C"]]
    assert len(r2) == len(r1) and not r2["request_ms"].equals(r1["request_ms"])  # timed again, never kept
