"""The answer a task's model emits, declared in params ``task`` rather than written in code.

One declaration names the answer's fields in the order the model writes them, each with a role
and a type; everything that depends on the answer's shape comes from it: the prompt's
instruction and the JSON object the model emits (:mod:`clap.task.prompt`), the JSON schema of
constrained decoding, the parser and per-field scoring with its weights
(:mod:`clap.task.scoring`), admission's GRPO perturbations (one per key field, a wrong value,
another document's evidence, an unparseable answer), and the slices the gate and summary report.

Roles: ``key`` fields identify the fact (copied from the question; e.g. a metric, a line, a
shift and a date, or a report's row and period; any names), ``evidence`` is a verbatim quote of
the context that carries the value, ``value`` the fact itself (type ``number``: compared within
the scoring tolerances; type ``text``: a string, e.g. a span of a report as it prints it, compared
after :func:`clap.task.scoring.normalize_text`), ``unit`` its unit (any name; optionally decided by a key field: ``of``). The
value and evidence fields are named ``value`` and ``evidence`` (items, scored rows and reports
name them by their role). Types: ``vocabulary``
(one of the words the answer space gives for the field), ``date`` (ISO ``YYYY-MM-DD``), ``text``
(a free string), ``number``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clap.params import bad_param, stray_key

ROLES = ("key", "evidence", "value", "unit")
TYPES = ("vocabulary", "date", "text", "number")
VALUE_TYPES = ("number", "text")  # the types a value may have
PARAMS = "params.yaml"


@dataclasses.dataclass(frozen=True)
class AnswerField:
    """One field of the answer object."""

    name: str
    role: str  # key | evidence | value | unit
    type: str  # vocabulary | date | text | number
    weight: float  # weight in the item's ``overall`` score (normalized by the sum over fields)
    note: str = ""  # shown after the field's name in the prompt's instruction
    of: str = ""  # unit: the key field whose value decides it (constrained decoding forces it)


@dataclasses.dataclass(frozen=True)
class ContextSpec:
    """Params ``task.context``: ``docs`` 0 shows every document an item cites, N > 0 the N its question
    ranks highest plus the best match of ``cues`` (words of a context-wide convention, e.g. a unit)."""

    docs: int = 0
    cues: tuple[str, ...] = ()


EVERY_DOC = ContextSpec()  # every cited document shown (the default)


@dataclasses.dataclass(frozen=True)
class AnswerSchema:
    """The declared answer: its fields in emission order, the instruction and the extra slice columns."""

    instruction: str
    fields: tuple[AnswerField, ...]
    slice_columns: tuple[
        str, ...
    ]  # item columns results are also broken down by (e.g. source, question type)
    show_doc_ids: bool = True  # each context document is shown after its ``[doc_id]`` (else its text only)
    context: ContextSpec = (
        ContextSpec()
    )  # which of an item's cited documents a prompt shows (clap/task/context.py)

    @property
    def names(self) -> tuple[str, ...]:
        """Every field, in the order the model writes them."""
        return tuple(f.name for f in self.fields)

    @property
    def keys(self) -> tuple[str, ...]:
        """The key fields (what identifies the fact), in order."""
        return tuple(f.name for f in self.fields if f.role == "key")

    def field(self, name: str) -> AnswerField:
        return next(f for f in self.fields if f.name == name)

    def _role(self, role: str) -> str:
        return next(f.name for f in self.fields if f.role == role)

    @property
    def value(self) -> str:
        return self._role("value")

    @property
    def value_is_text(self) -> bool:
        """The value is declared ``type: text`` (a string), not a number."""
        return self.field(self.value).type == "text"

    @property
    def evidence(self) -> str:
        return self._role("evidence")

    @property
    def labels(self) -> tuple[str, ...]:
        """Fields scored as labels (case-folded equality): every field but the value and the evidence."""
        return tuple(f.name for f in self.fields if f.role in ("key", "unit"))

    @property
    def slices(self) -> tuple[str, ...]:
        """Item columns results are broken down by: each vocabulary key field, then ``slice_columns``."""
        return (
            tuple(f.name for f in self.fields if f.role == "key" and f.type == "vocabulary")
            + self.slice_columns
        )

    @property
    def weights(self) -> dict[str, float]:
        return {f.name: f.weight for f in self.fields}

    @property
    def perturbations(self) -> tuple[str, ...]:
        """Admission's perturbed answers: a wrong value, one wrong key field each, another doc's evidence, unparseable."""
        return (
            f"wrong_{self.value}",
            *(f"wrong_{k}" for k in self.keys),
            f"other_doc_{self.evidence}",
            "unparseable",
        )

    @property
    def system_prompt(self) -> str:
        """The instruction with the answer's keys (and their notes) in order."""
        keys = ", ".join(f'"{f.name}"' + (f" ({f.note})" if f.note else "") for f in self.fields)
        return f"{self.instruction} {keys}."


