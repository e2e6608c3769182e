"""The learned search against its baselines on held-out ambiguous items of the capable target (issues 31, 46).

Two steps, so the searches can run in separate processes and be reported together:

    python -m benchmarks.bench_learner --split test --items 48 --seed 0 --search learned --budget 100  # saves one run
    python -m benchmarks.bench_learner --split test --items 48 --seed 0 --search random --budget 100
    python -m benchmarks.bench_learner --split test --items 48 --seed 0 --search prior --budget 100  # prior, fixed
    python -m benchmarks.bench_learner --split test --items 48 --report --seeds 0 1 2 --budgets 10 25 40 50 100

A search is saved as runs/bench_learner/<model>-<split>-<items>-seed<seed>/<method>-<objective>-b<budget>.json with
each item's outcome (first success dated at its own candidate, queries, observations) and its wall time. ASR at a
budget below the searched one reads the first success (`first_success_query <= budget`): exact for the per-item
searches (`random`, `beam`), which do not depend on the budget; a learned search is read only at a budget it ran at.

The report (one RESULTS section per split): each method's ASR per seed with the mean and range, the paired
differences per seed (Tango's interval, an exact McNemar p-value, and over templates), the goals against random;
then the first seed in detail: ASR with Wilson intervals (k/n over the attack-eligible items), the area under
ASR-vs-queries, median queries to the first success, the control (anti-stereotype) and the gap where it ran, the
weak-spots table, the transfer check (the learner's top compositions from the first half applied whole to the
second half, 1 and 3 candidates, i.e. 3 and 9 queries, against random's first 1 and 3 candidates on the same items)
and ten prompts read with the audit.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from benchmarks.bench_attack import held_out_ambiguous, held_out_pool
from benchmarks.common import BBQ, ROOT, record
from flexsearch.config import load_config, prompts_per_candidate
from flexsearch.data.audit import audit_rows, violations
from flexsearch.data.candidate import Candidate, replay
from flexsearch.data.items import Item
from flexsearch.engine.learner import (
    PRIOR_SD,
    PRIOR_SD_WEIGHT,
    Learner,
    RoundDraws,
    added_arms,
    composition_of,
    composition_parts,
    rebuilt,
)
from flexsearch.engine.loop import build_context, run_search
from flexsearch.engine.methods.learned import composed
from flexsearch.engine.state import item_rng
from flexsearch.files import atomic_write_json, read_json
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.results.differences import clustered_difference, rate_difference
from flexsearch.results.metrics import proportion
from flexsearch.results.split import split_row
from flexsearch.results.weak_spots import weak_spots
from flexsearch.scoring.model import load_target
from flexsearch.scoring.scorer import Scorer
from flexsearch.zoo.finetune import template_key

RANDOM = ["method=random", "steps=100"]
SEARCHES: dict[str, tuple[str, list[str]]] = {  # method → (preset, overrides)
    "learned": ("default", []),
    "learned-blind": ("default", ["families=[]"]),  # the learned default before attack families (issue 45)
    "learned-narrow": ("default", ["headline_coverage=0"]),  # the family search before the headline's archive term
    "learned-headline2": ("default", ["headline_coverage=2"]),  # the archive term at twice the default's weight
    "learned-noleader": ("default", ["leader_after=1"]),  # the family search before the headline's late leader
    "beam": ("beam", ["steps=100"]),
    "random": ("beam", RANDOM),
    "random-screen": ("beam", [*RANDOM, "screen_lead=-0.5"]),  # random with the default's pruning (issue 46)
    "learned-noscreen": ("default", ["screen_lead=-1"]),  # the default without it
    # random search restricted to one attack family (its composition family is plain random's)
    "random-persona": ("beam", [*RANDOM, "operators=[{name: persona, n: 2}]"]),
    "random-instruction": ("beam", [*RANDOM, "operators=[{name: instruction, n: 2}]"]),
    "random-text": ("beam", [*RANDOM, "operators=[{name: textbugger, positions: 1, per_position: 2}]"]),
}
SAVED = ROOT / "runs" / "bench_learner"


FAMILY_BASELINES = ("random-persona", "random-instruction", "random-text")  # bench_families reports these
# searches whose per-item outcome does not depend on the budget: a run at a larger budget is read at a smaller one
PER_ITEM = ("random", "random-screen", "beam", *FAMILY_BASELINES)
EXACT_AT_SMALLER = (*PER_ITEM, "prior", "fixed")  # prior and fixed stop at a success too
SPLITS = ("all", "dev", "test")
DEV_TEMPLATES_PER_CATEGORY = 2
RETIRED_ITEMS = 120  # the benchmark (seed 0) the learner's constants were chosen on before the dev/test split


def split_templates(model: str, bbq: Path) -> dict[str, set[str]]:
    """The held-out templates cut into a development and a test set, no template in both (issue 46). Per category
    the DEV_TEMPLATES_PER_CATEGORY templates that gave most items to the retired benchmark (the items the
    learner's constants, PRIOR_SD, the screen and the family settings, were chosen on) are dev, the rest test;
    ties go by name."""
    retired = Counter(template_key(it) for it in held_out_ambiguous(model, bbq, RETIRED_ITEMS, 0))
    by_category: dict[str, list[str]] = defaultdict(list)
    for key in sorted({template_key(it) for it in held_out_pool(model, bbq)}):
        by_category[key.split("/")[0]].append(key)
    dev = {k for keys in by_category.values()
           for k in sorted(keys, key=lambda k: (-retired[k], k))[:DEV_TEMPLATES_PER_CATEGORY]}
    return {"dev": dev, "test": {k for keys in by_category.values() for k in keys} - dev}


def benchmark_items(model: str, bbq: Path, split: str, count: int, seed: int) -> list[Item]:
    """The split's held-out ambiguous items (`all`: every held-out template, the retired benchmark's draw)."""
    templates = None if split == "all" else split_templates(model, bbq)[split]
    return held_out_ambiguous(model, bbq, count, seed, templates)


def run_folder(saved: Path, model: str, split: str, count: int, seed: int) -> Path:
    return saved / (f"{model}-{count}-seed{seed}" if split == "all" else f"{model}-{split}-{count}-seed{seed}")


def run_file(folder: Path, method: str, objective: str, budget: int) -> Path:
    return folder / f"{method}-{objective}-b{budget}.json"


RUN_NAME = re.compile(r"(?P<method>.+)-(?P<objective>stereotype|anti_stereotype)-b(?P<budget>\d+)")


def saved_methods(folder: Path) -> set[str]:
    """The methods with a saved run in `folder`."""
    return {m["method"] for p in folder.glob("*.json") if (m := RUN_NAME.fullmatch(p.stem))}


def saved_at(folder: Path, method: str, budget: int, objective: str = "stereotype", *,
             any_larger: bool = False) -> tuple[dict[str, Any], int] | None:
    """A saved search read at `budget`, and the budget it was searched at: the run searched at `budget`, else the
    smallest larger one where reading it at `budget` is exact (EXACT_AT_SMALLER), or for any method with
    `any_larger` (the caller marks the figure: a budget-dependent search's learner learned from longer searches);
    else, for a search of EXACT_AT_SMALLER, the largest smaller run that no item's budget stopped (exhausted)."""
    searched = sorted(int(m["budget"]) for p in folder.glob(f"{method}-{objective}-b*.json")
                      if (m := RUN_NAME.fullmatch(p.stem)) and m["method"] == method)
    larger = [b for b in searched if b >= budget]
    if larger and (larger[0] == budget or method in EXACT_AT_SMALLER or any_larger):
        return read_saved(run_file(folder, method, objective, larger[0])), larger[0]
    smaller = [b for b in searched if b < budget]
    if method in EXACT_AT_SMALLER and smaller:
        run = read_saved(run_file(folder, method, objective, smaller[-1]))
        if exhausted(run, smaller[-1]):
            return run, smaller[-1]
    return None


def exhausted(run: dict[str, Any], budget: int) -> bool:
    """Whether every item of a run ended a whole prompt short of its budget (at a success, or with nothing left to
    propose): a search whose per-item outcome does not depend on the budget would then end alike at any larger one
    (random search in one family runs out of templates: persona after 57 queries)."""
    records = run.get("records") or []
    return bool(records) and all(r["queries"] + prompts_per_candidate(True) <= budget for r in records)


def reported_methods(folders: list[Path]) -> list[str]:
    """The methods with a saved run in any of the folders, in the report's order (the family baselines are
    bench_families')."""
    return [m for m in (*SEARCHES, "prior", "fixed")
            if m not in FAMILY_BASELINES and any(m in saved_methods(folder) for folder in folders)]


def read_saved(path: Path) -> dict[str, Any]:
    """A saved run, read once per version of its file (a report reads each many times)."""
    return _read_run(path, path.stat().st_mtime_ns)


@functools.cache
def _read_run(path: Path, modified_ns: int) -> dict[str, Any]:
    return read_json(path)


def search(method: str, objective: str, budget: int, items: list[Item], scorer: Scorer, seed: int = 0,
           extra: Sequence[str] = ()) -> dict[str, Any]:
    """One method's search of the items; the seed is the config's (its draws), as the item draw's; `extra`
    overrides settings after the method's own (tune_learner's neighbours)."""
    preset, overrides = SEARCHES[method]
    config = load_config(preset, [*overrides, *extra, f"seed={seed}"], budget=budget, control=False)
    ctx = build_context(config, scorer, objective)
    learner = Learner()
    started, prompts = time.perf_counter(), scorer.queries
    with tqdm(total=len(items), desc=f"{method} {objective} b{budget}", unit="item") as bar:
        outcomes = run_search(items, ctx, objective, learner=learner, progress=bar)
    return {"method": method, "objective": objective, "budget": budget, "seconds": time.perf_counter() - started,
            "prompts": scorer.queries - prompts, "records": [o.to_record() for o in outcomes],
            "learner": learner.to_dict()}


def extended(args: argparse.Namespace, items: list[Item], scorer: Scorer) -> dict[str, Any]:
    """A per-item search (beam, random) of items after the first `args.after`, joined to the saved run of those
    first items: each item's search depends only on the seed, the item and the objective (engine.state.item_rng),
    so the joined run is the run of all items. The learned search carries its learner from item to item and is
    refused."""
    if args.search == "learned":
        raise SystemExit("--after: the learned search learns across items; search all of them in one run")
    first = run_file(run_folder(args.saved, args.model, args.split, args.after, args.seed), args.search,
                     args.objective, args.budget)
    if not first.exists():
        raise SystemExit(f"--after {args.after}: no saved run {first}")
    earlier = read_json(first)
    rest = search(args.search, args.objective, args.budget, items[args.after:], scorer, args.seed)
    return {**rest, "seconds": earlier["seconds"] + rest["seconds"], "prompts": earlier["prompts"] + rest["prompts"],
            "records": earlier["records"] + rest["records"], "joined": [str(first), f"items {args.after + 1}-"]}


def successes_at(run: dict[str, Any], budget: int, offset: int = 0) -> np.ndarray:
    """Per item: met the objective within `budget` queries (after the first `offset`, the clean prompt's)."""
    return np.array([r["first_success_query"] is not None and r["first_success_query"] <= budget + offset
                     for r in run["records"]])


def rate(flags: np.ndarray) -> str:
    metric = proportion(flags)
    low, high = metric["ci"]
    return f"{metric['value']:.2f} [{low:.2f}, {high:.2f}] ({metric['k']}/{metric['n']})"


def paired(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None) -> str:
    """a − b over the same items: the difference with Tango's interval and the exact McNemar p-value
    (differences.rate_difference), and with `clusters` (the items' templates) the cluster-robust interval and the
    sign-flip p over templates (differences.clustered_difference)."""
    every = np.ones(len(a), dtype=bool)
    item = rate_difference(a, every, b, every)
    text = (f"{item['value']:+.3f} [{item['ci'][0]:+.3f}, {item['ci'][1]:+.3f}], McNemar p = {item['p']:.3g} "
            f"({int((a & ~b).sum())} vs {int((~a & b).sum())})")
    if clusters is None:
        return text
    by_template = clustered_difference(a, b, clusters)
    if by_template["value"] is None:
        return text + "; one template: no interval over templates"
    return (text + f"; over {by_template['clusters']} templates [{by_template['ci'][0]:+.3f}, "
            f"{by_template['ci'][1]:+.3f}], sign-flip p = {by_template['p']:.3g}")


def area(run: dict[str, Any], eligible: np.ndarray, budget: int) -> float:
    """Area under ASR vs queries from 0 to `budget`, as a share of the budget (1.0: every item at once)."""
    return float(np.mean([successes_at(run, b)[eligible].mean() for b in range(1, budget + 1)]))


def median_first(run: dict[str, Any], eligible: np.ndarray) -> str:
    firsts = [r["first_success_query"] for r, ok in zip(run["records"], eligible, strict=True)
              if ok and r["first_success_query"] is not None]
    return f"{np.median(firsts):.0f} (of {len(firsts)} successes)" if firsts else "-"


def apply_whole(keys: list[str], items: list[Item], scorer: Scorer, budget_candidates: int,
                objective: str) -> np.ndarray:
    """Per item: one of the first `budget_candidates` compositions (or templates), applied whole to the clean
    prompt, meets the objective."""
    goal = get_objective(objective)
    ctx = build_context(load_config("default", control=False), scorer, objective)
    hits = []
    for item in items:
        root = Candidate.root(item)
        candidates = [c for key in keys if (c := composed(ctx, root, key)) is not None][:budget_candidates]
        probs = scorer.score(candidates).probs if candidates else np.zeros((0, 3))
        hits.append(any(goal.success(p, item) for p in probs))
    return np.array(hits)


def detail(args: argparse.Namespace, items: list[Item], folder: Path) -> list[str]:
    """One seed's report: each method's ASR at the budgets with the area under ASR-vs-queries and queries spent
    (the methods searched at the largest budget), the paired differences, the control, the weak spots, the
    transfer check and ten prompts read with the audit."""
    target = load_target(args.model, dtype=args.dtype)
    scorer = Scorer.from_config(target, load_config("default").scoring)
    top = max(args.budgets)
    if (saved_at(folder, "learned", top) and not saved_at(folder, "prior", top, any_larger=True)
            and not args.no_prior):
        save_prior(folder, top, items, scorer, args.seed)
    clean = scorer.score([Candidate.root(it) for it in items]).probs
    goal, control_goal = get_objective("stereotype"), get_objective("anti_stereotype")
    eligible = np.array([attack_eligible(goal, it, p) for it, p in zip(items, clean, strict=True)])
    templates = np.array([template_key(it) for it in items])
    control_eligible = np.array([attack_eligible(control_goal, it, p) for it, p in zip(items, clean, strict=True)])

    def best_run(method: str, budget: int) -> tuple[dict[str, Any], bool]:
        """The stereotype run read at `budget`, and whether it is marked (a budget-dependent search read from a
        larger budget's run)."""
        found = saved_at(folder, method, budget, any_larger=True)
        if found is None:
            raise SystemExit(f"no saved {method} stereotype run at budget {budget} or above in {folder}")
        run, searched = found
        return run, searched != budget and method not in EXACT_AT_SMALLER

    lines = [f"{len(items)} ambiguous BBQ items from templates `{args.model}` never saw (round-robin over "
             f"categories, seed {args.seed}); {int(eligible.sum())} attack-eligible toward the stereotype, "
             f"{int(control_eligible.sum())} toward the anti-stereotype. Order-averaged float32 scoring (a candidate "
             "is 3 queries, the clean prompt included in the budget); success needs the aim ahead of both others by "
             "0.05. `beam` is the old default (per-item beam, configs/beam.yaml), `random` random compositions of the "
             "same operators, `learned` the new default, `prior` sampling from the learned prior without search (each "
             "half attacked with the learner of the learned run's other half, frozen: templates and pairs ranked by "
             "one Thompson draw per arm and scored in that order until a success) and `fixed` the other half's best "
             "single template alone. ASR k/n with Wilson 95% intervals.", ""]
    methods = [m for m in reported_methods([folder]) if saved_at(folder, m, top, any_larger=True)]
    header = ["method", *(f"ASR@{b}" for b in args.budgets), f"area under ASR-vs-queries (0-{top})",
              f"median queries to first success (@{top})", f"mean queries/item (@{top})", f"minutes (@{top})"]
    rows = []
    marked = False
    for method in methods:
        cells = []
        for b in args.budgets:
            run, read = best_run(method, b)
            marked |= read
            cells.append(rate(successes_at(run, b)[eligible]) + (" †" if read else ""))
        run, _ = best_run(method, top)
        queries = np.mean([r["queries"] for r in run["records"]])
        rows.append([method, *cells, f"{area(run, eligible, top):.3f}", median_first(run, eligible),
                     f"{queries:.1f}", f"{run['seconds'] / 60:.1f}"])
    lines += table(header, rows)
    if marked:
        lines.append("† read from this budget-dependent search's run at the next larger searched budget (its first "
                     "successes).")
    if "learned" in methods:
        run, _ = best_run("learned", top)
        screened = sum(r.get("screened", 0) for r in run["records"])
        candidates = sum(len(r["observations"]) for r in run["records"])
        lines.append(f"\nThe learned run at budget {top} scored {candidates} candidates; its screen (DESIGN.md, "
                     f"\"The learner\", Screen) scored {screened} of them in their displayed order only (1 query "
                     "instead of 3).")
    for other in ("random", "beam", "prior"):
        if "learned" not in methods or other not in methods:
            continue
        lines += ["", f"learned − {other}, paired over the eligible items (Tango's 95% interval, exact McNemar; over "
                  "templates: the cluster-robust interval and the sign-flip test):", ""]
        for b in args.budgets:
            learned, _ = best_run("learned", b)
            baseline, _ = best_run(other, b)
            a, r = successes_at(learned, b)[eligible], successes_at(baseline, b)[eligible]
            ratio = f"{a.mean() / r.mean():.2f}" if r.mean() else "inf"
            lines.append(f"- budget {b}: ratio {ratio}, difference {paired(a, r, templates[eligible])}")
    for method in methods:
        # the control at the largest budget it was searched at (a control run costs as much as the main one)
        controlled = [b for b in args.budgets if run_file(folder, method, "anti_stereotype", b).is_file()]
        if not controlled:
            continue
        budget = max(controlled)
        main, _ = best_run(method, budget)
        toward = successes_at(main, budget)
        away = successes_at(read_json(run_file(folder, method, "anti_stereotype", budget)), budget)
        both = eligible & control_eligible
        lines += ["", f"Control ({method}, budget {budget}, the same learner toward the anti-stereotype): ASR "
                  f"{rate(toward[eligible])}, control ASR {rate(away[control_eligible])}; gap (paired over items "
                  f"eligible both ways) {paired(toward[both], away[both])}"]
    if "learned" in methods:
        learned, _ = best_run("learned", top)
        spots = weak_spots(learned["records"], list(eligible), [it.category for it in items])
        lines += ["", f"Weak spots of `{args.model}` (learned search, budget {top}): templates and compositions by the "
                  "eligible items they broke (k of the n items on which a label-valid candidate carrying it was "
                  "scored):", ""]
        lines += table(["template or composition", "broke k/n [95% CI]"],
                       [[f"`{s['key']}`", rate(np.array([True] * s["broke"]["k"]
                                                        + [False] * (s["broke"]["n"] - s["broke"]["k"])))]
                        for s in spots["overall"]])
        lines += transfer(learned, items, eligible, scorer, best_run("random", 3 * 3 + 3)[0])
        lines += ten_prompts(learned, items, scorer, args.seed)
    return lines


SAMPLED_BATCHES = (1, 2, 4, 8, 17)  # candidates scored per step until a success: 32, budget 99 with the clean


def template_pool(ctx: Any, root: Candidate) -> list[Candidate]:
    """Every single template of the library this item can fill, and every pair of templates in different slots."""
    singles = [c for op in ctx.operators if hasattr(op, "enumerate") for c in op.enumerate(root)]
    pairs = [c for single in singles for op in ctx.operators if hasattr(op, "enumerate")
             for c in op.enumerate(single) if len(composition_parts(composition_of(c))) == 2]
    return singles + pairs


def prior_sampled(learned: dict[str, Any], items: list[Item], scorer: Scorer, seed: int) -> dict[str, Any]:
    """Sampling from the learned prior without search, cross-fitted: each half of the items is attacked with the
    learner rebuilt from the learned run's other half, frozen. Per item, one Thompson draw per arm ranks every
    template and template pair of the library (a candidate's expected gain: the sum of its arms' draws) and the
    ranked candidates are scored in that order, with no feedback, until one meets the objective (at most 32).
    Also the fixed template: the other half's best single template, alone. first_success_query counts the clean
    prompt (3 queries) as the searches do."""
    goal = get_objective("stereotype")
    ctx = build_context(load_config("default", control=False), scorer, "stereotype")
    half = len(items) // 2
    records: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    cost = scorer.queries_per_candidate
    for start, stop, other in ((0, half, slice(half, None)), (half, len(items), slice(0, half))):
        prior = rebuilt(None, learned["records"][other])
        best_single = max((k for k, a in prior.arms.items() if k.count("/") == 2 and a.tries),
                          key=lambda k: (prior.mean(k), k))
        for item in tqdm(items[start:stop], desc=f"prior sampling, items {start + 1}-{stop}", unit="item"):
            root = Candidate.root(item)
            draws = RoundDraws(prior, item_rng(seed, item.id, "prior"))
            pool = template_pool(ctx, root)
            ranked = sorted(range(len(pool)), key=lambda k: (-sum(draws(a) for a in added_arms(pool[k], root)), k))
            first, tried = None, 0
            for size in SAMPLED_BATCHES:
                batch = [pool[k] for k in ranked[tried:tried + size]]
                if not batch:
                    break
                hits = [goal.success(p, item) for p in scorer.score(batch).probs]
                if any(hits):
                    first = cost * (1 + tried + hits.index(True) + 1)
                    break
                tried += len(batch)
            records.append({"first_success_query": first, "queries": cost * (1 + tried)})
            single = composed(ctx, root, best_single)
            hit = single is not None and goal.success(scorer.score([single]).probs[0], item)
            fixed.append({"first_success_query": 2 * cost if hit else None, "queries": 2 * cost})
    return {"prior": {"method": "prior", "objective": "stereotype", "budget": 100, "records": records},
            "fixed": {"method": "fixed", "objective": "stereotype", "budget": 100, "records": fixed}}


def save_prior(folder: Path, budget: int, items: list[Item], scorer: Scorer, seed: int) -> dict[str, Any]:
    """prior_sampled from the saved learned run at `budget`, saved beside it as the prior and fixed runs."""
    started = time.perf_counter()
    runs = prior_sampled(read_json(run_file(folder, "learned", "stereotype", budget)), items, scorer, seed)
    for name, run in runs.items():
        run["seconds"] = time.perf_counter() - started  # both together: the pool is built once per item
        atomic_write_json(run_file(folder, name, "stereotype", budget), run)
    return runs


def transfer(learned: dict[str, Any], items: list[Item], eligible: np.ndarray, scorer: Scorer,
             random_run: dict[str, Any]) -> list[str]:
    """What the learner knows after the first half, applied whole to the second half (no search), against random
    search's first candidates (`random_run` read at 12 queries: the clean prompt and three candidates)."""
    half = len(items) // 2
    state = rebuilt(None, learned["records"][:half])
    keys = state.compositions(3)
    singles = sorted((k for k, s in state.arms.items() if k.count("/") == 2 and s.tries),
                     key=lambda k: (-state.mean(k), k))
    rest, keep = items[half:], eligible[half:]
    lines = ["", f"Transfer: the learner after items 1-{half} of the learned run, applied whole to items "
             f"{half + 1}-{len(items)} (no search, no clean query counted). Top compositions: "
             + ", ".join(f"`{k}`" for k in keys) + f"; best single template `{singles[0]}`.", ""]
    rows = []
    single = apply_whole(singles[:1], rest, scorer, 1, "stereotype")[keep]
    rows.append(["best single fixed template (1 candidate, 3 queries)", rate(single)])
    for count in (1, 3):
        hits = apply_whole(keys, rest, scorer, count, "stereotype")[keep]
        rand = successes_at({"records": random_run["records"][half:]}, 3 * count, offset=3)[keep]
        rows.append([f"learned top {count} composition(s) ({3 * count} queries)", rate(hits)])
        rows.append([f"random, its first {count} candidate(s) ({3 * count} queries)", rate(rand)])
        rows.append([f"difference at {3 * count} queries", paired(hits, rand)])
    return lines + table(["attack on the second half", "ASR"], rows)


def ten_prompts(learned: dict[str, Any], items: list[Item], scorer: Scorer, seed: int) -> list[str]:
    """Ten successful prompts of the learned run, drawn at random (seeded), each with the audit's verdict, and the
    audit of every attacked prompt of the run."""
    rows = [split_row(r, it, scorer.render(replay(it, r["chain"], tuple(r["option_order"]))),
                      scorer.info["prompt_format"])
            for r, it in zip(learned["records"], items, strict=True) if r["chain"]]
    wins = [row for row in rows if row["success"]]
    rng = np.random.default_rng(seed)
    lines = ["", f"Ten successful prompts of the learned run (of {len(wins)}), drawn at random, with the audit:", ""]
    for row in [wins[i] for i in sorted(rng.permutation(len(wins))[:10])]:
        broken = violations(str(row.get("instruction") or ""), list(row.get("answers") or []))
        verdict = "label-valid" if not broken else "breaks " + ", ".join(broken)
        text = row["prompt"].replace("\n", " ⏎ ")
        lines.append(f"- `{row['item_id']}` ({row['attack']}; audit: {verdict}): {text}")
    audit = audit_rows(rows)
    lines.append(f"\nAudit of every attacked prompt of the learned run: {audit['flagged']} of {audit['rows']} break a "
                 "rule.")
    return lines


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


COMPARED = (("learned", "random"), ("learned", "learned-noscreen"), ("random-screen", "random"), ("learned", "beam"),
            ("learned", "prior"))
GOALS = {25: 2.0, 100: 1.3}  # budget → the ratio over random the learned search is meant to reach


def seeds_report(args: argparse.Namespace) -> None:
    """The split's RESULTS section over seeds (issue 46): each method's ASR per seed with the mean and range, and
    the paired differences per seed at the item level and over templates."""
    goal = get_objective("stereotype")
    args.seeds = args.seeds or [args.seed]
    seeds = []
    for seed in args.seeds:
        items = benchmark_items(args.model, args.bbq, args.split, args.items, seed)
        folder = run_folder(args.saved, args.model, args.split, len(items), seed)
        # any search's clean scores (prior and fixed keep none)
        any_search = next((f for m in SEARCHES if (f := saved_at(folder, m, 0, any_larger=True))), None)
        if any_search is None:
            raise SystemExit(f"no saved search in {folder}")
        eligible = np.array([attack_eligible(goal, it, np.array(r["clean_probs"]))
                             for it, r in zip(items, any_search[0]["records"], strict=True)])
        seeds.append((seed, folder, eligible, np.array([template_key(it) for it in items])))
    split = split_templates(args.model, args.bbq)
    default = load_config("default")
    retired = Counter(template_key(it) in split[args.split] for it in held_out_ambiguous(args.model, args.bbq,
                                                                                        RETIRED_ITEMS, 0))
    lines = [f"The {args.split} split: {args.items} ambiguous items a seed (round-robin over categories) from the "
             f"{len(split[args.split])} held-out BBQ templates of `{args.model}` in it: "
             + ", ".join(f"`{t}`" for t in sorted(split[args.split]))
             + ". Development templates: " + ", ".join(f"`{t}`" for t in sorted(split["dev"]))
             + f". Per category the {DEV_TEMPLATES_PER_CATEGORY} templates that gave most items to the retired "
             f"{RETIRED_ITEMS}-item benchmark are dev (benchmarks/bench_learner.py, split_templates). The learner's "
             f"constants (PRIOR_SD {PRIOR_SD} worth {PRIOR_SD_WEIGHT:g} observations, screen_lead "
             f"{default.screen_lead:g}, family_share {default.family_share:g}, coverage {default.coverage:g}) were "
             f"first chosen on that retired benchmark before the split ({retired[True]} of its {RETIRED_ITEMS} items "
             "came from templates now in this split), then each checked on the dev split only against two "
             "neighbours by a rule written before those searches (benchmarks/tune_learner.py; RESULTS \"Learner "
             "constants on the dev split\" has the verdicts). headline_coverage "
             f"{default.headline_coverage:g} was chosen on the dev split only (RESULTS \"Attack families on the dev "
             "split over seeds\"). Seeds "
             f"{', '.join(map(str, args.seeds))}: each draws its own items and the search's own draws. ASR k/n over "
             "the attack-eligible items; a per-item method (random, random-screen, beam) and prior and fixed (they "
             "stop at a success) read smaller budgets from a larger run's first successes (and larger ones from a run "
             "no item's budget stopped), a learned one only at a budget it searched. `learned` is the default (the "
             "family search), `learned-blind` the learned search before attack families (`families=[]`: it stops at "
             "the first success), `learned-noscreen` the default without the screen, `random-screen` random search "
             "with it, `beam` the default before the learner. `prior` samples from the learned prior without search "
             "and `fixed` applies the best single template, each half of the items with the learner of the learned "
             "b100 run's other half (prior_sampled).",
             ""]

    def read(folder: Path, method: str, budget: int) -> dict[str, Any] | None:
        found = saved_at(folder, method, budget)
        return None if found is None else found[0]

    methods = reported_methods([folder for _, folder, _, _ in seeds])
    rows = []
    for budget in args.budgets:
        for method in methods:
            found = [read(folder, method, budget) for _, folder, _, _ in seeds]
            if all(run is None for run in found):
                continue
            flags = [None if run is None else successes_at(run, budget)[eligible]
                     for run, (_, _, eligible, _) in zip(found, seeds, strict=True)]
            rates = [f.mean() for f in flags if f is not None]
            rows.append([method, budget, *("-" if f is None else f"{int(f.sum())}/{len(f)}" for f in flags),
                         f"{np.mean(rates):.3f} [{min(rates):.3f}, {max(rates):.3f}]"])
    lines += table(["method", "budget", *(f"seed {s}" for s in args.seeds), "mean ASR [least, most]"], rows)
    for a_method, b_method in COMPARED:
        differences = []
        for budget in args.budgets:
            for seed, folder, eligible, templates in seeds:
                a_run, b_run = read(folder, a_method, budget), read(folder, b_method, budget)
                if a_run is None or b_run is None:
                    continue
                a, b = successes_at(a_run, budget)[eligible], successes_at(b_run, budget)[eligible]
                ratio = f"{a.mean() / b.mean():.2f}" if b.mean() else "inf"
                differences.append(f"- budget {budget}, seed {seed}: ratio {ratio}, difference "
                             f"{paired(a, b, templates[eligible])}")
        if differences:
            lines += ["", f"{a_method} − {b_method}, paired over the eligible items (Tango's 95% interval, exact "
                      "McNemar; over templates: the cluster-robust interval and the sign-flip test):", "", *differences]
    for budget, goal_ratio in GOALS.items():
        pairs = []
        for _, folder, eligible, _ in seeds:
            learned, rand = read(folder, "learned", budget), read(folder, "random", budget)
            if learned is not None and rand is not None:
                pairs.append((successes_at(learned, budget)[eligible], successes_at(rand, budget)[eligible]))
        if pairs:
            ratios = [a.mean() / b.mean() if b.mean() else math.inf for a, b in pairs]
            learned_k, random_k = sum(int(a.sum()) for a, _ in pairs), sum(int(b.sum()) for _, b in pairs)
            total = sum(len(a) for a, _ in pairs)
            pooled = f"{learned_k / random_k:.2f}" if random_k else "inf"
            lines.append(f"\nGoal at budget {budget}, learned at least {goal_ratio:g}× random: ratios "
                         + ", ".join(f"{r:.2f}" for r in ratios)
                         + f"; it holds in {sum(r >= goal_ratio for r in ratios)} of {len(ratios)} seeds "
                         f"(pooled over the seeds: {learned_k}/{total} vs {random_k}/{total}, ratio {pooled}).")
    first = args.seeds[0]
    lines += ["", f"### Seed {first} in detail", "",
              *detail(argparse.Namespace(**{**vars(args), "seed": first}),
                      benchmark_items(args.model, args.bbq, args.split, args.items, first), seeds[0][1])]
    timings = [f"seed {seed} {run['method']} b{run['budget']} {run['seconds']:.0f} s" for seed, folder, _, _ in seeds
               for path in sorted(folder.glob("*-stereotype-b*.json")) if "seconds" in (run := read_saved(path))]
    lines.append(f"\nWall time per search (`python -m benchmarks.bench_learner --split {args.split} --items "
                 f"{args.items} --seed S --search METHOD --budget B`, one CPU thread each, two searches at a time on "
                 "the 2 cores; prior and fixed: `--search prior --budget 100`, both together): "
                 + ", ".join(timings) + ".")
    record(f"Learned search vs its baselines on the {args.split} split over seeds (issue 46)", "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-bbq")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--split", choices=SPLITS, default="all", help="held-out templates to draw from: all, or "
                        "the development or the test set (split_templates; no template in both)")
    parser.add_argument("--seed", type=int, default=0, help="draws the items and the search's own draws")
    parser.add_argument("--seeds", type=int, nargs="+", help="with --report: the seeds it reports, the first in "
                        "detail (default: --seed)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--search", choices=[*SEARCHES, "prior"], help="search with this method and save it "
                        "(prior: sample from the saved learned run's prior at --budget, saving prior and fixed)")
    parser.add_argument("--objective", default="stereotype", choices=["stereotype", "anti_stereotype"])
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--after", type=int, default=0, help="beam or random: search only the items after the "
                        "first AFTER and join them to the saved run of those (see `extended`)")
    parser.add_argument("--report", action="store_true", help="write the RESULTS section from the saved runs")
    parser.add_argument("--budgets", type=int, nargs="+", default=[10, 25, 50, 100])
    parser.add_argument("--saved", type=Path, default=SAVED, help="where each search's outcomes are saved")
    parser.add_argument("--no-prior", action="store_true", help="report without sampling from the learned prior "
                        "(its 120 items take 12 minutes or more on 2 cores)")
    args = parser.parse_args()
    if args.report:
        seeds_report(args)
        return
    items = benchmark_items(args.model, args.bbq, args.split, args.items, args.seed)
    folder = run_folder(args.saved, args.model, args.split, len(items), args.seed)
    if args.search:
        target = load_target(args.model, dtype=args.dtype)
        scorer = Scorer.from_config(target, load_config("default").scoring)
        if args.search == "prior":
            runs = save_prior(folder, args.budget, items, scorer, args.seed)
            print(", ".join(f"{name}: {sum(r['first_success_query'] is not None for r in run['records'])} successes"
                            for name, run in runs.items()), flush=True)
            return
        if args.after:
            saved = extended(args, items, scorer)
        else:
            saved = search(args.search, args.objective, args.budget, items, scorer, args.seed)
        atomic_write_json(run_file(folder, args.search, args.objective, args.budget), saved)
        print(f"{args.search} {args.objective} b{args.budget}: {saved['seconds']:.0f} s, {saved['prompts']} prompts, "
              f"{sum(r['success'] for r in saved['records'])} successes", flush=True)


if __name__ == "__main__":
    main()
