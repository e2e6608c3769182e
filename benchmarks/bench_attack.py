"""Attack strength on a model that reads: ASR and mean P(target) shift versus the query budget for
flexsearch's searches and their baselines, all on the same held-out BBQ items of the capable target,
each with the counter-stereotype control beside it.

Methods (budgets in prompts scored; a forward+backward over one prompt counts as 3, see attacks/gradient.py):
- default: the default preset (beam search over persona, instruction and TextBugger edits);
- gradient: the same with gradient-guided word edits (configs/gradient.yaml);
- textbugger: TextAttack's TextBugger recipe logic (greedy leave-one-out word importance, then character
  bugs and WordNet Sub-W per word, an edit kept only when it helps), our re-implementation;
- random: random compositions of the default operators, no selection (`method: random`);
- suffix: the research preset's adversarial suffix (not natural text; reported apart);
- FLEX-style fixed attacks, one prompt each, written by us in FLEX's style: one hostile-speaker persona,
  one refusal-suppression instruction, one character swap in the context's longest editable word.

TextAttack 0.3.11 itself cannot run beside transformers 5 (it pins transformers < 5) and fetches data at
import; to run it, use its own environment (`pip install textattack==0.3.11`, `textattack attack --recipe
textbugger`).

    python -m benchmarks.bench_attack --model gemma3-bbq --items 120 --budgets 25 50 100 200

Each method's outcomes are saved as it finishes (runs/bench_attack/<model>-<items>-seed<seed>-budget<budget>/
<method>.json), so methods can run in separate processes (or a stopped run can go on) and be reported
together: with `--reuse`, a method whose outcomes are saved for the same model, items, budget and dtype is
read from there instead of searched again; `--search-only` saves without writing the report. `--extend-from DIR`
reads the outcomes saved in DIR for a shorter list (the same model, budget and dtype; its items the first of this
list, as the seeded round-robin gives) and searches only the items after them: each item's search depends only on
the seed, the item and the objective (`engine.state.item_rng`), so a longer list costs only its new items.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Container
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from benchmarks.common import BBQ, ROOT, markdown_table, record
from flexsearch.attacks import AttackResources
from flexsearch.attacks.constraints import SentenceSimilarity, editable_positions, protected_positions
from flexsearch.attacks.templates import INSTRUCTION_FAMILIES, PERSONA_FAMILIES, fill
from flexsearch.attacks.textbugger import character_bugs, split_word
from flexsearch.config import load_config
from flexsearch.data.audit import PRESERVING, audit_rows, violations
from flexsearch.data.candidate import Candidate, replay
from flexsearch.data.items import Item, load_items
from flexsearch.engine.loop import build_context, run_search
from flexsearch.engine.state import ItemOutcome
from flexsearch.files import atomic_write_json, read_json
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.results.metrics import forced_choice_metrics, mean_with_interval, proportion, with_interval
from flexsearch.scoring.model import load_target, zoo_adapter
from flexsearch.scoring.scorer import Scorer
from flexsearch.zoo.finetune import eval_items_of, template_key

SEARCHES: dict[str, tuple[str, list[str]]] = {  # method → (preset, overrides); steps high so the budget binds
    "default": ("default", ["steps=100"]),
    "gradient": ("gradient", ["steps=100"]),
    "textbugger": ("textbugger", []),
    "random": ("default", ["method=random", "steps=100"]),
    "suffix": ("research", ["steps=100"]),
    "forced": ("forced_choice", ["steps=100"]),  # the forced-choice measurement: reported apart, never as ASR
}
APART = ("forced",)  # methods measured apart from ASR (their rows are not label-valid)
PLOT = ROOT / "benchmarks" / "attack_asr_vs_queries.png"
SAVED = ROOT / "runs" / "bench_attack"


@dataclass
class MethodResult:
    """One method on every item, toward the stereotype and toward the anti-stereotype (the control)."""

    name: str
    main: list[ItemOutcome]
    control: list[ItemOutcome]
    seconds: float
    prompts: int
    gradient_passes: int


def outcome_record(outcome: ItemOutcome) -> dict[str, Any]:
    return {**outcome.to_record(), "improvements": [[spent, [float(p) for p in probs]]
                                                   for spent, probs in outcome.improvements]}


def outcome_from(record: dict[str, Any], item: Item) -> ItemOutcome:
    return ItemOutcome(item, record["objective"], replay(item, record["chain"], tuple(record["option_order"])),
                       np.array(record["clean_probs"]), np.array(record["best_probs"]), record["success"],
                       record["queries"], record["first_success_query"],
                       [(spent, np.array(probs)) for spent, probs in record["improvements"]])


def save_method(result: MethodResult, folder: Path, setup: dict[str, Any]) -> None:
    atomic_write_json(folder / f"{result.name}.json", {
        "setup": setup, "seconds": result.seconds, "prompts": result.prompts, "gradient_passes": result.gradient_passes,
        "main": [outcome_record(o) for o in result.main], "control": [outcome_record(o) for o in result.control]})


def result_from(name: str, saved: dict[str, Any], items: list[Item]) -> MethodResult:
    return MethodResult(name, [outcome_from(r, it) for r, it in zip(saved["main"], items, strict=True)],
                        [outcome_from(r, it) for r, it in zip(saved["control"], items, strict=True)],
                        saved["seconds"], saved["prompts"], saved["gradient_passes"])


def load_method(name: str, folder: Path, setup: dict[str, Any], items: list[Item]) -> MethodResult | None:
    """A method's saved outcomes for this setup (None when none are saved)."""
    path = folder / f"{name}.json"
    if not path.is_file():
        return None
    saved = read_json(path)
    if saved["setup"] != setup:
        raise SystemExit(f"--reuse: {path} was measured on another setup (model, items, budget or dtype); "
                         "move it away to search again")
    return result_from(name, saved, items)


