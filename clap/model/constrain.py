"""Schema-constrained greedy decoding: the model may emit only tokens that keep the answer valid.

A production chain does not ask a small model to type braces: it constrains decoding to the
answer's JSON schema, so a model is judged on what it knows rather than on whether it can
produce the format. :class:`Grammars` compiles JSON schemas for one tokenizer with
`xgrammar <https://xgrammar.mlc.ai>`_ (chosen by measurement: ``benchmarks/grammar_engines.py``,
``benchmarks/constrained_decoding.py`` and their committed results) in the layout
``clap.task.prompt.format_answer`` writes (keys in order, ``", "`` and ``": "`` separators, no other
whitespace). Schemas differ per request (the evidence quote is one of the request's context
sentences), so compiled grammars are cached by schema: every model of an eval run reuses them.

Wherever the grammar allows one continuation only (the JSON skeleton ``", "line": "`` between
values, the rest of a vocabulary word after its first tokens), :meth:`RowMatcher.forced` returns
those tokens and the generator queues them behind the chosen token and feeds them in chunks
(:func:`clap.model.generate.chunk_length`), computing logits at a chunk's last position only. xgrammar splits a forced string into tokens its own way,
which is not always how the model would have tokenized it, so a constrained answer that was
already valid is the same text as the free answer but not always the same token ids, and a later
token may differ (measured: ``benchmarks/results/constrained_decoding*.json``). After the closing
brace only an end-of-sequence token is allowed, so no answer rambles past its object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

DECODING_MODES = ("constrained", "free")


class RowMatcher:
    """The grammar state of one generated row."""

    def __init__(self, matcher: Any):
        self._m = matcher

    def fill(self, bitmask: Any, index: int) -> None:
        """Write the allowed next tokens of this row into row ``index`` of ``bitmask``."""
        self._m.fill_next_token_bitmask(bitmask, index)

    def accept(self, token: int) -> None:
        """Advance over ``token``; a token the grammar refuses is a bug, never a silent pass."""
        if not self._m.accept_token(token):
            raise RuntimeError(f"constrained decoding: token {token} was not allowed by the grammar")

    def forced(self, limit: int) -> list[int]:
        """Tokens the grammar forces next (at most ``limit``), already accepted."""
        if limit <= 0 or self._m.is_terminated():
            return []
        tokens = list(self._m.find_jump_forward_tokens())[:limit]
        for t in tokens:
            self.accept(t)
        return tokens


class Grammar:
    """One compiled JSON schema; hands out a fresh :class:`RowMatcher` per generated row."""

    def __init__(self, compiled: Any):
        self._compiled = compiled

    def matcher(self) -> RowMatcher:
        import xgrammar as xgr

        return RowMatcher(xgr.GrammarMatcher(self._compiled))


class Grammars:
    """JSON schemas compiled for one tokenizer, cached by schema.

    Args:
        tokenizer: the Hugging Face tokenizer the model generates with.
        vocab_size: the model's logits width (may exceed the tokenizer's vocabulary).
        stop_ids: end-of-sequence ids (the only tokens allowed once the object is closed).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]):
        import xgrammar as xgr

        self.vocab_size = int(vocab_size)
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(stop_ids)
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: dict[str, Grammar] = {}

    def compile(self, schema: Mapping[str, Any]) -> Grammar:
        """The grammar of ``schema`` (compiled once per distinct schema)."""
        key = json.dumps(schema, ensure_ascii=False)
        if key not in self._cache:
            self._cache[key] = Grammar(
                self._compiler.compile_json_schema(
                    key, any_whitespace=False, separators=(", ", ": "), strict_mode=True
                )
            )
        return self._cache[key]

    def bitmask(self, rows: int) -> Any:
        import xgrammar as xgr

        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    @staticmethod
    def apply(logits: Any, bitmask: Any) -> None:
        """Set the logits of disallowed tokens to -inf, in place (rows of ``logits`` = rows of ``bitmask``)."""
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device))


class Constraint:
    """What constrained generation needs: the compiler (masks) and each chat's grammar, in chat order."""

    def __init__(self, grammars: Grammars, per_chat: Sequence[Grammar]):
        self.grammars, self.per_chat = grammars, list(per_chat)
