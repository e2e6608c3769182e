"""How well the first-order estimate ranks real word edits on the capable target: for each parent prompt,
a seeded sample of its admissible TextBugger one-word edits (the gradient preset's operator and
constraints) is scored order-averaged, and the estimated gains of each gradient variant are compared with
the objective's measured change.

Variants: the gradient of the objective over the displayed option order only (one prompt, charged 3,
what the search uses) and of the order-averaged objective over all three cyclic orders (three prompts).
Reported per variant: the mean Spearman correlation between estimated gain and measured change over
parents, the lift of scoring its top-k edits instead of k random ones (mean measured change of the top-k
minus the mean of the sample), and how often its top edit is among the sample's five best; beside them,
the best edit in the sample (the headroom any ranking has) and how often one edit alone flips the answer
to the target.

    python -m benchmarks.bench_gradient --model gemma3-bbq --items 12 --sample 30
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from benchmarks.bench_attack import fixed_attacks, held_out_ambiguous, interval
from benchmarks.common import BBQ, markdown_table, record
from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.gradient import prompt_gradient, substitution_gains
from flexsearch.attacks.textbugger import BUGS
from flexsearch.config import load_config
from flexsearch.data.candidate import Candidate
from flexsearch.data.render import cyclic_orders
from flexsearch.engine.loop import build_context
from flexsearch.engine.state import ItemState, item_rng, propose_all
from flexsearch.results.metrics import mean_with_interval, proportion
from flexsearch.scoring.model import load_target
from flexsearch.scoring.scorer import Scorer

VARIANTS = {"displayed order": False, "three orders": True}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's correlation (0 when either side is constant)."""
    rho = float(spearmanr(a, b).statistic)
    return 0.0 if np.isnan(rho) else rho


def mean_interval(values: list[float]) -> str:
    return interval(mean_with_interval(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-bbq")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--items", type=int, default=12)
    parser.add_argument("--sample", type=int, default=30, help="scored one-word edits per parent")
    parser.add_argument("--top", type=int, default=2, help="edits a guided expansion scores (gradient_top)")
    parser.add_argument("--bugs", nargs="+", choices=BUGS, help="TextBugger's edit kinds (default: the preset's); "
                        "sub_w alone measures whole-word WordNet swaps")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    target = load_target(args.model, dtype=args.dtype)
    config = load_config("gradient")
    textbugger = next(spec for spec in config.operators if spec["name"] == "textbugger")
    if args.bugs:
        textbugger["bugs"] = args.bugs
    bugs = ", ".join(textbugger.get("bugs", BUGS))
    scorer = Scorer.from_config(target, config.scoring)
    ctx = build_context(config, scorer, "stereotype")
    rng = np.random.default_rng(args.seed)
    per_variant: dict[str, dict[str, list[float]]] = {v: {"rho": [], "lift": [], "hit": []} for v in VARIANTS}
    best_change, flips, parents, seconds = [], [], 0, dict.fromkeys(VARIANTS, 0.0)
    for item in tqdm(held_out_ambiguous(args.model, args.bbq, args.items, args.seed), desc="gradient ranking",
                     unit="item"):
        state = ItemState(item, ctx.objective, item_rng(args.seed, item.id, "stereotype"), 10**9, 3)
        for parent in (Candidate.root(item), fixed_attacks(item)["FLEX persona"]):
            edits = ctx.admissible(propose_all(ctx, state, parent, ctx.word_operators, editable_positions(parent)))
            if len(edits) < 2 * args.top:
                continue
            sample = [edits[i] for i in sorted(rng.permutation(len(edits))[: args.sample])]
            probs = scorer.score([parent, *sample]).probs
            values = ctx.values(item, probs)
            change = values[1:] - values[0]
            parents += 1
            best_change.append(float(change.max()))
            flips.append(bool(any(ctx.objective.success(p, item) for p in probs[1:])))
            for name, averaged in VARIANTS.items():
                tick = time.perf_counter()
                orders = cyclic_orders(parent.option_order) if averaged else [parent.option_order]
                gradient = prompt_gradient(target, scorer.fmt, ctx.objective, parent, orders)
                gains = substitution_gains(gradient, target, sample)
                seconds[name] += time.perf_counter() - tick
                top = np.argsort(-gains, kind="stable")
                per_variant[name]["rho"].append(spearman(gains, change))
                per_variant[name]["lift"].append(float(change[top[: args.top]].mean() - change.mean()))
                per_variant[name]["hit"].append(float(top[0] in np.argsort(-change, kind="stable")[:5]))
    rows = []
    for name, metrics in per_variant.items():
        hits = proportion(np.array(metrics["hit"], dtype=bool))
        rows.append([name, parents, mean_interval(metrics["rho"]), mean_interval(metrics["lift"]),
                     f"{hits['k']}/{hits['n']} [{hits['ci'][0]:.2f}, {hits['ci'][1]:.2f}]",
                     f"{seconds[name] / parents:.2f}"])
    flip = proportion(np.array(flips))
    lines = [f"{parents} parent prompts (the clean prompt and one with the FLEX-style persona, on {args.items} "
             f"held-out ambiguous items of `{args.model}`), up to {args.sample} admissible TextBugger one-word edits "
             f"each (bugs: {bugs}; the gradient preset's constraints), scored order-averaged; measured change = the "
             "stereotype objective's value (log-margin) of the edit minus its parent's. Means over parents with "
             "bootstrap 95% intervals.", "",
             markdown_table(["gradient", "parents", "Spearman ρ (gain, change)",
                             f"lift of its top-{args.top} over random", "its top edit in the sample's best 5",
                             "s per gradient"], rows), "",
             f"Headroom: the best edit in each sample changes the objective by {mean_interval(best_change)}; one edit "
             f"alone flips the answer to the target on {flip['k']} of {flip['n']} parents.",
             "", f"Wall time {(time.perf_counter() - started) / 60:.1f} min."]
    record("Gradient-guided proposals: how well the estimate ranks real edits", "\n".join(lines))


if __name__ == "__main__":
    main()
