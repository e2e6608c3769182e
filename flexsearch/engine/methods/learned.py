"""The learned search (the default; DESIGN.md "The learner") and its family search ("Attack families")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from flexsearch.data.candidate import Candidate
from flexsearch.engine.families import family_of, templates_of
from flexsearch.engine.learner import COMPOSE, RoundDraws, added_arms, replaced_arms
from flexsearch.engine.methods.base import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod, prompt_key, propose_all
from flexsearch.objectives import attack_eligible


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


@SEARCH_METHODS.register("learned")
class Learned:
    """The default. Each round ranks every proposal on the current best prompt (each template of the library, each
    persona-instruction pair, sampled word edits) by the gain in the aim's lead it is expected to bring: a Thompson
    draw of the gain of each arm it adds, minus that of each template it replaces, drawn from the run-level learner
    (DESIGN.md "The learner"); it scores the `population` best. Compositions grow around the best;
    word edits, which no library lists, come in when their arm has paid on this model or the templates run out.
    With `families` (DESIGN.md "Attack families") the round also serves each family still without a success, and
    the item's search goes on after its first success until every family has one or the budget is spent."""

    reads = ("steps", "population", "family_share", "coverage", "headline_coverage", "leader_after")

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
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
    on the best prompt ranked by drawn gain, as the family-blind search ranks them, less `headline_coverage` times
    the archive share of the proposal's templates: the first success is also its family's, so a headline that
    repeats the leader narrows the family split; once `leader_after` of the budget is spent, the round's first
    headline pick goes by drawn gain alone, so an item only the leader breaks still gets it) but for
    `family_share` of the candidates, at least one a round left to the headline. Those, and every slot after the
    first success, go in turn to each open family not yet in the round (open_families): its proposals from any of
    those prompts ranked by expected lead (the prompt's lead plus the drawn gain), a prompt whose templates already
    carry much of this category's successes in the family ranked lower (`coverage`); a family with a success is
    served only prompts whose templates the archive holds less than its success's."""
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
        archive = state.learner.archive
        best = state.best or root
        parents = {prompt_key(p): p for p in [best, root, *(state.families[f].candidate for f in families
                                                            if f in state.families and state.families[f].orders > 1)]}
        # the proposals on the best prompt: (rank value, order, candidate, expected lead before the archive term)
        headline: list[tuple[float, int, Candidate, float]] = []
        expected: dict[tuple[Any, ...], tuple[float, int, Candidate, str | None]] = {}
        for parent in parents.values():  # the best prompt's first: its draws come in the blind search's order
            base = state.scored[prompt_key(parent)]
            for candidate in learned_proposals(ctx, state, parent):
                key = prompt_key(candidate)
                if key in state.seen:
                    continue
                family = family_of(candidate)
                entry = (base + expected_gain(drawn, candidate, parent), len(expected), candidate, family)
                if parent is best and not state.succeeded:  # the headline (read until the first success),
                    # ranked lower the more its templates hold of the category's successes
                    crowded = archive.share(category, family, templates_of(candidate)) if family else 0.0
                    headline.append((entry[0] - ctx.config.headline_coverage * crowded, entry[1], candidate, entry[0]))
                if key not in expected or entry[0] > expected[key][0]:
                    expected[key] = entry
        by_lead = [c for _, _, c, _ in sorted(headline, key=lambda t: (-t[0], t[1]))]
        by_gain = [c for _, _, c, _ in sorted(headline, key=lambda t: (-t[3], t[1]))]
        pick = FirstAdmissible(ctx)
        chosen: list[Candidate] = []
        population = ctx.config.population
        if not state.succeeded:  # the headline first: until the first success families get `family_share` of it
            owed = math.floor(ctx.config.family_share * (proposed + population)) - for_families
            slots = population - min(max(owed, 0), population - 1)
            leaders = 1 if state.queries >= ctx.config.leader_after * state.budget else 0  # slots is at least 1
            for ranked in [by_gain] * leaders + [by_lead] * (slots - leaders):  # the leader first
                found = pick(ranked)
                if found is None:  # both rankings hold the same proposals: none is left
                    break
                chosen.append(found)
        headline_picks = list(chosen)
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
            found = pick(by_lead)
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
