"""What the CLI and the API print: the score table of a run with its confounds, verdict, per-group table and
weak spots, the attack summary line, compact text tables (`format_table`, `cell_text`, which the HTML report shares)
and a bar for work without steps (a model load). The typed results
(`flexsearch.results`) carry these texts; nothing here computes a figure.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tqdm.auto import tqdm

from flexsearch.config import prompts_per_candidate
from flexsearch.data.audit import audit_summary
from flexsearch.results.metrics import dig, forced_choice_text, metric_text


def format_table(score: dict[str, Any], columns: Sequence[tuple[str, str]]) -> str:
    """A compact text table: one row overall, one per category; columns are (header, metric key)."""
    rows = [("overall", score), *score.get("per_category", {}).items()]
    header = ["group", "n", *(h for h, _ in columns), "letters A/B/C"]
    body = []
    for name, metrics in rows:
        letters = metrics.get("letter_bias", {})
        body.append([
            name, str(metrics.get("n_items", "")), *(cell_text(metrics.get(key)) for _, key in columns),
            "/".join(f"{letters.get(x, 0):.2f}" for x in "ABC"),
        ])
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *body])


def cell_text(value: Any) -> str:
    """A table cell: text as it is (a verdict), a metric as its value and interval, and a proportion with
    its count over the denominator it rests on ('0.50 [0.15, 0.85] 2/4')."""
    if isinstance(value, str):
        return value
    text = metric_text(value)
    return f"{text} {value['k']}/{value['n']}" if value and value.get("k") is not None and value.get("n") else text


CLEAN_COLUMNS = (("accuracy", "accuracy"), ("P(target)", "mean_p_target"), ("s_dis", "s_dis"), ("s_amb", "s_amb"))



def format_search_table(score: dict[str, Any], objective: str) -> str:
    """Headline and per-category table of a search (or a re-scored split)."""
    columns: list[tuple[str, tuple[str, ...]]] = [
               ("clean acc", ("clean", "accuracy")), ("attacked acc", ("attacked", "accuracy")),
               ("ASR", (objective, "asr")), ("P(target) shift", (objective, "mean_p_target_shift"))]
    if "fairness_gap" in score:
        columns += [("control ASR", ("anti_stereotype", "asr")), ("gap", ("fairness_gap",))]
    if "verdict" in score:
        columns.append(("verdict", ("verdict", "verdict")))
    flat = {"n_items": score["items"], "letter_bias": score["clean"].get("letter_bias", {}),
            **{header: dig(score, path) for header, path in columns},
            "per_category": {
                cat: {"n_items": block["clean"]["n_items"], "letter_bias": block["clean"].get("letter_bias", {}),
                      **{header: dig(block, path) for header, path in columns}}
                for cat, block in score["per_category"].items()}}
    lines = [format_table(flat, [(h, h) for h, _ in columns])]
    clean = score["clean"]
    lines.append(f"confounds: letter bias A/B/C {'/'.join(f'{v:.2f}' for v in clean.get('letter_bias', {}).values())}"
                 f", disambiguated accuracy {cell_text(clean['accuracy_disambig'])}"
                 f", abstention {metric_text(clean['abstention_rate'])}"
                 f" (on disambiguated items {cell_text(clean.get('abstention_disambig'))})")
    capability = score.get("capability")
    if capability:
        lines.append(f"capability ({capability['n_items']} disambiguated items of --capability {capability['data']}, "
                     f"scored clean): accuracy {cell_text(capability['accuracy_disambig'])}, abstention "
                     f"{cell_text(capability['abstention_disambig'])}")
    attack = score[objective]
    if "queries" in attack:
        orders = prompts_per_candidate(bool(score.get("average_orders")))
        cost = score.get("queries_per_candidate") or orders  # written by searches since served targets
        per = "one per option order" if cost == orders else f"{orders} option order(s) × {cost // orders} samples"
        reach = (f"; budget {score['budget']} = {score['budget'] // cost} prompts of {cost} queries ({per}): "
                 f"the clean one and {score['budget'] // cost - 1} attacked" if "budget" in score else "")
        lines.append(f"queries per item: mean {attack['queries']['mean']:.1f}, median {attack['queries']['median']:.0f}"
                     f" (ASR over {attack['eligible_items']} items answered correctly when clean{reach})")
    lines.append(summary_text(attack["summary"], score, objective))
    untried = {o: n for o, n in (score.get("untried_items") or {}).items() if n}
    if untried:
        lines.append("warning: " + "; ".join(f"{n} of {score['items']} items tried no attack toward {o}" for o, n
                                              in untried.items())
                     + f": budget {score['budget']} ran out before any operator (greedy word importance first "
                       "spends one prompt per editable word); raise --budget")
    if "fairness_gap" in score:
        gap = score["fairness_gap"]
        lines.append(f"fairness gap ASR(stereotype) - ASR(anti-stereotype): {metric_text(gap)}"
                     " — a gap near 0 means the model is merely easy to push, not biased")
    if "verdict" in score:
        lines.append(f"verdict: {score['verdict']['verdict']} ({score['verdict']['reason']})")
    lines += family_lines(score, objective)
    lines += group_lines(score, objective)
    lines += weak_spot_lines(score)
    forced = attack.get("forced_choice")
    if forced:
        lines.append(f"forced choice ({objective} search): {forced_choice_text(forced)}")
    if "audit" in score:
        lines.append(audit_summary(score["audit"]) + ("; `flexsearch audit` lists them" if score["audit"]["flagged"]
                                                      else ""))
    return "\n".join(lines)


def family_lines(score: dict[str, Any], objective: str) -> list[str]:
    """ASR per attack family (the family split, split-families.*) beside the union, with the control and the gap, and
    the width of both splits."""
    families = {f: b for f, b in (score.get("families") or {}).items() if isinstance(b, dict)}
    if not families:
        return []
    rows = [["family", "searched", "ASR", "control ASR", "gap"],
            ["union (split.jsonl)", str(score["items"]), cell_text(dig(score, (objective, "asr"))),
             cell_text(dig(score, ("anti_stereotype", "asr"))), metric_text(score.get("fairness_gap"))]]
    for family, block in families.items():
        if not block["searched"]:
            rows.append([family, "not searched", block["reason"], "", ""])
            continue
        gap = block.get("fairness_gap")
        rows.append([family, str(block["searched_items"]), cell_text(dig(block, (objective, "asr"))),
                     cell_text(dig(block, ("anti_stereotype", "asr"))), metric_text(gap) if gap else "-"])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["per attack family (each family's hardest prompt per item, split-families.*; searched = items that "
             "scored a prompt of it):",
             *("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)]
    for name, measures in (score.get("diversity") or {}).items():
        lines.append(f"width of the {'benchmark' if name == 'benchmark' else 'family'} split: "
                     + diversity_text(measures))
    return lines


def diversity_text(measures: dict[str, Any]) -> str:
    """The width measures (flexsearch.results.diversity) as one phrase."""
    if not measures["successful_rows"]:
        return "no successful rows"
    top, composition = measures["top_template"], measures["top_composition"]
    cosine = measures["mean_pairwise_cosine"]
    return (f"{measures['successful_rows']} successful rows; top template {top['key']} {top['share']:.2f} of "
            f"{measures['template_uses']} uses, top composition {composition['share']:.2f}, effective templates "
            f"{measures['effective_templates']:.1f}, mean pairwise cosine "
            f"{'-' if cosine is None else f'{cosine:.2f}'}")


def group_lines(score: dict[str, Any], objective: str) -> list[str]:
    """The per-group table (stereotyped group tags): ASR and control ASR with k/n, the gap, Holm flags."""
    groups = score.get("per_group") or {}
    if not groups:
        return []
    rows = [["group", "n", "ASR", "control ASR", "gap (* Holm)", "smallest gap n can show"]]
    for tag, cell in groups.items():
        gap = cell.get("fairness_gap")
        rows.append([tag, str(cell["n_items"]), cell_text(cell[objective]["asr"]),
                     cell_text(dig(cell, ("anti_stereotype", "asr"))),
                     metric_text(gap) + ("*" if gap and gap.get("holm_significant") else "") if gap else "-",
                     f"{gap['detectable']:.2f}" if gap and gap.get("detectable") is not None else "-"])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["per stereotyped group (BBQ group tag of the stereotyped person; n = items):",
            *("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)]


def weak_spot_lines(score: dict[str, Any], top: int = 5) -> list[str]:
    """The model's weak spots: the templates and compositions that broke the most eligible items."""
    spots = (score.get("weak_spots") or {}).get("overall") or []
    if not spots:
        return []
    width = max(len(s["key"]) for s in spots[:top])
    lines = [f"weak spots (templates and compositions by the {score['weak_spots']['items']} eligible items they broke, "
             "k of the n items they were tried on; score.json weak_spots has them per category and per family):",
             *(f"  {s['key'].ljust(width)}  {cell_text(s['broke'])}" for s in spots[:top])]
    leaders = {f: block["overall"][0] for f, block in (score["weak_spots"].get("per_family") or {}).items()
               if block["overall"]}
    if leaders:
        lines.append("  per family, what broke most: " + "; ".join(f"{f} {s['key']} {s['broke']['k']}/{s['broke']['n']}"
                                                                  for f, s in leaders.items()))
    return lines


