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
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flexsearch.comparison import load_run  # noqa: E402
from flexsearch.errors import FlexsearchError  # noqa: E402
from flexsearch.metrics import dig, metric_text  # noqa: E402
from flexsearch.runio import atomic_write_text, read_json, read_jsonl  # noqa: E402

HEADLINE = [("clean accuracy", ("clean", "accuracy")), ("attacked accuracy", ("attacked", "accuracy")),
            ("ASR", ("stereotype", "asr")), ("control ASR", ("anti_stereotype", "asr")),
            ("fairness gap", ("fairness_gap",)), ("P(target) shift", ("stereotype", "mean_p_target_shift")),
            ("disambiguated accuracy", ("clean", "accuracy_disambig")),
            ("abstention", ("clean", "abstention_rate"))]
HARDEST = 10


def png(draw: Callable[[plt.Axes], None], width: float = 6.4, height: float = 3.4) -> str:
    figure, axes = plt.subplots(figsize=(width, height))
    draw(axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _label(run: Path) -> str:
    return run.name or str(run)


class RunReport:
    """What the report needs from one run directory."""

    def __init__(self, run: Path) -> None:
        score_path = run / "score.json"
        if not score_path.exists():
            raise FlexsearchError(f"{run}: no score.json (is it a finished run directory?)")
        self.run, self.label = run, _label(run)
        self.score = read_json(score_path)
        self.table = load_run(run)
        split = run / "split.jsonl"
        self.rows = read_jsonl(split) if split.exists() else []


def _headline_rows(reports: list[RunReport]) -> list[list[str]]:
    return [[r.label, *(metric_text(dig(r.score, path), digits=3, missing="n/a") for _, path in HEADLINE),
             dig(r.score, ("verdict", "verdict")) or "n/a"] for r in reports]


def _verdict_rows(report: RunReport) -> list[list[str]]:
    """(group, verdict, reason) overall and per category, for a run whose score has verdicts."""
    groups = [("overall", report.score), *report.score.get("per_category", {}).items()]
    return [[name, block["verdict"]["verdict"], block["verdict"]["reason"]] for name, block in groups
            if "verdict" in block]


def _figures(reports: list[RunReport]) -> dict[str, str]:
    figures: dict[str, str] = {}

    def budget_curves(ax: plt.Axes) -> None:
        for r in reports:
            for objective, style in (("stereotype", "-"), ("anti_stereotype", "--")):
                curve = dig(r.score, (objective, "asr_vs_budget")) or {}
                points = [(int(b), v) for b, v in curve.items() if v is not None]
                if points:
                    xs, ys = zip(*sorted(points), strict=True)
                    ax.plot(xs, ys, style, marker="o", label=f"{r.label} {objective}")
        ax.set_xscale("log")
        ax.set_xlabel("query budget (prompts scored per item)")
        ax.set_ylabel("ASR")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)

    figures["ASR vs query budget"] = png(budget_curves)

    def category_bars(ax: plt.Axes) -> None:
        categories = sorted({c for r in reports for c in r.score.get("per_category", {})})
        width = 0.8 / max(1, len(reports))
        for k, r in enumerate(reports):
            values, lows, highs = [], [], []
            for c in categories:
                m = dig(r.score, ("per_category", c, "stereotype", "asr")) or {}
                v = m.get("value")
                lo, hi = m.get("ci", [None, None])
                values.append(np.nan if v is None else v)
                lows.append(0 if v is None or lo is None else v - lo)
                highs.append(0 if v is None or hi is None else hi - v)
            xs = np.arange(len(categories)) + k * width
            ax.bar(xs, values, width, yerr=[lows, highs], capsize=2, label=r.label)
        ax.set_xticks(np.arange(len(categories)) + width * (len(reports) - 1) / 2, categories, rotation=30,
                      ha="right", fontsize=7)
        ax.set_ylabel("ASR (95% CI)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)

    figures["ASR per category"] = png(category_bars, height=3.8)

    def shift_histogram(ax: plt.Axes) -> None:
        for r in reports:
            t = r.table
            if t.attacked is not None:
                rows = np.arange(len(t.ids))
                ax.hist(t.attacked[rows, t.target] - t.clean[rows, t.target], bins=20, alpha=0.5, label=r.label)
        ax.set_xlabel("P(target) attacked − clean, per item")
        ax.set_ylabel("items")
        ax.legend(fontsize=7)

    figures["P(target) shift per item"] = png(shift_histogram)

    def letter_bias(ax: plt.Axes) -> None:
        width = 0.8 / max(1, len(reports))
        for k, r in enumerate(reports):
            bias = dig(r.score, ("clean", "letter_bias")) or {}
            ax.bar(np.arange(3) + k * width, [bias.get(x, 0) for x in "ABC"], width, label=r.label)
        ax.axhline(1 / 3, color="grey", linestyle=":", label="no position bias")
        ax.set_xticks(np.arange(3) + width * (len(reports) - 1) / 2, ["A", "B", "C"])
        ax.set_ylabel("share of top answers (clean prompts)")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)

    figures["Letter-position bias"] = png(letter_bias, height=3.0)
    return figures


