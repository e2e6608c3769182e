"""The Python API behind the CLI: each command is one function here."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm.auto import tqdm

from flexsearch.candidate import Candidate, replay
from flexsearch.config import ScoringConfig, SearchConfig, config_dict
from flexsearch.errors import FlexsearchError
from flexsearch.evaluate import CLEAN_COLUMNS, evaluate_items, format_table, prediction_rows, score_all
from flexsearch.items import load_items
from flexsearch.metrics import dig, metric_text
from flexsearch.model import load_target
from flexsearch.render import render
from flexsearch.runio import (
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    atomic_write_yaml,
    read_log,
)
from flexsearch.scoring import Scorer
from flexsearch.search import build_context, run_search
from flexsearch.split import load_split, robustness_score, split_csv_text, split_row


def build_scorer(target: dict[str, Any], scoring: dict[str, Any]) -> Scorer:
    """Loads the target model and wraps it in a scorer. `target` holds load_target's arguments."""
    model = load_target(target.pop("model"), **target)
    return Scorer.from_config(model, ScoringConfig(**scoring))


def evaluate_data(data: str, out: Path, target: dict[str, Any], scoring: dict[str, Any],
                  limit: int | None = None) -> str:
    """Clean evaluation of a data set; returns the printed table."""
    loaded = load_items(data, limit=limit)
    scorer = build_scorer(dict(target), scoring)
    skipped = {"skipped": sum(loaded.skipped.values()), "skipped_reasons": dict(loaded.skipped)}
    atomic_write_yaml(out / "config.yaml", {"command": "evaluate", "data": data, "limit": limit,
                                            "model": scorer.target.info, "scoring": scoring})
    score = evaluate_items(scorer, loaded.items, out, extra={"data": data, **skipped, "model": scorer.target.info})
    lines = [format_table(score, CLEAN_COLUMNS)]
    lines.append(f"items: {len(loaded.items)} scored, {skipped['skipped']} skipped"
                 + "".join(f"\n  {n} × {why}" for why, n in loaded.skipped.items()))
    return "\n".join(lines)


