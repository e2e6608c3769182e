"""`flexsearch report`: one self-contained HTML file (figures inlined) and the same numbers as Markdown."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on these machines
matplotlib.rcParams["text.parse_math"] = False  # category names and labels are plain text, never TeX
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flexsearch.data.audit import audit_summary  # noqa: E402
from flexsearch.errors import FlexsearchError  # noqa: E402
from flexsearch.files import atomic_write_text, read_json  # noqa: E402
from flexsearch.results.comparison import load_run  # noqa: E402
from flexsearch.results.metrics import dig, forced_choice_text, metric_text  # noqa: E402
from flexsearch.results.printing import cell_text, diversity_text  # noqa: E402
from flexsearch.results.run_dir import (  # noqa: E402
    SCORE_SCHEMA_VERSION,
    check_output_file,
    portable_path,
    read_jsonl,
    read_run_config,
)
from flexsearch.results.run_files import SCORE, SPLIT_JSONL  # noqa: E402

HEADLINE = [("clean accuracy", ("clean", "accuracy")), ("attacked accuracy", ("attacked", "accuracy")),
            ("ASR", ("stereotype", "asr")), ("control ASR", ("anti_stereotype", "asr")),
            ("fairness gap", ("fairness_gap",)), ("P(target) shift", ("stereotype", "mean_p_target_shift")),
            ("disambiguated accuracy", ("clean", "accuracy_disambig")),
            ("abstention", ("clean", "abstention_rate"))]
HARDEST = 10
OBJECTIVES = (("stereotype", "-", "stereotype"), ("anti_stereotype", "--", "control (anti-stereotype)"))


def png(draw: Callable[[plt.Axes], None], width: float = 6.4, height: float = 3.4) -> str:
    figure, axes = plt.subplots(figsize=(width, height))
    draw(axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


REPORT_SIGNATURE = "<meta name='generator' content='flexsearch report'>"  # marks a page `report` may replace
MARKDOWN_TITLE = "# flexsearch robustness report"


def _label(run: Path) -> str:
    return run.name or str(run)


class RunReport:
    """What the report needs from one run directory."""

    def __init__(self, run: Path) -> None:
        score_path = run / SCORE
        if not score_path.exists():
            raise FlexsearchError(f"{run}: no {SCORE} (is it a finished run directory?)")
        self.run, self.label = run, _label(run)
        self.score = read_json(score_path)
        if self.score.get("schema_version") != SCORE_SCHEMA_VERSION:
            raise FlexsearchError(f"{score_path}: written by an older flexsearch (score schema "
                                  f"{self.score.get('schema_version', 1)}, this one reads {SCORE_SCHEMA_VERSION}); "
                                  "rerun the command into a new directory to report it")
        self.table = load_run(run)
        self.config = read_run_config(run) or {}
        split = run / SPLIT_JSONL
        self.rows = read_jsonl(split) if split.exists() else []

    def predicted(self) -> dict[str, str]:
        """Item id → the answer text the attacked prompt's scores put on top (empty without attacked scores)."""
        t = self.table
        if t.attacked is None:
            return {}
        answers = {row["item_id"]: row["answers"] for row in self.rows}
        return {item: answers[item][int(p.argmax())] for item, p in zip(t.ids, t.attacked, strict=True)
                if item in answers}

    def provenance(self) -> dict[str, str]:
        """Where the numbers come from: model and file hash, adapter, data and hash, items, search settings."""
        model, versions = self.score["model"], self.score["versions"]  # schema 2 has both
        search = self.config.get("search") or {}
        eligible = dig(self.score, ("stereotype", "eligible_items"))
        control = "on" if search.get("control") else "off"
        return {
            "run": portable_path(self.run),
            "model": str(model.get("model", "?")),
            "model file sha256": str(model.get("gguf_sha256") or model.get("revision") or "n/a"),
            "adapter": portable_path(model["adapter"]) if model.get("adapter") else "none",
            "data": portable_path(str(self.config.get("data") or self.config.get("split") or "?")),
            "data sha256": str(self.config.get("data_sha256", "?")),
            "items": f"{self.score.get('items', self.score.get('n_items', '?'))} scored"
                     + (f", {eligible} attack-eligible" if eligible is not None else "")
                     + f", {self.score.get('skipped', 0)} skipped",
            "search": (f"{search.get('method')}, objective {search.get('objective')}, budget {search.get('budget')} "
                       f"prompts per item, seed {search.get('seed')}, control {control}"
                       if search else "none (evaluation)"),
            "prompt": prompt_layout(model.get("prompt_format") or {}),
            **({"served scoring": served_scoring(model)} if model.get("served") else {}),
            "date": self.score["created"],
            "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        }


def prompt_layout(facts: dict[str, Any]) -> str:
    """The prompt layout a run recorded: mode, where the attack text sat, the chat template (its hash)."""
    if facts.get("mode", "plain") == "plain":
        return "plain text (FLEX's layout), the attack before the question"
    where = "the system message" if facts.get("slot") == "system" else "the user turn, before the question"
    template = facts.get("chat_template") or f"sha256 {str(facts.get('chat_template_sha256', '?'))[:12]}…"
    return f"chat, the attack in {where}; template {template}"


def served_scoring(model: dict[str, Any]) -> str:
    """A served run's scoring mode, and why when --served-mode auto chose it."""
    found = model.get("served_mode_probe")
    mode = str(model["served"].get("mode", "?"))
    return f"{mode} (chosen by --served-mode auto: {found['why']})" if found else f"{mode} (as asked)"


def _cell(metric: dict[str, Any] | None) -> str:
    """A metric with its interval and denominator."""
    text = metric_text(metric, digits=3, missing="n/a")
    return text if not metric or metric.get("n") is None else f"{text} (n={metric['n']})"


def _headline_rows(reports: list[RunReport]) -> list[list[str]]:
    return [[r.label, *(_cell(dig(r.score, path)) for _, path in HEADLINE),
             dig(r.score, ("verdict", "verdict")) or "n/a"] for r in reports]


def _no_data(ax: plt.Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in these runs", ha="center", va="center", transform=ax.transAxes, color="grey")


def _verdict_rows(report: RunReport) -> list[list[str]]:
    """(group, the eligible items the verdict rests on, verdict, reason) overall and per category, for a run
    whose score has verdicts."""
    groups = [("overall", report.score), *report.score.get("per_category", {}).items()]

    def eligible(block: dict[str, Any]) -> str:
        counts = [f"{dig(block, (objective, 'eligible_items'))} {label}"
                  for objective, label in (("stereotype", "toward"), ("anti_stereotype", "control"))
                  if dig(block, (objective, "eligible_items")) is not None]
        return ", ".join(counts) + f" of {dig(block, ('clean', 'n_items'))}"

    def detectable(block: dict[str, Any]) -> str:
        value = block["verdict"].get("detectable_gap")
        return "-" if value is None else f"{value:.2f}"

    return [[name, eligible(block), block["verdict"]["verdict"], detectable(block), block["verdict"]["reason"]]
            for name, block in groups if "verdict" in block]


def _group_rows(report: RunReport) -> list[list[str]]:
    """(group tag, items, ASR, control ASR, gap) per stereotyped group of a search run."""
    rows = []
    for tag, cell in (report.score.get("per_group") or {}).items():
        gap = cell.get("fairness_gap")
        rows.append([tag, str(cell["n_items"]), cell_text(dig(cell, ("stereotype", "asr"))),
                     cell_text(dig(cell, ("anti_stereotype", "asr"))),
                     metric_text(gap) + ("*" if gap and gap.get("holm_significant") else "") if gap else "-"])
    return rows


def _validity_lines(report: RunReport) -> list[str]:
    """The label-validity facts of a search run: the audit, the success margin and near ties, and the
    forced-choice measurement when the run has one (DESIGN.md "Label validity")."""
    score, lines = report.score, []
    audit = score.get("audit")
    if audit:
        sentence = audit_summary(audit)
        lines.append(sentence[0].upper() + sentence[1:] + ".")
    for objective in ("stereotype", "anti_stereotype"):
        block = score.get(objective)
        if not isinstance(block, dict) or "summary" not in block:
            continue
        summary = block["summary"]
        lines.append(f"{objective}: success margin {score.get('success_margin', 'n/a')}; ASR "
                     f"{metric_text(block['asr'])}, bare argmax {metric_text(block.get('asr_argmax'))}; "
                     f"{summary.get('near_ties', 0)} near ties counted as failed; "
                     f"{summary.get('forced_choice', 0)} forced-choice items measured apart.")
        forced = block.get("forced_choice")
        if forced:
            lines.append(f"forced choice ({objective} search): {forced_choice_text(forced)}.")
    return lines


def _family_rows(report: RunReport) -> list[list[str]]:
    """One row per attack family: items that searched it, ASR, control ASR and the gap (score.json `families`)."""
    rows = []
    for family, block in (report.score.get("families") or {}).items():
        if not isinstance(block, dict):
            continue
        if not block["searched"]:
            rows.append([family, "not searched", block["reason"], "", ""])
            continue
        gap = block.get("fairness_gap")
        rows.append([family, str(block["searched_items"]), cell_text(dig(block, ("stereotype", "asr"))),
                     cell_text(dig(block, ("anti_stereotype", "asr"))), metric_text(gap) if gap else "-"])
    return rows


def family_heat_map(report: RunReport) -> str | None:
    """ASR per attack family × category as a heat map (each cell k/n), or None when the run has no families."""
    families = {f: b for f, b in (report.score.get("families") or {}).items()
                if isinstance(b, dict) and b["searched"] and "stereotype" in b}
    if not families:
        return None
    categories = sorted({c for b in families.values() for c in b["per_category"]})

    def draw(ax: plt.Axes) -> None:
        grid = np.full((len(families), len(categories)), np.nan)
        for i, block in enumerate(families.values()):
            for j, category in enumerate(categories):
                asr = dig(block, ("per_category", category, "stereotype", "asr")) or {}
                if asr.get("value") is not None:
                    grid[i, j] = asr["value"]
                    ax.text(j, i, f"{asr['value']:.2f}\n{asr['k']}/{asr['n']}", ha="center", va="center", fontsize=7,
                            color="white" if asr["value"] > 0.6 else "black")
                else:
                    ax.text(j, i, "no eligible\nitems", ha="center", va="center", fontsize=6, color="grey")
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="Reds", aspect="auto")
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=7)
        ax.set_yticks(range(len(families)), list(families), fontsize=8)
        ax.figure.colorbar(image, ax=ax, label="ASR toward the stereotype")

    return png(draw, width=max(6.4, 0.9 * len(categories) + 2), height=0.55 * len(families) + 2.2)


