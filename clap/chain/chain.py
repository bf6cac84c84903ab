"""The application chain: retrieve -> build the prompt -> generate -> parse. One implementation.

The replay stage (CLAP's ABCD experiment) and ``clap serve`` both answer questions through
:class:`Chain`, so what replay measures is what serving does: BM25 retrieval over the
batch's knowledge base (:mod:`clap.chain.retrieval`), the one prompt builder
(:func:`clap.task.prompt.build_messages`, the same as training and eval), greedy generation with
the base model or base + adapter (:func:`clap.model.generate.generate_batched`) and the answer
parser of :mod:`clap.task.scoring`. With ``rag=False`` the prompt has no documents
(``build_messages(question, None, answer)``): the no-RAG conditions of the replay. Under
``chain.decoding: constrained`` every answer is decoded inside its request's answer schema
(:mod:`clap.chain.grounding`), for the base model and an adapter alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from clap.chain.grounding import AnswerSpace, check_decoding, constrainer_for
from clap.chain.retrieval import KBIndex, RetrievalParams
from clap.errors import ClapError
from clap.model.engine import EngineParams
from clap.model.generate import Generation, generate_batched
from clap.model.memo import Memo
from clap.params import check_keys
from clap.task.prompt import build_messages
from clap.task.scoring import ParsedAnswer, context_text, parse_answer


@dataclasses.dataclass(frozen=True)
class ChainParams:
    """Params section ``chain``."""

    top_k: int
    max_new_tokens: int
    decoding: str
    engine: EngineParams
    retrieval: RetrievalParams

    def __post_init__(self) -> None:
        check_decoding(self.decoding, "chain.decoding")
        check_keys(
            {"chain.top_k": self.top_k >= 1, "chain.max_new_tokens": self.max_new_tokens >= 1},
            "chain: top_k and max_new_tokens must be >= 1",
        )


@dataclasses.dataclass(frozen=True)
class Retrieved:
    """The documents retrieved for one question, best first, and the time it took."""

    docs: tuple[tuple[str, str], ...]
    retrieval_ms: float

    @property
    def doc_ids(self) -> list[str]:
        return [doc_id for doc_id, _ in self.docs]


@dataclasses.dataclass(frozen=True)
class ChainAnswer:
    """One question answered by the chain.

    Attributes:
        question: the question as asked.
        rag: whether retrieval was on.
        retrieved: the documents put in the prompt (none without RAG).
        context: the context text the answer is checked against (:func:`clap.task.scoring.context_text`).
        generation: the raw generation (text, token counts, apportioned latency).
        parsed: the parsed answer; ``parsed.ok`` is the answer's validity.
    """

    question: str
    rag: bool
    retrieved: Retrieved
    context: str
    generation: Generation
    parsed: ParsedAnswer

    @property
    def valid(self) -> bool:
        return self.parsed.ok

    @property
    def latency_ms(self) -> float:
        """Retrieval time plus this answer's share of its generation batch."""
        return self.retrieved.retrieval_ms + self.generation.latency_ms


class Chain:
    """A model, its tokenizer and one knowledge base's index, answering questions.

    Args:
        model: a causal LM in eval mode (:func:`clap.model.base.load_model`).
        tokenizer: its tokenizer with left padding (:func:`clap.model.base.load_tokenizer`).
        index: the knowledge base index, or None for a chain that never retrieves.
        p: chain params.
        space: the declared answer and its space (params ``task``, ``normalize``): the prompt's
            instruction, the parser, and the schema constrained decoding enforces.
    """

    def __init__(self, model: Any, tokenizer: Any, index: KBIndex | None, p: ChainParams, space: AnswerSpace):
        self.model, self.tokenizer, self.index, self.p, self.space = model, tokenizer, index, p, space
        self.constrainer = constrainer_for(p.decoding, space, model, tokenizer)

    def retrieve(self, question: str) -> Retrieved:
        """The top-k documents for ``question`` from the index."""
        if self.index is None:
            raise ClapError(
                "this chain has no knowledge base index: retrieval is impossible", rule="no_index"
            )
        start = time.perf_counter()
        hits = self.index.search(question, self.p.top_k)
        return Retrieved(tuple((h.doc_id, h.text) for h in hits), (time.perf_counter() - start) * 1000.0)

    def answer(
        self,
        questions: Sequence[str],
        *,
        rag: bool,
        batch_size: int,
        desc: str | None = None,
        memo: tuple[Memo, str] | None = None,
    ) -> list[ChainAnswer]:
        """Answer every question (same order), with or without retrieval.

        Args:
            questions: the questions.
            rag: retrieve top-k documents into the prompt (False: no documents at all).
            batch_size: prompts per generate call (1 for serving one request).
            desc: progress label of the generation (None: no progress shown, as when serving).
            memo: the base model's kept answers (:mod:`clap.model.memo`) and the label its log entry
                takes: answers an earlier run generated for exactly these prompts are read, not generated.

        Returns:
            One :class:`ChainAnswer` per question.
        """
        retrieved = [self.retrieve(q) if rag else Retrieved((), 0.0) for q in questions]
        contexts = [r.docs if rag else None for r in retrieved]
        chats = [
            build_messages(q, None if c is None else list(c), self.space.answer)
            for q, c in zip(questions, contexts)
        ]
        key = (
            memo[0].key(
                chats,
                [self.space.schema(c) for c in contexts] if self.constrainer else None,
                batch_size=batch_size,
                max_new_tokens=self.p.max_new_tokens,
                decoding=self.p.decoding,
            )
            if memo
            else ""
        )
        kept = memo[0].load(key, memo[1]) if memo else None
        if kept is not None:
            gens = kept[0]
        else:
            gens = generate_batched(
                self.model,
                self.tokenizer,
                chats,
                batch_size=batch_size,
                max_new_tokens=self.p.max_new_tokens,
                desc=desc,
                constraint=self.constrainer(contexts) if self.constrainer else None,
            )
            if memo:
                memo[0].save(key, gens, label=memo[1])
        return [
            ChainAnswer(q, rag, r, context_text(list(r.docs)), g, parse_answer(g.text, self.space.answer))
            for q, r, g in zip(questions, retrieved, gens)
        ]


def load_chain(
    base_dir: Path | str,
    adapter_dir: Path | str | None,
    index: KBIndex | None,
    p: ChainParams,
    space: AnswerSpace,
) -> Chain:
    """A chain with the base model (``adapter_dir=None``) or base + adapter, over ``index``."""
    from clap.model.base import load_tokenizer
    from clap.model.engine import load_generator

    model, tok = (
        load_generator(base_dir, adapter_dir, p.engine),
        load_tokenizer(base_dir, padding_side="left"),
    )
    return Chain(model, tok, index, p, space)


def build_index(kb: pd.DataFrame, p: ChainParams) -> KBIndex:
    """The BM25 index of one knowledge base (build it once and share it between chains)."""
    return KBIndex(kb, p.retrieval)
