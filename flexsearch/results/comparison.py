"""`flexsearch compare`: a paired comparison of two runs on the items they share.

A run is a search run (trace.jsonl + split.jsonl) or an evaluate run (predictions.jsonl, with
attacked probabilities when it re-scored a split). Every interval is for the difference itself, paired over the
shared items: a rate's (ASR, accuracy, abstention) is differences.rate_difference's small-sample interval with its
exact test; a mean's (and the difference of the fairness gaps) a paired bootstrap over the items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexsearch.data.candidate import chain_edits, forced_in_place
from flexsearch.engine.families import FAMILIES
from flexsearch.errors import FlexsearchError
from flexsearch.files import read_json
from flexsearch.objectives import SUCCESS_MARGIN, aim_lead, eligible_mask
from flexsearch.results.differences import rate_difference
from flexsearch.results.metrics import BOOTSTRAP_SAMPLES, holm, proportion
from flexsearch.results.run_dir import read_jsonl, read_run_config, read_trace
from flexsearch.results.run_files import CONFIG, PREDICTIONS, SCORE, SPLIT_FILES, SPLIT_JSONL, TRACE
from flexsearch.results.verdict import verdict


@dataclass
class RunTable:
    """Per-item arrays of one run, rows in item order."""

    path: Path
    scoring: dict[str, Any]
    ids: list[str]
    category: np.ndarray
    group: np.ndarray  # the stereotyped person's BBQ group tag ("" when the rows carry none)
    condition: np.ndarray
    gold: np.ndarray
    target: np.ndarray
    anti_target: np.ndarray
    unknown: np.ndarray
    clean: np.ndarray  # (n, 3)
    attacked: np.ndarray | None  # (n, 3) best prompt toward the stereotype, when the run attacked
    control: np.ndarray | None  # (n, 3) best prompt toward the anti-stereotype, when the run had a control
    control_clean: np.ndarray | None
    forced: np.ndarray | None = None  # per item: the stereotype search's hardest prompt is forced-choice
    control_forced: np.ndarray | None = None  # the same for the control search (both measured apart from ASR)
    margin: float = SUCCESS_MARGIN  # the success margin the run was scored with
    budget: int | None = None  # the search's per-item budget (None: an evaluate run)
    # attack family → (n, 3) the stereotype search's best prompt in that family, NaN where the item did not search it
    families: dict[str, np.ndarray] = field(default_factory=dict)

    def take(self, order: list[int]) -> RunTable:
        pick = np.asarray(order, dtype=int)

        def sub(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[pick]

        return RunTable(self.path, self.scoring, [self.ids[i] for i in order], self.category[pick],
                        self.group[pick], self.condition[pick], self.gold[pick],
                        self.target[pick], self.anti_target[pick], self.unknown[pick], self.clean[pick],
                        sub(self.attacked), sub(self.control), sub(self.control_clean), sub(self.forced),
                        sub(self.control_forced), self.margin, self.budget,
                        {f: probs[pick] for f, probs in self.families.items()})


def _scoring_of(run: Path) -> dict[str, Any]:
    if not run.is_dir():
        raise FlexsearchError(f"{run}: no such run directory")
    config = read_run_config(run)
    if config is None:
        raise FlexsearchError(f"{run} is not a run directory (no {CONFIG})")
    scoring = config.get("scoring") or {}
    return {"mode": scoring.get("mode", "plain"), "slot": scoring.get("slot", "user"),
            "average_orders": scoring.get("average_orders", True)}


def load_run(run: Path) -> RunTable:
    """The per-item table of a search or evaluate run directory."""
    scoring = _scoring_of(run)
    forced = control_forced = None
    if (run / TRACE).exists() and (run / SPLIT_JSONL).exists():
        records = read_trace(run / TRACE)
        first_seen: dict[str, int] = {}
        for k, record in enumerate(records):
            first_seen.setdefault(record["item_id"], k)
        rows = sorted((r for jsonl, _ in SPLIT_FILES if (run / jsonl).is_file() for r in read_jsonl(run / jsonl)),
                      key=lambda r: first_seen.get(r["item_id"], len(records)))  # every emitted row, trace order
        if not rows:
            raise FlexsearchError(f"{run}: the search emitted no rows")
        outcomes = {(r["objective"], r["item_id"]): r for r in records}
        objective = rows[0]["objective"]

        def outcome_arrays(obj: str) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
            """(clean, best, forced-choice) per row for one objective; Nones when the trace lacks a row's item."""
            hits = [h for h in (outcomes.get((obj, r["item_id"])) for r in rows) if h is not None]
            if len(hits) < len(rows):
                return None, None, None
            return (np.array([h["clean_probs"] for h in hits]), np.array([h["best_probs"] for h in hits]),
                    np.array([forced_in_place(chain_edits(h["chain"])) for h in hits], dtype=bool))

        clean, attacked, forced = outcome_arrays(objective)
        control_clean, control, control_forced = outcome_arrays("anti_stereotype")
        families = _family_arrays([outcomes.get((objective, r["item_id"])) for r in rows])
    elif (run / PREDICTIONS).exists():
        rows = read_jsonl(run / PREDICTIONS)
        clean = np.array([r["probs"] for r in rows])
        attacked = np.array([r["attacked_probs"] for r in rows]) if rows and "attacked_probs" in rows[0] else None
        control = control_clean = None
        families = {}
    else:
        raise FlexsearchError(f"{run}: no {SPLIT_JSONL}/{TRACE} or {PREDICTIONS} to compare")
    if clean is None:
        raise FlexsearchError(f"{run}: the search has not finished ({TRACE} lacks items)")
    gold, target, anti_target, unknown = (np.array([r[k] for r in rows]) for k in ("gold", "target", "anti_target",
                                                                                "unknown"))
    return RunTable(run, scoring, [r["item_id"] for r in rows], np.array([r["category"] for r in rows]),
                    np.array([r.get("stereotyped_group") or "" for r in rows]),
                    np.array([r.get("condition", "ambig") for r in rows]), gold, target, anti_target, unknown,
                    clean=clean, attacked=attacked, control=control, control_clean=control_clean, forced=forced,
                    control_forced=control_forced, families=families, **_search_settings(run))