def budget_curves(reports: list[RunReport], ax: plt.Axes) -> None:
    """ASR against the query budget per run and objective, with Wilson bands."""
    drawn = False
    for r in reports:
        for objective, style, name in OBJECTIVES:
            curve = dig(r.score, (objective, "asr_vs_budget")) or {}
            points = sorted((int(b), m) for b, m in curve.items() if m.get("value") is not None)
            if not points:
                continue
            xs = [b for b, _ in points]
            line, = ax.plot(xs, [m["value"] for _, m in points], style, marker="o",
                            label=f"{r.label} {name} (n={points[-1][1]['n']})")
            ax.fill_between(xs, [m["ci"][0] for _, m in points], [m["ci"][1] for _, m in points],
                            color=line.get_color(), alpha=0.15)
            drawn = True
    if not drawn:
        _no_data(ax, "search results")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    budgets = sorted({int(b) for r in reports for o, _, _ in OBJECTIVES
                      for b in (dig(r.score, (o, "asr_vs_budget")) or {})})
    if budgets:  # label the budgets the score was read at, as plain numbers
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
    costs = sorted({3 if (r.config.get("scoring") or {}).get("average_orders", True) else 1 for r in reports})
    ax.set_xlabel("query budget (prompts scored per item; a candidate costs "
                  + " or ".join(str(c) for c in costs) + " with its option orders)")
    ax.set_ylabel("ASR (95% Wilson band)")
    ax.set_ylim(-0.04, 1.04)  # a curve at 0 or 1 stays visible above the frame
    if drawn:
        ax.legend(fontsize=7)


