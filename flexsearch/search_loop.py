"""The search loop: find, per item, the prompt mutation that pushes the target model furthest toward
the objective's answer within a query budget.

Read top to bottom: outcome dataclass → per-item state → pure helpers → the search methods
(each a generator that yields candidates to score and receives their answer distributions) → the
driver that runs many items at once, so one forward batch mixes prompts of several items.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from tqdm.auto import tqdm

from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
from flexsearch.attacks.base import Constraint, Operator, Position
from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.gradient import GRADIENT_PASS_QUERIES, substitution_gains, word_saliency
from flexsearch.attacks.importance import importance_from_probes, leave_one_out_probes
from flexsearch.candidate import Candidate
from flexsearch.config import SearchConfig
from flexsearch.families import SLOT_KIND, FamilyBest, family_of, templates_of
from flexsearch.items import Item
from flexsearch.learner import (
    COMPOSE,
    Learner,
    Observation,
    RoundDraws,
    added_arms,
    composition_of,
    replaced_arms,
)
from flexsearch.objectives import Objective, attack_eligible, get_objective, lead

if TYPE_CHECKING:
    from flexsearch.scoring import Scorer

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
    best: Candidate | None = None
    best_value: float = -np.inf
    best_probs: np.ndarray | None = None
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
        assert self.best is not None and self.best_probs is not None and self.clean_probs is not None
        return ItemOutcome(self.item, objective_name, self.best, self.clean_probs, self.best_probs,
                           bool(self.objective.success(self.best_probs, self.item)), self.queries,
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
        options = state.affordable(ctx.admissible(propose_all(ctx, state, root, templates)))
        if options:
            probs = yield Request(options)
            values = ctx.values(state.item, probs)
            if values.max() > current_value:
                current, current_value = options[int(values.argmax())], float(values.max())
    positions = editable_positions(current)
    if not ctx.word_operators or not positions or state.succeeded:
        return
    if ctx.config.importance == "gradient":
        if not state.can_afford_gradient():
            return
        scores = word_saliency(ctx.charged(state, lambda: ctx.resources.gradient(current)), positions)
    else:
        probes = state.affordable(leave_one_out_probes(current, positions))
        if len(probes) < len(positions):
            return
        probs = yield Request(probes, probe=True)
        scores = importance_from_probes(current_value, ctx.values(state.item, probs))
    for index in np.argsort(-scores, kind="stable"):
        if state.succeeded and ctx.config.stop_on_success:
            return
        edits = propose_all(ctx, state, current, ctx.word_operators, [positions[index]])
        options = state.affordable(best_first(ctx, state, current, edits) if ctx.config.proposals == "gradient"
                                   else ctx.admissible(edits))
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
        scored: list[tuple[float, Candidate]] = []
        for phase in expansion_phases(ctx, state, [parent for _, _, parent in beam]):
            if state.succeeded and ctx.config.stop_on_success:
                break
            options = state.affordable(phase())
            if options:
                probs = yield Request(options)
                scored += zip(ctx.values(state.item, probs), options, strict=True)
        if not scored:
            return
        # Ties break toward the earlier candidate, so the beam is deterministic.
        ranked = beam + [(v, len(beam) + i, c) for i, (v, c) in enumerate(scored)]
        beam = sorted(ranked, key=lambda t: (-t[0], t[1]))[: ctx.config.beam_width]


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
            offspring = propose_all(ctx, state, parent, [operator])
            if offspring:
                children.append(offspring[int(state.rng.integers(len(offspring)))])
        options = state.affordable(ctx.admissible(children))
        if not options:
            continue
        probs = yield Request(options)
        population += list(zip(ctx.values(state.item, probs), options, strict=True))
        population.sort(key=lambda t: -t[0])
        population = population[: max(2, ctx.config.population // 2)]


def random_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """The baseline a guided search must beat: each candidate is the clean prompt with one to three
    proposals of randomly chosen operators applied in turn; `population` are scored a round and nothing
    is selected between rounds."""
    root = Candidate.root(state.item)
    yield Request([root])
    for _ in range(ctx.config.steps):
        if state.succeeded and ctx.config.stop_on_success:
            return
        batch = []
        for _ in range(ctx.config.population):
            candidate = root
            for _ in range(int(state.rng.integers(1, 4))):
                operator = ctx.operators[int(state.rng.integers(len(ctx.operators)))]
                offspring = ctx.admissible(propose_all(ctx, state, candidate, [operator]))
                if offspring:
                    candidate = offspring[int(state.rng.integers(len(offspring)))]
            batch.append(candidate)
        options = state.affordable(batch)
        if options:
            yield Request(options)
        elif state.queries + state.cost_per_candidate > state.budget:
            return


def learned_proposals(ctx: SearchContext, state: ItemState, parent: Candidate) -> list[Candidate]:
    """Every proposal on `parent`: each library operator's whole library (`enumerate`), every pair of two library
    operators' templates set together (a persona with an instruction: compositions are what moves a model), and
    each other operator's sampled proposals (word edits at positions it picks; a gradient operator only when the
    budget pays)."""
    libraries = [op for op in ctx.operators if hasattr(op, "enumerate")]
    pool: list[Candidate] = []
    for operator in ctx.operators:
        if operator in libraries:
            singles = operator.enumerate(parent)  # type: ignore[attr-defined]
            pool += singles
            for other in libraries[libraries.index(operator) + 1:]:
                pool += [pair for single in singles for pair in other.enumerate(single)]
        else:
            pool += propose_all(ctx, state, parent, [operator])
    return pool


def composed(ctx: SearchContext, root: Candidate, composition: str) -> Candidate | None:
    """The clean prompt with a composition's templates set ('persona/role_play/1+instruction/...'), or None when this
    item cannot fill one."""
    candidate = root
    for part in composition.removeprefix(f"{COMPOSE}:").split("+"):
        matches = [c for op in ctx.operators if hasattr(op, "enumerate")
                   for c in op.enumerate(candidate) if added_arms(c, candidate) == [part]]
        if not matches:
            return None
        candidate = matches[0]
    return candidate


def learned_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """The default. Each round ranks every proposal on the current best prompt (each template of the library, each
    persona-instruction pair, sampled word edits) by the gain in the aim's lead it is expected to bring: a Thompson
    draw of the gain of each arm it adds, minus that of each template it replaces, drawn from the run-level learner
    (DESIGN.md "The learner"); it scores the `population` best. Compositions grow around the best;
    word edits, which no library lists, come in when their arm has paid on this model or the templates run out.
    With `families` (DESIGN.md "Attack families") the round also serves each family still without a success, and
    the item's search goes on after its first success until every family has one or the budget is spent."""
    if ctx.config.families:
        yield from family_search(ctx, state)
        return
    root = Candidate.root(state.item)
    yield Request([root])
    for _ in range(ctx.config.steps):
        if state.succeeded and ctx.config.stop_on_success:
            return
        parent = state.best or root
        drawn = RoundDraws(state.learner, state.rng)
        ranked: list[tuple[float, int, Candidate]] = []
        for order, candidate in enumerate(learned_proposals(ctx, state, parent)):
            if prompt_key(candidate) in state.seen:
                continue
            ranked.append((expected_gain(drawn, candidate, parent), order, candidate))
        ranked.sort(key=lambda t: (-t[0], t[1]))
        chosen: list[Candidate] = []
        wanted = ctx.config.population
        for start in range(0, len(ranked), wanted):  # constraints run on a few at a time, best first
            chosen += ctx.admissible([c for _, _, c in ranked[start : start + wanted]])
            if len(chosen) >= wanted:
                break
        options = state.affordable(chosen[:wanted])
        if not options:
            return
        yield Request(options)


