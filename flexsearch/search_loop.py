"""The search loop: find, per item, the prompt mutation that pushes the target model furthest toward
the objective's answer within a query budget.

Read top to bottom: outcome dataclass → per-item state → pure helpers → the three search methods
(each a generator that yields candidates to score and receives their answer distributions) → the
driver that runs many items at once, so one forward batch mixes prompts of several items.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
from flexsearch.attacks.base import Constraint, Operator, Position
from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.importance import gradient_importance, importance_from_probes, leave_one_out_probes
from flexsearch.candidate import Candidate
from flexsearch.config import SearchConfig
from flexsearch.items import Item
from flexsearch.objectives import Objective, attack_eligible, get_objective
from flexsearch.scoring import Scorer


@dataclass
class ItemOutcome:
    """The hardest prompt found for one item under one objective, and what it cost."""

    item: Item
    objective: str
    best: Candidate
    clean_probs: np.ndarray
    best_probs: np.ndarray
    success: bool
    queries: int
    first_success_query: int | None  # queries spent when the objective was first met

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "item", "objective": self.objective, "item_id": self.item.id,
            "chain": self.best.chain(), "option_order": list(self.best.option_order),
            "clean_probs": [float(p) for p in self.clean_probs], "best_probs": [float(p) for p in self.best_probs],
            "success": self.success, "queries": self.queries, "first_success_query": self.first_success_query,
        }


@dataclass
class Request:
    """Candidates an item wants scored. Probes (leave-one-out deletions) inform the search but are
    never emitted as attacks."""

    candidates: list[Candidate]
    probe: bool = False


@dataclass
class ItemState:
    """Book-keeping the driver does for each item: budget, best candidate so far, first success."""

    item: Item
    objective: Objective
    rng: np.random.Generator
    budget: int
    cost_per_candidate: int
    queries: int = 0
    best: Candidate | None = None
    best_value: float = -np.inf
    best_probs: np.ndarray | None = None
    clean_probs: np.ndarray | None = None
    first_success_query: int | None = None
    seen: set[tuple[Any, ...]] = field(default_factory=set)

    @property
    def succeeded(self) -> bool:
        return self.first_success_query is not None

    def affordable(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Drops candidates already scored for this item, then caps the rest to the remaining budget."""
        fresh = []
        for c in candidates:
            key = prompt_key(c)
            if key not in self.seen:
                self.seen.add(key)
                fresh.append(c)
        return fresh[: max(0, (self.budget - self.queries) // self.cost_per_candidate)]

    def record(self, request: Request, probs: np.ndarray) -> None:
        """Charges the request and keeps its best candidate. An item pays for every distinct prompt its
        search asks for, whether or not the shared cache already held it: the budget then does not
        depend on other searches. A success is dated at its own candidate, as if the request's
        candidates had been scored one after another (ASR vs budget)."""
        spent_before = self.queries
        self.queries += len(request.candidates) * self.cost_per_candidate
        self.seen.update(prompt_key(c) for c in request.candidates)  # the clean prompt is never paid twice
        if self.clean_probs is None:
            self.clean_probs = probs[0]
        if request.probe:
            return
        for k, (candidate, p) in enumerate(zip(request.candidates, probs, strict=True)):
            value = self.objective.value(p, self.item)
            if value > self.best_value:
                self.best, self.best_value, self.best_probs = candidate, value, p
            if self.first_success_query is None and self.objective.success(p, self.item):
                self.first_success_query = spent_before + (k + 1) * self.cost_per_candidate

    def outcome(self, objective_name: str) -> ItemOutcome:
        assert self.best is not None and self.best_probs is not None and self.clean_probs is not None
        return ItemOutcome(self.item, objective_name, self.best, self.clean_probs, self.best_probs,
                           bool(self.objective.success(self.best_probs, self.item)), self.queries,
                           self.first_success_query)


SearchMethod = Generator[Request, np.ndarray, None]


@dataclass
class SearchContext:
    """What every search method uses: the config, operators, constraints, scorer and objective."""

    config: SearchConfig
    scorer: Scorer
    objective: Objective
    operators: list[Operator]
    constraints: list[Constraint]
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def word_operators(self) -> list[Operator]:
        return [op for op in self.operators if op.edits_words]

    def admissible(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Candidates that pass every constraint; rejections are counted per constraint."""
        alive = list(candidates)
        for constraint in self.constraints:
            verdicts = constraint.accept(alive) if alive else []
            self.rejected[constraint.name] += verdicts.count(False)
            alive = [c for c, ok in zip(alive, verdicts, strict=True) if ok]
        return alive

    def values(self, item: Item, probs: np.ndarray) -> np.ndarray:
        return np.array([self.objective.value(p, item) for p in probs])


# ---------------------------------------------------------------- helpers


def prompt_key(candidate: Candidate) -> tuple[Any, ...]:
    """What the rendered prompt depends on (two candidates with one key score the same)."""
    return (candidate.instruction, candidate.context_words, candidate.question_words, candidate.option_order)


def item_rng(seed: int, item_id: str, objective: str) -> np.random.Generator:
    """A generator that depends only on the seed, the item and the objective (so resumes and
    different batchings give identical searches)."""
    digest = hashlib.sha256(f"{seed}|{item_id}|{objective}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def propose_all(ctx: SearchContext, candidate: Candidate, rng: np.random.Generator,
                operators: Sequence[Operator] | None = None,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
    return [c for op in (operators if operators is not None else ctx.operators)
            for c in op.propose(candidate, rng, positions if op.edits_words else None)]


def crossover(a: Candidate, b: Candidate) -> Candidate:
    """a's instruction slots with as many of b's word edits as still apply."""
    child = a
    for edit in b.edits:
        if edit.position is None or (edit.field, edit.position) in child.edited_positions():
            continue
        if child.words(edit.field)[edit.position] == edit.before:
            child = child.apply(edit)
    return child


# ---------------------------------------------------------------- search methods


def greedy_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """TextBugger/BERT-Attack style: rank words by importance, then edit them in that order, keeping an
    edit only when it moves the objective; templates are tried once at the start."""
    root = Candidate.root(state.item)
    probs = yield Request([root])
    current, current_value = root, ctx.values(state.item, probs)[0]
    templates = [op for op in ctx.operators if not op.edits_words]
    if templates:
        options = state.affordable(ctx.admissible(propose_all(ctx, root, state.rng, templates)))
        if options:
            probs = yield Request(options)
            values = ctx.values(state.item, probs)
            if values.max() > current_value:
                current, current_value = options[int(values.argmax())], float(values.max())
    positions = editable_positions(current)
    if not ctx.word_operators or not positions or state.succeeded:
        return
    if ctx.config.importance == "gradient":
        scores = gradient_importance(ctx.scorer.target, ctx.scorer.fmt, ctx.objective, current, positions)
        state.queries += 1  # one forward (and backward) pass
    else:
        probes = state.affordable(leave_one_out_probes(current, positions))
        if len(probes) < len(positions):
            return
        probs = yield Request(probes, probe=True)
        scores = importance_from_probes(current_value, ctx.values(state.item, probs))
    for index in np.argsort(-scores, kind="stable"):
        if state.succeeded and ctx.config.stop_on_success:
            return
        options = state.affordable(ctx.admissible(
            propose_all(ctx, current, state.rng, ctx.word_operators, [positions[index]])))
        if not options:
            if state.queries + state.cost_per_candidate > state.budget:
                return
            continue
        probs = yield Request(options)
        values = ctx.values(state.item, probs)
        if values.max() > current_value:
            current, current_value = options[int(values.argmax())], float(values.max())


def beam_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """Keep the `beam_width` best candidates; expand each with every operator; repeat."""
    root = Candidate.root(state.item)
    probs = yield Request([root])
    beam = [(ctx.values(state.item, probs)[0], 0, root)]
    for _ in range(ctx.config.steps):
        if state.succeeded and ctx.config.stop_on_success:
            return
        proposals = [c for _, _, parent in beam for c in propose_all(ctx, parent, state.rng)]
        options = state.affordable(ctx.admissible(proposals))
        if not options:
            return
        probs = yield Request(options)
        scored = [(v, len(beam) + i, c) for i, (v, c) in enumerate(zip(ctx.values(state.item, probs), options,
                                                                           strict=True))]
        # Ties break toward the earlier candidate, so the beam is deterministic.
        beam = sorted(beam + scored, key=lambda t: (-t[0], t[1]))[: ctx.config.beam_width]


def evolutionary_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """A population of template/edit combinations: keep the fittest half, refill it with mutated
    children and crossovers of fit parents."""
    root = Candidate.root(state.item)
    probs = yield Request([root])
    population = [(ctx.values(state.item, probs)[0], root)]
    for _ in range(ctx.config.steps):
        if state.succeeded and ctx.config.stop_on_success:
            return
        parents = [c for _, c in population]
        children: list[Candidate] = []
        for _ in range(ctx.config.population):
            parent = parents[int(state.rng.integers(len(parents)))]
            if len(parents) > 1 and state.rng.random() < 0.3:
                other = parents[int(state.rng.integers(len(parents)))]
                children.append(crossover(parent, other))
                continue
            operator = ctx.operators[int(state.rng.integers(len(ctx.operators)))]
            offspring = operator.propose(parent, state.rng)
            if offspring:
                children.append(offspring[int(state.rng.integers(len(offspring)))])
        options = state.affordable(ctx.admissible(children))
        if not options:
            continue
        probs = yield Request(options)
        population += list(zip(ctx.values(state.item, probs), options, strict=True))
        population.sort(key=lambda t: -t[0])
        population = population[: max(2, ctx.config.population // 2)]


METHODS: dict[str, Callable[[SearchContext, ItemState], SearchMethod]] = {
    "greedy": greedy_search, "beam": beam_search, "evolutionary": evolutionary_search,
}


# ---------------------------------------------------------------- driver


def build_context(config: SearchConfig, scorer: Scorer, objective_name: str) -> SearchContext:
    resources = AttackResources(target=scorer.target)
    return SearchContext(
        config=config, scorer=scorer, objective=get_objective(objective_name),
        operators=[build(OPERATORS, spec, resources) for spec in config.operators],
        constraints=[build(CONSTRAINTS, spec, resources) for spec in config.constraints],
    )


def run_search(
    items: Sequence[Item],
    ctx: SearchContext,
    objective_name: str,
    on_batch_done: Callable[[list[ItemOutcome]], None] = lambda outcomes: None,
    progress: tqdm | None = None,
) -> list[ItemOutcome]:
    """Searches every item; items are processed `item_batch` at a time with their prompts scored
    together. `on_batch_done` receives each finished batch (the run directory appends it)."""
    config, scorer = ctx.config, ctx.scorer
    outcomes: list[ItemOutcome] = []
    started, start_queries = time.perf_counter(), scorer.queries
    for start in range(0, len(items), config.item_batch):
        states = [ItemState(item, ctx.objective, item_rng(config.seed, item.id, objective_name), config.budget,
                            scorer.prompts_per_candidate) for item in items[start : start + config.item_batch]]
        methods = [METHODS[config.method](ctx, s) for s in states]
        pending = {i: next(m) for i, m in enumerate(methods)}
        while pending:
            order = list(pending)
            flat = [c for i in order for c in pending[i].candidates]
            scores = scorer.score(flat)
            offset = 0
            for i in order:
                request, state = pending[i], states[i]
                span = slice(offset, offset + len(request.candidates))
                offset = span.stop
                state.record(request, scores.probs[span])
                try:
                    pending[i] = methods[i].send(scores.probs[span])
                    if not pending[i].candidates:
                        raise StopIteration
                except StopIteration:
                    del pending[i]
        batch = [s.outcome(objective_name) for s in states]
        outcomes += batch
        on_batch_done(batch)
        if progress is not None:
            rate = (scorer.queries - start_queries) / max(time.perf_counter() - started, 1e-9)
            wins = [o.success for o in outcomes if attack_eligible(ctx.objective, o.item, o.clean_probs)]
            progress.update(len(batch))
            progress.set_postfix({f"ASR({objective_name})": f"{np.mean(wins):.2f}" if wins else "-",
                                  "q_per_s": f"{rate:.1f}"})
    return outcomes