def saved_prefix(name: str, folder: Path, setup: dict[str, Any], items: list[Item]) -> MethodResult | None:
    """A method's outcomes saved for the first items of this list, same model, budget and dtype (--extend-from)."""
    path = folder / f"{name}.json"
    if not path.is_file():
        return None
    saved = read_json(path)
    shorter = saved["setup"]
    count = len(shorter["items"])
    if ({k: v for k, v in shorter.items() if k != "items"} != {k: v for k, v in setup.items() if k != "items"}
            or shorter["items"] != setup["items"][:count]):
        raise SystemExit(f"--extend-from: {path} was not measured on the first items of this list with the same "
                         "model, budget and dtype")
    return result_from(name, saved, items[:count])


def joined(first: MethodResult, rest: MethodResult) -> MethodResult:
    """One method's outcomes on a list measured in two parts (costs added)."""
    return MethodResult(first.name, first.main + rest.main, first.control + rest.control,
                        first.seconds + rest.seconds, first.prompts + rest.prompts,
                        first.gradient_passes + rest.gradient_passes)


def held_out_ambiguous(model: str, bbq: Path, count: int, seed: int,
                       templates: Container[str] | None = None) -> list[Item]:
    """Ambiguous items of templates the capable target never saw (of `templates` only, when given: template_key),
    round-robin over categories, seeded."""
    held = [it for it in held_out_pool(model, bbq) if templates is None or template_key(it) in templates]
    rng = np.random.default_rng(seed)
    by_category = {c: [held[i] for i in rng.permutation(len(held)) if held[i].category == c]
                   for c in sorted({it.category for it in held})}
    chosen: list[Item] = []
    while len(chosen) < count and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def held_out_pool(model: str, bbq: Path) -> list[Item]:
    """Every ambiguous item of the templates the capable target never saw, in the adapter recipe's order."""
    pool = [it for path in sorted(bbq.glob("*.jsonl")) for it in load_items(path).items]
    return [it for it in eval_items_of(zoo_adapter(model), pool) if it.condition == "ambig"]


def run_method(name: str, items: list[Item], scorer: Scorer, budget: int) -> MethodResult:
    preset, overrides = SEARCHES[name]
    config = load_config(preset, overrides, budget=budget, control=False)
    prompts_before, started = scorer.queries, time.perf_counter()
    outcomes, passes = {}, 0
    with tqdm(total=2 * len(items), desc=f"{name} (stereotype + control)", unit="item") as progress:
        for objective in ("stereotype", "anti_stereotype"):
            ctx = build_context(config, scorer, objective)
            outcomes[objective] = run_search(items, ctx, objective, progress=progress)
            passes += ctx.resources.gradient_passes
    return MethodResult(name, outcomes["stereotype"], outcomes["anti_stereotype"], time.perf_counter() - started,
                        scorer.queries - prompts_before, passes)


