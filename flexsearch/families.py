"""Attack families (DESIGN.md "Attack families"): which family a prompt belongs to, the best prompt an item's
search found in each, and the archive of successes by category × family × template family that keeps a run's
finds diverse.

The families are FLEX's three plus their compositions: `persona` (a persona template alone), `instruction` (a
competing-objective / refusal-suppression template alone), `text` (word- and character-level edits alone) and
`composition` (two or more of those together). An item's search keeps its hardest label-valid prompt in every
family it scored (`FamilyBest`), so the run writes one row per item and family beside the hardest-overall row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexsearch.candidate import SLOT_FIELDS, WORD_FIELDS, Candidate

FAMILIES = ("persona", "instruction", "text", "composition")
# FLEX's name of each family (its `attack` column); FLEX has no composition family, so ours keeps its own name.
FLEX_NAMES = {"persona": "persona", "instruction": "refusal_suppression", "text": "text",
              "composition": "composition"}
SLOT_KIND = {  # the kind of attack a filled slot carries
    "persona": "persona", "directive": "instruction", "suffix": "suffix"}


def attack_kinds(candidate: Candidate) -> set[str]:
    """The kinds of attack in place on a candidate: a filled slot's kind (persona, instruction, suffix) and `text`
    when a context or question word differs from the clean item's."""
    kinds = {SLOT_KIND[slot] for slot in SLOT_FIELDS if getattr(candidate, slot)}
    clean = Candidate.root(candidate.item)
    if any(candidate.words(f) != clean.words(f) for f in WORD_FIELDS):
        kinds.add("text")
    return kinds


def family_of(candidate: Candidate) -> str | None:
    """The candidate's family: its one kind of attack, `composition` for two or more, None when unattacked or
    when its one kind is no family (an optimised suffix alone, research only)."""
    kinds = attack_kinds(candidate)
    if len(kinds) >= 2:
        return "composition"
    family = next(iter(kinds), None)
    return family if family in FAMILIES else None


def template_cell(candidate: Candidate) -> str:
    """The archive's template family of a candidate: the template families in place (operator/family) and the
    word operators that edited it, sorted and '+'-joined."""
    return chain_cell(candidate.chain())


@dataclass
class FamilyBest:
    """The hardest label-valid prompt an item's search scored in one family. `orders` is how many option orders
    scored it: 1 when every candidate of the family was kept out by the screen (then `probs` are its displayed
    order's and it is never a success)."""

    candidate: Candidate
    value: float
    probs: np.ndarray
    success: bool
    first_success_query: int | None
    orders: int
    queries: int = 0  # what this item spent on the family's candidates

    def better_than(self, value: float, success: bool, orders: int, fill: int, own_fill: int) -> bool:
        """Whether a newly scored candidate (its value, success, orders scored and archive fill) replaces this
        one: a success beats a failure, and among successes the one in the least filled archive cell wins (the
        harder on a tie); a prompt scored in every order beats one the screen kept out; otherwise the harder."""
        if success != self.success:
            return success
        if success and fill != own_fill:
            return fill < own_fill
        if orders != self.orders:
            return orders > self.orders
        return value > self.value

    def to_record(self) -> dict[str, Any]:
        return {"chain": self.candidate.chain(), "option_order": list(self.candidate.option_order),
                "probs": [float(p) for p in self.probs], "success": self.success,
                "first_success_query": self.first_success_query, "orders": self.orders, "queries": self.queries}


def family_record(record: Mapping[str, Any], family: str) -> dict[str, Any]:
    """An item's trace record with the family's best prompt in place of the hardest overall (what split_row and the
    metrics read)."""
    best = record["families"][family]
    return {**record, "chain": best["chain"], "option_order": best["option_order"], "best_probs": best["probs"],
            "success": best["success"], "first_success_query": best["first_success_query"]}


@dataclass
class Archive:
    """Successes by category × family × template family over the items a run has finished (Rainbow Teaming's
    idea): the learned search prefers, within a family, the template families whose cell holds fewest of the
    category's successes so far, so a run's finds spread over the library instead of repeating its leader."""

    cells: Counter[tuple[str, str, str]]

    @classmethod
    def empty(cls) -> Archive:
        return cls(Counter())

    def add_record(self, record: Mapping[str, Any]) -> None:
        """Counts an item record's successful family prompts (records without families count nothing)."""
        category = record.get("category", "")
        for family, best in (record.get("families") or {}).items():
            if best["success"]:
                self.cells[(category, family, chain_cell(best["chain"]))] += 1

    def fill(self, category: str, family: str, cell: str) -> int:
        return self.cells[(category, family, cell)]

    def share(self, category: str, family: str, cell: str) -> float:
        """The cell's share of the category's successes in the family (0 when there are none yet)."""
        total = sum(n for (c, f, _), n in self.cells.items() if c == category and f == family)
        return self.cells[(category, family, cell)] / total if total else 0.0

    def to_dict(self) -> dict[str, int]:
        return {"|".join(key): n for key, n in sorted(self.cells.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Archive:
        return cls(Counter({tuple(key.split("|", 2)): int(n) for key, n in data.items()}))  # type: ignore[misc]


def chain_cell(chain: Iterable[Mapping[str, Any]]) -> str:
    """template_cell from a recorded chain (no replay needed): a slot's last edit holds its text."""
    steps = list(chain)
    slots = {s["field"]: s for s in steps if s["field"] in SLOT_FIELDS}
    parts = {f"{s['operator']}/{(s.get('args') or {}).get('family', s['operator'])}" for s in slots.values()
             if s["after"]}
    parts |= {s["operator"] for s in steps if s["field"] in WORD_FIELDS}
    return "+".join(sorted(parts))