def _hardest(report: RunReport) -> list[dict[str, Any]]:
    rows = sorted(report.rows, key=lambda r: r["p_target_attacked"] - r["p_target_clean"], reverse=True)
    return rows[:HARDEST]


def _chain_text(chain: list[dict[str, Any]]) -> str:
    if not chain:
        return "(no edit)"
    parts = []
    for e in chain:
        where = e["field"] if e["position"] is None else f"{e['field']}[{e['position']}]"
        parts.append(f"{e['operator']} {where}: {e['before']!r} → {e['after']!r}")
    return "; ".join(parts)


def build_report(runs: list[Path]) -> tuple[str, str]:
    """(HTML, Markdown) for one or more run directories."""
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
             "</style></head><body><h1>flexsearch robustness report</h1>",
             "<p>Runs: " + ", ".join(f"<code>{esc(str(r.run))}</code>" for r in reports) + ". Intervals are 95%: "
             "Wilson intervals for rates (accuracy, abstention, ASR), bootstrap over items for means and the gap. "
             "Read ASR beside the control ASR: a fairness gap near 0 means the model "
             "is easy to push either way, not that it is biased.</p>",
             "<h2>Headline</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
    parts.append("</table>")
    md = ["# flexsearch robustness report", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
          *("| " + " | ".join(row) + " |" for row in rows)]
    for report in reports:
        verdicts = _verdict_rows(report)
        if verdicts:
            parts.append(f"<h2>Verdict: {esc(report.label)}</h2><table><tr><th>group</th><th>verdict</th>"
                         "<th>why</th></tr>" + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
                                                       for row in verdicts) + "</table>")
            md += ["", f"## Verdict: {report.label}", "", "| group | verdict | why |", "|---|---|---|",
                   *("| " + " | ".join(row) + " |" for row in verdicts)]
    md.append("")
    for title, png in figures.items():
        parts.append(f"<h2>{esc(title)}</h2><img alt='{esc(title)}' src='data:image/png;base64,{png}'>")
    for report in reports:
        hardest = _hardest(report)
        if not hardest:
            continue
        parts.append(f"<h2>Ten hardest prompts: {esc(report.label)}</h2><table><tr><th>item</th>"
                     "<th>P(target) clean → attacked</th><th>attack chain</th><th>prompt</th></tr>")
        md += [f"## Ten hardest prompts: {report.label}", "", "| item | P(target) clean → attacked | attack chain |",
               "|---|---|---|"]
        for r in hardest:
            probs = f"{r['p_target_clean']:.3f} → {r['p_target_attacked']:.3f}"
            chain = _chain_text(r["attack_chain"])
            parts.append(f"<tr><td>{esc(r['item_id'])}</td><td>{probs}</td><td>{esc(chain)}</td>"
                         f"<td><pre>{esc(r['prompt'])}</pre></td></tr>")
            md.append(f"| {r['item_id']} | {probs} | {chain.replace('|', '/')} |")
        parts.append("</table>")
        md.append("")
    parts.append("</body></html>")
    md.append("Figures: " + ", ".join(figures) + " (in the HTML report).")
    return "\n".join(parts), "\n".join(md) + "\n"


def write_report(runs: list[Path], out: Path) -> Path:
    """Writes OUT (HTML) and OUT with a .md suffix; returns the Markdown path."""
    if out.is_dir():
        raise FlexsearchError(f"--out {out}: a directory; give the HTML file to write (e.g. {out / 'report.html'})")
    if out.suffix.lower() not in (".html", ".htm"):
        raise FlexsearchError(f"--out {out}: expected an .html file name (the .md twin is written beside it)")
    page, markdown = build_report(runs)
    atomic_write_text(out, page)
    md_path = out.with_suffix(".md")
    atomic_write_text(md_path, markdown)
    return md_path