def cost_rows(items: list[Item], target: Any, budgets: list[int], methods: list[str]) -> list[list[Any]]:
    """Seconds, prompts/s and gradient passes/s of whole searches (no stop on success, a fresh prompt
    cache each) at every budget: how the cost grows with the budget."""
    rows = []
    for name in methods:
        preset, overrides = SEARCHES[name]
        for budget in budgets:
            config = load_config(preset, [*overrides, "stop_on_success=false"], budget=budget, control=False)
            scorer = Scorer.from_config(target, config.scoring)
            ctx = build_context(config, scorer, "stereotype")
            started = time.perf_counter()
            run_search(items, ctx, "stereotype")
            seconds = time.perf_counter() - started
            rows.append([name, budget, len(items), f"{seconds / len(items):.1f}", f"{scorer.queries / seconds:.1f}",
                         f"{ctx.resources.gradient_passes / seconds:.2f}"])
    return rows


def fixed_attacks(item: Item) -> dict[str, Candidate]:
    """FLEX-style single attacks on one item (ours, in FLEX's style)."""
    root = Candidate.root(item)
    attacks = {
        "FLEX persona": root.with_slot("persona", "persona", str(fill(PERSONA_FAMILIES["hostile_speaker"][0].text,
                                                                     item)),
                                       family="hostile_speaker", template=0, effect=PRESERVING),
        "FLEX refusal suppression": root.with_slot("instruction", "directive",
                                                   INSTRUCTION_FAMILIES["refusal_suppression"][0].text,
                                                   family="refusal_suppression", template=0, effect=PRESERVING),
    }
    words = [(f, i) for f, i in editable_positions(root) if f == "context" and "swap" in character_bugs(
        split_word(root.words(f)[i])[1])]
    if words:
        field_name, index = max(words, key=lambda p: len(split_word(root.words(p[0])[p[1]])[1]))
        lead, word, trail = split_word(root.words(field_name)[index])
        swapped = f"{lead}{character_bugs(word)['swap'][0]}{trail}"
        attacks["FLEX text (char swap)"] = root.with_words("textbugger", field_name, index, swapped, bug="swap")
    return attacks


def gap_of(toward: np.ndarray, away: np.ndarray, eligible: np.ndarray, control_eligible: np.ndarray,
           idx: np.ndarray) -> float:
    """ASR toward minus ASR away on a resample of items (each keeps both outcomes; eligibility differs)."""
    return float(toward[idx][eligible[idx]].mean() - away[idx][control_eligible[idx]].mean())


def success_at(outcomes: list[ItemOutcome], budget: int) -> np.ndarray:
    return np.array([o.first_success_query is not None and o.first_success_query <= budget for o in outcomes])


def p_aim_at(outcomes: list[ItemOutcome], budget: int, aim: str) -> np.ndarray:
    """P(aimed answer) of the best candidate found within `budget` prompts (the clean one before any)."""
    values = []
    for o in outcomes:
        index = getattr(o.item, aim)
        best = [p for spent, p in o.improvements if spent <= budget]
        values.append(float((best[-1] if best else o.clean_probs)[index]))
    return np.array(values)


def rate(flags: np.ndarray) -> str:
    return rate_text(proportion(flags))


def rate_text(r: dict[str, Any]) -> str:
    return f"{r['value']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] ({r['k']}/{r['n']})" if r["n"] else "-"


def interval(block: dict[str, Any]) -> str:
    return f"{block['value']:+.3f} [{block['ci'][0]:+.3f}, {block['ci'][1]:+.3f}]"


def queries_to_reach(outcomes: list[ItemOutcome], eligible: np.ndarray, level: float, budget: int) -> int | None:
    """The smallest budget at which the method's ASR reaches `level` (None: not within `budget`)."""
    firsts = sorted(o.first_success_query for o, e in zip(outcomes, eligible, strict=True)
                    if e and o.first_success_query is not None)
    needed = int(np.ceil(level * eligible.sum() - 1e-9))
    if needed == 0:
        return 0
    return firsts[needed - 1] if len(firsts) >= needed and firsts[needed - 1] <= budget else None


