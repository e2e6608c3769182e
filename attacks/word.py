"""The shared shape of word-substitution operators: pick positions, ask for replacements, apply each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from flexsearch.attacks.base import Position
from flexsearch.attacks.constraints import sample_positions
from flexsearch.data.candidate import Candidate


class WordOperator:
    """Base class for operators that replace one word at a time. Subclasses set `positions` (how many
    to pick when the search does not say) and `per_position`, and implement `replacements`."""

    name: ClassVar[str]
    edits_words: ClassVar[bool] = True
    needs_gradient: ClassVar[bool] = False
    positions: int
    per_position: int

    def replacements(self, words: Sequence[str], index: int,
                     rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
        """(new whitespace token, edit arguments) pairs for words[index], best or sampled first."""
        raise NotImplementedError

    def propose(self, candidate: Candidate, rng: np.random.Generator,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
        if positions is None:
            positions = sample_positions(candidate, rng, self.positions)
        return [candidate.with_words(self.name, field_name, index, token, **args)
                for field_name, index in positions
                for token, args in self.replacements(candidate.words(field_name), index, rng)[: self.per_position]]
