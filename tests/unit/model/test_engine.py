"""clap.model.engine: the OpenVINO graph computes the torch model's logits (padding, dropped and
reordered rows, a widened prefix), so generation on it is token-identical at f32, free and
constrained; what it cannot express is refused; params are checked."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import scramble_weights

from clap.errors import ClapError
from clap.model.base import load_model, load_tokenizer
from clap.model.constrain import Constraint, Grammars
from clap.model.engine import (
    EngineParams,
    OpenVINOModel,
    choose_engine,
    engine_label,
    load_generator,
    resolve_engine,
)
from clap.model.generate import generate_batched, stop_ids
from clap.model.ov_graph import causal_lm_graph, int8_weights, unsupported
from clap.task.answer import load_answer_schema
from clap.task.prompt import answer_json_schema, build_messages

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")


@pytest.fixture(scope="module")
def pair(tiny_base):
    """The tiny model with larger random weights (answers depend on the whole prompt) and its openvino twin."""
    model = scramble_weights(load_model(tiny_base), seed=1)
    return model, OpenVINOModel(model, "f32", 1), load_tokenizer(tiny_base, padding_side="left")


def _torch_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions),
        )
    return out.logits[:, -1].numpy()


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))


def test_logits_equal_torch_through_padding_dropped_and_reordered_rows(pair):
    model, ov_model, _ = pair
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, :4] = 0  # a left-padded row
    positions = np.clip(mask.cumsum(-1) - 1, 0, None)
    state = ov_model.session(None, 3)
    _close(
        state.forward(*map(torch.tensor, (ids, mask, positions))).numpy(),
        _torch_logits(model, ids, mask, positions),
    )
    for keep in ([2, 0, 1], [1, 2], [1]):  # reorder, then drop rows: the kept keys/values follow
        ids, mask, positions = ids[keep], mask[keep], positions[keep]
        nxt = rng.integers(0, model.config.vocab_size, (len(keep), 2))
        step_mask = np.ones((len(keep), 2), np.int64)
        step_pos = positions[:, -1:] + np.arange(1, 3)
        state.select(keep)
        got = state.forward(*map(torch.tensor, (nxt, np.concatenate([mask, step_mask], 1), step_pos))).numpy()
        ids, mask = np.concatenate([ids, nxt], 1), np.concatenate([mask, step_mask], 1)
        positions = np.concatenate([positions, step_pos], 1)
        _close(got, _torch_logits(model, ids, mask, positions))


def test_a_one_row_prefix_is_widened_to_every_row(pair):
    model, ov_model, _ = pair
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, model.config.vocab_size, 5).tolist()
    suffix = rng.integers(0, model.config.vocab_size, (3, 4))
    suffix_mask = np.ones((3, 4), np.int64)
    suffix_mask[2, :2] = 0
    positions = np.clip(5 + suffix_mask.cumsum(-1) - 1, 0, None)
    mask = np.concatenate([np.ones((3, 5), np.int64), suffix_mask], 1)
    state = ov_model.session(ov_model.prefix(prefix), 3)
    got = state.forward(*map(torch.tensor, (suffix, mask, positions))).numpy()
    full = np.concatenate([np.tile(prefix, (3, 1)), suffix], 1)
    full_positions = np.concatenate([np.tile(np.arange(5), (3, 1)), positions], 1)
    _close(got, _torch_logits(model, full, mask, full_positions))


def test_every_session_starts_from_the_same_kept_prefix(pair):
    """The prefix runs once; each session copies its keys/values, so a session in between (other rows,
    other tokens) changes nothing for the next one, bit for bit."""
    model, ov_model, _ = pair
    rng = np.random.default_rng(2)
    kept = ov_model.prefix(rng.integers(0, model.config.vocab_size, 5).tolist())
    before = {k: v.copy() for k, v in kept.items()}
    suffix = torch.tensor(rng.integers(0, model.config.vocab_size, (3, 4)))
    mask, positions = torch.ones(3, 9, dtype=torch.long), torch.arange(5, 9).expand(3, -1)
    first = ov_model.session(kept, 3).forward(suffix, mask, positions).numpy()
    other = ov_model.session(kept, 2)
    other.forward(suffix[:2, :2], mask[:2, :7], positions[:2, :2])
    other.forward(suffix[:2, 2:3], mask[:2, :8], positions[:2, 2:3])
    again = ov_model.session(kept, 3).forward(suffix, mask, positions).numpy()
    assert np.array_equal(first, again)
    assert all(np.array_equal(kept[k], before[k]) for k in before)


def _chats(n=5):
    docs = [("KB-1", "Line L1 on 2026-01-05, shift A. OEE was 81.5 %.")]
    return [build_messages(f"question {i} about line L{i}?" + " more" * i, docs, ANSWER) for i in range(n)]


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_free_generation_is_token_identical_to_torch(pair, batch_size):
    model, ov_model, tok = pair
    want = generate_batched(model, tok, _chats(), batch_size=batch_size, max_new_tokens=12, desc=None)
    got = generate_batched(ov_model, tok, _chats(), batch_size=batch_size, max_new_tokens=12, desc=None)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.text for g in got] == [g.text for g in want]


def test_constrained_generation_is_token_identical_to_torch(pair):
    model, ov_model, tok = pair
    grammars = Grammars(tok, model.config.vocab_size, stop_ids(model, tok))
    schema = answer_json_schema(
        ANSWER,
        {"metric": ["oee", "scrap_count"], "line": ["L1", "L2"], "shift": ["A", "B"], "unit": ["%", "pcs"]},
        ["Line L1 on 2026-01-05, shift A", "OEE was 81.5 %"],
        {"oee": "%", "scrap_count": "pcs"},
        ["2026-01-05"],
    )
    constraint = Constraint(grammars, [grammars.compile(schema)] * 5)
    runs = [
        generate_batched(m, tok, _chats(), batch_size=3, max_new_tokens=200, desc=None, constraint=constraint)
        for m in (model, ov_model)
    ]
    assert [g.token_ids for g in runs[1]] == [g.token_ids for g in runs[0]]


def test_bf16_is_a_separate_precision_that_still_generates(pair):
    model, _, tok = pair
    bf16 = OpenVINOModel(model, "bf16", 1)
    gens = generate_batched(bf16, tok, _chats(2), batch_size=2, max_new_tokens=5, desc=None)
    assert all(1 <= g.new_tokens <= 5 for g in gens)


def test_int8_weights_are_symmetric_per_output_channel():
    w = np.random.default_rng(3).normal(size=(5, 7)).astype(np.float32)
    w[2] = 0.0  # an all-zero channel
    q, scale = int8_weights(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (5, 1)
    assert np.abs(q).max(axis=1).tolist() == [
        127,
        127,
        0,
        127,
        127,
    ]  # each channel's largest magnitude at 127
    assert np.all(np.abs(q.astype(np.float32) * scale - w) <= scale / 2 + 1e-7)  # round to nearest
    assert np.array_equal(np.sign(q), np.sign(w).astype(np.int8))


def _dequantized(model):
    """An independent torch twin of the int8 graph: every projection and the output layer replaced by its
    int8 values times their scales, the embedding lookup left at f32 (so the tied output layer is untied)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if p.ndim == 2 and "embed_tokens" not in name:
                q, scale = int8_weights(p.numpy())
                p.copy_(torch.from_numpy(q.astype(np.float32) * scale))
        q, scale = int8_weights(twin.get_input_embeddings().weight.numpy())
        twin.lm_head.weight = torch.nn.Parameter(torch.from_numpy(q.astype(np.float32) * scale))
    return twin


