"""How wide and how strong the split is per attack family (issue 45), from searches bench_learner saved.

    python -m benchmarks.bench_learner --split test --items 48 --seed S --search METHOD --budget B
        # S 0, 1, 2; METHOD learned, learned-blind and learned-noleader at B 25, 40, 100, and random,
        # random-persona, random-instruction, random-text at 100 (read at the smaller budgets)
    python -m benchmarks.bench_families --split test --items 48 --seeds 0 1 2 --budgets 25 40 100 150  # its section
        # (150: learned, learned-blind and learned-noleader searched at 150 too; random-* read where exact)

Per seed, budget and method: the headline (union) ASR over the attack-eligible items with its Wilson interval, the
ASR of each family's hardest prompt, and the width of the headline split and of the family split (diversity.py: the
most common template's share of the template uses, the most common composition's share of the successful rows, the
effective number of templates, the mean pairwise MiniLM cosine of the added attack texts). Per budget, issue 45's
goals over the seeds: the default's union ASR against the learned default when the issue was filed (learned-blind,
the goal's baseline) and against the family search before the headline's late leader (learned-noleader), the family
split's width, and each family against random search restricted to it (plain random's
composition family is the composition baseline), with each seed's paired difference (differences.rate_difference:
Tango's interval, the exact McNemar test). The default shares its budget among the families while each baseline
spends all of it in one: so each single family is also compared at equal effort, the baseline read item by item at
the queries the default spent in that family (at_spend). A budget below the searched one reads first successes
(`first_success_query <= budget`, per family too): exact for random, whose per-item search does not depend on the
budget, and at a larger budget where no item's budget stopped the run (bench_learner.exhausted); a learned search
is reported only at a budget it was searched at.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_learner import SAVED, SPLITS, benchmark_items, run_folder, saved_at
from benchmarks.common import BBQ, record
from flexsearch.data.items import Item
from flexsearch.engine.families import FAMILIES, family_record
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.results.differences import rate_difference
from flexsearch.results.diversity import Encode, diversity, minilm_encoder
from flexsearch.results.metrics import proportion
from flexsearch.results.split import split_row

BASELINE = {"persona": "random-persona", "instruction": "random-instruction", "text": "random-text",
            "composition": "random"}


def within(first: int | None, budget: int) -> bool:
    return first is not None and first <= budget


def outcomes(items: list[Item], records: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per item: eligible, union success within the budget, each family's success within it (None: not searched)."""
    goal = get_objective("stereotype")
    eligible = np.array([attack_eligible(goal, it, np.array(r["clean_probs"])) for it, r in zip(items, records,
                                                                                                 strict=True)])
    union = np.array([within(r["first_success_query"], budget) for r in records])
    families = {f: [within(r["families"][f]["first_success_query"], budget) if f in r["families"] else None
                    for r in records] for f in FAMILIES}
    spent = {f: [r["families"][f]["queries"] if f in r["families"] else None for r in records] for f in FAMILIES}
    return {"eligible": eligible, "union": union, "families": families, "spent": spent, "records": records}


def at_spend(default: dict[str, Any], baseline: dict[str, Any], family: str) -> tuple[np.ndarray, np.ndarray]:
    """(success, searched) per item of a family's baseline (random search restricted to it) read at the queries the
    default spent on that family in the item, beyond the baseline's clean prompt: the two searches at equal effort
    in the family. Exact: the baseline's per-item search does not depend on its budget."""
    flags = []
    for spent, theirs in zip(default["spent"][family], baseline["records"], strict=True):
        best = theirs["families"].get(family)
        clean = theirs["queries"] - best["queries"] if best else 0  # all a family baseline spends outside it
        flags.append(spent is not None and best is not None and within(best["first_success_query"], spent + clean))
    return np.array(flags), _family_flags(baseline, family)[1] & _family_flags(default, family)[1]


def _family_flags(result: dict[str, Any], family: str) -> tuple[np.ndarray, np.ndarray]:
    """(success, eligible) per item in one family: eligible and searched it."""
    found = result["families"][family]
    searched = np.array([x is not None for x in found])
    return np.array([bool(x) for x in found]), result["eligible"] & searched