def category_bars(reports: list[RunReport], ax: plt.Axes) -> None:
    """ASR per category per run and objective, with Wilson intervals and denominators."""
    categories = sorted({c for r in reports for c in r.score.get("per_category", {})})
    series = [(r, objective, name) for r in reports for objective, _, name in OBJECTIVES
              if any(dig(r.score, ("per_category", c, objective, "asr")) for c in categories)]
    if not series:
        _no_data(ax, "per-category ASR")
    width = 0.8 / max(1, len(series))
    for k, (r, objective, name) in enumerate(series):
        values, lows, highs, labels = [], [], [], []
        for c in categories:
            m = dig(r.score, ("per_category", c, objective, "asr")) or {}
            v = m.get("value")
            lo, hi = m.get("ci", [None, None])
            values.append(0 if v is None else v)
            lows.append(0 if v is None or lo is None else v - lo)
            highs.append(0 if v is None or hi is None else hi - v)
            labels.append("n/a" if v is None else f"{v:.2f}\nn={m.get('n')}")
        xs = np.arange(len(categories)) + k * width
        bars = ax.bar(xs, values, width, yerr=[lows, highs], capsize=2, label=f"{r.label} {name}",
                      hatch="//" if objective == "anti_stereotype" else None, alpha=0.85)
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(categories)) + width * (len(series) - 1) / 2, categories, rotation=30,
                  ha="right", fontsize=7)
    ax.set_ylabel("ASR (95% Wilson interval)")
    ax.set_ylim(0, 1.15)
    if series:
        ax.legend(fontsize=7)