def _ids(model, rows=3, length=9):
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (rows, length))
    return ids, np.ones_like(ids), np.arange(length)[None].repeat(rows, 0)


def test_the_int8_graph_computes_the_dequantized_model(pair):
    """With the plugin's on-the-fly activation quantization off, the int8 graph is the f32 model with
    dequantized weights (float rounding): the quantization is all in the weights, as stated."""
    import openvino as ov

    model = pair[0]
    ids, mask, positions = _ids(model)
    compiled = ov.Core().compile_model(
        causal_lm_graph(model, "int8"),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
    )
    feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    got = compiled.create_infer_request().infer({**feed, "beam_idx": np.arange(3, dtype=np.int32)})[0][:, -1]
    _close(got, _torch_logits(_dequantized(model), ids, mask, positions))


def test_int8_keeps_the_weights_int8_and_stays_near_the_dequantized_model(pair):
    """The engine's int8: weights kept int8 by the CPU plugin, activations quantized per group of 32 on the
    fly (its default): logits within a few percent of the dequantized model's (2.3 % of the largest on this
    model), not equal to them; a different precision, generated from like the others."""
    model, _, tok = pair
    int8 = OpenVINOModel(model, "int8", 1)
    assert int8._compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == 32
    runtime = int8._compiled.get_runtime_model()
    products = [
        op for op in runtime.get_ops() if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
    ]
    assert products and all(
        any(i.get_element_type().get_type_name() == "i8" for i in op.inputs()) for op in products
    )
    ids, mask, positions = _ids(model)
    got = int8.session(None, 3).forward(*map(torch.tensor, (ids, mask, positions))).numpy()
    want = _torch_logits(_dequantized(model), ids, mask, positions)
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    gens = generate_batched(int8, tok, _chats(2), batch_size=2, max_new_tokens=5, desc=None)
    assert all(1 <= g.new_tokens <= 5 for g in gens)