def rows_of(items: list[Item], records: list[dict[str, Any]], budget: int, eligible: np.ndarray) -> tuple[list, list]:
    """The headline split's rows and the family split's (eligible items, families searched), with success read at
    the budget."""
    fmt = {"slot": "user"}
    headline = [{**split_row(r, it, "", fmt), "success": bool(ok and within(r["first_success_query"], budget))}
                for it, r, ok in zip(items, records, eligible, strict=True)]
    family = [{**split_row(family_record(r, f), it, "", fmt),
               "success": within(r["families"][f]["first_success_query"], budget)}
              for it, r, ok in zip(items, records, eligible, strict=True) if ok for f in FAMILIES if f in r["families"]]
    return headline, family


def family_rate_text(result: dict[str, Any], family: str) -> str:
    """A family's ASR over the eligible items that searched it (outcomes' result), as rate_text writes it."""
    return rate_text(np.array([x for x, ok in zip(result["families"][family], result["eligible"], strict=True)
                               if ok and x is not None], dtype=bool))


def rate_text(flags: np.ndarray) -> str:
    rate = proportion(flags)
    if rate["value"] is None:
        return "-"
    return f"{rate['k']}/{rate['n']} = {rate['value']:.2f} [{rate['ci'][0]:.2f}, {rate['ci'][1]:.2f}]"


def width_text(measures: dict[str, Any]) -> str:
    top, composition = measures["top_template"], measures["top_composition"]
    if top is None:
        return "no successes"
    cosine = measures["mean_pairwise_cosine"]
    return (f"{measures['successful_rows']} rows; top template {top['key']} {top['share']:.2f}; top composition "
            f"{composition['share']:.2f}; effective {measures['effective_templates']:.1f}; cosine "
            f"{'-' if cosine is None else f'{cosine:.2f}'}")


# on a dev/test split: the default, the learned default when issue 45 was filed (family-blind), the family search
# before the headline's late leader (the default before), plain random search, and random search restricted to each
# family
SPLIT_METHODS = ("learned", "learned-blind", "learned-noleader", "random", "random-persona", "random-instruction",
                 "random-text")
PREVIOUS = "learned-noleader"  # the default before the change the section measures (its paired comparison)
TRIED = {  # variants tried on the dev split and not kept (`--also`) → (what, the commit whose settings searched it,
    # the default it was tried against: its paired comparison)
    "learned-leaders1": ("one headline proposal a round by drawn gain alone from the start", "53a224c", PREVIOUS),
    "learned-leaders2": ("two such proposals a round", "53a224c", PREVIOUS),
    "learned-fade": ("the headline's archive term weighted by the share of the budget left", "53a224c", PREVIOUS),
    "learned-allot": ("the open families' slots ordered by the drawn lead of each family's best proposal, each family "
                      "queried once first: family_allocation gain", "25dff61", "learned"),
    "learned-allot5": ("the same with family_share 0.5", "25dff61", "learned"),
    "learned-screen25": ("a stricter screen, screen_lead -0.25", "25dff61", "learned"),
    "learned-screen0": ("screen_lead 0", "25dff61", "learned"),
}
SINGLE_FAMILIES = tuple(f for f, m in BASELINE.items() if m != "random")  # those with a baseline restricted to them
STRENGTH = 0.95  # issue 45's goals: the default's union ASR at least this share of the earlier learned search's,
TOP_TEMPLATE, EFFECTIVE_TEMPLATES = 0.25, 10.0  # and a family split whose top template holds at most this much


def pooled_text(counts: list[tuple[int, int]]) -> str:
    """k/n summed over the seeds (each seed's own rate is in the table with its interval)."""
    return f"{sum(k for k, _ in counts)}/{sum(n for _, n in counts)}"


