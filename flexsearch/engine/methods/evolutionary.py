"""An evolutionary search over template/edit combinations."""

from __future__ import annotations

from flexsearch.data.candidate import Candidate
from flexsearch.engine.methods.base import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod, propose_all


def crossover(a: Candidate, b: Candidate) -> Candidate:
    """a's instruction slots with as many of b's word edits as still apply."""
    child = a
    for edit in b.edits:
        if edit.position is None or (edit.field, edit.position) in child.edited_positions():
            continue
        if child.words(edit.field)[edit.position] == edit.before:
            child = child.apply(edit)
    return child


@SEARCH_METHODS.register("evolutionary")
class Evolutionary:
    """A population of template/edit combinations: keep the fittest half, refill it with mutated
    children and crossovers of fit parents."""

    reads = ("steps", "population")

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
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
