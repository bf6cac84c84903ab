"""A base given as a folder holding one GGUF file, for each family transformers reads from GGUF: the exported
base computes what the model written into the file computes (issue 59).

Each tiny model is written the way llama.cpp writes its family (tests/gguf_writer.py), exported by
``export_base`` and loaded back by ``load_model``. Where transformers cannot load a family's file, the case
is a strict xfail that says what transformers does wrong, so that a fix upstream shows up here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_writer import tiny_model, tokenizer_size, write_gguf

from clap import params
from clap.model.base import BaseParams, export_base, load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROOT = Path(__file__).resolve().parents[3]
PLAIN = params.load(ROOT / "params.yaml")["base"]["plain_chat_template"]

CASES = [
    pytest.param("llama", {}, id="llama"),
    pytest.param("qwen2", {}, id="qwen2"),
    pytest.param("qwen3", {}, id="qwen3"),
    pytest.param("phi3", {}, id="phi3"),
    pytest.param("gemma2", {}, id="gemma2"),
    pytest.param("gemma3", {}, id="gemma3"),
    pytest.param(
        "mistral",
        {},
        id="mistral",
        marks=pytest.mark.xfail(
            strict=True,
            raises=NotImplementedError,
            reason="transformers builds a MistralForCausalLM from a llama file named 'mistral', then maps its "
            "tensor names with gguf's TensorNameMap for model_type 'mistral' "
            "(get_gguf_hf_weights_map), an architecture gguf does not have (llama.cpp writes Mistral "
            "as llama): 'Unknown gguf model_type: mistral in gguf-py'",
        ),
    ),
    pytest.param(
        "qwen3",
        {"head_dim": 16},
        id="qwen3-head_dim-16",
        marks=pytest.mark.xfail(
            strict=True,
            raises=RuntimeError,
            reason="GGUF_CONFIG_MAPPING['qwen3'] does not read qwen3.attention.key_length, so head_dim stays "
            "Qwen3Config's default 128 and the file's q/k/v/o and q/k-norm shapes do not fit",
        ),
    ),
]


@pytest.mark.parametrize(("family", "config"), CASES)
def test_a_gguf_folder_exports_a_base_with_the_written_models_logits(family, config, tmp_path):
    vocab = tokenizer_size()
    model = tiny_model(family, vocab, seed=0, **config)
    src = write_gguf(model, tmp_path / "src" / f"tiny-{family}.f32.gguf", family).parent

    spec = BaseParams(model=str(src), dtype="float32", plain_chat_template=PLAIN)
    record = export_base(spec, tmp_path / "base")

    assert record["source_kind"] == "gguf-folder"
    assert record["source_file"] == f"tiny-{family}.f32.gguf"
    assert record["architecture"] == model.config.model_type
    assert record["vocab_size"] == vocab
    assert record["chat_template"] == "params"  # only tokenizer.ggml.* was copied: SmolLM2's template is not
    # 20 tokens: past the Gemma models' sliding windows of 8
    ids = torch.randint(vocab, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = model(input_ids=ids).logits, load_model(tmp_path / "base")(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