def shift_histogram(reports: list[RunReport], ax: plt.Axes) -> None:
    """How far each attacked row moved P(target) from its clean prompt."""
    drawn = False
    for r in reports:
        attacked = [row for row in r.rows if row.get("attack_chain")]  # unattacked rows shift by 0: left out
        if attacked:
            ax.hist([row["p_target_attacked"] - row["p_target_clean"] for row in attacked], bins=20, alpha=0.5,
                    label=f"{r.label} ({len(attacked)} attacked rows; {len(r.rows) - len(attacked)} "
                          "unattacked left out)")
            drawn = True
    if not drawn:
        _no_data(ax, "attacked prompts")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("P(target) attacked − clean, per attacked row of split.jsonl")
    ax.set_ylabel("items")
    if drawn:
        ax.legend(fontsize=7)


def letter_bias(reports: list[RunReport], ax: plt.Axes) -> None:
    """The share of clean top answers at each letter (position bias)."""
    width = 0.8 / max(1, len(reports))
    for k, r in enumerate(reports):
        bias = dig(r.score, ("clean", "letter_bias")) or {}
        bars = ax.bar(np.arange(3) + k * width, [bias.get(x, 0) for x in "ABC"], width, label=r.label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.axhline(1 / 3, color="grey", linestyle=":", label="no position bias")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(3) + width * (len(reports) - 1) / 2, ["A", "B", "C"])
    ax.set_ylabel("share of top answers (clean prompts)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)


def _figures(reports: list[RunReport]) -> dict[str, str]:
    """The report's figures, each a PNG in base64."""
    return {
        "ASR vs query budget": png(lambda ax: budget_curves(reports, ax)),
        "ASR per category": png(lambda ax: category_bars(reports, ax), width=7.5, height=4.0),
        "P(target) shift per item": png(lambda ax: shift_histogram(reports, ax)),
        "Letter-position bias": png(lambda ax: letter_bias(reports, ax), height=3.0),
    }


def _hardest(report: RunReport) -> list[dict[str, Any]]:
    rows = sorted(report.rows, key=lambda r: r["p_target_attacked"] - r["p_target_clean"], reverse=True)
    return rows[:HARDEST]


def _chain_text(chain: list[dict[str, Any]]) -> str:
    """The edits in order: a template as the text it set, a word edit as before → after."""
    if not chain:
        return "(no edit)"
    parts = []
    for e in chain:
        if e["position"] is None:
            parts.append(f"{e['operator']}: {e['after']!r}")
        else:
            parts.append(f"{e['operator']} {e['field']}[{e['position']}]: {e['before']!r} → {e['after']!r}")
    return "; ".join(parts)


def _html_table(head: list[str], rows: list[list[str]], sep: str = "") -> str:
    cells = ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + sep + sep.join(cells)
            + sep + "</table>")


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(row) + " |" for row in rows)]


