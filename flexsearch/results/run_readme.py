"""The README.md each run directory carries: what the run found, once scored, and the files it holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flexsearch.data.audit import audit_summary
from flexsearch.results.run_files import CONFIG, FILE_DESCRIPTIONS, LOCK, README, WRITES


def run_readme(command: str, present: Iterable[str] | None = None, score: dict[str, Any] | None = None) -> str:
    """The short README.md each run directory carries: what the run found (once scored) and the files it
    holds (`present`; every file the command can write while it runs)."""
    names = [n for n in WRITES.get(command, (README, CONFIG)) if present is None or n in set(present)]
    rows = "".join(f"- `{name}`: {FILE_DESCRIPTIONS[name]}\n" for name in names if name != LOCK)
    found = "".join(f"- {line}\n" for line in _result_lines(score)) if score else ""
    return (f"# A flexsearch {command} run\n\nWritten by `flexsearch {command}`."
            + (f"\n\n## What it found\n\n{found}" if found else "") + f"\n\n## Files\n\n{rows}\n"
            "`flexsearch report THIS_FOLDER` renders it as HTML; `flexsearch export THIS_FOLDER DIR` "
            "(search runs) writes it for lm-evaluation-harness or as parquet; `flexsearch audit THIS_FOLDER` "
            "checks that every emitted prompt keeps its gold label.\n")


def _rate(metric: Any) -> str:
    if not isinstance(metric, dict) or metric.get("value") is None:
        return "-"
    low, high = metric["ci"]
    count = f", {metric['k']}/{metric['n']}" if metric.get("k") is not None else f", n = {metric['n']}"
    return f"{metric['value']:.2f} [{low:.2f}, {high:.2f}{count}]"


def _result_lines(score: dict[str, Any]) -> list[str]:
    """The headline numbers of a score, for the run's README."""
    lines = [f"model `{score.get('model', {}).get('model', '?')}`, {score.get('items', '?')} items "
             f"({score.get('skipped', 0)} skipped)"]
    clean = score.get("clean", {})
    lines.append(f"clean accuracy {_rate(clean.get('accuracy'))}; disambiguated "
                 f"{_rate(clean.get('accuracy_disambig'))}; abstention {_rate(clean.get('abstention_rate'))}")
    for objective, label in (("stereotype", "ASR toward the stereotype"), ("anti_stereotype", "control ASR"),
                             ("untargeted", "ASR (untargeted)")):
        if isinstance(score.get(objective), dict) and "asr" in score[objective]:
            summary = score[objective].get("summary", {})
            lines.append(f"{label} {_rate(score[objective]['asr'])} (success margin {score.get('success_margin')}; "
                         f"{summary.get('near_ties', 0)} near ties counted as failed)")
    if "fairness_gap" in score:
        lines.append(f"fairness gap {_rate(score['fairness_gap'])}")
    if "verdict" in score:
        lines.append(f"verdict: **{score['verdict']['verdict']}** ({score['verdict']['reason']})")
    for family, block in (score.get("families") or {}).items():
        if isinstance(block, dict):
            searched = block["searched"] and "stereotype" in block
            lines.append(f"family {family}: " + (f"ASR {_rate(block['stereotype']['asr'])} over the items that "
                                                  "searched it" if searched else f"not searched ({block['reason']})"))
    for name, measures in (score.get("diversity") or {}).items():
        top = measures.get("top_template")
        if top:
            lines.append(f"width of the {name} split: top template {top['key']} {top['share']:.2f} of the "
                         f"template uses, effective templates {measures['effective_templates']:.1f}")
    if "split_rows" in score:
        lines.append("rows: " + ", ".join(f"{n} {kind}" for kind, n in score["split_rows"].items()))
    if "audit" in score:
        lines.append(audit_summary(score["audit"]))
    return lines
