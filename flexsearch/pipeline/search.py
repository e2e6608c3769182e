"""`flexsearch search` as a pipeline: the settings checked against the target and the data, the run directory
opened, every (objective, item) searched with its trace as the resume point, then the split, the family split, the
learner, the score and the audit written."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.attacks.base import availability_problems
from flexsearch.config import SearchConfig, check_budget, config_dict
from flexsearch.data.audit import audit_rows
from flexsearch.data.candidate import Candidate, chain_edits, forced_in_place, replay
from flexsearch.data.items import Item, load_items, source_sha256
from flexsearch.engine.families import FAMILIES, FLEX_NAMES, family_record
from flexsearch.engine.learner import Learner, Prior, learner_document, read_prior, rebuilt
from flexsearch.engine.loop import build_context, proposable_arms, run_search, unreachable_families
from flexsearch.errors import FlexsearchError, Interrupted
from flexsearch.files import append_jsonl, atomic_write_json, atomic_write_jsonl, atomic_write_text
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.pipeline.evaluate import score_all
from flexsearch.pipeline.run import fitting_items, opened_run
from flexsearch.pipeline.target import RayOptions, Target
from flexsearch.results import RunResult, Score
from flexsearch.results.diversity import diversity, minilm_encoder
from flexsearch.results.metrics import (
    clean_metrics,
    family_scores,
    perturbed_word_share,
    robustness_score,
)
from flexsearch.results.printing import format_search_table
from flexsearch.results.run_dir import RunDirectory, config_fingerprint, read_trace
from flexsearch.results.run_files import (
    FAMILY_CSV,
    FAMILY_JSONL,
    FORCED_CSV,
    FORCED_JSONL,
    LEARNER,
    RESEARCH_CSV,
    RESEARCH_JSONL,
    SPLIT_CSV,
    SPLIT_FILES,
    SPLIT_JSONL,
    TRACE,
)
from flexsearch.results.split import split_csv_text, split_row
from flexsearch.results.weak_spots import weak_spots
from flexsearch.scoring.scorer import Scorer


def run_search_command(data: str, target: Target, run_dir: Path, resolved_config: SearchConfig,
                       overrides: Sequence[str], limit: int | None, ray: RayOptions | None,
                       capability: str | None) -> RunResult:
    """Runs (or resumes) a search of `data` into `run_dir` (flexsearch.api.search says what each argument means)."""
    started = time.time()
    loaded = load_items(data, limit=limit)
    capability_items = _capability_items(capability) if capability else None
    refused = target.white_box_problem(resolved_config, overrides)
    if refused:  # what the settings ask of the target comes before what they ask of the machine
        raise FlexsearchError(refused)
    missing = availability_problems(resolved_config.operators)
    if missing:  # before the target model loads: say at once what this machine lacks
        raise FlexsearchError(missing[0])
    requested = target.requested(resolved_config.scoring.mode)
    served = requested.get("served", {})
    check_budget(resolved_config, per_prompt=served["samples"] if served.get("mode") == "sample" else 1,
                 items=loaded.items)
    objectives = _objectives(resolved_config)
    warm = (read_prior(resolved_config.prior, objectives, proposable_arms(resolved_config))
            if resolved_config.prior else None)
    settings = config_dict(resolved_config)
    resolved = {"command": "search", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": requested, "scoring": settings.pop("scoring"), "search": settings,
                "prior": warm.provenance if warm else None,
                "capability": {"data": capability, "sha256": source_sha256(capability)} if capability else None}
    with opened_run(run_dir, resolved, target) as (run, scorer):
        check_budget(resolved_config, per_prompt=scorer.backend.queries_per_prompt, items=loaded.items)  # sampled?
        items, skipped = fitting_items(loaded, scorer, SEARCH_PROMPT_MARGIN)
        done, retries = _search_objectives(run, items, objectives, scorer, resolved_config, target, ray,
                                           config_fingerprint(resolved), warm)
        searched = len(items) * len(objectives)
        # a Ctrl-C while the outputs are written says how to finish them too
        with _resumable(lambda: searched, searched, run.path / TRACE):
            rows = _write_split(run, items, done[resolved_config.objective], scorer)
            family_rows = _write_family_split(run, items, done[resolved_config.objective], resolved_config.objective,
                                              scorer)
            _write_learner(run, items, done, warm, resolved_config, scorer, data)
            measured = None
            if capability_items is not None:
                scores = score_all(scorer, [Candidate.root(it) for it in capability_items], "capability items")
                measured = {"data": capability, **clean_metrics(capability_items, scores.probs, scores.letters)}
            score = _search_score(items, done, objectives, scorer, resolved_config, data, skipped, retries, ray,
                                  measured)
            score["prior"] = warm.provenance if warm else None
            score["split_rows"] = {name: sum(split_file_of(r)[0] == jsonl for r in rows)
                                   for name, jsonl in (("benchmark", SPLIT_JSONL), ("forced_choice", FORCED_JSONL),
                                                       ("research", RESEARCH_JSONL))}
            score["split_rows"]["families"] = len(family_rows)
            score["families"] = family_block(items, done, objectives, resolved_config)
            score["diversity"] = _diversity(rows, family_rows)
            score["audit"] = audit_emitted([{**r, "file": split_file_of(r)[0]} for r in rows]
                                           + [{**r, "file": FAMILY_JSONL} for r in family_rows])
            written = run.write_score(score, started)
        files = run.files()
    return RunResult(run_dir, Score.from_dict(written), rows, format_search_table(written, resolved_config.objective),
                     files)


def _capability_items(data: str) -> list[Item]:
    """The disambiguated items of --capability DATA (refused in one line when it has none)."""
    items = [it for it in load_items(data).items if it.condition == "disambig"]
    if not items:
        raise FlexsearchError(f"--capability {data}: no disambiguated items (the context must name the person: "
                              "BBQ's context_condition disambig)")
    return items


SEARCH_PROMPT_MARGIN = 64  # tokens left free under the context limit for instructions and word edits


def _objectives(config: SearchConfig) -> list[str]:
    """The searched objective, then the counter-stereotype control when asked for."""
    if config.control and config.objective != "anti_stereotype":
        return [config.objective, "anti_stereotype"]
    return [config.objective]


def _search_objectives(run: RunDirectory, items: list[Item], objectives: list[str], scorer: Scorer,
                       config: SearchConfig, target: Target, ray: RayOptions | None,
                       fingerprint: str, warm: Prior | None) -> tuple[dict[str, dict[str, dict[str, Any]]], int]:
    """Searches every (objective, item) the trace does not hold yet, appending each finished batch to
    the trace (the resume point), each record stamped with the run's config fingerprint; each objective's
    learner starts from the prior and learns from the finished items too. Returns objective → item id →
    outcome record, and Ray's retries."""
    trace = run.path / TRACE
    done: dict[str, dict[str, dict[str, Any]]] = {o: {} for o in objectives}
    for record in read_trace(trace, repair=True, fingerprint=fingerprint):
        if record["objective"] in done:
            done[record["objective"]][record["item_id"]] = record
    retries = 0
    total = len(items) * len(objectives)
    wanted = {(o, it.id) for o in objectives for it in items}

    def kept() -> int:  # read back from the trace: a Ctrl-C may land between an append and the book-keeping
        return len(wanted & {(r["objective"], r["item_id"]) for r in read_trace(trace)})

    with tqdm(total=total, desc=f"search ({' + control '.join(objectives)})", unit="item") as bar, \
            _resumable(kept, total, trace):
        bar.update(sum(it.id in done[o] for o in objectives for it in items))
        for objective in objectives:
            if all(it.id in done[objective] for it in items):
                continue
            learner = warm.for_objective(objective).copy() if warm else Learner()

            def keep(records: list[dict[str, Any]], objective: str = objective) -> None:
                records = [{**r, "config": fingerprint} for r in records]
                append_jsonl(trace, records)
                done[objective].update({r["item_id"]: r for r in records})

            if ray is not None:
                from flexsearch.engine.distributed import search_on_ray

                retries += search_on_ray(items, config, target.arguments(), objective, keep, bar,
                                         on_usage=scorer.backend.merge_usage, finished=dict(done[objective]),
                                         learner=learner, **asdict(ray))
            else:
                run_search(items, build_context(config, scorer, objective), objective, progress=bar,
                           on_batch_done=lambda batch: keep([o.to_record() for o in batch]),
                           finished=dict(done[objective]), learner=learner)
    return done, retries