def _family_arrays(found: list[dict[str, Any] | None]) -> dict[str, np.ndarray]:
    """Per attack family the best prompt's probabilities per row (NaN where the row's item did not search it); none
    for a run whose trace predates families."""
    records = [r for r in found if r is not None and "families" in r]
    if not records or len(records) < len(found):
        return {}
    missing = [float("nan")] * 3
    return {f: np.array([r["families"][f]["probs"] if f in r["families"] else missing for r in records])
            for f in FAMILIES}


def _search_settings(run: Path) -> dict[str, Any]:
    """The success margin and budget a run was scored with (score.json and config.yaml; defaults for runs
    that predate the margin)."""
    score = read_json(run / SCORE) if (run / SCORE).is_file() else {}
    search = (read_run_config(run) or {}).get("search") or {}
    return {"margin": float(score.get("success_margin", SUCCESS_MARGIN)), "budget": search.get("budget")}


def paired(a: RunTable, b: RunTable) -> tuple[RunTable, RunTable]:
    """Both runs restricted to their shared items, in A's order; refuses incomparable runs."""
    if a.scoring != b.scoring:
        differ = ", ".join(f"{key} {a.scoring[key]} vs {b.scoring[key]}" for key in a.scoring
                           if a.scoring[key] != b.scoring[key])
        raise FlexsearchError(f"the runs used different scoring modes ({differ}); their probabilities are not "
                              "comparable")
    if a.margin != b.margin:
        raise FlexsearchError(f"the runs used different success margins ({a.margin} vs {b.margin}); their "
                              "ASRs count different things")
    index_b = {item_id: i for i, item_id in enumerate(b.ids)}
    shared = [i for i, item_id in enumerate(a.ids) if item_id in index_b]
    if not shared:
        raise FlexsearchError(f"{a.path} and {b.path} share no items")
    return a.take(shared), b.take([index_b[a.ids[i]] for i in shared])


# ---------------------------------------------------------------- metrics on a table and item indices


def _rate(hit: np.ndarray, keep: np.ndarray) -> float:
    return float(hit[keep].mean()) if keep.any() else float("nan")


