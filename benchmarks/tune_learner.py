"""The learner's constants checked on bench_learner's development split only (issue 46).

    python -m benchmarks.tune_learner --seed 0 --checked                             # the values checked
    python -m benchmarks.tune_learner --seed 0 --constant screen_lead --value -0.25  # one neighbour, saved beside it
    python -m benchmarks.tune_learner --report --seeds 0                               # the RESULTS section

PRIOR_SD, screen_lead, family_share and coverage were chosen on the retired 120-item benchmark, some of whose items
came from templates now in the test split. Here each is searched at two neighbours of the value it had then
(CHECKED), every other constant at its checked value, on the dev split only, and RULE (written before any of these
searches ran) says which value the default takes. The test split's figures (bench_learner, bench_families) use
those values.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from benchmarks.bench_families import difference_text, family_rate_text, outcomes, rate_text, rows_of, width_text
from benchmarks.bench_learner import SAVED, benchmark_items, run_file, run_folder, saved_at, search
from benchmarks.common import BBQ, record
from flexsearch.config import load_config
from flexsearch.engine import learner
from flexsearch.engine.families import FAMILIES
from flexsearch.files import atomic_write_json
from flexsearch.results.differences import rate_difference
from flexsearch.results.diversity import diversity, minilm_encoder
from flexsearch.scoring.model import load_target
from flexsearch.scoring.scorer import Scorer

SPLIT, ITEMS, BUDGET = "dev", 48, 25
CHECKED: dict[str, float] = {"prior_sd": 0.5, "screen_lead": -0.5, "family_share": 0.2, "coverage": 0.5}
NEIGHBOURS: dict[str, tuple[float, float]] = {
    "prior_sd": (0.25, 1.0),  # learner.PRIOR_SD: a module constant, patched for the search's duration
    "screen_lead": (-1.0, -0.25),  # -1 screens nothing
    "family_share": (0.1, 0.4),
    "coverage": (0.0, 1.0),  # 0: no archive term within a family
}
BASE = "learned@checked"  # the saved run with every constant at its checked value
SHAPES_FAMILY_SPLIT = ("family_share", "coverage")  # issue 45's width is what these are for
STRENGTH = 0.95  # issue 45's bar: a wider family split may cost at most this share of the union ASR
RULE = ("A neighbour replaces the value in use only where the dev split tells them apart: its union ASR minus the "
        "value in use's, paired over the items (Tango's 95% interval), has its interval above 0; or, for "
        f"{' and '.join(SHAPES_FAMILY_SPLIT)} (they shape the family split), its family split is wider on both "
        "measures (a lower top-template share and more effective templates) while its union ASR is at least "
        f"{STRENGTH} of the value in use's. Of several such neighbours, the higher union ASR, then the wider. "
        "Otherwise the value in use stays. Written before any of these searches ran.")


def variant(constant: str, value: float) -> str:
    """The saved run's method name."""
    return f"learned@{constant}={value:g}"


def search_variant(constant: str | None, value: float, seed: int, bbq: Path) -> dict[str, Any]:
    """The default searched with every constant at its checked value but `constant` at `value` (None: none moved),
    on the dev split's items of `seed`."""
    values = {**CHECKED, **({constant: value} if constant else {})}
    items = benchmark_items("gemma3-bbq", bbq, SPLIT, ITEMS, seed)
    scorer = Scorer.from_config(load_target("gemma3-bbq"), load_config("default").scoring)
    overrides = [f"{name}={v:g}" for name, v in values.items() if name != "prior_sd"]
    with mock.patch.object(learner, "PRIOR_SD", values["prior_sd"]):
        return {**search("learned", "stereotype", BUDGET, items, scorer, seed, overrides),
                "method": variant(constant, value) if constant else BASE}