@contextmanager
def _resumable(finished: Callable[[], int], total: int, trace: Path) -> Iterator[None]:
    """Turns Ctrl-C into Interrupted, saying how much was kept and how to go on (also once every search is done
    and the outputs are being written)."""
    try:
        yield
    except KeyboardInterrupt:
        if finished() == total:
            raise Interrupted(f"interrupted while writing the outputs; all {total} item searches are kept in {trace}: "
                              "rerun the same command to write them") from None
        raise Interrupted(f"interrupted after {finished()} of {total} item searches; the finished ones are kept in "
                          f"{trace}: rerun the same command to resume") from None


def split_file_of(row: dict[str, Any]) -> tuple[str, str]:
    """Where a row goes: the benchmark split holds natural, label-valid rows only; a row carrying an optimised
    suffix goes to split-research.*, one carrying a forced-choice template to split-forced.*."""
    if not row["natural"]:
        return RESEARCH_JSONL, RESEARCH_CSV
    return (FORCED_JSONL, FORCED_CSV) if row["forced_choice"] else (SPLIT_JSONL, SPLIT_CSV)


def _write_split(run: RunDirectory, items: list[Item], outcomes: dict[str, dict[str, Any]],
                 scorer: Scorer) -> list[dict[str, Any]]:
    """The hardest prompt per item, each row in its file (split_file_of), so the benchmark split never carries
    a forced-choice or non-natural prompt. Returns all rows."""
    rows = []
    for item in items:
        record = outcomes[item.id]
        prompt = scorer.render(replay(item, record["chain"], tuple(record["option_order"])))
        rows.append(split_row(record, item, prompt, scorer.info["prompt_format"]))
    for jsonl, csv in SPLIT_FILES:
        kept = [r for r in rows if split_file_of(r) == (jsonl, csv)]
        if kept or jsonl == SPLIT_JSONL:
            atomic_write_jsonl(run.path / jsonl, kept)
            atomic_write_text(run.path / csv, split_csv_text(kept))
    return rows