def expected_gain(drawn: RoundDraws, candidate: Candidate, parent: Candidate) -> float:
    """The Thompson-drawn gain of the arms `candidate` adds to `parent`, minus that of the templates it replaces."""
    return (sum(drawn(a) for a in added_arms(candidate, parent))
            - sum(drawn(a) for a in replaced_arms(candidate, parent)))


def open_families(ctx: SearchContext, state: ItemState) -> list[str]:
    """The searched families still to serve on this item, where the config fixes a family's share of the budget
    with some of it left: first those with no success yet, then those whose success carries a template the archive
    already holds (a success with rarer templates would replace it: FamilyBest.better_than); within each, the least
    served first (queries spent on each), then in config order."""
    shares, budget = ctx.config.family_shares, state.budget
    spent = {f: state.families[f].queries if f in state.families else 0 for f in ctx.config.families}
    wanted = [f for f in ctx.config.families if (f not in shares or spent[f] < shares[f] * budget)
              and (not state.family_succeeded(f) or crowding(state, f) > 0)]
    return sorted(wanted, key=lambda f: (state.family_succeeded(f), spent[f]))  # stable: config order breaks ties


def crowding(state: ItemState, family: str) -> int:
    """The archive fill of the family's best prompt on this item (0 when it has none)."""
    return state.cell_fill(family, state.families[family].candidate) if family in state.families else 0


