"""The Python API behind the CLI: each command is one function here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.candidate import Candidate, replay
from flexsearch.config import ScoringConfig, SearchConfig, config_dict
from flexsearch.errors import FlexsearchError
from flexsearch.evaluate import CLEAN_COLUMNS, evaluate_items, format_table, prediction_rows, score_all
from flexsearch.items import LoadResult, load_items, source_sha256
from flexsearch.metrics import dig, metric_text
from flexsearch.model import load_target, requested_model
from flexsearch.render import render
from flexsearch.runio import (
    PREDICTIONS,
    SCORE,
    SPLIT_CSV,
    SPLIT_JSONL,
    TRACE,
    RunDirectory,
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    read_log,
)
from flexsearch.scoring import Scorer, fit_context
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
    resolved = {"command": "evaluate", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": requested_model(target), "scoring": scoring}
    with _opened_run(out, resolved, target, scoring) as (_, scorer):
        items, too_long = fit_context(loaded.items, scorer, 0)
        skipped = loaded.skipped + too_long
        counts = {"skipped": sum(skipped.values()), "skipped_reasons": dict(skipped)}
        score = evaluate_items(scorer, items, out, extra={"data": data, **counts, "model": scorer.target.info})
    lines = [format_table(score, CLEAN_COLUMNS)]
    lines.append(f"items: {len(items)} scored, {counts['skipped']} skipped"
                 + "".join(f"\n  {n} × {why}" for why, n in skipped.items()))
    return "\n".join(lines)


@contextmanager
def _opened_run(out: Path, resolved: dict[str, Any], target: dict[str, Any],
                scoring: dict[str, Any]) -> Iterator[tuple[RunDirectory, Scorer]]:
    """Checks the run directory (before the model loads), locks it, loads the scorer and records the
    resolved settings: a new run writes config.yaml, a resumed one must match it on every key."""
    command = resolved["command"]
    run = RunDirectory(out, command)
    resuming = run.check(resolved)
    with run:
        scorer = build_scorer(dict(target), scoring)
        resolved.update(model=scorer.target.info, versions=_versions())
        if resuming:
            run.check(resolved, model_loaded=True)
        if not resuming or command != "search":
            run.write_config(resolved)
        yield run, scorer


def registries() -> dict[str, dict[str, str]]:
    """Name → one-line description of everything registered, by kind."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS
    from flexsearch.finetune import POLICIES
    from flexsearch.model import ALIAS_DESCRIPTIONS
    from flexsearch.objectives import OBJECTIVES
    from flexsearch.search import METHODS

    return {"model aliases": dict(ALIAS_DESCRIPTIONS), "label policies (finetune)": POLICIES.describe(),
            "operators": OPERATORS.describe(), "constraints": CONSTRAINTS.describe(),
            "objectives": OBJECTIVES.describe(),
            "search methods": {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in METHODS.items()}}


def _versions() -> dict[str, str]:
    import platform

    import torch
    import transformers

    import flexsearch

    return {"flexsearch": flexsearch.__version__, "torch": str(torch.__version__),
            "transformers": transformers.__version__, "python": platform.python_version()}