def _write_family_split(run: RunDirectory, items: list[Item], outcomes: dict[str, dict[str, Any]], objective: str,
                        scorer: Scorer) -> list[dict[str, Any]]:
    """The family split: for every attack-eligible item, its hardest label-valid prompt in each family it searched,
    FLEX's `attack` column naming the family (FLEX_NAMES), `family` ours. Returns its rows."""
    goal, rows = get_objective(objective), []
    for item in items:
        record = outcomes[item.id]
        if not attack_eligible(goal, item, np.array(record["clean_probs"])):
            continue
        for family in FAMILIES:
            if family not in (record.get("families") or {}):
                continue
            taken = family_record(record, family)
            prompt = scorer.render(replay(item, taken["chain"], tuple(taken["option_order"])))
            row = split_row(taken, item, prompt, scorer.info["prompt_format"])
            rows.append({**row, "attack": FLEX_NAMES[family], "family": family,
                         "scored_orders": record["families"][family]["orders"]})
    atomic_write_jsonl(run.path / FAMILY_JSONL, rows)
    atomic_write_text(run.path / FAMILY_CSV, split_csv_text(rows))
    return rows


def family_block(items: list[Item], done: dict[str, dict[str, dict[str, Any]]], objectives: list[str],
                 config: SearchConfig) -> dict[str, Any]:
    """score.json `families`: the searched families (config), the ASR per family (metrics.family_scores) and why a
    family was not searched where the search's operators cannot make it."""
    main = config.objective
    control = [done["anti_stereotype"][it.id] for it in items] if "anti_stereotype" in objectives and \
        main != "anti_stereotype" else None
    return {"searched_by_config": list(config.families),
            **family_scores(items, (main, [done[main][it.id] for it in items]), control, FAMILIES,
                            config.success_margin, unreachable_families(config))}


