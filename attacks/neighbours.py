"""Word-neighbour sources for substitution attacks: WordNet synonyms and embedding nearest neighbours."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from flexsearch.errors import FlexsearchError
from flexsearch.files import atomic_write_text
from flexsearch.scoring.model import cache_root

if TYPE_CHECKING:
    from flexsearch.scoring.model import TargetModel

# WordNet 3.0's lexicographer files, in number order. Debian's wordnet-base omits the `lexnames`
# index that nltk's reader needs, so it is rebuilt from this list.
_LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()
_POS_NUMBER = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
WORDNET_DIRS = [os.environ.get("FLEXSEARCH_WORDNET", ""), "/usr/share/wordnet"]


class NeighbourSource(Protocol):
    def neighbours(self, word: str, k: int) -> list[str]: ...


def _lexnames_text() -> str:
    return "".join(f"{i:02d}\t{name}\t{_POS_NUMBER[name.split('.')[0]]}\n" for i, name in enumerate(_LEXNAMES))


def wordnet_root() -> Path | None:
    """A directory nltk can read: the system WordNet files plus the missing lexnames file."""
    source = next((Path(d) for d in WORDNET_DIRS if d and (Path(d) / "data.noun").exists()), None)
    if source is None:
        return None
    if (source / "lexnames").exists():
        return source
    # A private copy (nltk refuses symlinks that leave its allowed roots), completed by lexnames.
    root = cache_root() / "wordnet"
    if not (root / "lexnames").exists():
        root.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if entry.is_file():
                shutil.copyfile(entry, root / entry.name)
        atomic_write_text(root / "lexnames", _lexnames_text())
    return root


class WordNetNeighbours:
    """Synonyms from WordNet (Debian's wordnet-base, read with nltk)."""

    def __init__(self, root: Path | None = None) -> None:
        root = root or wordnet_root()
        if root is None:
            raise FlexsearchError("WordNet not found: apt-get install wordnet-base, or set FLEXSEARCH_WORDNET")
        import nltk  # imported here: a second of import time that only WordNet users pay
        from nltk.corpus.reader.wordnet import WordNetCorpusReader

        class LocalWordNet(WordNetCorpusReader):
            def map_wn(self, version: str = "wordnet") -> None:
                return None  # this copy is the reference WordNet; nltk would otherwise look for a downloaded one

        if str(root) not in nltk.data.path:
            nltk.data.path.append(str(root))  # nltk only reads corpora under its allowed roots
        with warnings.catch_warnings():  # no multilingual data is expected here
            warnings.simplefilter("ignore")
            self.reader: Any = LocalWordNet(str(root), None)

    @classmethod
    @lru_cache(maxsize=1)
    def if_available(cls) -> WordNetNeighbours | None:
        return cls() if wordnet_root() is not None else None

    def neighbours(self, word: str, k: int) -> list[str]:
        found: list[str] = []
        for synset in self.reader.synsets(word.lower()):
            for lemma in synset.lemma_names():
                name = lemma.lower()
                if "_" not in name and name != word.lower() and name not in found:
                    found.append(name)
        return found[:k]

    def antonyms(self, word: str) -> set[str]:
        return {a.name().lower().replace("_", " ")
                for synset in self.reader.synsets(word.lower())
                for lemma in synset.lemmas() for a in lemma.antonyms()}


class EmbeddingNeighbours:
    """Cosine nearest neighbours in a static word-vector space: a text vector file (word then
    numbers per line, GloVe/word2vec text format) or the target model's input embeddings restricted
    to whole-word tokens."""

    def __init__(self, words: list[str], vectors: np.ndarray) -> None:
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self.vectors = vectors / np.maximum(norms, 1e-12)

    @classmethod
    def from_file(cls, path: str | Path, limit: int | None = None) -> EmbeddingNeighbours:
        words, rows = [], []
        with Path(path).open(encoding="utf-8") as handle:
            for line in handle:
                parts = line.rstrip().split(" ")
                if len(parts) < 3:  # word2vec header line "count dim"
                    continue
                words.append(parts[0])
                rows.append(np.asarray(parts[1:], dtype=np.float32))
                if limit and len(words) >= limit:
                    break
        if not words:
            raise FlexsearchError(f"{path}: no word vectors found")
        return cls(words, np.stack(rows))

    @classmethod
    def from_target(cls, target: TargetModel) -> EmbeddingNeighbours:
        tokenizer = target.tokenizer
        import torch

        weight = target.model.get_input_embeddings().weight
        assert isinstance(weight, torch.Tensor)
        matrix = weight.detach().float().cpu().numpy()
        words, ids = [], []
        for token_id in range(min(len(tokenizer), matrix.shape[0])):
            text = str(tokenizer.decode([token_id]))
            # A whole word is a token that starts a word (leading space) and is letters only.
            if text.startswith(" ") and re.fullmatch(r"[A-Za-z]{3,}", text[1:]):
                words.append(text[1:].lower())
                ids.append(token_id)
        if not words:
            raise FlexsearchError("the target tokenizer has no whole-word tokens to use as neighbours")
        unique = dict(zip(words, ids, strict=True))  # case variants collapse to one entry
        return cls(list(unique), matrix[list(unique.values())])

    def neighbours(self, word: str, k: int) -> list[str]:
        index = self.index.get(word.lower())
        if index is None:
            return []
        sims = self.vectors @ self.vectors[index]
        best = np.argsort(-sims)[: k + 1]
        return [self.words[i] for i in best if i != index][:k]