def wider(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Both width measures better (issue 45): a lower top-template share and more effective templates."""
    if new["top_template"] is None or old["top_template"] is None:
        return False
    return (new["top_template"]["share"] < old["top_template"]["share"]
            and new["effective_templates"] > old["effective_templates"])


def chosen(constant: str, value_in_use: float, runs: dict[float, dict[str, Any]]) -> tuple[float, str]:
    """RULE applied to one constant: (the value kept, why). `runs` maps each value to its pooled measures: union
    and eligible flags over the same items, and the family split's width."""
    base = runs[value_in_use]
    base_k = int((base["union"] & base["eligible"]).sum())
    passing = []
    for value, run in runs.items():
        if value == value_in_use:
            continue
        diff = rate_difference(run["union"], run["eligible"], base["union"], base["eligible"])
        k = int((run["union"] & run["eligible"]).sum())
        stronger = diff["ci"][0] is not None and diff["ci"][0] > 0
        broader = (constant in SHAPES_FAMILY_SPLIT and wider(run["width"], base["width"])
                   and k >= STRENGTH * base_k)
        if stronger or broader:
            passing.append((k, run["width"]["effective_templates"] or 0.0, value,
                            "stronger" if stronger else "wider at the strength bar"))
    if not passing:
        return value_in_use, "no neighbour passes: the value in use stays"
    k, _, value, why = max(passing)
    return value, f"{value:g} replaces {value_in_use:g} ({why}, union {k} vs {base_k})"


def pooled_run(method: str, seed_items: list[tuple[int, list]], saved: Path, encode: Any) -> dict[str, Any]:
    """One saved dev run per seed, pooled: per-item union and eligible flags, family outcomes, the family split's
    width, and each seed's wall time."""
    per_seed = []
    for seed, items in seed_items:
        found = saved_at(run_folder(saved, "gemma3-bbq", SPLIT, ITEMS, seed), method, BUDGET)
        if found is None or found[1] != BUDGET:
            raise SystemExit(f"no saved {method} run at budget {BUDGET} on the dev split, seed {seed}")
        per_seed.append((seed, items, found[0]))
    pooled = [(items, run["records"], outcomes(items, run["records"], BUDGET)) for _, items, run in per_seed]
    return {"union": np.concatenate([result["union"] for _, _, result in pooled]),
            "eligible": np.concatenate([result["eligible"] for _, _, result in pooled]),
            "families": {f: sum((result["families"][f] for _, _, result in pooled), []) for f in FAMILIES},
            "width": diversity([row for items, records, result in pooled
                                for row in rows_of(items, records, BUDGET, result["eligible"])[1]], encode),
            "seconds": [(seed, run["seconds"]) for seed, _, run in per_seed]}


def report(seeds: list[int], saved: Path, bbq: Path) -> str:
    encode = minilm_encoder()
    lines = [f"bench_learner's dev split (issue 46), {ITEMS} ambiguous items a seed, seeds "
             f"{', '.join(map(str, seeds))}, budget {BUDGET}, stereotype objective, the default preset with the "
             "constants at the values checked ("
             + ", ".join(f"{name} {value:g}" for name, value in CHECKED.items())
             + ", the values in use when the check began; the rule's 'value in use') and one at a time moved to a "
             "neighbour. " + RULE + " ASR k/n over the "
             "attack-eligible items with the Wilson 95% interval, pooled over the seeds; the family split's width "
             "over its successful rows (bench_families). Reference target `gemma3-bbq`: it reads whether a context "
             "is ambiguous but not which person the evidence names (disambiguated accuracy 0.48), so these figures "
             "measure the search, not a capable model's bias.", "",
             "| constant | value | union ASR | " + " | ".join(f"{f} ASR" for f in FAMILIES)
             + " | family split | union − value checked (paired) |", "|" + "---|" * (5 + len(FAMILIES))]
    seed_items = [(seed, benchmark_items("gemma3-bbq", bbq, SPLIT, ITEMS, seed)) for seed in seeds]
    verdicts: list[str] = []
    timings: list[str] = []
    measured: dict[str, dict[str, Any]] = {}  # method → its pooled run: the checked one serves every constant
    for constant, neighbours in NEIGHBOURS.items():
        value_in_use = CHECKED[constant]
        runs: dict[float, dict[str, Any]] = {}
        for value in (value_in_use, *neighbours):
            method = BASE if value == value_in_use else variant(constant, value)
            if method not in measured:
                measured[method] = pooled_run(method, seed_items, saved, encode)
                timings += [] if method == BASE else [f"seed {seed} {method} {seconds:.0f} s"
                                                      for seed, seconds in measured[method]["seconds"]]
            runs[value] = measured[method]
        base = runs[value_in_use]
        for value, run in runs.items():
            e = run["eligible"]
            diff = ("(checked)" if value == value_in_use else
                    difference_text(rate_difference(run["union"], e, base["union"], base["eligible"])))
            lines.append(f"| {constant} | {value:g} | {rate_text(run['union'][e])} | "
                         + " | ".join(family_rate_text(run, f) for f in FAMILIES)
                         + f" | {width_text(run['width'])} | {diff} |")
        verdicts.append(f"- {constant}: {chosen(constant, value_in_use, runs)[1]}")
    return "\n".join([*lines, "", "The rule's verdict per constant:", "", *verdicts, "",
                      f"Wall time per neighbour's search (one CPU thread, two searches at a time on the 2 cores): "
                      f"{', '.join(timings)}; the values checked: `python -m benchmarks.tune_learner --seed S "
                      "--checked`."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checked", action="store_true", help="search with every constant at its checked value")
    parser.add_argument("--constant", choices=list(NEIGHBOURS))
    parser.add_argument("--value", type=float, help="one of the constant's two neighbours (NEIGHBOURS)")
    parser.add_argument("--seed", type=int, default=0, help="draws the items and the search's own draws")
    parser.add_argument("--report", action="store_true", help="write the RESULTS section from the saved runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="with --report: the seeds it pools")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--saved", type=Path, default=SAVED)
    args = parser.parse_args()
    if args.report:
        record("Learner constants on the dev split (issue 46)", report(args.seeds, args.saved, args.bbq))
        return
    if not args.checked and (args.constant is None or args.value not in NEIGHBOURS[args.constant]):
        parser.error("--checked, or --constant and --value: one of NEIGHBOURS' values, e.g. --constant screen_lead "
                     "--value -0.25")
    run = search_variant(None if args.checked else args.constant, args.value, args.seed, args.bbq)
    folder = run_folder(args.saved, "gemma3-bbq", SPLIT, ITEMS, args.seed)
    atomic_write_json(run_file(folder, run["method"], "stereotype", BUDGET), run)
    print(f"{run['method']} b{BUDGET}: {run['seconds']:.0f} s, "
          f"{sum(r['success'] for r in run['records'])} successes", flush=True)


if __name__ == "__main__":
    main()
