"""clap.train.shared_prefix: the shared prefix computed once, and rows run at their own lengths, give the
plain forward's loss and gradients."""

from __future__ import annotations

import contextlib

import pytest
import torch

from clap.model import base as mdl
from clap.train.shared_prefix import common_prefix_length, right_padded_lengths, shared_prefix_backbone


def _lora_model(tiny_base):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(
        mdl.load_model(tiny_base).train(),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]),
    )
    with torch.no_grad():  # B = 0 at init would leave half the gradients trivially zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def _batch(prefix: int, suffixes: list[int], pad_side: str = "right"):
    torch.manual_seed(1)
    head = torch.randint(5, 400, (prefix,))
    width = prefix + max(suffixes)
    ids = torch.zeros((len(suffixes), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(suffixes):
        row = torch.cat([head, torch.randint(5, 400, (n,))])
        span = slice(0, len(row)) if pad_side == "right" else slice(width - len(row), width)
        ids[r, span], mask[r, span] = row, 1
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : prefix + 2] = -100  # completion-only: the prompt carries no loss
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.fixture(autouse=True)
def _cheap_row_calls(monkeypatch):
    """Rows of a few tokens: a row's own forward priced at 2 positions, so padding of 3 or more
    per extra row splits them (the real price suits rows of hundreds of tokens)."""
    monkeypatch.setattr(mdl, "ROW_CALL_TOKENS", 2)


def _loss_and_grads(model, batch, shared: bool):
    model.zero_grad()
    with shared_prefix_backbone(model, min_tokens=4) if shared else contextlib.nullcontext():
        loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize(
    ("prefix", "suffixes"),
    [
        (20, [7, 3, 5]),  # shared prefix, rows at their own lengths
        (20, [6, 6]),  # shared prefix, one padded-free call for the rest
        (20, [9, 1, 4, 2]),
        (20, [30, 29]),  # 1 padded position, under ROW_CALL_TOKENS: one padded call
        (2, [9, 3]),  # no prefix long enough to share: rows at their own lengths
    ],
)
def test_loss_and_lora_gradients_equal_the_plain_forward(tiny_base, prefix, suffixes):
    model = _lora_model(tiny_base)
    batch = _batch(prefix=prefix, suffixes=suffixes)
    assert common_prefix_length(batch["input_ids"], batch["attention_mask"]) >= prefix
    plain_loss, plain_grads = _loss_and_grads(model, batch, shared=False)
    shared_loss, shared_grads = _loss_and_grads(model, batch, shared=True)
    torch.testing.assert_close(shared_loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, g in plain_grads.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(shared_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def _decoder_calls(model, batch) -> list[tuple[int, int]]:
    seen = []
    embed = model.get_base_model().model.embed_tokens
    hook = embed.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    with shared_prefix_backbone(model, min_tokens=4):
        model(**batch)
    hook.remove()
    return seen


def test_the_prefix_runs_once_and_no_padded_position_runs(tiny_base):
    """The decoder sees the prefix in one row, then each row's rest at its own length (padding 6 of 21
    positions); rows of one length (or nearly) run their rest in one call."""
    model = _lora_model(tiny_base)
    assert _decoder_calls(model, _batch(prefix=20, suffixes=[7, 3, 5])) == [(1, 20), (1, 7), (1, 3), (1, 5)]
    assert _decoder_calls(model, _batch(prefix=20, suffixes=[6, 6])) == [(1, 20), (2, 6)]
    assert _decoder_calls(model, _batch(prefix=20, suffixes=[30, 29])) == [(1, 20), (2, 30)]
    assert _decoder_calls(model, _batch(prefix=2, suffixes=[9, 3])) == [(1, 11), (1, 5)]


def test_rows_without_a_long_enough_common_prefix_take_the_plain_forward(tiny_base):
    """Left padding (the first positions masked), one row, or too short a prefix and no padding: the
    plain forward, unchanged."""
    model = _lora_model(tiny_base)
    for batch in (_batch(20, [7, 3], pad_side="left"), _batch(20, [7]), _batch(3, [7, 7])):
        model.zero_grad()
        plain = model(**batch).loss
        with shared_prefix_backbone(model, min_tokens=4):
            again = model(**batch).loss
        assert torch.equal(plain, again)


def test_the_decoder_forward_is_restored(tiny_base):
    model = _lora_model(tiny_base)
    decoder = model.get_base_model().model
    with shared_prefix_backbone(model):
        assert "forward" in decoder.__dict__
    assert "forward" not in decoder.__dict__


def test_right_padded_lengths():
    assert right_padded_lengths(None, 2, 3) == [3, 3]
    assert right_padded_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]]), 2, 3) == [2, 3]
    assert right_padded_lengths(torch.tensor([[0, 1, 1], [1, 1, 1]]), 2, 3) is None  # left padding
    assert right_padded_lengths(torch.tensor([[1, 0, 1], [1, 1, 1]]), 2, 3) is None  # a hole


def test_common_prefix_length():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 4]])
    assert common_prefix_length(ids, None) == 2
    assert common_prefix_length(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])) == 0
    assert common_prefix_length(ids[:1], None) == 0
    assert common_prefix_length(torch.tensor([[1, 2], [1, 2]]), None) == 2
