"""Greedy word-by-word search (TextBugger/BERT-Attack style)."""

from __future__ import annotations

import numpy as np

from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.gradient import word_saliency
from flexsearch.attacks.importance import importance_from_probes, leave_one_out_probes
from flexsearch.data.candidate import Candidate
from flexsearch.engine.methods.base import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod, best_first, propose_all


@SEARCH_METHODS.register("greedy")
class Greedy:
    """TextBugger/BERT-Attack style: rank words by importance, then edit them in that order, keeping an
    edit only when it moves the objective; templates are tried once at the start."""

    reads = ("importance", "proposals")

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
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