def split_report(args: argparse.Namespace, encode: Encode) -> str:
    """The split's one section over seeds and budgets (issue 45's goals): per seed, budget and method the union and
    per-family ASR and the width of both splits; per budget the goals over the seeds (strength against learned-blind
    and the previous default, width, each family against random search restricted to it), with paired differences."""
    rows: list[str] = []
    paired: list[str] = []
    goals: list[str] = []
    equal_rows: list[str] = []
    timings: list[str] = []
    seeds = []  # each seed's items and saved runs, drawn once for every budget
    for seed in args.seeds:
        items = benchmark_items(args.model, args.bbq, args.split, args.items, seed)
        seeds.append((seed, items, run_folder(args.saved, args.model, args.split, len(items), seed)))
    methods = (*SPLIT_METHODS, *args.also)
    for budget in args.budgets:
        union: dict[str, list[tuple[int, int]]] = {m: [] for m in methods}
        family_counts: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (method, family) → (k, n) per seed
        widths: list[bool] = []  # per seed: the default's family split meets both width goals
        equal: dict[str, list[tuple[int, ...]]] = {}  # family → per seed: the default's k, n, queries spent; the
        # baseline's k, n at that spend
        for seed, items, folder in seeds:
            found: dict[str, dict[str, Any]] = {}
            for method in methods:
                run = saved_at(folder, method, budget)
                if run is None:
                    continue
                saved, searched_at = run
                if searched_at == budget:
                    timings.append(f"seed {seed} {method} b{budget} {saved['seconds']:.0f} s")
                result = found[method] = outcomes(items, saved["records"], budget)
                e = result["eligible"]
                union[method].append((int(result["union"][e].sum()), int(e.sum())))
                for family in FAMILIES:
                    success, searched = _family_flags(result, family)
                    if searched.any():
                        family_counts.setdefault((method, family), []).append(
                            (int(success[searched].sum()), int(searched.sum())))
                headline, family_rows = rows_of(items, saved["records"], budget, e)
                family_width = diversity(family_rows, encode)
                if method == "learned":
                    widths.append(family_width["top_template"] is not None
                                  and family_width["top_template"]["share"] <= TOP_TEMPLATE
                                  and family_width["effective_templates"] >= EFFECTIVE_TEMPLATES)
                rows.append(f"| {budget} | {seed} | {method} | {searched_at} | {rate_text(result['union'][e])} | "
                            + " | ".join(family_rate_text(result, f) for f in FAMILIES)
                            + f" | {width_text(diversity(headline, encode))} | {width_text(family_width)} |")
            for method, against in (("learned", "learned-blind"), ("learned", PREVIOUS),
                                    *((also, TRIED[also][2] if also in TRIED else PREVIOUS) for also in args.also)):
                if method in found and against in found:
                    new, old = found[method], found[against]
                    diff = rate_difference(new["union"], new["eligible"], old["union"], old["eligible"])
                    paired.append(f"- budget {budget}, seed {seed}: {method} − {against} (union) "
                                  f"{difference_text(diff)}")
            for family, baseline in BASELINE.items():
                if "learned" in found and baseline in found:
                    diff = rate_difference(*_family_flags(found["learned"], family),
                                           *_family_flags(found[baseline], family))
                    if diff["value"] is not None:
                        paired.append(f"- budget {budget}, seed {seed}: {family}, the default − {baseline} "
                                      f"{difference_text(diff)}")
                if "learned" in found and baseline in found and family in SINGLE_FAMILIES:
                    mine, theirs = _family_flags(found["learned"], family), at_spend(found["learned"],
                                                                                      found[baseline], family)
                    spent = [q for q, ok in zip(found["learned"]["spent"][family], mine[1], strict=True) if ok]
                    equal.setdefault(family, []).append((int(mine[0][mine[1]].sum()), int(mine[1].sum()), sum(spent),
                                                         int(theirs[0][theirs[1]].sum()), int(theirs[1].sum())))
                    diff = rate_difference(*mine, *theirs)
                    if diff["value"] is not None:
                        paired.append(f"- budget {budget}, seed {seed}: {family} at equal queries in it, the default "
                                      f"− {baseline} read at the default's spend {difference_text(diff)}")
        goals.append(goal_row(budget, union, family_counts, widths))
        equal_rows += [equal_row(budget, family, counts, family_counts.get((BASELINE[family], family), []))
                       for family, counts in equal.items()]
    about = "templates no constant was chosen on" if args.split == "test" else \
        "its templates are where headline_coverage and leader_after were chosen"
    tried = "".join(f", `{m}` {TRIED[m][0]} (tried on dev; searched at commit {TRIED[m][1]})" if m in TRIED
                    else f", `{m}` a variant" for m in args.also) + (
        " (at commit 53a224c `learned` was `learned-lateleader`, the same search, its runs renamed)"
        if any(TRIED.get(m, ("", ""))[1] == "53a224c" for m in args.also) else "")
    return "\n".join([
        f"bench_learner's {args.split} split ({about}; issue 46), {args.items} ambiguous items a seed, seeds "
        f"{', '.join(map(str, args.seeds))} (each draws its own items and the search's draws), stereotype objective, "
        "the default preset. `learned` is the default (headline_coverage 1, leader_after 0.5), `learned-blind` the "
        "learned default when issue 45 was filed (family-blind, `families=[]`: it stops at the first success; the "
        "goal's 'today's learned default'), `learned-noleader` the family search before the headline's late leader "
        f"(leader_after 1: the default until 2026-12-07){tried}, `random` random search over every operator, "
        "`random-persona`, `random-instruction` and `random-text` random search restricted to one family (each "
        "family's baseline; plain random's composition family is the composition baseline). leader_after was chosen "
        "on the dev split (seed 0, budgets 25 and 40) by a rule written down before its searches ran: of one "
        "headline proposal a round by drawn gain alone from the start (leaders1) or two (leaders2), the archive term "
        "fading with the budget spent (fade) and one such proposal once half the budget is spent (leader_after 0.5), "
        "those whose union ASR summed over both budgets is above learned-noleader's, whose family split meets the "
        "width goals at both budgets, and whose single families lose at most 2 successes; of those, the higher union, "
        "then the narrower split's top template at 40. Only leader_after 0.5 passed (44/96 against 42/96; leaders1 "
        "and leaders2 broke the width goal at 40, fade did not add union ASR). headline_coverage was chosen on the "
        "dev split before it (benchmarks/EXPERIMENTS.md, 'Attack families on the dev split over seeds: the "
        "headline's archive term'). Two recipes for the single families were tried there after it (the same day), each "
        "by a rule written down before its searches, and refused, so the default stays: the learner ordering the open "
        "families' slots (allot; allot5 with family_share 0.5), kept only with union ASR summed over both budgets at "
        "least the default's 44/96, more than its 8 single-family successes and the width goals at both budgets: union "
        "42 and 41, single-family successes 9 and 9, the family split's top template at 25 and 40 0.29 and 0.26, 0.30 "
        "and 0.28 (refused: width); a stricter screen (screen25, screen0), kept only with union at least 44, "
        "single-family successes at least 8, their sum above 52 and the width goals at both budgets: union 45 and 42, "
        "single-family successes 6 and 3 (refused: single families; screen0 also width). A random search's outcome "
        "per item does not depend on its budget, so a run searched at a larger budget is read at a smaller one "
        "(first success within it; 'searched at'), and one that no item's budget stopped (every item ended a whole "
        "prompt short of it: random-persona and random-instruction run out of templates) at a larger one; a learned "
        "search is read only at a budget it "
        "ran at. ASR: k/n over the attack-eligible items with the Wilson 95% interval; a family's ASR counts the "
        "eligible items whose search scored a label-valid prompt of that family, over those that searched it. "
        "Reference target `gemma3-bbq`: it reads whether a context is ambiguous but not which person the evidence "
        "names (disambiguated accuracy 0.48), so these figures measure the search, not a capable model's bias.", "",
        "### Issue 45's goals per budget, over the seeds", "",
        f"k/n summed over the seeds; strength: the default's union against learned-blind's, the goal's baseline "
        f"(≥ {STRENGTH}), and against learned-noleader's (the default before); "
        f"width: the seeds whose family split has its top template at most {TOP_TEMPLATE} of the template uses and "
        f"at least {EFFECTIVE_TEMPLATES:.0f} effective templates; each family: the default's family ASR against "
        "random search restricted to it (composition: against plain random), met where its summed rate is at least "
        "the baseline's; '-': a method not run on every seed. Each seed's paired difference is below the table.", "",
        "| budget | strength (against learned-blind) | against learned-noleader | width | " + " | ".join(FAMILIES)
        + " |", "|" + "---|" * (4 + len(FAMILIES)),
        *goals, "",
        "### Each family at equal queries in it, over the seeds", "",
        "The default shares its budget among the families (family_share) while each baseline spends all of it in "
        "one, so the goals' table compares unequal effort. Here each baseline is read, item by item, at the queries "
        "the default spent in that family (its clean prompt apart): k/n summed over the seeds, over the eligible "
        "items both searched the family; met where the default's summed rate is at least the baseline's at equal "
        "queries. The baseline at the whole budget is the goals' table's figure.", "",
        "| budget | family | the default | its queries in the family per item (mean) | baseline at those queries "
        "| baseline at the whole budget | at equal queries |", "|---|---|---|---|---|---|---|", *equal_rows, "",
        "### ASR per family and width, per seed", "",
        "top template: the most common template's share of the template uses; top composition: the most common set "
        "of templates' share of the rows; effective: exp of the entropy of the template distribution; cosine: mean "
        "pairwise MiniLM cosine of the added attack texts (over the successful rows).", "",
        "| budget | seed | method | searched at | union ASR | " + " | ".join(f"{f} ASR" for f in FAMILIES)
        + " | headline split | family split |", "|" + "---|" * (7 + len(FAMILIES)), *rows, "",
        "### Paired differences per seed (Tango's interval, exact McNemar; a family over the items both searched it)",
        "", *paired, "",
        f"Wall time per search (`python -m benchmarks.bench_learner --split {args.split} --items {args.items} --seed S "
        f"--search METHOD --budget B`, one CPU thread each, two at a time on the 2 cores): {', '.join(timings)}."])