class FirstAdmissible:
    """Picks, from ranked lists of one round, the first candidate that passes the constraints and is not taken
    yet; each candidate's constraints run once a round, a few at a time, best first."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx, self.verdicts, self.taken = ctx, dict[tuple[Any, ...], bool](), set[tuple[Any, ...]]()

    def __call__(self, ranked: Sequence[Candidate]) -> Candidate | None:
        step = self.ctx.config.population
        for start in range(0, len(ranked), step):
            chunk = [c for c in ranked[start : start + step] if prompt_key(c) not in self.taken]
            unchecked = {prompt_key(c): c for c in chunk if prompt_key(c) not in self.verdicts}
            alive = {prompt_key(c) for c in self.ctx.admissible(list(unchecked.values()))}
            self.verdicts.update({key: key in alive for key in unchecked})
            for c in chunk:
                if self.verdicts[prompt_key(c)]:
                    self.taken.add(prompt_key(c))
                    return c
        return None


def family_search(ctx: SearchContext, state: ItemState) -> SearchMethod:
    """The learned search serving every attack family. Each round proposes on the item's best prompt, the clean
    prompt and each open family's best. Until the item's first success the headline's proposals are scored (those
    on the best prompt ranked by drawn gain, as the family-blind search ranks them) but for `family_share` of the
    candidates, at least one a round left to the headline. Those, and every slot after the first success, go in turn
    to each open family not yet in the round (open_families): its proposals from any of those prompts ranked by
    expected lead (the prompt's lead plus the drawn gain), a prompt whose templates already carry much of this
    category's successes in the family ranked lower (`coverage`); a family with a success is served only prompts
    whose templates the archive holds less than its success's."""
    root = Candidate.root(state.item)
    yield Request([root])
    category = state.item.category
    proposed = for_families = 0  # candidates scored before the first success, and those that served a family
    # an item the clean model does not answer right counts toward no rate: only its headline is searched
    assert state.clean_probs is not None  # recorded with the clean prompt
    eligible = attack_eligible(ctx.objective, state.item, state.clean_probs)
    for _ in range(ctx.config.steps):
        families = open_families(ctx, state) if eligible else []
        if state.succeeded and ctx.config.stop_on_success and not families:
            return
        drawn = RoundDraws(state.learner, state.rng)
        best = state.best or root
        parents = {prompt_key(p): p for p in [best, root, *(state.families[f].candidate for f in families
                                                            if f in state.families and state.families[f].orders > 1)]}
        headline: list[tuple[float, int, Candidate, str | None]] = []  # the proposals on the best prompt
        expected: dict[tuple[Any, ...], tuple[float, int, Candidate, str | None]] = {}
        for parent in parents.values():  # the best prompt's first: its draws come in the blind search's order
            base = state.scored[prompt_key(parent)]
            for candidate in learned_proposals(ctx, state, parent):
                key = prompt_key(candidate)
                if key in state.seen:
                    continue
                entry = (base + expected_gain(drawn, candidate, parent), len(expected), candidate, family_of(candidate))
                if parent is best:
                    headline.append(entry)
                if key not in expected or entry[0] > expected[key][0]:
                    expected[key] = entry
        by_lead = sorted(headline, key=lambda t: (-t[0], t[1]))
        pick = FirstAdmissible(ctx)
        chosen: list[Candidate] = []
        population = ctx.config.population
        if not state.succeeded:  # the headline first: until the first success families get `family_share` of it
            owed = math.floor(ctx.config.family_share * (proposed + population)) - for_families
            while len(chosen) < population - min(max(owed, 0), population - 1):
                found = pick([c for _, _, c, _ in by_lead])
                if found is None:
                    break
                chosen.append(found)
        headline_picks = list(chosen)
        archive = state.learner.archive
        ceiling = {f: crowding(state, f) if state.family_succeeded(f) else math.inf for f in families}
        served = {f: sorted(((v - ctx.config.coverage * archive.share(category, f, templates_of(c)), order, c)
                             for v, order, c, family in expected.values()
                             if family == f and state.cell_fill(f, c) < ceiling[f]),
                            key=lambda t: (-t[0], t[1]))
                  for f in families if f not in {family_of(c) for c in chosen}}
        while len(chosen) < population and served:  # then one proposal per open family in turn
            for f in list(served):
                if len(chosen) == population:
                    break
                found = pick([c for _, _, c in served[f]])
                if found is None:
                    del served[f]
                else:
                    chosen.append(found)
        while len(chosen) < population and not state.succeeded:  # no family left to serve: the headline
            found = pick([c for _, _, c, _ in by_lead])
            if found is None:
                break
            chosen.append(found)
        options = state.affordable(chosen)
        if not options:
            return
        if not state.succeeded:
            proposed += len(options)
            for_families += sum(c not in headline_picks for c in options)
        yield Request(options)


METHODS: dict[str, Callable[[SearchContext, ItemState], SearchMethod]] = {
    "learned": learned_search, "greedy": greedy_search, "beam": beam_search, "evolutionary": evolutionary_search,
    "random": random_search,
}


# ---------------------------------------------------------------- driver


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
    methods = [METHODS[config.method](ctx, s) for s in states]
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