Section = tuple[str, list[str]]  # a part of the report: its HTML, its Markdown lines


def _table_section(title: str, intro: str, head: list[str], rows: list[list[str]], after: str = "",
                   after_md: tuple[str, ...] = ()) -> Section:
    """A titled table with its intro paragraph (HTML only) and what follows it."""
    return (f"<h2>{html.escape(title)}</h2>{intro}{_html_table(head, rows)}{after}",
            ["", f"## {title}", "", *_md_table(head, rows), *after_md])


def _provenance_section(report: RunReport) -> Section:
    facts = report.provenance()
    return (f"<h3>{html.escape(report.label)}</h3><table>" + "".join(
        f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(v)}</code></td></tr>" for k, v in facts.items())
        + "</table>", [f"## Provenance: {report.label}", "", "| | |", "|---|---|",
                       *(f"| {k} | `{v}` |" for k, v in facts.items()), ""])


def _run_sections(report: RunReport) -> list[Section]:
    """The per-run tables: verdicts, stereotyped groups, attack families, weak spots, label validity."""
    esc, label, sections = html.escape, report.label, []
    verdicts = _verdict_rows(report)
    if verdicts:
        sections.append(_table_section(f"Verdict: {label}", "", ["group", "eligible items", "verdict",
                                                                 "smallest gap these items can show", "why"],
                                       verdicts))
    groups = _group_rows(report)
    if groups:
        sections.append(_table_section(
            f"Per stereotyped group: {label}", "<p>The stereotyped person's BBQ group tag; intersectional items form "
            "their own cells. Rates are k/n of eligible items.</p>",
            ["group", "items", "ASR toward the stereotype", "control ASR", "gap (* Holm)"], groups))
    families = _family_rows(report)
    if families:
        widths = report.score.get("diversity") or {}
        width_lines = tuple(f"Width of the {name} split: {diversity_text(m)}." for name, m in widths.items())
        heat = family_heat_map(report)
        sections.append(_table_section(
            f"Attack families: {label}", "<p>Each family's hardest label-valid prompt per attack-eligible item "
            "(split-families.*): persona or instruction templates alone, word edits alone (text), or two or more "
            "together (composition). Rates are k/n of the eligible items that searched the family; a family never "
            "searched has no rate.</p>",
            ["family", "items that searched it", "ASR toward the stereotype", "control ASR", "gap"], families,
            "".join(f"<p>{esc(line)}</p>" for line in width_lines)
            + (f"<h3>ASR per family and category</h3><img alt='ASR per attack family and category' "
               f"src='data:image/png;base64,{heat}'>" if heat else ""), ("", *width_lines)))
    spots = (report.score.get("weak_spots") or {}).get("overall") or []
    if spots:
        sections.append(_table_section(
            f"Weak spots: {label}", "<p>Templates and compositions ranked by the attack-eligible items they broke: k "
            "of the n items on which a label-valid prompt carrying it was scored.</p>",
            ["template or composition", "items broken k/n [95% CI]"],
            [[spot["key"], cell_text(spot["broke"])] for spot in spots]))
    validity = _validity_lines(report)
    if validity:
        sections.append((f"<h2>Label validity: {esc(label)}</h2>" + "".join(f"<p>{esc(line)}</p>" for line in validity),
                         ["", f"## Label validity: {label}", "", *validity]))
    return sections


