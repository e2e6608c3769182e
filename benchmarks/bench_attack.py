"""Query efficiency and attack strength: ASR versus query budget for flexsearch's default search and a
TextAttack-style greedy word-importance TextBugger search, on the same BBQ items and model.

TextAttack 0.3.11 cannot run beside transformers 5 (it pins transformers < 5 through flair) and
fetches nltk data and models at import, which these machines cannot; the baseline is therefore
our faithful re-implementation of its TextBugger recipe on our scorer (configs/textbugger.yaml:
leave-one-out word importance, then character bugs and WordNet Sub-W per word in that order,
keeping an edit only when it helps), labelled as such. To run TextAttack itself on a machine
with a hub, use its own virtual environment: `python -m venv ta && ta/bin/pip install
textattack==0.3.11` and its `textattack attack --recipe textbugger`.

    python benchmarks/bench_attack.py [--model smollm2] [--items 12] [--budget 100]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import bbq_items, markdown_table, record, timed
from flexsearch.config import load_config
from flexsearch.model import load_target
from flexsearch.objectives import attack_eligible
from flexsearch.scoring import Scorer
from flexsearch.search_loop import build_context, run_search

BUDGETS = (10, 20, 50, 100, 200, 500)


def asr_curve(preset: str, items, target, budget: int) -> tuple[dict[int, float], int, float]:
    config = load_config(preset, budget=budget, control=False)
    ctx = build_context(config, Scorer.from_config(target, config.scoring), "stereotype")
    outcomes, seconds = timed(lambda: run_search(items, ctx, "stereotype"))
    eligible = [o for o in outcomes if attack_eligible(ctx.objective, o.item, o.clean_probs)]
    curve = {b: float(np.mean([o.first_success_query is not None and o.first_success_query <= b for o in eligible]))
             if eligible else float("nan") for b in BUDGETS if b <= budget}
    return curve, len(eligible), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--budget", type=int, default=100)
    args = parser.parse_args()
    target = load_target(args.model)
    items = bbq_items("Age", args.items, condition="ambig")
    ours, n_ours, t_ours = asr_curve("default", items, target, args.budget)
    base, n_base, t_base = asr_curve("textbugger", items, target, args.budget)
    rows = [[b, ours[b], base[b], (ours[b] / base[b]) if base[b] else "inf" if ours[b] else "-"] for b in ours]
    body = (f"{len(items)} ambiguous BBQ Age items; ASR over items answered correctly when clean "
            f"({n_ours} and {n_base}); order-averaged scoring; stereotype objective.\n\n"
            + markdown_table(["budget", "flexsearch default (beam)", "TextBugger greedy (re-implementation)",
                              "ratio"], rows)
            + f"\n\nWall time: {t_ours:.0f} s vs {t_base:.0f} s.")
    record("Attack strength: ASR vs query budget", body)


if __name__ == "__main__":
    main()
