"""What one item's search holds and what every search method is given: the outcome record, the requests a method
yields, the per-item state the driver keeps, the shared context, and the proposal helpers several methods use.

A search method is a generator: it yields a Request of candidates to score and receives their answer distributions
(methods/; the driver in loop.py)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from flexsearch.attacks import AttackResources
from flexsearch.attacks.base import Constraint, Operator, Position
from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.gradient import GRADIENT_PASS_QUERIES, substitution_gains
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item
from flexsearch.engine.families import FamilyBest, family_of, templates_of
from flexsearch.engine.learner import Learner, Observation, added_arms, composition_of, replaced_arms
from flexsearch.objectives import Objective, lead

if TYPE_CHECKING:
    from flexsearch.config import SearchConfig
    from flexsearch.scoring.scorer import Scorer


T = TypeVar("T")


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
    # (queries spent, answer probabilities) each time the best candidate improved: the best at any smaller
    # budget, for ASR/P(target)-vs-budget curves (kept in memory, not in the trace)
    improvements: list[tuple[int, np.ndarray]] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)  # every scored candidate, for the learner
    screened: int = 0  # candidates scored in their displayed order only (SearchConfig.screen_lead)
    families: dict[str, FamilyBest] = field(default_factory=dict)  # the hardest label-valid prompt per family

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "item", "objective": self.objective, "item_id": self.item.id, "category": self.item.category,
            "chain": self.best.chain(), "option_order": list(self.best.option_order),
            "clean_probs": [float(p) for p in self.clean_probs], "best_probs": [float(p) for p in self.best_probs],
            "success": self.success, "queries": self.queries, "first_success_query": self.first_success_query,
            "screened": self.screened, "observations": [o.to_list() for o in self.observations],
            "families": {f: best.to_record() for f, best in self.families.items()},
        }


@dataclass
class Request:
    """Candidates an item wants scored. Probes (leave-one-out deletions) inform the search but are
    never emitted as attacks."""

    candidates: list[Candidate]
    probe: bool = False


@dataclass
class Screen:
    """A request's screen (SearchConfig.screen_lead): each candidate's answer distribution in its displayed order
    alone, and which candidates it kept out of the other two orders."""

    displayed: np.ndarray  # (N, 3)
    leads: np.ndarray  # (N,) the aim's lead in the displayed order
    out: np.ndarray  # (N,) bool


@dataclass
class ItemState:
    """Book-keeping the driver does for each item: budget, best candidate so far, first success."""

    item: Item
    objective: Objective
    rng: np.random.Generator
    budget: int
    cost_per_candidate: int
    screen_cost: int = 1  # what a candidate scored in its displayed order only costs (one prompt)
    queries: int = 0
    screened: int = 0
    best: Candidate | None = None  # the highest-valued prompt: where the learned search climbs from
    best_value: float = -np.inf
    best_probs: np.ndarray | None = None
    # the prompt the split emits: a success beats a failure, then the higher value (near the margin the
    # highest-valued prompt can fall short of it while another prompt meets it)
    hardest: Candidate | None = None
    hardest_rank: tuple[bool, float] = (False, -np.inf)
    hardest_probs: np.ndarray | None = None
    clean_probs: np.ndarray | None = None
    first_success_query: int | None = None
    seen: set[tuple[Any, ...]] = field(default_factory=set)
    improvements: list[tuple[int, np.ndarray]] = field(default_factory=list)
    learner: Learner = field(default_factory=Learner)  # the run's learner as of this item's round, plus this item
    scored: dict[tuple[Any, ...], float] = field(default_factory=dict)  # the aim's lead of each scored prompt
    displayed: dict[tuple[Any, ...], float] = field(default_factory=dict)  # the same in the displayed order alone
    observations: list[Observation] = field(default_factory=list)
    families: dict[str, FamilyBest] = field(default_factory=dict)  # the hardest label-valid prompt per family

    @property
    def succeeded(self) -> bool:
        return self.first_success_query is not None

    def family_succeeded(self, family: str) -> bool:
        return family in self.families and self.families[family].success

    def affordable(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Drops candidates already scored for this item, then caps the rest to the remaining budget."""
        fresh = []
        for c in candidates:
            key = prompt_key(c)
            if key not in self.seen:
                self.seen.add(key)
                fresh.append(c)
        return fresh[: max(0, (self.budget - self.queries) // self.cost_per_candidate)]

    def can_afford_gradient(self) -> bool:
        """Whether a gradient pass still leaves room to score one candidate it leads to."""
        return self.queries + GRADIENT_PASS_QUERIES + self.cost_per_candidate <= self.budget

    def record(self, request: Request, probs: np.ndarray, screen: Screen | None = None) -> None:
        """Charges the request and keeps its best candidate. An item pays for every distinct prompt its
        search asks for, whether or not the shared cache already held it: the budget then does not
        depend on other searches. A success is dated at its own candidate, as if the request's
        candidates had been scored one after another (ASR vs budget). With a `screen`, a screened-out candidate
        costs one prompt, is never the best nor a success, and the learner reads its displayed-order gain."""
        self.seen.update(prompt_key(c) for c in request.candidates)  # the clean prompt is never paid twice
        if self.clean_probs is None:
            self.clean_probs = probs[0]
        if request.probe:
            self.queries += len(request.candidates) * self.cost_per_candidate
            return
        for k, (candidate, p) in enumerate(zip(request.candidates, probs, strict=True)):
            family = family_of(candidate)
            if screen is not None:
                self.displayed[prompt_key(candidate)] = float(screen.leads[k])
                if screen.out[k]:
                    self.queries += self.screen_cost
                    self.screened += 1
                    self.observe(candidate, family, float(screen.leads[k]), False, screened=True)
                    self.keep_family_best(candidate, family, screen.displayed[k], False, 1, self.screen_cost)
                    continue
            self.queries += self.cost_per_candidate
            value, success = self.objective.value(p, self.item), bool(self.objective.success(p, self.item))
            self.observe(candidate, family, lead(self.objective, p, self.item), success)
            self.keep_family_best(candidate, family, p, success, self.cost_per_candidate // self.screen_cost,
                                  self.cost_per_candidate)
            if value > self.best_value:
                self.best, self.best_value, self.best_probs = candidate, value, p
            if (success, value) > self.hardest_rank:
                self.hardest, self.hardest_rank, self.hardest_probs = candidate, (success, value), p
                self.improvements.append((self.queries, p))
            if self.first_success_query is None and success:
                self.first_success_query = self.queries

    def keep_family_best(self, candidate: Candidate, family: str | None, probs: np.ndarray, success: bool,
                         orders: int, cost: int) -> None:
        """Keeps the candidate as its family's best when it is label-valid (natural, no forced-choice template) and
        beats the family's best so far (FamilyBest.better_than: among successes, the one whose templates the
        archive holds least)."""
        if family is None or not candidate.natural or candidate.forced_choice:
            return
        value = self.objective.value(probs, self.item)
        current = self.families.get(family)
        spent = (current.queries if current else 0) + cost
        first = current.first_success_query if current else None
        if success and first is None:
            first = self.queries
        if current is None or current.better_than(value, success, orders, self.cell_fill(family, candidate),
                                                  self.cell_fill(family, current.candidate)):
            self.families[family] = FamilyBest(candidate, value, probs, success, first, orders, spent)
        else:
            current.queries, current.first_success_query = spent, first

    def cell_fill(self, family: str, candidate: Candidate) -> int:
        """How many of the category's successes in the family the run's archive holds with the candidate's most
        crowded template (Archive.fill)."""
        return self.learner.archive.fill(self.item.category, family, templates_of(candidate))

    def observe(self, candidate: Candidate, family: str | None, aim_lead: float, success: bool,
                screened: bool = False) -> None:
        """Notes a scored candidate for the learner: the arm that made it from its nearest scored ancestor, its
        gain in the aim's lead (objectives.lead: what success with the margin reads) over that ancestor and over
        the clean prompt; the item's own copy of the learner learns it at once. A screened-out candidate's lead is
        its displayed order's, and so are the leads its gains subtract (the order's letter bias cancels)."""
        leads = self.displayed if screened else self.scored
        ancestor = candidate.parent
        while ancestor is not None and prompt_key(ancestor) not in self.scored:
            ancestor = ancestor.parent
        if ancestor is not None and candidate.edits:
            clean = leads[prompt_key(Candidate.root(self.item))]
            observation = Observation("+".join(added_arms(candidate, ancestor)), composition_of(candidate),
                                      aim_lead - leads[prompt_key(ancestor)], aim_lead - clean, success,
                                      candidate.natural and not candidate.forced_choice,
                                      "+".join(replaced_arms(candidate, ancestor)), family or "")
            self.observations.append(observation)
            self.learner.observe(observation)
        if not screened:
            self.scored[prompt_key(candidate)] = aim_lead

    def outcome(self, objective_name: str) -> ItemOutcome:
        assert self.hardest is not None and self.hardest_probs is not None and self.clean_probs is not None
        return ItemOutcome(self.item, objective_name, self.hardest, self.clean_probs, self.hardest_probs,
                           bool(self.objective.success(self.hardest_probs, self.item)), self.queries,
                           self.first_success_query, self.improvements, self.observations, self.screened,
                           self.families)

SearchMethod = Generator[Request, np.ndarray, None]


@dataclass
class SearchContext:
    """What every search method uses: the config, operators, constraints, scorer and objective."""

    config: SearchConfig
    scorer: Scorer
    objective: Objective
    operators: list[Operator]
    constraints: list[Constraint]
    resources: AttackResources
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

    def charged(self, state: ItemState, work: Callable[[], T]) -> T:
        """Runs `work` and charges the gradient passes it took to the item's budget."""
        before = self.resources.gradient_passes
        result = work()
        state.queries += (self.resources.gradient_passes - before) * GRADIENT_PASS_QUERIES
        return result


# ---------------------------------------------------------------- helpers


def prompt_key(candidate: Candidate) -> tuple[Any, ...]:
    """What the rendered prompt depends on (two candidates with one key score the same)."""
    return (candidate.instruction, candidate.context_words, candidate.question_words, candidate.option_order)


def item_rng(seed: int, item_id: str, objective: str) -> np.random.Generator:
    """A generator that depends only on the seed, the item and the objective (so resumes and
    different batchings give identical searches)."""
    digest = hashlib.sha256(f"{seed}|{item_id}|{objective}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def propose_all(ctx: SearchContext, state: ItemState, candidate: Candidate,
                operators: Sequence[Operator] | None = None,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
    """Every operator's proposals; operators that take a gradient pass are skipped once the item's
    budget cannot pay for it, and charged for it otherwise."""
    chosen = [op for op in (operators if operators is not None else ctx.operators)
              if not op.needs_gradient or state.can_afford_gradient()]
    return ctx.charged(state, lambda: [c for op in chosen
                                       for c in op.propose(candidate, state.rng,
                                                           positions if op.edits_words else None)])


def best_first(ctx: SearchContext, state: ItemState, parent: Candidate, edits: Sequence[Candidate]) -> list[Candidate]:
    """The admissible, unseen one-word edits of `parent`, the `gradient_top` of highest first-order gain
    (one gradient pass on the parent, charged); all of them unranked when the budget has no room."""
    fresh = [c for c in edits if prompt_key(c) not in state.seen]
    if not fresh or not state.can_afford_gradient():
        return ctx.admissible(fresh)[: ctx.config.gradient_top]
    gradient = ctx.charged(state, lambda: ctx.resources.gradient(parent))
    gains = substitution_gains(gradient, ctx.resources.white_box(), fresh)
    ranked = [fresh[i] for i in np.argsort(-gains, kind="stable")]
    kept: list[Candidate] = []
    top = ctx.config.gradient_top
    for start in range(0, len(ranked), top):  # constraints run on a few at a time, best first
        kept += ctx.admissible(ranked[start : start + top])
        if len(kept) >= top:
            break
    return kept[:top]


def expansion_phases(ctx: SearchContext, state: ItemState,
                     parents: Sequence[Candidate]) -> list[Callable[[], list[Candidate]]]:
    """Admissible proposals from every parent, in phases scored one after another. Sampled proposals
    are one phase: each operator's own. With `proposals: gradient`, the slot operators' proposals
    come first and the gradient-ranked word edits (a pass per parent, charged) only once those are
    scored, so a step the templates already win pays no gradient."""
    if ctx.config.proposals == "sampled":
        return [lambda: ctx.admissible([c for p in parents for c in propose_all(ctx, state, p)])]
    slots = [op for op in ctx.operators if not op.edits_words]

    def word_edits() -> list[Candidate]:
        options: list[Candidate] = []
        for parent in parents:
            positions = editable_positions(parent)
            if positions and ctx.word_operators:
                options += best_first(ctx, state, parent,
                                      propose_all(ctx, state, parent, ctx.word_operators, positions))
        return options

    return [lambda: ctx.admissible([c for p in parents for c in propose_all(ctx, state, p, slots)]), word_edits]