def test_load_generator_merges_the_adapter_then_compiles(tiny_base, monkeypatch):
    ov_model = load_generator(tiny_base, None, EngineParams("openvino", "f32"))
    assert isinstance(ov_model, OpenVINOModel) and ov_model.precision == "f32"
    assert not isinstance(load_generator(tiny_base, None, EngineParams("torch", "f32")), OpenVINOModel)
    monkeypatch.setattr(
        "clap.model.base.default_device", lambda: "cuda"
    )  # openvino compiles for the CPU only
    torch_model = SimpleNamespace(config=None)
    monkeypatch.setattr("clap.model.base.load_model", lambda *a: torch_model)
    assert load_generator(tiny_base, None, EngineParams("openvino", "f32")) is torch_model


@pytest.mark.parametrize(
    "change, why",
    [
        ({"model_type": "gpt_neox"}, "model_type 'gpt_neox'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            "rope_type dynamic",
        ),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type longrope"),
        ({"rope_parameters": {"rope_type": "not-a-rope", "rope_theta": 1e4}}, "rope_type not-a-rope"),
    ],
)
def test_a_model_the_graph_cannot_express_is_refused(pair, change, why):
    config = copy.deepcopy(pair[0].config)
    for key, value in change.items():
        setattr(config, key, value)
    assert why in unsupported(config)
    with pytest.raises(ClapError, match=why) as err:
        causal_lm_graph(SimpleNamespace(config=config))  # refused before any weight is read
    assert err.value.rule == "engine_unsupported"
    choice = choose_engine(EngineParams("openvino", "int8"), "cpu", config)
    assert (choice.name, choice.label) == ("torch", "torch-f32") and why in choice.fallback


def test_engine_params_are_checked():
    with pytest.raises(ClapError, match="chain.engine.name"):
        EngineParams("llamacpp", "f32")
    with pytest.raises(ClapError, match="chain.engine.precision"):
        EngineParams("openvino", "int4")
    for precision in ("bf16", "int8"):
        with pytest.raises(ClapError, match="openvino engine only"):
            EngineParams("torch", precision)


@pytest.mark.parametrize(
    "name, precision, device, engine, label, fallback",
    [
        ("openvino", "f32", "cpu", "openvino", "openvino-f32", ""),
        ("openvino", "bf16", "cpu", "openvino", "openvino-bf16", ""),
        ("openvino", "int8", "cpu", "openvino", "openvino-int8", ""),
        ("openvino", "f32", "cuda", "torch", "torch-bf16", "openvino compiles for the CPU only, not cuda"),
        ("torch", "f32", "cpu", "torch", "torch-f32", ""),
    ],
)
def test_resolved_engine_and_its_label(pair, name, precision, device, engine, label, fallback):
    p, config = EngineParams(name, precision), pair[0].config
    assert resolve_engine(p, device, config) == engine and engine_label(p, device, config) == label
    assert choose_engine(p, device, config).record() == {
        "generation_engine": label,
        "engine_fallback": fallback,
    }


@pytest.mark.parametrize("engine", ["torch", "openvino"])
def test_logits_of_chosen_rows_are_those_rows_of_every_rows_logits(pair, engine):
    """Greedy decoding asks only the rows that choose next for logits: the same numbers in that order. On torch
    within float rounding: the matrix product's kernel depends on how many rows it multiplies, as it already
    did when finished rows leave the batch."""
    from clap.model.engine import TorchSession

    model, ov_model, _ = pair
    rng = np.random.default_rng(2)
    ids = torch.tensor(rng.integers(0, model.config.vocab_size, (4, 6)))
    mask, positions = torch.ones((4, 6), dtype=torch.long), torch.arange(6).repeat(4, 1)

    def session():
        return TorchSession(model, None, 4, 8) if engine == "torch" else ov_model.session(None, 4)

    with torch.inference_mode():
        every = session().forward(ids, mask, positions)
        for rows in ([3, 1], [2], []):
            got = session().forward(ids, mask, positions, rows)
            assert got.shape == (len(rows), model.config.vocab_size)
            if engine == "openvino":
                assert torch.equal(got, every[rows])
            torch.testing.assert_close(got, every[rows], rtol=1e-5, atol=1e-5)
        hooks = model.get_output_embeddings()._forward_pre_hooks
        assert not hooks  # the row selection does not outlive its call