def summary_text(summary: dict[str, Any], score: dict[str, Any], objective: str) -> str:
    """TextAttack's attack summary as one line."""
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    ties = summary.get("near_ties", 0)
    apart = (f" (of them {ties} near tie{'s' if ties != 1 else ''}: the aim on top by less than the margin)"
             if ties else "")
    forced = (f", {summary['forced_choice']} forced-choice (measured apart)" if summary.get("forced_choice") else "")
    return (f"attack summary ({objective}): {summary['succeeded']} succeeded, {summary['failed']} failed{apart}, "
            f"{summary['skipped']} skipped (not eligible){forced}; "
            f"clean accuracy {metric_text(score['clean']['accuracy'])}, "
            f"under attack {metric_text(score['attacked']['accuracy'])}, ASR {metric_text(score[objective]['asr'])}; "
            f"words perturbed {num(summary['mean_perturbed_word_share'], '.1%')} (successes), queries "
            f"{num(summary['mean_queries'], '.1f')} (attacked items), {num(summary['mean_queries_to_success'], '.1f')}"
            " to first success")


@contextmanager
def elapsed_bar(description: str, tick_s: float = 0.5) -> Iterator[tqdm | None]:
    """A bar showing the seconds spent, redrawn every `tick_s` on a terminal, for work without steps (a model
    load); None and silent elsewhere."""
    if not sys.stderr.isatty():
        yield None
        return
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=True)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(tick_s):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        ticker.join()
        bar.close()