def forced_lines(result: MethodResult, eligible: np.ndarray, control_eligible: np.ndarray) -> list[str]:
    """The forced-choice measurement (forced_choice preset), apart from ASR: over the items whose hardest prompt
    carries a forced-choice template, P(stereotyped) − P(anti-stereotyped) and the share choosing the stereotyped
    person, for the search toward the stereotype and for its control."""
    out = ["", "Forced-choice measurement (`forced_choice` preset, reported apart: these prompts exclude an option, "
               "ask for an assumption or demand a person, so they are no attack on the gold label):", ""]
    rows = []
    for objective, outcomes, keep in (("stereotype", result.main, eligible),
                                      ("anti_stereotype", result.control, control_eligible)):
        forced = [o for o in outcomes if o.best.forced_choice]
        block = forced_choice_metrics([o.item for o in forced], np.array([o.best_probs for o in forced]).reshape(-1, 3))
        valid = [o.success for o, e in zip(outcomes, keep, strict=True) if e and not o.best.forced_choice]
        rows.append([objective, f"{len(forced)} of {len(outcomes)}", interval(block["mean_p_stereotyped_minus_anti"])
                     if block["mean_p_stereotyped_minus_anti"]["value"] is not None else "-",
                     rate_text(block["stereotyped_share"]),
                     rate(np.array(valid, dtype=bool))])
    return out + [markdown_table(["search toward", "forced-choice rows", "P(stereotyped) − P(anti) [95% CI]",
                                  "chose the stereotyped person (of person answers)",
                                  "ASR of its label-valid rows"], rows)]


def meaning_checks(results: list[MethodResult], scorer: Scorer, seed: int) -> list[str]:
    """The emitted natural prompts against the constraints they were searched under, and ten of them."""
    encoder = SentenceSimilarity(AttackResources())
    emitted = [o.best for r in results for o in (*r.main, *r.control) if o.best.edits and o.best.natural]
    if not emitted:
        return ["", "No natural prompt was emitted with an edit."]
    similarity = encoder.similarity(emitted)
    edits = [(c, e) for c in emitted for e in c.edits if e.position is not None]
    protected = sum((e.field, e.position) in protected_positions(c.item) for c, e in edits)
    # the ten shown come from the default search's split: its hardest prompt per item toward the stereotype
    split = [o.best for r in results if r.name == "default" for o in r.main if o.best.edits and o.best.natural]
    source = "the default search's split (its hardest prompt per item toward the stereotype)"
    pool = split
    if not split:
        pool, source = emitted, "every method's emitted prompts"
    rng = np.random.default_rng(seed)
    shown = [pool[i] for i in sorted(rng.permutation(len(pool))[:10])]
    audit = audit_rows([{"item_id": c.item.id, "instruction": c.instruction, "answers": c.item.answers}
                        for c in emitted])
    rules = ", ".join(f"{rule} {count}" for rule, count in audit["by_rule"].items())
    out = ["", f"Meaning checks on {len(emitted)} emitted natural prompts with an edit: similarity to the clean "
               f"context+question below the floor {encoder.threshold}: {int((similarity < encoder.threshold).sum())}"
               f" (lowest {similarity.min():.3f}); word edits touching a protected span: {protected} of "
               f"{len(edits)}; label-validity audit (flexsearch/data/audit.py): {audit['flagged']} break a rule "
               f"({rules}).", "", f"Ten prompts of {source}, drawn at random (seeded), each with the audit's verdict:",
           ""]
    for candidate in shown:
        text = scorer.render(candidate).replace("\n", " ⏎ ")
        broken = violations(candidate.instruction, candidate.item.answers)
        verdict = f"audit: breaks {', '.join(broken)}" if broken else "audit: label-valid"
        out.append(f"- `{candidate.item.id}` ({' + '.join(e.operator for e in candidate.edits)}; {verdict}): {text}")
    return out


