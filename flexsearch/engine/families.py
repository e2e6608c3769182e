"""Attack families (DESIGN.md "Attack families"): which family a prompt belongs to, the best prompt an item's
search found in each, and the archive of successes by category × family × template that keeps a run's finds
diverse.

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

from flexsearch.data.candidate import SLOT_FIELDS, WORD_FIELDS, Candidate, chain_edits, templates_in_place

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
        one: a success beats a failure, and among successes the one whose templates the archive holds least
        (Archive.fill) wins (the harder on a tie); a prompt scored in every order beats one the screen kept out;
        otherwise the harder."""
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
    """Successes by category × family × template over the items a run has finished (Rainbow Teaming's idea, with a
    template as the split's `attack_type` names it): the learned search prefers, within a family, prompts whose
    templates hold fewest of the category's successes so far, so a run's finds spread over the library instead of
    repeating its leader. A success counts once in the cell of each template it carries."""

    cells: Counter[tuple[str, str, str]]

    @classmethod
    def empty(cls) -> Archive:
        return cls(Counter())

    def add_record(self, record: Mapping[str, Any]) -> None:
        """Counts an item record's successful family prompts (records without families count nothing)."""
        category = record.get("category", "")
        for family, best in (record.get("families") or {}).items():
            if best["success"]:
                for template in templates_in_place(chain_edits(best["chain"])):
                    self.cells[(category, family, template)] += 1

    def fill(self, category: str, family: str, templates: Iterable[str]) -> int:
        """The most crowded of the templates' cells: how many of the category's successes in the family carry it."""
        return max((self.cells[(category, family, t)] for t in templates), default=0)

    def share(self, category: str, family: str, templates: Iterable[str]) -> float:
        """The fill's share of the template uses among the category's successes in the family (0 when none yet):
        the top-template share of DESIGN "Diversity", cell by cell."""
        total = sum(n for (c, f, _), n in self.cells.items() if c == category and f == family)
        return self.fill(category, family, templates) / total if total else 0.0

    def to_dict(self) -> dict[str, int]:
        return {"|".join(key): n for key, n in sorted(self.cells.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Archive:
        return cls(Counter({tuple(key.split("|", 2)): int(n) for key, n in data.items()}))  # type: ignore[misc]


def templates_of(candidate: Candidate) -> list[str]:
    """The templates in place on a candidate (its archive cells within its family)."""
    return templates_in_place(candidate.edits)
