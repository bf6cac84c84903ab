"""clap.train.shared_prefix: the shared prefix computed once gives the plain forward's loss and gradients."""

from __future__ import annotations

import contextlib

import pytest
import torch

from clap.model import base as mdl
from clap.train.shared_prefix import common_prefix_length, shared_prefix_backbone


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


def _loss_and_grads(model, batch, shared: bool):
    model.zero_grad()
    with shared_prefix_backbone(model, min_tokens=4) if shared else contextlib.nullcontext():
        loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("suffixes", [[7, 3, 5], [6, 6], [9, 1, 4, 2]])
def test_loss_and_lora_gradients_equal_the_plain_forward(tiny_base, suffixes):
    model = _lora_model(tiny_base)
    batch = _batch(prefix=20, suffixes=suffixes)
    assert common_prefix_length(batch["input_ids"], batch["attention_mask"]) >= 20
    plain_loss, plain_grads = _loss_and_grads(model, batch, shared=False)
    shared_loss, shared_grads = _loss_and_grads(model, batch, shared=True)
    torch.testing.assert_close(shared_loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, g in plain_grads.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(shared_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_the_prefix_runs_once(tiny_base, monkeypatch):
    """The decoder sees the prefix in one row, then every row's rest: fewer positions than the plain forward."""
    model = _lora_model(tiny_base)
    batch = _batch(prefix=20, suffixes=[7, 3, 5])
    seen = []
    embed = model.get_base_model().model.embed_tokens
    hook = embed.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    with shared_prefix_backbone(model, min_tokens=4):
        model(**batch)
    hook.remove()
    assert seen == [(1, 20), (3, 7)]


def test_rows_without_a_long_enough_common_prefix_take_the_plain_forward(tiny_base):
    """Left padding (the first positions masked), one row, or too short a prefix: the plain forward, unchanged."""
    model = _lora_model(tiny_base)
    for batch in (_batch(20, [7, 3], pad_side="left"), _batch(20, [7]), _batch(3, [7, 3])):
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


def test_common_prefix_length():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 4]])
    assert common_prefix_length(ids, None) == 2
    assert common_prefix_length(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])) == 0
    assert common_prefix_length(ids[:1], None) == 0
    assert common_prefix_length(torch.tensor([[1, 2], [1, 2]]), None) == 2
