"""The driver: runs many items' searches at once, so one forward batch mixes prompts of several items; the screen
that prunes before the full price is paid; the learner's rounds. The per-item state is in state.py, the methods in
methods/ (one file each)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
from flexsearch.config import SearchConfig
from flexsearch.data.items import Item
from flexsearch.engine.families import SLOT_KIND
from flexsearch.engine.learner import Learner
from flexsearch.engine.methods import SEARCH_METHODS
from flexsearch.engine.state import ItemOutcome, ItemState, Request, Screen, SearchContext, item_rng
from flexsearch.objectives import attack_eligible, get_objective, lead
from flexsearch.scoring.scorer import Scorer

ALWAYS_ON = ("no_option_names",)  # constraints every search applies, listed in its config or not (label validity)


def constraint_specs(specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A config's constraint specs with the always-on ones put first where the config does not list them."""
    named = {spec["name"] for spec in specs}
    return [*({"name": name} for name in ALWAYS_ON if name not in named), *specs]


def proposable_arms(config: SearchConfig) -> set[str]:
    """Every learner arm this config's operators can propose: each library template, each other operator."""
    arms: set[str] = set()
    for spec in config.operators:
        if hasattr(OPERATORS.get(spec["name"]), "arms"):
            arms |= set(build(OPERATORS, spec, AttackResources()).arms())  # type: ignore[attr-defined]
        else:
            arms.add(spec["name"])
    return arms


def unreachable_families(config: SearchConfig) -> dict[str, str]:
    """The attack families this config's operators cannot make, each with the reason (score.json `families`)."""
    kinds = set()
    for spec in config.operators:
        cls = OPERATORS.get(spec["name"])
        kinds.add("text" if cls.edits_words else SLOT_KIND.get(getattr(cls, "slot", ""), ""))
    kinds -= {"", "suffix"}
    reasons = {f: f"no {f} operator in the search's operators" for f in ("persona", "instruction") if f not in kinds}
    if "text" not in kinds:
        reasons["text"] = "no word operator (textbugger, bert_attack, ...) in the search's operators"
    if len(kinds) < 2:
        reasons["composition"] = "needs operators of two families"
    return reasons


def build_context(config: SearchConfig, scorer: Scorer, objective_name: str) -> SearchContext:
    objective = get_objective(objective_name, config.success_margin)
    resources = AttackResources(target=scorer.target, fmt=scorer.fmt, objective=objective)
    specs = constraint_specs(config.constraints)
    return SearchContext(
        config=config, scorer=scorer, objective=objective,
        operators=[build(OPERATORS, spec, resources) for spec in config.operators],
        constraints=[build(CONSTRAINTS, spec, resources) for spec in specs],
        resources=resources,
    )


def search_batch(items: Sequence[Item], ctx: SearchContext, objective_name: str, learner: Learner) -> list[ItemOutcome]:
    """Searches a few items together (their prompts share forward batches), each with its own copy of `learner`."""
    config, scorer = ctx.config, ctx.scorer
    states = [ItemState(item, ctx.objective, item_rng(config.seed, item.id, objective_name), config.budget,
                        scorer.queries_per_candidate, scorer.backend.queries_per_prompt, learner=learner.copy())
              for item in items]
    methods = [SEARCH_METHODS.get(config.method).search(ctx, s) for s in states]
    pending = {i: next(m) for i, m in enumerate(methods)}
    while pending:
        order = list(pending)
        flat = [c for i in order for c in pending[i].candidates]
        screens = screened(ctx, [(states[i], pending[i]) for i in order])
        if screens is None:
            probs = scorer.score(flat).probs
        else:  # screened-out candidates keep their displayed order's distribution
            probs, kept = np.concatenate([s.displayed for s in screens]), ~np.concatenate([s.out for s in screens])
            if kept.any():
                probs[kept] = scorer.score([c for c, k in zip(flat, kept, strict=True) if k]).probs
        offset = 0
        for j, i in enumerate(order):
            request, state = pending[i], states[i]
            span = slice(offset, offset + len(request.candidates))
            offset = span.stop
            state.record(request, probs[span], None if screens is None else screens[j])
            try:
                pending[i] = methods[i].send(probs[span])
                if not pending[i].candidates:
                    raise StopIteration
            except StopIteration:
                del pending[i]
    return [s.outcome(objective_name) for s in states]


def screened(ctx: SearchContext, requests: Sequence[tuple[ItemState, Request]]) -> list[Screen] | None:
    """Pruning before the full price is paid: with averaged orders and `screen_lead` above -1 (any method, so a
    baseline can have the same pruning), every candidate is first scored in its displayed order (one prompt), and
    one whose aim lead there is below `screen_lead` is not scored in the other two. The clean prompt is never
    screened. None: no screen."""
    config, scorer = ctx.config, ctx.scorer
    if not scorer.average_orders or config.screen_lead <= -1:
        return None
    displayed = scorer.score([c for _, r in requests for c in r.candidates], displayed_only=True).probs
    screens, offset = [], 0
    for state, request in requests:
        shown = displayed[offset : offset + len(request.candidates)]
        offset += len(request.candidates)
        leads = np.array([lead(ctx.objective, p, state.item) for p in shown])
        out = np.array([bool(c.edits) for c in request.candidates]) & (leads < config.screen_lead)
        screens.append(Screen(shown, leads, out))
    return screens


def rounds(items: Sequence[Item], size: int) -> list[Sequence[Item]]:
    """The learner's rounds: consecutive items of the whole list, `size` at a time. Every item of a round is
    searched with the state the earlier rounds left, whatever was finished before a resume or on which worker."""
    return [items[start : start + size] for start in range(0, len(items), size)]


def run_search(
    items: Sequence[Item],
    ctx: SearchContext,
    objective_name: str,
    on_batch_done: Callable[[list[ItemOutcome]], None] = lambda outcomes: None,
    progress: tqdm | None = None,
    finished: dict[str, dict[str, Any]] | None = None,
    learner: Learner | None = None,
) -> list[ItemOutcome]:
    """Searches every item not in `finished` (item id → trace record) and returns their outcomes; items are
    processed `item_batch` at a time with their prompts scored together, and `on_batch_done` receives each
    finished batch (the run directory appends it). `learner` (a prior, or empty) learns from every item,
    finished ones included, after each round of `learner_round` items, in item order."""
    config, scorer = ctx.config, ctx.scorer
    finished = finished or {}
    learner = learner if learner is not None else Learner()
    outcomes: list[ItemOutcome] = []
    started, start_queries = time.perf_counter(), scorer.queries
    records = dict(finished)  # every item's record as the learner reads it: finished ones, then searched ones
    for round_items in rounds(items, config.learner_round):
        todo = [it for it in round_items if it.id not in finished]
        for start in range(0, len(todo), config.item_batch):
            batch = search_batch(todo[start : start + config.item_batch], ctx, objective_name, learner)
            outcomes += batch
            records.update({o.item.id: o.to_record() for o in batch})
            on_batch_done(batch)
            if progress is not None:
                rate = (scorer.queries - start_queries) / max(time.perf_counter() - started, 1e-9)
                wins = [o.success for o in outcomes if attack_eligible(ctx.objective, o.item, o.clean_probs)]
                progress.update(len(batch))
                progress.set_postfix({f"ASR({objective_name})": f"{np.mean(wins):.2f}" if wins else "-",
                                      "q_per_s": f"{rate:.1f}", **scorer.backend.progress()})
        learner.observe_records(records[it.id] for it in round_items)
    return outcomes