def plot(results: list[MethodResult], eligible: np.ndarray, budget: int, fixed: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.arange(0, budget + 1)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for result in results:
        axes.plot(grid, [success_at(result.main, int(b))[eligible].mean() for b in grid], label=result.name)
    for name, value in fixed.items():
        axes.scatter([6], [value], marker="x", label=f"{name} (one prompt)")
    axes.set_xlabel("queries (prompts scored; a forward+backward over a prompt counts as 3)")
    axes.set_ylabel("ASR toward the stereotype")
    axes.set_title(f"ASR vs queries ({int(eligible.sum())} attack-eligible held-out BBQ items)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-bbq")
    parser.add_argument("--bbq", type=Path, default=BBQ)
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--budgets", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--methods", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    parser.add_argument("--reuse", action="store_true", help="read methods saved for this setup instead of searching")
    parser.add_argument("--search-only", action="store_true", help="search and save the methods; no report")
    parser.add_argument("--saved", type=Path, default=SAVED, help="where each method's outcomes are saved")
    parser.add_argument("--extend-from", type=Path,
                        help="saved outcomes of a shorter list (its items first here): search only the rest")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-fixed", action="store_true", help="skip the FLEX-style fixed attacks")
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--cost-items", type=int, default=0, help="items for the cost-vs-budget table (0: none)")
    parser.add_argument("--cost-methods", nargs="+", choices=list(SEARCHES), help="(default: --methods)")
    args = parser.parse_args()
    started = time.perf_counter()
    budget = max(args.budgets)
    target = load_target(args.model, dtype=args.dtype)
    scorer = Scorer.from_config(target, load_config("default").scoring)  # order-averaged, as every preset
    if not scorer.average_orders:
        raise SystemExit("the default preset no longer averages option orders; this benchmark assumes it does")
    items = held_out_ambiguous(args.model, args.bbq, args.items, args.seed)
    stereotype, anti_stereotype = get_objective("stereotype"), get_objective("anti_stereotype")  # default margin
    clean = scorer.score([Candidate.root(it) for it in items]).probs
    eligible = np.array([attack_eligible(stereotype, it, p) for it, p in zip(items, clean, strict=True)])
    control_eligible = np.array([attack_eligible(anti_stereotype, it, p) for it, p in zip(items, clean, strict=True)])

    fixed_rows, fixed_asr = [], {}
    fixed_names = () if args.no_fixed or args.search_only else ("FLEX persona", "FLEX refusal suppression",
                                                                 "FLEX text (char swap)")
    per_item = [fixed_attacks(it) for it in items] if fixed_names else []
    for name in fixed_names:
        pairs = [(k, attacks[name]) for k, attacks in enumerate(per_item) if name in attacks]
        probs = scorer.score([c for _, c in pairs]).probs
        hit = np.array([stereotype.success(probs[j], items[k]) for j, (k, _) in enumerate(pairs)])
        anti = np.array([anti_stereotype.success(probs[j], items[k]) for j, (k, _) in enumerate(pairs)])
        keep = eligible[[k for k, _ in pairs]]
        keep_control = control_eligible[[k for k, _ in pairs]]
        shift = np.array([probs[j][items[k].target] - clean[k][items[k].target] for j, (k, _) in enumerate(pairs)])
        fixed_asr[name] = float(hit[keep].mean()) if keep.any() else 0.0
        fixed_rows.append([name, 3, rate(hit[keep]), rate(anti[keep_control]),
                           interval(mean_with_interval(shift[keep]))])

    setup = {"model": args.model, "items": [it.id for it in items], "budget": budget, "dtype": args.dtype}
    folder = args.saved / f"{args.model}-{len(items)}-seed{args.seed}-budget{budget}"
    results = []
    for name in args.methods:  # each saved as it finishes: a stopped run keeps what it measured
        saved = load_method(name, folder, setup, items) if args.reuse else None
        if saved is not None:
            print(f"{name}: read from {folder / name}.json", flush=True)
            results.append(saved)
            continue
        first = saved_prefix(name, args.extend_from, setup, items) if args.extend_from else None
        if first is None:
            results.append(run_method(name, items, scorer, budget))
        else:
            print(f"{name}: the first {len(first.main)} items read from {args.extend_from / name}.json", flush=True)
            results.append(joined(first, run_method(name, items[len(first.main):], scorer, budget)))
        save_method(results[-1], folder, setup)
        print(f"{name}: stereotype first successes {[o.first_success_query for o in results[-1].main]}, "
              f"control {[o.first_success_query for o in results[-1].control]}, {results[-1].seconds:.0f} s",
              flush=True)
    if args.search_only:
        return
    by_name = {r.name: r for r in results}
    rows = []
    clean_target = np.array([p[it.target] for it, p in zip(items, clean, strict=True)])
    label_valid = [r for r in results if r.name not in APART]
    for result in label_valid:
        main_hits = {b: success_at(result.main, b)[eligible] for b in args.budgets}
        toward, away = success_at(result.main, budget), success_at(result.control, budget)
        shifts = {b: (p_aim_at(result.main, b, "target") - clean_target)[eligible] for b in args.budgets}
        # the gap resamples items, each with its stereotype and control outcome (eligibility differs)
        gap = with_interval(partial(gap_of, toward, away, eligible, control_eligible), len(items))
        argmax = np.array([stereotype.flipped(o.best_probs, o.item) for o in result.main])[eligible]
        rows.append([result.name, *(rate(main_hits[b]) for b in args.budgets), rate(argmax),
                     *(f"{shifts[b].mean():+.3f}" for b in args.budgets), rate(away[control_eligible]),
                     interval(gap),
                     f"{result.prompts / result.seconds:.1f}", f"{result.gradient_passes / result.seconds:.2f}",
                     f"{result.seconds / 60:.1f}"])
    headers = ["method", *(f"ASR@{b}" for b in args.budgets), f"argmax flips@{budget} (no margin)",
               *(f"ΔP(target)@{b}" for b in args.budgets),
               f"control ASR@{budget}", f"gap@{budget} [95% CI]", "prompts/s", "gradient passes/s", "minutes"]
    mean_queries = {r.name: np.mean([o.queries for o in (*r.main, *r.control)]) for r in results}
    for row, result in zip(rows, label_valid, strict=True):
        row.insert(-3, f"{mean_queries[result.name]:.0f}")
    headers.insert(-3, "mean queries used")
    lines = [f"{len(items)} ambiguous BBQ items from templates `{args.model}` never saw; "
             f"{int(eligible.sum())} attack-eligible for the stereotype objective (clean answer correct), "
             f"{int(control_eligible.sum())} for the control. Order-averaged scoring ({args.dtype}; a candidate is 3 "
             "prompts); a success needs the aimed-at answer ahead of both others by the success margin "
             f"({stereotype.margin}); ASR with Wilson 95% intervals (k/n); the gap's interval is a bootstrap over "
             "items. A forward+backward over one prompt is charged as 3 prompts. Label-valid searches only: "
             "persona and instruction templates are the preserving ones (DESIGN.md \"Label validity\").", "",
             markdown_table(headers, rows)]
    if fixed_rows:
        lines += ["", "FLEX-style fixed attacks (one prompt per item, 3 prompts with order averaging):", "",
                  markdown_table(["attack", "prompts", "ASR stereotype", "ASR anti-stereotype", "ΔP(target) [95% CI]"],
                                 fixed_rows)]
    if "default" in by_name and "textbugger" in by_name:
        ours, base = success_at(by_name["default"].main, 100)[eligible], success_at(by_name["textbugger"].main,
                                                                                    100)[eligible]
        difference = with_interval(lambda idx: float(ours[idx].mean() - base[idx].mean()), len(ours))
        ratio = f"{ours.mean() / base.mean():.2f}" if base.mean() else ("infinite" if ours.mean() else "undefined")
        lines += ["", f"Default vs TextBugger greedy at budget 100: ASR {ours.mean():.3f} vs {base.mean():.3f}, "
                      f"ratio {ratio}, paired bootstrap difference {interval(difference)}."]
    if "default" in by_name and "gradient" in by_name:
        level = success_at(by_name["default"].main, 100)[eligible].mean()
        reached = queries_to_reach(by_name["gradient"].main, eligible, level, budget)
        lines += [f"Gradient-guided proposals reach the default search's budget-100 ASR ({level:.3f}) at "
                  f"{reached if reached is not None else f'more than {budget}'} queries."]
    if "suffix" in by_name:
        research = sum(not o.best.natural for o in by_name["suffix"].main)
        lines += [f"Adversarial suffix (research preset): {research} of {len(items)} hardest prompts carry the suffix "
                  "(natural: false)."]
    if "forced" in by_name:
        lines += forced_lines(by_name["forced"], eligible, control_eligible)
    lines += meaning_checks([r for r in results if r.name not in ("suffix", "forced")], scorer, args.seed)
    plot(label_valid, eligible, budget, fixed_asr, args.plot)
    if args.cost_items:
        lines += ["", f"Cost of a whole search (stop on success off, fresh prompt cache) on the first "
                      f"{args.cost_items} items, stereotype objective:", "",
                  markdown_table(["method", "budget", "items", "s per item", "prompts/s", "gradient passes/s"],
                                 cost_rows(items[: args.cost_items], target, args.budgets,
                                           args.cost_methods or args.methods))]
    minutes = (time.perf_counter() - started) / 60
    shown = args.plot.resolve()
    lines += ["", f"Plot: `{shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}`. "
                  f"Wall time {minutes:.1f} min."]
    record("Attack strength on label-valid prompts: ASR vs queries", "\n".join(lines))


if __name__ == "__main__":
    main()