def parse_answer_schema(raw: Any, where: str = "task") -> AnswerSchema:
    """Check the declaration (params ``task``) and build the schema.

    Raises:
        ClapError: naming params.yaml and the dotted key of the first problem.
    """
    top = ("instruction", "answer", "slice_columns", "show_doc_ids", "context")
    if not isinstance(raw, dict) or set(raw) != set(top):
        raise bad_param(
            stray_key(where, raw, top),
            f"{where} must have exactly the keys {', '.join(top)}",
        )
    answer = raw["answer"]
    if not isinstance(answer, dict) or not answer:
        raise bad_param(f"{where}.answer", f"{where}.answer must map field names to their declarations")
    fields = [_field(str(name), decl, f"{where}.answer.{name}") for name, decl in answer.items()]
    counts = {r: sum(f.role == r for f in fields) for r in ROLES}
    if counts["value"] != 1 or counts["evidence"] != 1 or counts["unit"] > 1:
        raise bad_param(
            f"{where}.answer",
            f"{where}.answer needs exactly one value and one evidence field and at most one unit",
        )
    for f in fields:  # items, scored rows and reports name these two by their role
        if f.role in ("value", "evidence") and f.name != f.role:
            raise bad_param(
                f"{where}.answer.{f.name}",
                f"{where}.answer: the {f.role} field must be named {f.role!r}, not {f.name!r}",
            )
    keys = {f.name for f in fields if f.role == "key"}
    for f in fields:
        if f.of and (f.role != "unit" or f.of not in keys):
            raise bad_param(
                f"{where}.answer.{f.name}.of",
                f"{where}.answer.{f.name}.of must name a key field (and only a unit has one)",
            )
    if sum(f.weight for f in fields) <= 0:
        raise bad_param(f"{where}.answer", f"{where}.answer: the weights must have a positive sum")
    extra = raw["slice_columns"]
    if not isinstance(extra, list) or not all(isinstance(c, str) for c in extra):
        raise bad_param(f"{where}.slice_columns", f"{where}.slice_columns must be a list of item columns")
    if not isinstance(raw["show_doc_ids"], bool):
        raise bad_param(f"{where}.show_doc_ids", f"{where}.show_doc_ids must be true or false")
    return AnswerSchema(
        str(raw["instruction"]).strip(),
        tuple(fields),
        tuple(extra),
        raw["show_doc_ids"],
        _context(raw["context"], where),
    )


def _field(name: str, decl: Any, at: str) -> AnswerField:
    """One declared answer field (params ``task.answer.<name>``, at ``at``), checked."""
    if (
        not isinstance(decl, dict)
        or not {"role", "weight"} <= set(decl)
        or set(decl) - {"role", "type", "weight", "note", "of"}
    ):
        raise bad_param(
            stray_key(at, decl, ("role", "weight"), ("type", "note", "of")),
            f"{at} must be a mapping with role and weight (and type, note, of)",
        )
    role = decl["role"]
    kind = decl.get("type", {"evidence": "text", "unit": "vocabulary"}.get(role, ""))
    if role not in ROLES:
        raise bad_param(f"{at}.role", f"{at}.role {role!r} is not one of {list(ROLES)}")
    if kind not in TYPES:
        raise bad_param(f"{at}.type", f"{at}.type {kind!r} is not one of {list(TYPES)}")
    if role == "value" and kind not in VALUE_TYPES:
        raise bad_param(f"{at}.type", f"{at}: a value is of type {' or '.join(VALUE_TYPES)} (type {kind!r})")
    if role != "value" and kind == "number":
        raise bad_param(
            f"{at}.type", f"{at}: a {role} field is compared as a label: type vocabulary, date or text"
        )
    weight = decl["weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
        raise bad_param(f"{at}.weight", f"{at}.weight must be a number >= 0")
    return AnswerField(name, role, kind, float(weight), str(decl.get("note", "")), str(decl.get("of", "")))


def _context(raw: Any, where: str) -> ContextSpec:
    at = f"{where}.context"
    if not isinstance(raw, dict) or set(raw) != {"docs", "cues"}:
        raise bad_param(stray_key(at, raw, ("docs", "cues")), f"{at} must have exactly the keys docs, cues")
    docs, cues = raw["docs"], raw["cues"]
    if isinstance(docs, bool) or not isinstance(docs, int) or docs < 0:
        raise bad_param(f"{at}.docs", f"{at}.docs must be an integer >= 0 (0: every document)")
    if not isinstance(cues, list) or not all(isinstance(c, str) and c.strip() for c in cues):
        raise bad_param(f"{at}.cues", f"{at}.cues must be a list of words")
    return ContextSpec(docs, tuple(cues))


def load_answer_schema(path: Path | str = PARAMS) -> AnswerSchema:
    """The answer schema of a params file (section ``task``)."""
    from clap.params import raw_section

    return parse_answer_schema(raw_section("task", path))


def gold_of(row: Mapping[str, Any], schema: AnswerSchema) -> dict[str, Any]:
    """The reference answer of an item row (its answer fields; the value as a float, or as a str when
    it is declared ``type: text``)."""
    number = not schema.value_is_text
    return {k: (float(row[k]) if k == schema.value and number else str(row[k])) for k in schema.names}