def search(data: str, out: Path, target: dict[str, Any], config: SearchConfig,
           limit: int | None = None, ray: dict[str, Any] | None = None) -> str:
    """Runs (or resumes) a search into `out`; writes the split and the score; returns a summary.

    With `ray` (search_on_ray's keyword options) the items are searched by Ray workers; the run
    directory, and so resume, is the same either way."""
    loaded = load_items(data, limit=limit)
    resolved = {"command": "search", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": requested_model(target), "search": config_dict(config)}
    with _opened_run(out, resolved, target, asdict(config.scoring)) as (run, scorer):
        return _search_in(run, loaded, scorer, config, target, data, ray)


SEARCH_PROMPT_MARGIN = 64  # tokens left free under the context limit for instructions and word edits


def _search_in(run: RunDirectory, loaded: LoadResult, scorer: Scorer, config: SearchConfig,
               target: dict[str, Any], data: str, ray: dict[str, Any] | None) -> str:
    out = run.path
    trace = out / TRACE
    done = {(r["objective"], r["item_id"]): r for r in read_log(trace, repair=True) if r.get("kind") == "item"}
    objectives = [config.objective]
    if config.control and config.objective != "anti_stereotype":
        objectives.append("anti_stereotype")
    items, too_long = fit_context(loaded.items, scorer, SEARCH_PROMPT_MARGIN)
    skipped = loaded.skipped + too_long
    retries = 0
    with tqdm(total=len(items) * len(objectives), desc=f"search ({'+'.join(objectives)})", unit="item") as bar:
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
    atomic_write_jsonl(out / SPLIT_JSONL, rows)
    atomic_write_text(out / SPLIT_CSV, split_csv_text(rows))
    arrays = {o: _outcome_arrays(o, [done[(o, it.id)] for it in items]) for o in objectives}
    letters = scorer.score([Candidate.root(it) for it in items]).letters  # cached: no new queries
    score = {
        "data": data, "model": scorer.target.info, "items": len(items),
        "skipped": sum(skipped.values()), "skipped_reasons": dict(skipped),
        "method": config.method, "budget": config.budget, "average_orders": config.scoring.average_orders,
        "backend": "ray" if ray is not None else "local", "worker_retries": retries,
        **robustness_score(items, arrays[config.objective], arrays.get("anti_stereotype"), config.budget, letters),
    }
    atomic_write_json(out / SCORE, score)
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
    resolved = {"command": "evaluate", "split": str(split), "data_sha256": source_sha256(str(split)),
                "limit": limit, "model": requested_model(target), "scoring": scoring}
    with _opened_run(out, resolved, target, scoring) as (_, scorer):
        total = len(rows)
        rows = [r for r in rows if scorer.fits(Candidate.root(r.item)) and scorer.fits(r.candidate)]
        if not rows:
            raise FlexsearchError(f"{split}: every row is longer than the model's context")
        items = [r.item for r in rows]
        objective = str(rows[0].record.get("objective", "stereotype"))
        clean = score_all(scorer, [Candidate.root(it) for it in items], desc="clean")
        attacked = score_all(scorer, [r.candidate for r in rows], desc="attacked")
        arrays = {"objective": objective, "clean": clean.probs, "attacked": attacked.probs}
        dropped = total - len(rows)
        score = {"split": str(split), "model": scorer.target.info, "items": len(items),
                 "skipped": dropped, "skipped_reasons": {f"prompt over {scorer.max_prompt_tokens} tokens": dropped}
                 if dropped else {}, **robustness_score(items, arrays, None, None, clean.letters),
                 "queries": scorer.queries}
        atomic_write_json(out / SCORE, score)
        atomic_write_jsonl(out / PREDICTIONS, [
            {**row, "attacked_probs": [round(float(p), 6) for p in probs]}
            for row, probs in zip(prediction_rows(items, clean), attacked.probs, strict=True)])
    return format_search_table(score, objective)


def format_search_table(score: dict[str, Any], objective: str) -> str:
    """Headline and per-category table of a search (or a re-scored split)."""
    columns = [("clean acc", ("clean", "accuracy")), ("attacked acc", ("attacked", "accuracy")),
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
    if "verdict" in score:
        lines.append(f"verdict: {score['verdict']['verdict']} ({score['verdict']['reason']})")
    return "\n".join(lines)


def mutate(data: str, item_ref: str, operator: str, n: int, settings: list[str], seed: int) -> str:
    """Accepted mutations of one item (default constraints applied), one block per mutation."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
    from flexsearch.config import Origins, SearchConfig, apply_override, check_specs

    spec: dict[str, Any] = {"name": operator}
    for assignment in settings:
        apply_override(spec, assignment)
    origins = Origins()
    origins.set("operators", " ".join([f"--operator {operator}", *(f"--set {a}" for a in settings)]))
    check_specs({"operators": [spec]}, origins)  # names and setting types, before any data is read
    items = load_items(data).items
    chosen = next((it for it in items if it.id == item_ref), None)
    if chosen is None and item_ref.isdigit() and int(item_ref) < len(items):
        chosen = items[int(item_ref)]
    if chosen is None:
        raise FlexsearchError(f"--item {item_ref}: no such item id or index in {data} ({len(items)} items)")
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