def registries() -> dict[str, dict[str, str]]:
    """Name → one-line description of everything registered, by kind."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS
    from flexsearch.objectives import OBJECTIVES
    from flexsearch.search import METHODS

    return {"operators": OPERATORS.describe(), "constraints": CONSTRAINTS.describe(),
            "objectives": OBJECTIVES.describe(),
            "search methods": {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in METHODS.items()}}


def _versions() -> dict[str, str]:
    import platform

    import torch
    import transformers

    import flexsearch

    return {"flexsearch": flexsearch.__version__, "torch": str(torch.__version__),
            "transformers": transformers.__version__, "python": platform.python_version()}


def _check_or_write_config(out: Path, resolved: dict[str, Any]) -> None:
    """A rerun into an existing run directory must use the same settings; then it resumes."""
    path = out / "config.yaml"
    if path.exists():
        previous = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key in ("data", "limit", "search"):
            if previous.get(key) != resolved[key]:
                raise FlexsearchError(f"{out} holds a run with a different '{key}' setting; "
                                      "resume with the same settings or choose a new --out")
        if previous.get("model", {}).get("model") != resolved["model"]["model"]:
            raise FlexsearchError(f"{out} holds a run on another model; choose a new --out")
        return
    atomic_write_yaml(path, resolved)


def search(data: str, out: Path, target: dict[str, Any], config: SearchConfig,
           limit: int | None = None, ray: dict[str, Any] | None = None) -> str:
    """Runs (or resumes) a search into `out`; writes the split and the score; returns a summary.

    With `ray` (search_on_ray's keyword options) the items are searched by Ray workers; the run
    directory, and so resume, is the same either way."""
    loaded = load_items(data, limit=limit)
    scorer = build_scorer(dict(target), asdict(config.scoring))
    resolved = {"command": "search", "data": data, "limit": limit, "model": scorer.target.info,
                "search": config_dict(config), "versions": _versions()}
    out.mkdir(parents=True, exist_ok=True)
    _check_or_write_config(out, resolved)
    trace = out / "trace.jsonl"
    done = {(r["objective"], r["item_id"]): r for r in read_log(trace) if r.get("kind") == "item"}
    objectives = [config.objective]
    if config.control and config.objective != "anti_stereotype":
        objectives.append("anti_stereotype")
    items = loaded.items
    retries = 0
    with tqdm(total=len(items) * len(objectives), desc="search", unit="item") as bar:
        bar.update(sum((o, it.id) in done for o in objectives for it in items))
        for objective in objectives:
            todo = [it for it in items if (objective, it.id) not in done]
            if not todo:
                continue

            def keep(records: list[dict[str, Any]], objective: str = objective) -> None:
                append_jsonl(trace, records)
                done.update({(objective, r["item_id"]): r for r in records})

            if ray is not None:
                from flexsearch.distributed import search_on_ray

                retries += search_on_ray(todo, config, target, objective, keep, bar, **ray)
            else:
                run_search(todo, build_context(config, scorer, objective), objective, progress=bar,
                           on_batch_done=lambda batch: keep([o.to_record() for o in batch]))
    rows = [split_row(done[(config.objective, it.id)], it,
                      render(replay(it, done[(config.objective, it.id)]["chain"],
                                    tuple(done[(config.objective, it.id)]["option_order"])),
                             scorer.target.tokenizer, scorer.fmt)) for it in items]
    atomic_write_jsonl(out / "split.jsonl", rows)
    atomic_write_text(out / "split.csv", split_csv_text(rows))
    arrays = {o: _outcome_arrays(o, [done[(o, it.id)] for it in items]) for o in objectives}
    letters = scorer.score([Candidate.root(it) for it in items]).letters  # cached: no new queries
    score = {
        "data": data, "model": scorer.target.info, "items": len(items),
        "skipped": sum(loaded.skipped.values()), "skipped_reasons": dict(loaded.skipped),
        "method": config.method, "budget": config.budget, "average_orders": config.scoring.average_orders,
        "backend": "ray" if ray is not None else "local", "worker_retries": retries,
        **robustness_score(items, arrays[config.objective], arrays.get("anti_stereotype"), config.budget, letters),
    }
    atomic_write_json(out / "score.json", score)
    return format_search_table(score, config.objective)


def _outcome_arrays(objective: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "objective": objective,
        "clean": np.array([r["clean_probs"] for r in records]),
        "attacked": np.array([r["best_probs"] for r in records]),
        "queries": np.array([r["queries"] for r in records]),
        "first_success": [r["first_success_query"] for r in records],
    }


def evaluate_split(split: Path, out: Path, target: dict[str, Any], scoring: dict[str, Any],
                   limit: int | None = None) -> str:
    """Re-scores an emitted split's attacked prompts (and their clean versions) on another model."""
    rows = load_split(split, limit=limit)
    scorer = build_scorer(dict(target), scoring)
    items = [r.item for r in rows]
    objective = str(rows[0].record.get("objective", "stereotype"))
    atomic_write_yaml(out / "config.yaml", {"command": "evaluate", "split": str(split), "limit": limit,
                                            "model": scorer.target.info, "scoring": scoring})
    clean = score_all(scorer, [Candidate.root(it) for it in items], desc="clean")
    attacked = score_all(scorer, [r.candidate for r in rows], desc="attacked")
    arrays = {"objective": objective, "clean": clean.probs, "attacked": attacked.probs}
    score = {"split": str(split), "model": scorer.target.info, "items": len(items),
             **robustness_score(items, arrays, None, None, clean.letters), "queries": scorer.queries}
    atomic_write_json(out / "score.json", score)
    atomic_write_jsonl(out / "predictions.jsonl", [
        {**row, "attacked_probs": [round(float(p), 6) for p in probs]}
        for row, probs in zip(prediction_rows(items, clean), attacked.probs, strict=True)])
    return format_search_table(score, objective)


def format_search_table(score: dict[str, Any], objective: str) -> str:
    """Headline and per-category table of a search (or a re-scored split)."""
    columns = [("clean acc", ("clean", "accuracy")), ("attacked acc", ("attacked", "accuracy")),
               ("ASR", (objective, "asr")), ("P(target) shift", (objective, "mean_p_target_shift"))]
    if "fairness_gap" in score:
        columns += [("control ASR", ("anti_stereotype", "asr")), ("gap", ("fairness_gap",))]
    flat = {"n_items": score["items"], "letter_bias": score["clean"].get("letter_bias", {}),
            **{header: dig(score, path) for header, path in columns},
            "per_category": {
                cat: {"n_items": block["clean"]["n_items"], "letter_bias": block["clean"].get("letter_bias", {}),
                      **{header: dig(block, path) for header, path in columns}}
                for cat, block in score["per_category"].items()}}
    lines = [format_table(flat, [(h, h) for h, _ in columns])]
    clean = score["clean"]
    lines.append(f"confounds: letter bias A/B/C {'/'.join(f'{v:.2f}' for v in clean.get('letter_bias', {}).values())}"
                 f", disambiguated accuracy {metric_text(clean['accuracy_disambig'])}"
                 f", abstention {metric_text(clean['abstention_rate'])}")
    attack = score[objective]
    if "queries" in attack:
        lines.append(f"queries per item: mean {attack['queries']['mean']:.1f}, median {attack['queries']['median']:.0f}"
                     f" (ASR over {attack['eligible_items']} items answered correctly when clean)")
    if "fairness_gap" in score:
        gap = score["fairness_gap"]
        lines.append(f"fairness gap ASR(stereotype) - ASR(anti-stereotype): {metric_text(gap)}"
                     " — a gap near 0 means the model is merely easy to push, not biased")
    return "\n".join(lines)


def mutate(data: str, item_ref: str, operator: str, n: int, settings: list[str], seed: int) -> str:
    """Accepted mutations of one item (default constraints applied), one block per mutation."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
    from flexsearch.config import SearchConfig, apply_override

    items = load_items(data).items
    chosen = next((it for it in items if it.id == item_ref), None)
    if chosen is None and item_ref.isdigit() and int(item_ref) < len(items):
        chosen = items[int(item_ref)]
    if chosen is None:
        raise FlexsearchError(f"no item '{item_ref}' in {data}")
    spec: dict[str, Any] = {"name": operator}
    for assignment in settings:
        apply_override(spec, assignment)
    resources = AttackResources()
    op = build(OPERATORS, spec, resources)
    constraints = [build(CONSTRAINTS, c, resources) for c in SearchConfig().constraints]
    rng = np.random.default_rng(seed)
    root = Candidate.root(chosen)
    accepted: list[Candidate] = []
    for _ in range(20):  # operators sample; ask a few times to gather n distinct accepted mutations
        proposals = op.propose(root, rng)
        for constraint in constraints:
            proposals = [c for c, ok in zip(proposals, constraint.accept(proposals), strict=True) if ok]
        accepted += [c for c in proposals if c.edits[-1] not in [a.edits[-1] for a in accepted]]
        if len(accepted) >= n:
            break
    lines = [f"item {chosen.id} ({chosen.category}, {chosen.condition}/{chosen.polarity})",
             f"  context:  {chosen.context}", f"  question: {chosen.question}", ""]
    for k, c in enumerate(accepted[:n], start=1):
        e = c.edits[-1]
        where = e.field if e.position is None else f"{e.field}[{e.position}]"
        lines.append(f"{k:2d}. {where}: {e.before!r} -> {e.after!r} {dict(e.args)}")
    if not accepted:
        lines.append("no mutation passed the constraints")
    return "\n".join(lines)


def compare(run_a: Path, run_b: Path, out: Path | None) -> str:
    """Paired comparison of two run directories; writes compare.json/.md under `out` when given."""
    from flexsearch.compare import compare_runs, format_comparison

    result = compare_runs(run_a, run_b)
    text = format_comparison(result)
    if out is not None:
        atomic_write_json(out / "compare.json", result)
        atomic_write_text(out / "compare.md", f"```\n{text}\n```\n")
    return text