def difference_text(diff: dict[str, Any]) -> str:
    return f"{diff['value']:+.3f} [{diff['ci'][0]:+.3f}, {diff['ci'][1]:+.3f}], exact p = {diff['p']:.3f}"


def equal_row(budget: int, family: str, counts: list[tuple[int, ...]], whole: list[tuple[int, int]]) -> str:
    """One budget and family of the equal-queries table from each seed's (k, n, queries spent) of the default and
    (k, n) of the baseline at that spend."""
    k, n, spent, base_k, base_n = (sum(c[i] for c in counts) for i in range(5))
    met = k / max(1, n) >= base_k / max(1, base_n)
    return (f"| {budget} | {family} | {k}/{n} | {spent / max(1, n):.1f} | {base_k}/{base_n} | "
            f"{pooled_text(whole) if whole else '-'} | {'met' if met else '**not met**'} |")


def goal_row(budget: int, union: dict[str, list[tuple[int, int]]],
             family_counts: dict[tuple[str, str], list[tuple[int, int]]], widths: list[bool]) -> str:
    """One budget's line of the goals' table: each goal's summed counts and whether it is met ('-': not run)."""
    def share(counts: list[tuple[int, int]]) -> float:
        return sum(k for k, _ in counts) / max(1, sum(n for _, n in counts))

    strength = []
    for against in ("learned-blind", PREVIOUS):
        new, old = union["learned"], union[against]
        if not new or len(new) != len(old):
            strength.append("-")
            continue
        ratio = sum(k for k, _ in new) / max(1, sum(k for k, _ in old))
        strength.append(f"{pooled_text(new)} vs {pooled_text(old)} = {ratio:.2f}: "
                        f"{'met' if ratio >= STRENGTH else '**not met**'}")
    width = f"{sum(widths)} of {len(widths)} seeds" if widths else "-"
    cells = []
    for family in FAMILIES:
        mine, theirs = family_counts.get(("learned", family), []), family_counts.get((BASELINE[family], family), [])
        if not mine or len(mine) != len(theirs):
            cells.append(f"{pooled_text(mine)} (no baseline on every seed)" if mine else "-")
            continue
        met = share(mine) >= share(theirs)
        cells.append(f"{pooled_text(mine)} vs {pooled_text(theirs)}: {'met' if met else '**not met**'}")
    return f"| {budget} | {' | '.join(strength)} | {width} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-bbq")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--split", choices=[s for s in SPLITS if s != "all"], default="test",
                        help="bench_learner's development or test split (split_templates)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", type=int, nargs="+", default=[25, 40, 100])
    parser.add_argument("--saved", type=Path, default=SAVED)
    parser.add_argument("--also", nargs="*", default=[], metavar="METHOD",
                        help="saved runs of other searches to report beside them (variants tried on the dev split)")
    args = parser.parse_args()
    record(f"Attack families on the {args.split} split over seeds (issue 45)", split_report(args, minilm_encoder()))


if __name__ == "__main__":
    main()
