"""`flexsearch mutate`: one operator's accepted mutations of one item, for reading an operator by eye."""

from __future__ import annotations

from typing import Any

import numpy as np

from flexsearch.config import Origins, SearchConfig
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import load_items
from flexsearch.engine.loop import constraint_specs
from flexsearch.errors import FlexsearchError


def mutate(data: str, item_ref: str, operator: str, n: int, settings: list[str], seed: int) -> str:
    """Accepted mutations of one item (default constraints applied), one block per mutation."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
    from flexsearch.config import apply_override, check_specs

    spec: dict[str, Any] = {"name": operator}
    for assignment in settings:
        apply_override(spec, assignment)
    origins = Origins()
    origins.set("operators", " ".join([f"--operator {operator}", *(f"--set {a}" for a in settings)]))
    check_specs({"operators": [spec]}, origins)  # names and setting types, before any data is read
    items = load_items(data).items
    chosen = next((it for it in items if it.id == item_ref), None)
    if chosen is None and item_ref.isdigit() and int(item_ref) < len(items):
        chosen = items[int(item_ref)]
    if chosen is None:
        raise FlexsearchError(f"--item {item_ref}: no such item id or index in {data} ({len(items)} items)")
    resources = AttackResources()
    op = build(OPERATORS, spec, resources)
    # the similarity check (a sentence encoder) only judges word edits; a template operator is never slowed by it
    specs = [c for c in SearchConfig().constraints if op.edits_words or c["name"] != "similarity"]
    constraints = [build(CONSTRAINTS, c, resources) for c in constraint_specs(specs)]
    rng = np.random.default_rng(seed)
    root = Candidate.root(chosen)
    accepted: list[Candidate] = []
    for _ in range(20):  # operators sample; ask a few times to gather n distinct accepted mutations
        proposals = op.propose(root, rng)
        for constraint in constraints:
            proposals = [c for c, ok in zip(proposals, constraint.accept(proposals), strict=True) if ok]
        accepted += [c for c in proposals if c.edits[-1] not in [a.edits[-1] for a in accepted]]
        if len(accepted) >= n:
            break
    lines = [f"item {chosen.id} ({chosen.category}, {chosen.condition}/{chosen.polarity})",
             f"  context:  {chosen.context}", f"  question: {chosen.question}", ""]
    for k, c in enumerate(accepted[:n], start=1):
        e = c.edits[-1]
        where = e.field if e.position is None else f"{e.field}[{e.position}]"
        lines.append(f"{k:2d}. {where}: {e.before!r} -> {e.after!r} {dict(e.args)}")
    if not accepted:
        lines.append("no mutation passed the constraints")
    return "\n".join(lines)
