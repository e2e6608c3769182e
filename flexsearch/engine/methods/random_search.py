"""Random search: the baseline a guided search must beat."""

from __future__ import annotations

from flexsearch.data.candidate import Candidate
from flexsearch.engine.methods.base import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod, propose_all


@SEARCH_METHODS.register("random")
class Random:
    """The baseline a guided search must beat: each candidate is the clean prompt with one to three
    proposals of randomly chosen operators applied in turn; `population` are scored a round and nothing
    is selected between rounds."""

    reads = ("steps", "population")

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
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