def _diversity(rows: list[dict[str, Any]], family_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """score.json `diversity`: the width measures of the benchmark split and of the family split."""
    encode = minilm_encoder()
    benchmark = [r for r in rows if split_file_of(r)[0] == SPLIT_JSONL]
    return {"benchmark": diversity(benchmark, encode), "families": diversity(family_rows, encode)}


def _write_learner(run: RunDirectory, items: list[Item], done: dict[str, dict[str, dict[str, Any]]],
                   warm: Prior | None, config: SearchConfig, scorer: Scorer, data: str) -> None:
    """learner.json: each objective's learner after every item, rebuilt from the trace (what a resume gives)."""
    states = {o: rebuilt(warm.for_objective(o) if warm else None, [records[it.id] for it in items])
              for o, records in done.items()}
    atomic_write_json(run.path / LEARNER, learner_document(states, config.method, scorer.info, data,
                                                           warm.provenance if warm else None))


def _weak_spots(items: list[Item], records: dict[str, dict[str, Any]], objective: str) -> dict[str, Any]:
    goal = get_objective(objective)
    ordered = [records[it.id] for it in items]
    eligible = [attack_eligible(goal, it, np.array(r["clean_probs"])) for it, r in zip(items, ordered, strict=True)]
    return weak_spots(ordered, eligible, [it.category for it in items])


def _search_score(items: list[Item], done: dict[str, dict[str, dict[str, Any]]], objectives: list[str],
                  scorer: Scorer, config: SearchConfig, data: str, skipped: dict[str, int], retries: int,
                  ray: RayOptions | None, capability: dict[str, Any] | None) -> dict[str, Any]:
    arrays = {o: _outcome_arrays(o, items, [done[o][it.id] for it in items]) for o in objectives}
    letters = scorer.score([Candidate.root(it) for it in items]).letters  # cached: no new queries
    return {
        "data": data, "model": scorer.info, "items": len(items),
        "skipped": sum(skipped.values()), "skipped_reasons": skipped,
        "method": config.method, "budget": config.budget, "seed": config.seed,
        "average_orders": config.scoring.average_orders, "queries_per_candidate": scorer.queries_per_candidate,
        "backend": "ray" if ray is not None else "local", "worker_retries": retries,
        "success_margin": config.success_margin, **scorer.served_usage(),
        "weak_spots": _weak_spots(items, done[config.objective], config.objective),
        # items whose search scored nothing but the clean prompt, which had not already reached the aim (a search
        # stops there on success): the budget never reached an operator
        "untried_items": {o: sum(done[o][it.id]["queries"] <= scorer.queries_per_candidate
                                 and not done[o][it.id]["success"] for it in items) for o in objectives},
        **robustness_score(items, arrays[config.objective], arrays.get("anti_stereotype"), config.budget, letters,
                           config.success_margin, capability),
    }


def _outcome_arrays(objective: str, items: list[Item], records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "objective": objective,
        "forced": np.array([forced_in_place(chain_edits(r["chain"])) for r in records], dtype=bool),
        "perturbed": np.array([perturbed_word_share(it, r["chain"]) for it, r in zip(items, records, strict=True)]),
        "clean": np.array([r["clean_probs"] for r in records]),
        "attacked": np.array([r["best_probs"] for r in records]),
        "queries": np.array([r["queries"] for r in records]),
        "first_success": [r["first_success_query"] for r in records],
    }


def audit_emitted(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """audit_rows over every emitted row (each naming its file), with the benchmark split's count apart."""
    return {**audit_rows(rows), "benchmark": audit_rows([r for r in rows if r["file"] == SPLIT_JSONL], show=0)}
