"""The weak-spot map: which templates and compositions broke the target, on which items and categories, overall and
per attack family (score.json `weak_spots`). It reads the search's records as the learner does (observations), but
it is a finding about the model, not the learner's ranking of what to try next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flexsearch.engine.families import FAMILIES
from flexsearch.engine.learner import composition_parts, observations_of
from flexsearch.results.metrics import proportion


def weak_spots(records: Sequence[Mapping[str, Any]], eligible: Sequence[bool], categories: Sequence[str],
               top: int = 10, per_category: int = 3) -> dict[str, Any]:
    """Templates and compositions ranked by the attack-eligible items they broke: n items on which a label-valid
    candidate carrying it was scored, k of them where one such candidate met the objective. Overall and per
    category, each rate with its Wilson interval; `per_family` the same over each attack family's candidates (the
    map of what breaks the model: for text and composition the word operators count as keys too; a family's
    `items` are the eligible items that scored one of its candidates)."""
    def table(rows: list[tuple[str, tuple[set[str], set[str]]]], wanted: int) -> list[dict[str, Any]]:
        tried: dict[str, list[bool]] = {}
        for _, (touched, won) in rows:
            for key in touched:
                tried.setdefault(key, []).append(key in won)
        ranked: list[dict[str, Any]] = [
            {"key": key, "kind": "composition" if "+" in key else "template", "broke": proportion(flags)}
            for key, flags in tried.items()]
        ranked.sort(key=lambda r: (-r["broke"]["k"], -(r["broke"]["ci"][0] or 0.0), r["key"]))
        return ranked[:wanted]

    def ranked(family: str | None) -> dict[str, Any]:
        per_item: list[tuple[str, tuple[set[str], set[str]]]] = []
        for record, ok, category in zip(records, eligible, categories, strict=True):
            if not ok:
                continue
            touched: set[str] = set()
            won: set[str] = set()
            for observation in observations_of(record):
                if not observation.valid or (family is not None and observation.family != family):
                    continue
                parts = composition_parts(observation.composition)
                keys = {*parts, *([observation.composition] if len(parts) >= 2 else [])}
                if family in ("text", "composition"):  # word edits are in no composition: their operators count
                    keys |= {arm for arm in composition_parts(observation.arm) if "/" not in arm}
                touched |= keys
                if observation.success:
                    won |= keys
            if family is None or touched:
                per_item.append((category, (touched, won)))
        categories_seen = sorted({c for c, _ in per_item})
        return {
            "items": len(per_item),
            "overall": table([(c, r) for c, r in per_item], top),
            "per_category": {c: table([(x, r) for x, r in per_item if x == c], per_category)
                             for c in categories_seen},
        }

    return {**ranked(None), "per_family": {f: ranked(f) for f in FAMILIES}}