def _wins(t: RunTable, idx: np.ndarray, control: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """(eligible, success) per item of `idx` for the stereotype search or the control: right when clean and gold
    not the aim (objectives.attack_eligible), hardest prompt not forced-choice (measured apart, as in score.json),
    and the aim ahead of both other answers by more than the success margin (objectives' success rule)."""
    attacked, clean, aim, forced = ((t.control, t.control_clean, t.anti_target, t.control_forced) if control
                                    else (t.attacked, t.clean, t.target, t.forced))
    if attacked is None or clean is None:
        return None
    eligible = eligible_mask(clean[idx], t.gold[idx], aim[idx])
    if forced is not None:
        eligible &= ~forced[idx]
    return eligible, aim_lead(attacked[idx], aim[idx]) > t.margin


def _asr(t: RunTable, idx: np.ndarray, control: bool = False) -> float:
    """Share of eligible items whose attacked prompt meets the objective (see _wins)."""
    found = _wins(t, idx, control)
    return float("nan") if found is None else _rate(found[1], found[0])


def _everything(t: RunTable, idx: np.ndarray) -> np.ndarray:
    return np.ones(len(idx), dtype=bool)


Metric = Callable[[RunTable, np.ndarray], float]
METRICS: dict[str, Metric] = {
    "clean accuracy": lambda t, i: _rate(t.clean[i].argmax(-1) == t.gold[i], _everything(t, i)),
    "clean abstention": lambda t, i: _rate(t.clean[i].argmax(-1) == t.unknown[i], _everything(t, i)),
    "clean P(target)": lambda t, i: float(t.clean[i, t.target[i]].mean()) if len(i) else float("nan"),
    "attacked accuracy": lambda t, i: float("nan") if t.attacked is None else _rate(
        t.attacked[i].argmax(-1) == t.gold[i], _everything(t, i)),
    "attacked abstention": lambda t, i: float("nan") if t.attacked is None else _rate(
        t.attacked[i].argmax(-1) == t.unknown[i], _everything(t, i)),
    "ASR": lambda t, i: _asr(t, i),
    "control ASR": lambda t, i: _asr(t, i, control=True),
    "fairness gap": lambda t, i: _asr(t, i) - _asr(t, i, control=True),
    "P(target) shift": lambda t, i: float("nan") if t.attacked is None else float(
        (t.attacked[i, t.target[i]] - t.clean[i, t.target[i]]).mean()),
}


GROUP_METRICS = ("ASR", "control ASR", "fairness gap")  # compared per stereotyped group


def _flags(t: RunTable, idx: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(success, eligible) per item for a metric that is a rate, None for the others (means and the gap)."""
    everything = np.ones(len(idx), dtype=bool)
    answered = {"clean": t.clean, "attacked": t.attacked}
    for prefix, probs in answered.items():
        if name in (f"{prefix} accuracy", f"{prefix} abstention"):
            if probs is None:
                return None
            answer = t.gold[idx] if name.endswith("accuracy") else t.unknown[idx]
            return probs[idx].argmax(-1) == answer, everything
    if name in ("ASR", "control ASR"):
        found = _wins(t, idx, control=name == "control ASR")
        return None if found is None else (found[1], found[0])
    return None


def compare_metric(name: str, a: RunTable, b: RunTable, idx: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """A's and B's value, the delta B − A, its 95% interval and a two-sided p-value: for a rate the small-sample
    paired interval and exact test of differences.rate_difference, for a mean (and the difference of gaps) a
    paired bootstrap over the shared items."""
    metric = METRICS[name]
    value_a, value_b = metric(a, idx), metric(b, idx)
    flags_a, flags_b = _flags(a, idx, name), _flags(b, idx, name)
    if flags_a is not None and flags_b is not None:
        diff = rate_difference(flags_b[0], flags_b[1], flags_a[0], flags_a[1])
        return {"a": _clean(value_a), "b": _clean(value_b), "delta": diff["value"], "ci": diff["ci"],
                "p": diff["p"]}
    rng = np.random.default_rng(seed)
    deltas = []
    for _ in range(BOOTSTRAP_SAMPLES):
        sample = idx[rng.integers(0, len(idx), len(idx))]
        deltas.append(metric(b, sample) - metric(a, sample))
    draws = np.array(deltas, dtype=float)
    draws = draws[np.isfinite(draws)]
    delta = value_b - value_a
    if not np.isfinite(delta) or len(draws) == 0:
        return {"a": _clean(value_a), "b": _clean(value_b), "delta": None, "ci": [None, None], "p": None}
    low, high = np.percentile(draws, [2.5, 97.5])
    # Share of resamples on the far side of zero; identical runs give delta 0 and p = 1.
    p = 1.0 if np.all(draws == 0) else min(1.0, 2 * min((draws <= 0).mean(), (draws >= 0).mean()))
    return {"a": _clean(value_a), "b": _clean(value_b), "delta": _clean(delta), "ci": [_clean(low), _clean(high)],
            "p": round(float(p), 4)}


def _k_of_n(rate: dict[str, Any]) -> str:
    return f"{rate['k']}/{rate['n']}"


def _clean(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


def shared_verdict(t: RunTable, idx: np.ndarray) -> str | None:
    """The verdict (flexsearch/results/verdict.py) of a search run on the items `idx` alone, so both runs of a
    comparison are judged on the same items; None for a run with no attack toward the stereotype."""
    toward = _wins(t, idx)
    if toward is None:
        return None
    away = _wins(t, idx, control=True)
    clean_top = t.clean[idx].argmax(-1)
    disambig = t.condition[idx] == "disambig"
    block: dict[str, Any] = {
        "clean": {"accuracy_disambig": proportion((clean_top == t.gold[idx])[disambig]),
                  "abstention_disambig": proportion((clean_top == t.unknown[idx])[disambig])},
        "stereotype": {"asr": proportion(toward[1][toward[0]])},
    }
    if away is not None:
        block["anti_stereotype"] = {"asr": proportion(away[1][away[0]])}
        block["fairness_gap"] = rate_difference(toward[1], toward[0], away[1], away[0])
    return verdict(block)["verdict"]


def compare_runs(run_a: Path, run_b: Path) -> dict[str, Any]:
    """The full comparison: overall and per-category metrics, Holm flags and the worst group."""
    a, b = paired(load_run(run_a), load_run(run_b))
    everything = np.arange(len(a.ids))
    result: dict[str, Any] = {
        "run_a": str(run_a), "run_b": str(run_b), "shared_items": len(a.ids), "scoring": a.scoring,
        "overall": {name: compare_metric(name, a, b, everything) for name in METRICS},
        "per_category": {},
    }
    for category in sorted(set(a.category)):
        idx = np.flatnonzero(a.category == category)
        result["per_category"][category] = {name: compare_metric(name, a, b, idx) for name in METRICS}
    result["per_group"] = {tag: {name: compare_metric(name, a, b, np.flatnonzero(a.group == tag))
                                 for name in GROUP_METRICS}
                           for tag in sorted(set(a.group) - {""})}
    for block in ("per_category", "per_group"):
        cells = list(result[block])
        for name in METRICS if block == "per_category" else GROUP_METRICS:  # Holm over the cells, per metric
            flags = holm([result[block][c][name]["p"] for c in cells])
            for cell, flag in zip(cells, flags, strict=True):
                result[block][cell][name]["holm_significant"] = flag
    if a.attacked is not None or b.attacked is not None:  # verdicts on the shared items, not each run's own set
        result["verdict"] = {"a": shared_verdict(a, everything), "b": shared_verdict(b, everything)}
        for category, block in result["per_category"].items():
            idx = np.flatnonzero(a.category == category)
            block["verdict"] = {"a": shared_verdict(a, idx), "b": shared_verdict(b, idx)}
    if a.families and b.families:
        result["families"] = compare_families(a, b)
    budgets_differ = a.budget != b.budget and None not in (a.budget, b.budget)
    result["warnings"] = [f"the runs searched with different budgets ({a.budget} vs {b.budget} prompts per item): "
                          "a difference in ASR may come from the budget alone"] if budgets_differ else []
    rises = {c: m["ASR"]["delta"] for c, m in result["per_category"].items() if m["ASR"]["delta"] is not None}
    if rises and max(rises.values()) > 0:  # a worst group only where some category's ASR rose
        worst = max(rises, key=lambda c: rises[c])
        result["worst_group"] = {"category": worst, "asr_delta": rises[worst],
                                 "asr_a": result["per_category"][worst]["ASR"]["a"],
                                 "asr_b": result["per_category"][worst]["ASR"]["b"],
                                 "holm_significant": result["per_category"][worst]["ASR"]["holm_significant"]}
    return result


def _family_wins(t: RunTable, family: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(success, eligible) per item of `idx` in one family: eligible as for ASR, and the item searched the family."""
    probs = t.families[family][idx]
    searched = ~np.isnan(probs).any(-1)
    eligible = eligible_mask(t.clean[idx], t.gold[idx], t.target[idx]) & searched
    return aim_lead(np.nan_to_num(probs), t.target[idx]) > t.margin, eligible


def compare_families(a: RunTable, b: RunTable) -> dict[str, Any]:
    """ASR per attack family for A and B on the shared items, B − A with the paired small-sample interval and exact
    test (differences.rate_difference), overall and per category with Holm flags over the categories."""
    def cell(family: str, idx: np.ndarray) -> dict[str, Any]:
        (won_a, ok_a), (won_b, ok_b) = _family_wins(a, family, idx), _family_wins(b, family, idx)
        diff = rate_difference(won_b, ok_b, won_a, ok_a)
        return {"a": proportion(won_a[ok_a]), "b": proportion(won_b[ok_b]), "delta": diff["value"],
                "ci": diff["ci"], "p": diff["p"]}

    out: dict[str, Any] = {}
    for family in FAMILIES:
        categories = {c: cell(family, np.flatnonzero(a.category == c)) for c in sorted(set(a.category))}
        for c, flag in zip(categories, holm([m["p"] for m in categories.values()]), strict=True):
            categories[c]["holm_significant"] = flag
        out[family] = {**cell(family, np.arange(len(a.ids))), "per_category": categories}
    return out


def format_comparison(result: dict[str, Any]) -> str:
    """The overall table, the per-category deltas with Holm flags, and the worst group."""

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def delta_cell(metric: dict[str, Any]) -> str:
        return f"{num(metric['delta']) + ('*' if metric['holm_significant'] else ' '):>18}"

    lines = [f"A = {result['run_a']}", f"B = {result['run_b']}",
             f"{result['shared_items']} shared items; scoring {result['scoring']}",
             *(f"warning: {w}" for w in result.get("warnings", [])), "",
             f"{'metric':<20} {'A':>7} {'B':>7} {'B-A':>7}  95% CI (paired: score interval for rates, bootstrap "
             "for means)"]
    for name, m in result["overall"].items():
        if m["a"] is None and m["b"] is None:
            continue
        lines.append(f"{name:<20} {num(m['a']):>7} {num(m['b']):>7} {num(m['delta']):>7}  "
                     f"[{num(m['ci'][0])}, {num(m['ci'][1])}]")
    lines += ["", "per category (B-A; * = significant after Holm correction over categories):"]
    shown = [n for n in ("clean accuracy", "clean abstention", "ASR", "control ASR")
             if result["overall"][n]["delta"] is not None]
    lines.append(f"{'category':<22}" + "".join(f"{n:>18}" for n in shown))
    for category, metrics in result["per_category"].items():
        cells = "".join(delta_cell(metrics[n]) for n in shown)
        lines.append(f"{category:<22}{cells}")
    groups = {tag: cells for tag, cells in result.get("per_group", {}).items()
              if any(cells[n]["delta"] is not None for n in GROUP_METRICS)}
    if groups:
        lines += ["", "per stereotyped group (B-A; * = significant after Holm correction over groups):",
                  f"{'group':<22}" + "".join(f"{n:>18}" for n in GROUP_METRICS)]
        for tag, cells in groups.items():
            lines.append(f"{tag:<22}" + "".join(delta_cell(cells[n]) for n in GROUP_METRICS))
    if "families" in result:
        lines += ["", "ASR per attack family (k/n over eligible items that searched it; B-A, 95% CI, exact p):"]
        for family, m in result["families"].items():
            lines.append(f"  {family:<12} A {_k_of_n(m['a']):>9}  B {_k_of_n(m['b']):>9}  B-A {num(m['delta']):>6} "
                         f"[{num(m['ci'][0])}, {num(m['ci'][1])}]  p {num(m['p'])}")
    if "verdict" in result:
        lines.append("\nverdict on the shared items (A -> B):")
        for group, v in [("overall", result["verdict"]),
                         *((c, m["verdict"]) for c, m in result["per_category"].items())]:
            lines.append(f"  {group:<20} {v['a'] or '-'} -> {v['b'] or '-'}")
    if "worst_group" in result:
        w = result["worst_group"]
        flag = "significant after Holm correction" if w["holm_significant"] else "not significant after Holm correction"
        lines.append(f"\nworst group: {w['category']} (ASR {num(w['asr_a'])} -> {num(w['asr_b'])}, "
                     f"{w['asr_delta']:+.3f}; {flag})")
    elif result["overall"]["ASR"]["delta"] is not None:
        lines.append("\nworst group: none (no category's ASR rose)")
    return "\n".join(lines)
