"""`flexsearch evaluate` as a pipeline: items scored clean (`evaluate_items`, also the capability items of a search),
or a split's attacked prompts re-scored beside their clean versions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item, load_items, source_sha256
from flexsearch.errors import FlexsearchError
from flexsearch.files import atomic_write_jsonl
from flexsearch.objectives import SUCCESS_MARGIN
from flexsearch.pipeline.run import fitting_items, opened_run
from flexsearch.pipeline.target import Target
from flexsearch.results import RunResult, Score
from flexsearch.results.metrics import clean_metrics, per_category, robustness_score
from flexsearch.results.printing import CLEAN_COLUMNS, format_search_table, format_table
from flexsearch.results.run_files import PREDICTIONS
from flexsearch.results.split import load_split
from flexsearch.scoring.scorer import Scorer, Scores


def evaluate_data(data: str, out: Path, target: Target, scoring: dict[str, Any], limit: int | None) -> RunResult:
    started = time.time()
    loaded = load_items(data, limit=limit)
    resolved = {"command": "evaluate", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": target.requested(scoring["mode"]), "scoring": scoring}
    with opened_run(out, resolved, target) as (run, scorer):
        items, skipped = fitting_items(loaded, scorer, 0)
        counts = {"skipped": sum(skipped.values()), "skipped_reasons": skipped}
        score, predictions = evaluate_items(scorer, items, extra={"data": data, **counts, "model": scorer.info})
        atomic_write_jsonl(out / PREDICTIONS, predictions)
        written = run.write_score(score, started)
        files = run.files()
    lines = [format_table(written, CLEAN_COLUMNS)]
    lines.append(f"items: {len(items)} scored, {counts['skipped']} skipped"
                 + "".join(f"\n  {n} × {why}" for why, n in skipped.items()))
    return RunResult(out, Score.from_dict(written), predictions, "\n".join(lines), files)


def evaluate_split(split: Path, out: Path, target: Target, scoring: dict[str, Any], limit: int | None) -> RunResult:
    started = time.time()
    rows = load_split(split, limit=limit)
    resolved = {"command": "evaluate", "split": str(split), "data_sha256": source_sha256(str(split)),
                "limit": limit, "model": target.requested(scoring["mode"]), "scoring": scoring}
    with opened_run(out, resolved, target) as (run, scorer):
        total = len(rows)
        rows = [r for r in rows if scorer.fits(Candidate.root(r.item)) and scorer.fits(r.candidate)]
        if not rows:
            raise FlexsearchError(f"{split}: every row is longer than the model's context")
        items = [r.item for r in rows]
        objective = str(rows[0].record.get("objective", "stereotype"))
        clean = score_all(scorer, [Candidate.root(it) for it in items], desc="clean")
        attacked = score_all(scorer, [r.candidate for r in rows], desc="attacked")
        arrays = {"objective": objective, "clean": clean.probs, "attacked": attacked.probs,
                  "forced": np.array([r.candidate.forced_choice for r in rows], dtype=bool)}
        dropped = total - len(rows)
        score = {"split": str(split), "model": scorer.info, "items": len(items),
                 "skipped": dropped, "skipped_reasons": {f"prompt over {scorer.max_prompt_tokens} tokens": dropped}
                 if dropped else {}, "success_margin": SUCCESS_MARGIN,
                 **robustness_score(items, arrays, None, None, clean.letters, SUCCESS_MARGIN),
                 "queries": scorer.queries, **scorer.served_usage()}
        predictions = [{**row, "attacked_probs": [round(float(p), 6) for p in probs]}
                       for row, probs in zip(prediction_rows(items, clean), attacked.probs, strict=True)]
        atomic_write_jsonl(out / PREDICTIONS, predictions)
        written = run.write_score(score, started)
        files = run.files()
    return RunResult(out, Score.from_dict(written), predictions, format_search_table(written, objective), files)


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
