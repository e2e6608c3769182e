"""How wide a split is (DESIGN.md "Diversity"): over its successful rows, the most common template's share of the
template uses, the most common composition's share of the rows, the effective number of templates (exp of the
entropy of their distribution) and the mean pairwise cosine similarity of the text the attacks added (MiniLM). A
"template" is an attack variant as the split's `attack_type` names it: a persona or instruction template
(`persona:role_play.0`, operator/family/index) or a word operator's edit kind (`textbugger:swap`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flexsearch.data.candidate import chain_edits, templates_in_place

Encode = Callable[[list[str]], np.ndarray]  # texts → unit vectors, one a row


def row_variants(row: dict[str, Any]) -> list[str]:
    """A row's templates in place, once each, named as `attack_type` names them (`persona:role_play.0`,
    `textbugger:swap`): a template swapped out does not count."""
    return templates_in_place(chain_edits(row["attack_chain"]))


def added_text(row: dict[str, Any]) -> str:
    """What the attack added to the clean prompt: the instruction slots' text and each edited word as it now reads."""
    words = [str(e["after"]) for e in row["attack_chain"] if e.get("position") is not None]
    return " ".join(part for part in (row["instruction"], *words) if part)


def _top(counts: Counter[str], total: int) -> dict[str, Any] | None:
    if not counts:
        return None
    key, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"key": key, "count": n, "share": round(n / total, 4)}


def mean_pairwise_cosine(texts: Sequence[str], encode: Encode) -> float | None:
    """The mean cosine similarity over every pair of texts (None with fewer than two)."""
    if len(texts) < 2:
        return None
    vectors = encode(list(texts))
    gram = vectors @ vectors.T
    upper = gram[np.triu_indices(len(texts), k=1)]
    return round(float(upper.mean()), 4)


def diversity(rows: Sequence[dict[str, Any]], encode: Encode | None) -> dict[str, Any]:
    """The four width measures over the successful rows (`encode` None: the cosine is not computed)."""
    wins = [r for r in rows if r["success"]]
    uses = Counter(v for r in wins for v in row_variants(r))
    compositions = Counter("+".join(row_variants(r)) for r in wins)
    total = sum(uses.values())
    entropy = -sum(n / total * math.log(n / total) for n in uses.values()) if total else 0.0
    return {"successful_rows": len(wins), "template_uses": total, "distinct_templates": len(uses),
            "top_template": _top(uses, total), "top_composition": _top(compositions, len(wins)),
            "effective_templates": round(math.exp(entropy), 4) if total else None,
            "mean_pairwise_cosine": (mean_pairwise_cosine([added_text(r) for r in wins], encode)
                                     if encode is not None else None)}


def minilm_encoder() -> Encode:
    """The sentence encoder the similarity constraint uses (all-MiniLM-L6-v2), returning unit vectors."""
    from flexsearch.attacks.constraints import default_encoder_path, sentence_encoder

    model = sentence_encoder(default_encoder_path())
    return lambda texts: np.asarray(model.encode(texts, normalize_embeddings=True, convert_to_numpy=True))
