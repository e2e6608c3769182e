"""Scorer noise: how far the same prompts' answer distributions move between float32 and bfloat16 scoring,
the measurement the success margin (objectives.SUCCESS_MARGIN) is chosen from.

A success must be a clear change, not a near tie: a flip that the scorer's own numerical noise could undo is
no evidence. For BBQ items (clean and under preserving templates of the attack library) this scores every
prompt in both dtypes, order-averaged as the presets score, and reports the distribution of |Δ lead|, where
lead = P(target) − the largest other answer's probability (the quantity the margin bounds), and of the largest
|ΔP| over the three answers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.common import BBQ, markdown_table, record, timed
from flexsearch.attacks.templates import INSTRUCTION_FAMILIES, PERSONA_FAMILIES, fill
from flexsearch.data.audit import PRESERVING
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import load_items
from flexsearch.objectives import SUCCESS_MARGIN, get_objective
from flexsearch.scoring.scorer import build_scorer

CATEGORIES = ("Age", "Disability_status", "Nationality", "Physical_appearance", "Religion", "Sexual_orientation")


def prompts(bbq: Path, per_category: int, seed: int) -> list[Candidate]:
    """Per category the first items of each condition, each clean and with one preserving persona and one
    preserving instruction drawn at random."""
    rng = np.random.default_rng(seed)
    personas = [t.text for ts in PERSONA_FAMILIES.values() for t in ts if t.effect == PRESERVING]
    instructions = [t.text for ts in INSTRUCTION_FAMILIES.values() for t in ts if t.effect == PRESERVING]
    out: list[Candidate] = []
    for category in CATEGORIES:
        items = load_items(bbq / f"{category}.jsonl").items
        chosen = ([it for it in items if it.condition == "ambig"][: per_category // 2]
                  + [it for it in items if it.condition == "disambig"][: per_category - per_category // 2])
        for item in chosen:
            root = Candidate.root(item)
            persona = fill(personas[int(rng.integers(len(personas)))], item)
            instruction = fill(instructions[int(rng.integers(len(instructions)))], item)
            out.append(root)
            if persona:
                out.append(root.with_slot("persona", "persona", persona))
            if instruction:
                out.append(root.with_slot("instruction", "directive", instruction))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-bbq")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    candidates = prompts(args.bbq, args.per_category, args.seed)
    probs, seconds = {}, {}
    for dtype in ("float32", "bfloat16"):
        scorer = build_scorer({"model": args.model, "dtype": dtype, "device": "cpu"},
                              {"mode": "plain", "average_orders": True, "batch_size": 16})
        result, seconds[dtype] = timed(lambda s=scorer: s.score(candidates))
        probs[dtype] = result.probs
    stereotype = get_objective("stereotype")
    leads = {d: np.array([stereotype.lead(p, c.item) for p, c in zip(probs[d], candidates, strict=True)])
             for d in probs}
    lead_delta = np.abs(leads["float32"] - leads["bfloat16"])
    p_delta = np.abs(probs["float32"] - probs["bfloat16"]).max(-1)
    argmax_agree = float((probs["float32"].argmax(-1) == probs["bfloat16"].argmax(-1)).mean())
    quantiles = (50, 90, 95, 99, 100)
    rows = [[name, *(f"{np.percentile(values, q):.4f}" for q in quantiles)]
            for name, values in (("abs delta lead (P(target) - max other)", lead_delta),
                                 ("max abs delta P over the three answers", p_delta))]
    near = [float(np.mean(np.abs(leads["float32"]) < m)) for m in (0.01, 0.02, SUCCESS_MARGIN)]
    body = (f"{len(candidates)} prompts ({args.per_category} BBQ items per category, clean and under one preserving "
            f"persona and one preserving instruction), order-averaged, scored on `{args.model}` in float32 "
            f"({seconds['float32']:.0f} s) and bfloat16 ({seconds['bfloat16']:.0f} s).\n\n"
            + markdown_table(["quantity", *(f"p{q}" if q < 100 else "max" for q in quantiles)], rows)
            + f"\n\nArgmax agreement float32 vs bfloat16: {argmax_agree:.3f}. Share of prompts whose float32 lead is "
            f"within 0.01 / 0.02 / {SUCCESS_MARGIN} of a tie: {near[0]:.3f} / {near[1]:.3f} / {near[2]:.3f}. "
            f"The shipped success margin is {SUCCESS_MARGIN}.")
    record("Scorer noise and the success margin", body)


if __name__ == "__main__":
    main()
