"""`flexsearch evaluate`: score items (or an emitted split) on a target model and write the metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.candidate import Candidate
from flexsearch.items import Item
from flexsearch.metrics import clean_metrics, metric_text, per_category
from flexsearch.scoring import Scorer, Scores

PROGRESS_CHUNK = 32  # candidates per progress-bar step; the scorer batches within each chunk


def score_all(scorer: Scorer, candidates: Sequence[Candidate], desc: str = "scoring") -> Scores:
    """Scores any number of candidates with a progress bar."""
    parts: list[Scores] = []
    with tqdm(total=len(candidates), desc=desc, unit="item", disable=len(candidates) <= PROGRESS_CHUNK) as bar:
        for start in range(0, len(candidates), PROGRESS_CHUNK):
            parts.append(scorer.score(candidates[start : start + PROGRESS_CHUNK]))
            bar.update(len(parts[-1].probs))
            if scorer.backend.progress():
                bar.set_postfix(scorer.backend.progress())
    if not parts:
        return Scores(np.zeros((0, 3)), np.zeros((0, 1, 3)))
    return Scores(
        probs=np.concatenate([p.probs for p in parts]),
        letters=np.concatenate([p.letters for p in parts]),
    )


def metrics_for(items: Sequence[Item], scores: Scores) -> dict[str, Any]:
    """Overall and per-category clean metrics."""
    return {
        **clean_metrics(items, scores.probs, scores.letters),
        "per_category": per_category(
            items, lambda idx: clean_metrics([items[i] for i in idx], scores.probs[idx], scores.letters[idx])
        ),
    }


def prediction_rows(items: Sequence[Item], scores: Scores) -> list[dict[str, Any]]:
    rows = []
    for item, probs in zip(items, scores.probs, strict=True):
        prediction = int(probs.argmax())
        rows.append({
            "item_id": item.id, "category": item.category, "condition": item.condition,
            "polarity": item.polarity, "gold": item.gold, "target": item.target,
            "anti_target": item.anti_target, "unknown": item.unknown,
            "probs": [round(float(p), 6) for p in probs], "prediction": prediction,
            "correct": prediction == item.gold, "p_target": round(float(probs[item.target]), 6),
        })
    return rows


def evaluate_items(scorer: Scorer, items: Sequence[Item],
                   extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scores every item clean: the score (after `extra`) and the per-item prediction rows."""
    scores = score_all(scorer, [Candidate.root(it) for it in items], desc="evaluate")
    score = {**(extra or {}), **metrics_for(items, scores), "queries": scorer.queries, **scorer.served_usage()}
    return score, prediction_rows(items, scores)


def format_table(score: dict[str, Any], columns: Sequence[tuple[str, str]]) -> str:
    """A compact text table: one row overall, one per category; columns are (header, metric key)."""
    rows = [("overall", score), *score.get("per_category", {}).items()]
    header = ["group", "n", *(h for h, _ in columns), "letters A/B/C"]
    body = []
    for name, metrics in rows:
        letters = metrics.get("letter_bias", {})
        body.append([
            name, str(metrics.get("n_items", "")), *(cell_text(metrics.get(key)) for _, key in columns),
            "/".join(f"{letters.get(x, 0):.2f}" for x in "ABC"),
        ])
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *body])


def cell_text(value: Any) -> str:
    """A table cell: text as it is (a verdict), a metric as its value and interval, and a proportion with
    its count over the denominator it rests on ('0.50 [0.15, 0.85] 2/4')."""
    if isinstance(value, str):
        return value
    text = metric_text(value)
    return f"{text} {value['k']}/{value['n']}" if value and value.get("k") is not None and value.get("n") else text


CLEAN_COLUMNS = (("accuracy", "accuracy"), ("P(target)", "mean_p_target"), ("s_dis", "s_dis"), ("s_amb", "s_amb"))
