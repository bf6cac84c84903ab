"""What the chain lets a model say: the answer schema of one request, for constrained decoding.

Under ``chain.decoding: constrained`` every model (base, candidate, incumbent; eval, replay and
``clap serve`` alike) decodes its answer inside the request's JSON schema
(:func:`clap.task.prompt.answer_json_schema`): the declared answer's fields in order (params
``task``); each vocabulary field one of the canonical words params ``normalize`` gives it, the unit
the one its ``of`` key decides; the value a number; and the grounded fields from the request's own
context: the evidence one of its sentences (the quote must be verbatim) and a date field one of the
dates it mentions (in a configured format, :func:`clap.data.normalize.dates_in`). Without context
(the no-RAG conditions) they are a free string and any calendar date. The model still chooses every
field; it can no longer fail on the format, quote what is not there, or name a date no document gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from clap.data.normalize import (
    NormalizeParams,
    Vocab,
    answer_vocabularies,
    build_vocab,
    dates_in,
    key_units,
)
from clap.model.constrain import DECODING_MODES, Constraint, Grammars
from clap.model.generate import stop_ids
from clap.params import bad_param
from clap.task.answer import AnswerSchema
from clap.task.prompt import answer_json_schema, context_sentences

Docs = Sequence[tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class AnswerSpace:
    """The declared answer and the schema inputs params fix (vocabularies, units, date formats); the
    context adds the rest."""

    answer: AnswerSchema
    vocabularies: dict[str, list[str]]
    units: dict[str, str]
    vocab: Vocab

    def schema(self, docs: Docs | None) -> dict[str, Any]:
        """The JSON schema of an answer to a request with context ``docs`` (None: no RAG)."""
        docs = list(docs or [])
        dates = [d for _, text in docs for d in dates_in(text, self.vocab)]
        return answer_json_schema(self.answer, self.vocabularies, context_sentences(docs), self.units, dates)


def answer_space(p: NormalizeParams, answer: AnswerSchema) -> AnswerSpace:
    """The answer space of params ``normalize`` for the declared answer (params ``task``).

    Raises:
        ClapError: a vocabulary field params ``normalize`` gives no words for.
    """
    words = answer_vocabularies(p)
    missing = [f.name for f in answer.fields if f.type == "vocabulary" and not words.get(f.name)]
    if missing:
        raise bad_param(
            f"task.answer.{missing[0]}",
            f"answer field(s) {missing} are vocabularies, but params normalize gives no words for them "
            f"(it has {sorted(words)})",
        )
    unit = next((f for f in answer.fields if f.role == "unit" and f.of), None)
    units = key_units(p) if unit is not None else {}
    vocabularies = {k: v for k, v in words.items() if k in answer.names}
    return AnswerSpace(answer, vocabularies, units, build_vocab(p))


def check_decoding(mode: str, where: str) -> str:
    if mode not in DECODING_MODES:
        raise bad_param(where, f"decoding must be one of {list(DECODING_MODES)}, got {mode!r}")
    return mode


class Constrainer:
    """Builds the :class:`~clap.model.constrain.Constraint` of a list of requests for one tokenizer.

    Grammars are compiled once per distinct schema and shared by every model that uses this
    tokenizer (eval's base, candidate and incumbent answer the same requests).
    """

    def __init__(self, space: AnswerSpace, model: Any, tokenizer: Any):
        self.space = space
        self.grammars = Grammars(tokenizer, model.config.vocab_size, stop_ids(model, tokenizer))

    def __call__(self, contexts: Sequence[Docs | None]) -> Constraint:
        return Constraint(self.grammars, [self.grammars.compile(self.space.schema(d)) for d in contexts])


def constrainer_for(decoding: str, space: AnswerSpace, model: Any, tokenizer: Any) -> Constrainer | None:
    """The constrainer a ``decoding`` mode needs (None for free decoding)."""
    return Constrainer(space, model, tokenizer) if decoding == "constrained" else None
