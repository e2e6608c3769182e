"""Candidates: an item plus the mutations applied to it, with the edit chain that rebuilds it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flexsearch.data.audit import FORCED_CHOICE
from flexsearch.data.items import Item

WORD_FIELDS = ("context", "question")  # edited word by word
SLOT_FIELDS = ("persona", "directive", "suffix")  # replaced whole: the instruction placed before the question


@dataclass(frozen=True)
class Edit:
    """One mutation: which operator changed which field (and word), from what to what."""

    operator: str
    field: str
    position: int | None  # word index for WORD_FIELDS, None for SLOT_FIELDS
    before: str
    after: str
    args: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"operator": self.operator, "field": self.field, "position": self.position,
                "before": self.before, "after": self.after, "args": dict(self.args)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Edit:
        return cls(operator=data["operator"], field=data["field"], position=data["position"],
                   before=data["before"], after=data["after"], args=tuple(sorted(data.get("args", {}).items())))


def in_place(edits: Iterable[Edit]) -> list[Edit]:
    """The edits whose text the prompt holds now, in order: every word edit and each slot's last edit where it
    filled the slot (a slot holds one text, so a template swapped out or cleared is gone)."""
    edits = list(edits)
    last = {e.field: i for i, e in enumerate(edits) if e.field in SLOT_FIELDS}
    return [e for i, e in enumerate(edits) if e.field not in SLOT_FIELDS or (last[e.field] == i and e.after)]


def chain_edits(chain: Iterable[Mapping[str, Any]]) -> list[Edit]:
    """The edits of a chain as the trace records it (no replay needed)."""
    return [Edit.from_dict(dict(step)) for step in chain]


def variant_id(edit: Edit) -> str:
    """The attack variant an edit applies, as the split's `attack_type` names it: a template as
    operator:family.index (`persona:role_play.0`), a word operator by its edit kind (`textbugger:swap`)."""
    args = dict(edit.args)
    if "template" in args:  # persona / instruction: family and template index within it
        family = args.get("family", edit.operator)
        return f"{edit.operator}:{'' if family == edit.operator else f'{family}.'}{args['template']}"
    return f"{edit.operator}:{args.get('bug', 'word')}"  # TextBugger names its bug; BERT-Attack swaps a word


def templates_in_place(edits: Iterable[Edit]) -> list[str]:
    """The variants in place (in_place), once each, sorted."""
    return sorted({variant_id(e) for e in in_place(edits)})


def forced_in_place(edits: Iterable[Edit]) -> bool:
    """Whether a template still in a slot declares itself forced-choice; for a Candidate's edits and a trace
    record's chain (chain_edits) alike."""
    return any(dict(e.args).get("effect") == FORCED_CHOICE for e in in_place(edits) if e.field in SLOT_FIELDS)


@dataclass(frozen=True)
class Candidate:
    """An immutable prompt state. Words are kept as tuples so positions survive edits that add spaces."""

    item: Item
    context_words: tuple[str, ...]
    question_words: tuple[str, ...]
    persona: str = ""
    directive: str = ""
    suffix: str = ""  # free tokens after the instruction (adversarial_suffix); set means not natural text
    option_order: tuple[int, int, int] = (0, 1, 2)  # displayed slot → answer index
    edits: tuple[Edit, ...] = ()
    parent: Candidate | None = field(default=None, compare=False, repr=False)

    @classmethod
    def root(cls, item: Item) -> Candidate:
        return cls(item=item, context_words=tuple(item.context.split(" ")),
                   question_words=tuple(item.question.split(" ")))

    @property
    def context(self) -> str:
        return " ".join(self.context_words)

    @property
    def question(self) -> str:
        return " ".join(self.question_words)

    @property
    def instruction(self) -> str:
        return " ".join(part for part in (self.persona, self.directive, self.suffix) if part)

    @property
    def natural(self) -> bool:
        """Whether the prompt is natural text a person could have written (no optimised token slot)."""
        return not self.suffix

    @property
    def forced_choice(self) -> bool:
        """Whether a template still in a slot declares itself forced-choice (its row is measured apart)."""
        return forced_in_place(self.edits)

    def words(self, field_name: str) -> tuple[str, ...]:
        return self.context_words if field_name == "context" else self.question_words

    def edited_positions(self) -> set[tuple[str, int]]:
        return {(e.field, e.position) for e in self.edits if e.position is not None}

    def apply(self, edit: Edit) -> Candidate:
        """The child candidate with `edit` applied; the edit's `before` must match the current text."""
        if edit.field in SLOT_FIELDS:
            if getattr(self, edit.field) != edit.before:
                raise ValueError(f"edit {edit.operator}: {edit.field} does not match its 'before' text")
            changes: dict[str, Any] = {edit.field: edit.after}
        elif edit.field in WORD_FIELDS:
            words = list(self.words(edit.field))
            if edit.position is None or not 0 <= edit.position < len(words) or words[edit.position] != edit.before:
                raise ValueError(f"edit {edit.operator}: word {edit.position} of {edit.field} is not {edit.before!r}")
            words[edit.position] = edit.after
            changes = {f"{edit.field}_words": tuple(words)}
        else:
            raise ValueError(f"unknown edit field {edit.field!r}")
        return replace(self, **changes, edits=(*self.edits, edit), parent=self)

    def with_words(self, operator: str, field_name: str, position: int, after: str, **args: Any) -> Candidate:
        """Shorthand for the common word substitution edit."""
        before = self.words(field_name)[position]
        return self.apply(Edit(operator, field_name, position, before, after, tuple(sorted(args.items()))))

    def with_slot(self, operator: str, slot: str, text: str, **args: Any) -> Candidate:
        return self.apply(Edit(operator, slot, None, getattr(self, slot), text, tuple(sorted(args.items()))))

    def chain(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.edits]


def replay(item: Item, chain: list[dict[str, Any]], option_order: tuple[int, int, int] = (0, 1, 2)) -> Candidate:
    """Rebuilds a candidate from its item and recorded edit chain."""
    candidate = replace(Candidate.root(item), option_order=option_order)
    for data in chain:
        candidate = candidate.apply(Edit.from_dict(data))
    return candidate
