"""clap.model.engine on every base family its graph covers (tests/families.py): the OpenVINO graph
computes the torch model's logits through padding, dropped and reordered rows and a widened prefix,
past the sliding window; greedy generation on it is token-identical at f32, free and constrained; the
int8 graph is the model with dequantized weights; a model the graph cannot express generates on torch,
and the choice says why."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from families import FAMILIES, WINDOW, make_tiny_family

from clap.model.base import load_model, load_tokenizer
from clap.model.constrain import Constraint, Grammars
from clap.model.engine import EngineParams, OpenVINOModel, choose_engine, load_generator, model_config
from clap.model.generate import generate_batched, stop_ids
from clap.model.ov_graph import causal_lm_graph, int8_weights
from clap.task.answer import load_answer_schema
from clap.task.prompt import answer_json_schema, build_messages

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[3]
ANSWER = load_answer_schema(ROOT / "params.yaml")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """One family's tiny model (built once per module), its openvino twin and the tokenizer."""
    base = make_tiny_family(request.param, tmp_path_factory.mktemp(request.param) / "base", seed=7)
    model = load_model(base)
    return model, OpenVINOModel(model, "f32", 1), load_tokenizer(base, padding_side="left")


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


def test_logits_equal_torch_through_padding_dropped_and_reordered_rows(family):
    model, ov_model, _ = family
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, WINDOW + 4))  # longer than the window
    mask = np.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
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


def test_a_one_row_prefix_is_widened_to_every_row(family):
    model, ov_model, _ = family
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, model.config.vocab_size, WINDOW - 2).tolist()
    suffix = rng.integers(0, model.config.vocab_size, (3, 5))
    suffix_mask = np.ones((3, 5), np.int64)
    suffix_mask[2, :2] = 0
    n = len(prefix)
    positions = np.clip(n + suffix_mask.cumsum(-1) - 1, 0, None)
    mask = np.concatenate([np.ones((3, n), np.int64), suffix_mask], 1)
    got = ov_model.session(ov_model.prefix(prefix), 3).forward(*map(torch.tensor, (suffix, mask, positions)))
    full = np.concatenate([np.tile(prefix, (3, 1)), suffix], 1)
    full_positions = np.concatenate([np.tile(np.arange(n), (3, 1)), positions], 1)
    _close(got.numpy(), _torch_logits(model, full, mask, full_positions))


def _chats(n=5):
    docs = [("KB-1", "Line L1 on 2026-01-05, shift A. OEE was 81.5 %.")]
    return [build_messages(f"question {i} about line L{i}?" + " more" * i, docs, ANSWER) for i in range(n)]


def test_free_generation_is_token_identical_to_torch(family):
    model, ov_model, tok = family
    want = generate_batched(model, tok, _chats(), batch_size=3, max_new_tokens=12, desc=None)
    got = generate_batched(ov_model, tok, _chats(), batch_size=3, max_new_tokens=12, desc=None)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert len({tuple(g.token_ids) for g in want}) > 1  # answers depend on the prompt


def test_constrained_generation_is_token_identical_to_torch(family):
    model, ov_model, tok = family
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


def _dequantized(model):
    """A torch twin of the int8 graph: every matrix but the embedding table replaced by its int8 values
    times their scales; the output layer too, untied from the f32 table the lookup keeps."""
    twin = copy.deepcopy(model)

    def dequantized(w):
        q, scale = int8_weights(w.detach().numpy())
        return torch.from_numpy(q.astype(np.float32) * scale)

    table, head = twin.get_input_embeddings().weight, twin.get_output_embeddings()
    with torch.no_grad():
        head_weight = dequantized(head.weight)
        for p in twin.parameters():
            if p.ndim == 2 and p is not table:
                p.copy_(dequantized(p))
        head.weight = torch.nn.Parameter(head_weight)
    return twin


def test_the_int8_graph_computes_the_dequantized_model(family):
    import openvino as ov

    model = family[0]
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, WINDOW + 3))
    mask, positions = np.ones_like(ids), np.arange(ids.shape[1])[None].repeat(2, 0)
    compiled = ov.Core().compile_model(
        causal_lm_graph(model, "int8"),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
    )
    feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    got = compiled.create_infer_request().infer({**feed, "beam_idx": np.arange(2, dtype=np.int32)})[0][:, -1]
    _close(got, _torch_logits(_dequantized(model), ids, mask, positions))


def test_a_model_the_graph_cannot_express_generates_on_torch_and_says_why(tmp_path):
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}  # frequencies change with length
    base = make_tiny_family("llama", tmp_path / "base", seed=7, rope_parameters=dynamic)
    p = EngineParams("openvino", "f32")
    model = load_generator(base, None, p)
    assert not isinstance(model, OpenVINOModel)
    assert choose_engine(p, "cpu", model_config(base)).record() == {
        "generation_engine": "torch-f32",
        "engine_fallback": "openvino cannot build llama: rope_type dynamic (fixed frequencies only)",
    }