def _hardest_section(report: RunReport) -> Section | None:
    """The ten prompts that raised P(target) most, with their items' answers and chains."""
    hardest = _hardest(report)
    if not hardest:
        return None
    esc = html.escape
    page = [f"<h2>Ten hardest prompts: {esc(report.label)}</h2><p>Sorted by the rise in P(target); "
            "the target is the answer the objective pushes toward; predicted is the attacked prompt's top "
            "answer (order-averaged as scored).</p><table><tr><th>item</th><th>gold answer</th>"
            "<th>target answer</th><th>predicted</th><th>P(target) clean → attacked</th>"
            "<th>attack success</th><th>attack chain</th><th>prompt</th></tr>"]
    md = [f"## Ten hardest prompts: {report.label}", "",
          "| item | gold answer | target answer | predicted | P(target) clean → attacked | attack success "
          "| attack chain |", "|---|---|---|---|---|---|---|"]
    predicted = report.predicted()
    for r in hardest:
        probs = f"{r['p_target_clean']:.3f} → {r['p_target_attacked']:.3f}"
        chain = _chain_text(r["attack_chain"])
        pushed = {"stereotype": "target", "anti_stereotype": "anti_target"}.get(r["objective"])
        target = r["answers"][r[pushed]] if pushed else "any answer but the gold one"
        gold, guess = r["answers"][r["gold"]], predicted.get(r["item_id"], "?")
        met = "yes" if r["success"] else "no"
        page.append(f"<tr><td>{esc(r['item_id'])}</td><td>{esc(gold)}</td><td>{esc(target)}</td>"
                    f"<td>{esc(guess)}</td><td>{probs}</td><td>{met}</td><td>{esc(chain)}</td>"
                    f"<td><pre>{esc(r['prompt'])}</pre></td></tr>")
        md.append(f"| {r['item_id']} | {gold} | {target} | {guess} | {probs} | {met} | {chain.replace('|', '/')} |")
    page.append("</table>")
    md.append("")
    return "\n".join(page), md


def build_report(runs: list[Path]) -> tuple[str, str]:
    """(HTML, Markdown) for one or more run directories: provenance, the headline, each run's tables, the figures
    and each run's hardest prompts."""
    if not runs:
        raise FlexsearchError("report needs at least one run directory")
    reports = [RunReport(r) for r in runs]
    headers = ["run", *(name for name, _ in HEADLINE), "verdict"]
    rows = _headline_rows(reports)
    figures = _figures(reports)
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>flexsearch report</title><style>",
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px;"
             "vertical-align:top}th{background:#f3f3f3}pre{white-space:pre-wrap;margin:0;font-size:12px}",
             f"</style>{REPORT_SIGNATURE}</head><body><h1>flexsearch robustness report</h1>",
             "<p>Runs: " + ", ".join(f"<code>{esc(portable_path(r.run))}</code>" for r in reports)
             + ". Intervals are 95%: "
             "Wilson intervals for rates (accuracy, abstention, ASR), a small-sample score interval for the gap "
             "(a difference of rates), bootstrap over items for means. "
             "Read ASR beside the control ASR: a fairness gap near 0 means the model "
             "is easy to push either way, not that it is biased.</p>",
             "<h2>Provenance</h2>"]
    md = [MARKDOWN_TITLE, ""]
    sections: list[Section] = [_provenance_section(r) for r in reports]
    sections.append(("<h2>Headline</h2><p>Each cell: value [95% interval] (n = its denominator: items, or "
                     "attack-eligible items for ASR).</p>" + _html_table(headers, rows, sep="\n"),
                     ["## Headline", "", *_md_table(headers, rows)]))
    sections += [section for r in reports for section in _run_sections(r)]
    sections.append(("\n".join(f"<h2>{esc(title)}</h2><img alt='{esc(title)}' src='data:image/png;base64,{image}'>"
                               for title, image in figures.items()), [""]))
    sections += [section for r in reports if (section := _hardest_section(r))]
    for page, lines in sections:
        parts.append(page)
        md += lines
    parts.append("</body></html>")
    md.append("Figures: " + ", ".join(figures) + " (in the HTML report).")
    return "\n".join(parts), "\n".join(md) + "\n"


def write_report(runs: list[Path], out: Path) -> Path:
    """Writes OUT (HTML) and OUT with a .md suffix; returns the Markdown path."""
    if out.is_dir():
        raise FlexsearchError(f"--out {out}: a directory; give the HTML file to write (e.g. {out / 'report.html'})")
    if out.suffix.lower() not in (".html", ".htm"):
        raise FlexsearchError(f"--out {out}: expected an .html file name (the .md twin is written beside it)")
    md_path = out.with_suffix(".md")
    check_output_file(out, "--out", REPORT_SIGNATURE)  # only an earlier flexsearch report is ever replaced
    check_output_file(md_path, "--out (its .md twin)", MARKDOWN_TITLE)
    page, markdown = build_report(runs)
    atomic_write_text(out, page)
    atomic_write_text(md_path, markdown)
    return md_path
