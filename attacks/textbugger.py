"""TextBugger (Li et al., 2019): character bugs and nearest-neighbour word substitution (Sub-W)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from flexsearch.attacks.base import OPERATORS, AttackResources, refuse_settings
from flexsearch.attacks.neighbours import EmbeddingNeighbours, NeighbourSource, WordNetNeighbours
from flexsearch.attacks.word import WordOperator
from flexsearch.errors import FlexsearchError

# Visually similar substitutes (Sub-C).
HOMOGLYPHS = {"o": "0", "l": "1", "i": "1", "a": "@", "e": "3", "s": "$", "g": "9", "b": "6", "t": "7", "z": "2"}
BUGS = ("insert", "delete", "swap", "sub_c", "sub_w")
NEIGHBOUR_SOURCES = ("wordnet", "embedding")
_WORD = re.compile(r"^(\W*)(.*?)(\W*)$")


def split_word(token: str) -> tuple[str, str, str]:
    """'phone?' → ('', 'phone', '?'): edits touch the core, punctuation stays."""
    match = _WORD.match(token)
    assert match is not None
    return match.group(1), match.group(2), match.group(3)


def character_bugs(word: str) -> dict[str, list[str]]:
    """Bugged variants of one word by kind. First and last letters are never swapped or deleted."""
    if len(word) < 3:
        return {}
    inner = range(1, len(word) - 1)
    return {
        "insert": [word[:k] + " " + word[k:] for k in inner],
        "delete": [word[:k] + word[k + 1:] for k in inner],
        "swap": [word[:k] + word[k + 1] + word[k] + word[k + 2:] for k in range(1, len(word) - 2)
                 if word[k] != word[k + 1]],
        "sub_c": [word[:k] + HOMOGLYPHS[c] + word[k + 1:] for k, c in enumerate(word) if c in HOMOGLYPHS],
    }


def neighbour_source(kind: str, resources: AttackResources, vectors: str | None) -> NeighbourSource:
    if kind == "wordnet":
        return WordNetNeighbours()
    if kind == "embedding":
        if vectors:
            return EmbeddingNeighbours.from_file(vectors)
        if resources.target is None:
            raise FlexsearchError("embedding neighbours need a vector file (vectors: PATH) or a target model")
        return EmbeddingNeighbours.from_target(resources.target)
    raise FlexsearchError(f"unknown neighbour source '{kind}' (choose {' or '.join(NEIGHBOUR_SOURCES)})")


def match_case(template: str, word: str) -> str:
    return word.capitalize() if template[:1].isupper() else word


@OPERATORS.register("textbugger")
class TextBugger(WordOperator):
    """Character bugs (insert space, delete, swap, look-alike) and Sub-W neighbour swaps on chosen words."""

    def __init__(self, resources: AttackResources, bugs: Sequence[str] = BUGS, positions: int = 2,
                 per_position: int = 3, neighbours: str = "wordnet", vectors: str | None = None,
                 k: int = 8) -> None:
        refuse_settings("textbugger", self.settings_problem(bugs=bugs, positions=positions, per_position=per_position,
                                                            neighbours=neighbours, k=k))
        self.bugs, self.positions, self.per_position, self.k = list(bugs), positions, per_position, k
        self.source = neighbour_source(neighbours, resources, vectors) if "sub_w" in self.bugs else None

    @staticmethod
    def white_box_problem(bugs: Sequence[str] = BUGS, neighbours: str = "wordnet", vectors: str | None = None,
                          **_: object) -> str | None:
        """Embedding neighbours without a vector file read the target's own embedding matrix."""
        if "sub_w" in bugs and neighbours == "embedding" and not vectors:
            return "neighbours: embedding reads the target's embedding matrix (white-box only); give vectors: PATH " \
                   "or neighbours: wordnet"
        return None

    @staticmethod
    def settings_problem(bugs: Sequence[str] = BUGS, positions: int = 2, per_position: int = 3,
                         neighbours: str = "wordnet", k: int = 8, **_: object) -> str | None:
        """Why these settings cannot work, or None (checked with the config, before any model loads)."""
        unknown = sorted(set(bugs) - set(BUGS))
        if unknown:
            return f"unknown bugs {unknown}; known: {', '.join(BUGS)}"
        if neighbours not in NEIGHBOUR_SOURCES:
            return f"unknown neighbours '{neighbours}'; known: {', '.join(NEIGHBOUR_SOURCES)}"
        if min(positions, per_position, k) < 1:
            return f"positions, per_position and k must be at least 1, got {positions}, {per_position}, {k}"
        return None

    def variants(self, token: str) -> list[tuple[str, str]]:
        """(bug, new token) pairs for one whitespace token."""
        lead, word, trail = split_word(token)
        out = [(bug, v) for bug, vs in character_bugs(word).items() if bug in self.bugs for v in vs]
        if self.source is not None and len(word) >= 4:  # short function words have no useful synonyms
            out += [("sub_w", match_case(word, n)) for n in self.source.neighbours(word, self.k)]
        return [(bug, f"{lead}{v}{trail}") for bug, v in out if v != word]

    def replacements(self, words: Sequence[str], index: int,
                     rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
        options = self.variants(words[index])
        picked = sorted(rng.permutation(len(options))[: self.per_position])
        return [(options[k][1], {"bug": options[k][0]}) for k in picked]
