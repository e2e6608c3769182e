"""Beam search over every operator's proposals (the pre-learner default, configs/beam.yaml)."""

from __future__ import annotations

from flexsearch.data.candidate import Candidate
from flexsearch.engine.methods.base import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod, expansion_phases


@SEARCH_METHODS.register("beam")
class Beam:
    """Keep the `beam_width` best candidates; expand each with every operator; repeat."""

    reads = ("steps", "beam_width", "proposals")

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
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
