"""The typed Python API: `flexsearch.search`, `flexsearch.evaluate`, `flexsearch.compare` (and the
smaller commands). The CLI is a thin layer over these functions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from flexsearch.attacks.base import OPERATORS, availability_problems, white_box_problems
from flexsearch.attacks.constraints import editable_positions
from flexsearch.audit import audit_rows
from flexsearch.candidate import Candidate, chain_edits, forced_in_place, replay
from flexsearch.config import (
    Origins,
    ScoringConfig,
    SearchConfig,
    check_settings,
    config_dict,
    load_config,
    prompts_per_candidate,
    scoring_options,
)
from flexsearch.diversity import diversity, minilm_encoder
from flexsearch.engine.loop import build_context, constraint_specs, proposable_arms, run_search, unreachable_families
from flexsearch.errors import FlexsearchError, Interrupted
from flexsearch.evaluation import (
    CLEAN_COLUMNS,
    evaluate_items,
    format_table,
    prediction_rows,
    score_all,
)
from flexsearch.families import FAMILIES, FLEX_NAMES, family_record
from flexsearch.items import Item, LoadResult, load_items, source_sha256
from flexsearch.learner import Learner, Prior, learner_document, read_prior, rebuilt, weak_spots
from flexsearch.metrics import (
    clean_metrics,
    family_scores,
    perturbed_word_share,
    robustness_score,
)
from flexsearch.model import requested_model
from flexsearch.objectives import SUCCESS_MARGIN, attack_eligible, get_objective
from flexsearch.printing import elapsed_bar, format_search_table
from flexsearch.render import PromptFormat
from flexsearch.results import Comparison, RunResult, Score
from flexsearch.runio import (
    FAMILY_CSV,
    FAMILY_JSONL,
    FORCED_CSV,
    FORCED_JSONL,
    LEARNER,
    PREDICTIONS,
    RESEARCH_CSV,
    RESEARCH_JSONL,
    SPLIT_CSV,
    SPLIT_FILES,
    SPLIT_JSONL,
    TRACE,
    RunDirectory,
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    check_output_folder,
    config_fingerprint,
    read_jsonl,
    read_trace,
    software_versions,
)
from flexsearch.scoring import Scorer, build_scorer, fit_context
from flexsearch.served import is_served, served_options
from flexsearch.served_defaults import SERVED_DEFAULTS
from flexsearch.split import load_split, split_csv_text, split_row


@dataclass(frozen=True)
class Target:
    """The model to attack: a Hugging Face id, local directory, .gguf file or alias loaded in process, or
    `openai:NAME` served at `base_url` (an OpenAI-compatible /v1 root), with its options."""

    model: str = "smollm2"
    adapter: str | None = None
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    # a served model's (flexsearch.served; the API key comes from FLEXSEARCH_API_KEY or OPENAI_API_KEY only)
    base_url: str | None = SERVED_DEFAULTS["base_url"]
    served_mode: str | None = SERVED_DEFAULTS["served_mode"]  # auto (when None: probed) | logprobs | ... | sample
    top_logprobs: int = SERVED_DEFAULTS["top_logprobs"]
    samples: int = SERVED_DEFAULTS["samples"]
    temperature: float = SERVED_DEFAULTS["temperature"]
    concurrency: int = SERVED_DEFAULTS["concurrency"]
    request_timeout: float = SERVED_DEFAULTS["request_timeout"]
    retries: int = SERVED_DEFAULTS["retries"]
    request_cache: bool = SERVED_DEFAULTS["request_cache"]

    def arguments(self) -> dict[str, Any]:
        """The model spec and its options (build_backend's argument; also what Ray workers receive)."""
        return asdict(self)

    def requested(self, scoring_mode: str) -> dict[str, Any]:
        """What the loaded (or connected) target will record, known before: checks a served target's options."""
        served = served_options(self.arguments(), scoring_mode)
        if served is None:
            return requested_model(self.arguments())
        return {"model": self.model, "served": served.result_settings()}

    def white_box_problem(self, config: SearchConfig, overrides: Sequence[str] = ()) -> str | None:
        """Why a served target cannot run this (gradients, optimised suffixes, the target's embeddings, prefix
        key/value reuse are white-box only), or None."""
        if not is_served(self.model):
            return None
        where = f"--model {self.model} is served (black-box)"
        for option, value, instead in (("proposals", config.proposals, "sampled"),
                                       ("importance", config.importance, "leave_one_out")):
            if value == "gradient":
                return (f"{where}: {option}: gradient takes gradients of the target's weights (white-box only); "
                        f"use --set {option}={instead}")
        problems = white_box_problems(config.operators)
        if problems:
            return f"{where}: {problems[0]}"
        if any(o.replace(" ", "").lower() in ("scoring.prefix_reuse=true", "scoring.prefix_reuse=1")
               for o in overrides):
            return f"{where}: scoring.prefix_reuse reuses the target's key/value cache (white-box only; servers " \
                   "such as vLLM cache prefixes themselves)"
        return None


@dataclass(frozen=True)
class RayOptions:
    """Spread a search's items over Ray workers (each loads the model once)."""

    workers: int = 2
    address: str | None = None  # join this cluster (default: start a local one)
    gpus_per_worker: float = 0


def _target(model: str | Target) -> Target:
    return model if isinstance(model, Target) else Target(model=model)


def default_run_dir(*parts: str) -> Path:
    return Path("runs") / "-".join(Path(p).stem for p in parts)


# ---------------------------------------------------------------- search


def search(data: str = "seed", *, model: str | Target = "smollm2", out: str | Path | None = None,
           config: str | SearchConfig = "default", overrides: Sequence[str] = (), budget: int | None = None,
           method: str | None = None, objective: str | None = None, control: bool | None = None,
           seed: int | None = None, limit: int | None = None, ray: RayOptions | None = None,
           prior: str | Path | None = None, capability: str | None = None, slot: str | None = None) -> RunResult:
    """Runs (or resumes) a search into `out` and returns its score, split rows and files.

    `config` is a preset name, a YAML path or a SearchConfig; `overrides` are `key=value` strings
    as for `--set`; the keyword options override both (CLI > YAML > defaults). `prior` is an earlier run
    whose learner.json warm-starts the learner (its queries are not this run's). `slot` (scoring.slot) puts the
    attack text of chat prompts in the user turn or a system message. `capability` is BBQ-style data
    whose disambiguated items are scored clean beside the search: the verdict reads the model's capability from
    them (data without disambiguated items cannot show it)."""
    started = time.time()
    resolved_config = _search_config(config, overrides, budget=budget, method=method, objective=objective,
                                     control=control, seed=seed, prior=None if prior is None else str(prior),
                                     scoring_slot=slot)
    target = _target(model)
    run_dir = Path(out) if out is not None else default_run_dir(data, config if isinstance(config, str) else "api")
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
    _check_budget_reaches(resolved_config, loaded.items, served["samples"] if served.get("mode") == "sample" else 1)
    objectives = _objectives(resolved_config)
    warm = (read_prior(resolved_config.prior, objectives, proposable_arms(resolved_config))
            if resolved_config.prior else None)
    settings = config_dict(resolved_config)
    resolved = {"command": "search", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": requested, "scoring": settings.pop("scoring"), "search": settings,
                "prior": warm.provenance if warm else None,
                "capability": {"data": capability, "sha256": source_sha256(capability)} if capability else None}
    with _opened_run(run_dir, resolved, target) as (run, scorer):
        _check_budget_reaches(resolved_config, loaded.items, scorer.backend.queries_per_prompt)  # auto chose sample?
        items, skipped = _fitting_items(loaded, scorer, SEARCH_PROMPT_MARGIN)
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
            score["audit"] = _audit([{**r, "file": split_file_of(r)[0]} for r in rows]
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


def _check_budget_reaches(config: SearchConfig, items: list[Item], per_prompt: int) -> None:
    """Refuses, before any model loads, a greedy search whose budget cannot reach any operator on any item:
    with leave-one-out importance and word operators alone it first scores one probe per editable word
    (`per_prompt`: queries one prompt costs, the samples of a served sample mode)."""
    slot_operators = [s for s in config.operators if not OPERATORS.get(s["name"]).edits_words]
    if config.method != "greedy" or config.importance != "leave_one_out" or slot_operators or not items:
        return
    cost = prompts_per_candidate(config.scoring.average_orders) * per_prompt
    fewest = min(len(editable_positions(Candidate.root(it))) for it in items)
    needed = cost * (fewest + 2)  # the clean prompt, the probes, one edit
    if config.budget < needed:
        raise FlexsearchError(f"--budget {config.budget} cannot reach any operator: greedy word importance first "
                              f"scores one probe per editable word ({fewest} or more per item, {cost} queries "
                              f"each), so the budget must be at least {needed}")


def _search_config(config: str | SearchConfig, overrides: Sequence[str], **options: Any) -> SearchConfig:
    if isinstance(config, str):
        return load_config(config, list(overrides), **options)
    if overrides:
        raise FlexsearchError("overrides apply to a preset name or YAML path, not to a SearchConfig object")
    given, scoring = scoring_options(options)
    return replace(config, **given, scoring=replace(config.scoring, **scoring))


SEARCH_PROMPT_MARGIN = 64  # tokens left free under the context limit for instructions and word edits


def _fitting_items(loaded: LoadResult, scorer: Scorer, margin: int) -> tuple[list[Item], dict[str, int]]:
    """Items whose prompt fits the model, and the skipped ones counted by reason."""
    items, too_long = fit_context(loaded.items, scorer, margin)
    return items, dict(loaded.skipped + too_long)


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
                from flexsearch.distributed import search_on_ray

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


# ---------------------------------------------------------------- evaluate


def evaluate(data: str | None = None, *, split: str | Path | None = None, model: str | Target = "smollm2",
             out: str | Path | None = None, limit: int | None = None, mode: str = "plain", slot: str = "user",
             average_orders: bool = True, batch_size: int = 16) -> RunResult:
    """Scores items clean (`data`) or re-scores a split's attacked prompts and their clean versions
    (`split`) on a model; returns the score, per-item predictions and files. `slot` places a split's attack
    text in chat mode: in the user turn, or as the system message."""
    if (data is None) == (split is None):
        raise FlexsearchError("give exactly one of --data or --split")
    scoring = {"mode": mode, "slot": slot, "average_orders": average_orders, "batch_size": batch_size}
    origins = Origins()
    for key in scoring:
        origins.set(f"scoring.{key}", f"--{key.replace('_', '-')}")
    check_settings(ScoringConfig, scoring, origins, "scoring.")
    PromptFormat(mode=mode, slot=slot)  # a system slot without chat mode: one line, before the model loads
    target = _target(model)
    if split is not None:
        default = Path("runs") / f"{Path(split).parent.name}-on-{Path(target.model).stem}"
        run_dir = Path(out) if out is not None else default
        return _evaluate_split(Path(split), run_dir, target, scoring, limit)
    run_dir = Path(out) if out is not None else default_run_dir(str(data), "eval")
    return _evaluate_data(str(data), run_dir, target, scoring, limit)


def _evaluate_data(data: str, out: Path, target: Target, scoring: dict[str, Any], limit: int | None) -> RunResult:
    started = time.time()
    loaded = load_items(data, limit=limit)
    resolved = {"command": "evaluate", "data": data, "data_sha256": source_sha256(data), "limit": limit,
                "model": target.requested(scoring["mode"]), "scoring": scoring}
    with _opened_run(out, resolved, target) as (run, scorer):
        items, skipped = _fitting_items(loaded, scorer, 0)
        counts = {"skipped": sum(skipped.values()), "skipped_reasons": skipped}
        score, predictions = evaluate_items(scorer, items, extra={"data": data, **counts, "model": scorer.info})
        atomic_write_jsonl(out / PREDICTIONS, predictions)
        written = run.write_score(score, started)
        files = run.files()
    lines = [format_table(written, CLEAN_COLUMNS)]
    lines.append(f"items: {len(items)} scored, {counts['skipped']} skipped"
                 + "".join(f"\n  {n} × {why}" for why, n in skipped.items()))
    return RunResult(out, Score.from_dict(written), predictions, "\n".join(lines), files)


def _evaluate_split(split: Path, out: Path, target: Target, scoring: dict[str, Any], limit: int | None) -> RunResult:
    started = time.time()
    rows = load_split(split, limit=limit)
    resolved = {"command": "evaluate", "split": str(split), "data_sha256": source_sha256(str(split)),
                "limit": limit, "model": target.requested(scoring["mode"]), "scoring": scoring}
    with _opened_run(out, resolved, target) as (run, scorer):
        total = len(rows)
        rows = [r for r in rows if scorer.fits(Candidate.root(r.item)) and scorer.fits(r.candidate)]
        if not rows:
            raise FlexsearchError(f"{split}: every row is longer than the model's context")
        items = [r.item for r in rows]
        objective = str(rows[0].record.get("objective", "stereotype"))
        clean = score_all(scorer, [Candidate.root(it) for it in items], desc="clean")
        attacked = score_all(scorer, [r.candidate for r in rows], desc="attacked")
        arrays = {"objective": objective, "clean": clean.probs, "attacked": attacked.probs,
                  "forced": np.array([r.candidate.forced_choice for r in rows], dtype=bool)}
        dropped = total - len(rows)
        score = {"split": str(split), "model": scorer.info, "items": len(items),
                 "skipped": dropped, "skipped_reasons": {f"prompt over {scorer.max_prompt_tokens} tokens": dropped}
                 if dropped else {}, "success_margin": SUCCESS_MARGIN,
                 **robustness_score(items, arrays, None, None, clean.letters, SUCCESS_MARGIN),
                 "queries": scorer.queries, **scorer.served_usage()}
        predictions = [{**row, "attacked_probs": [round(float(p), 6) for p in probs]}
                       for row, probs in zip(prediction_rows(items, clean), attacked.probs, strict=True)]
        atomic_write_jsonl(out / PREDICTIONS, predictions)
        written = run.write_score(score, started)
        files = run.files()
    return RunResult(out, Score.from_dict(written), predictions, format_search_table(written, objective), files)


@contextmanager
def _opened_run(out: Path, resolved: dict[str, Any], target: Target) -> Iterator[tuple[RunDirectory, Scorer]]:
    """Checks the run directory (before the model loads), locks it, loads the scorer and records the
    resolved settings: a new run writes config.yaml, a resumed one must match it on every key."""
    command = resolved["command"]
    run = RunDirectory(out, command)
    resuming = run.check(resolved)
    with run:
        scorer = _loaded_scorer(target, resolved["scoring"])
        resolved.update(model=scorer.info, versions=software_versions())
        if resuming:
            run.check(resolved, model_loaded=True)
        if not resuming or command != "search":
            run.write_config(resolved)
        yield run, scorer


def _loaded_scorer(target: Target, scoring: dict[str, Any]) -> Scorer:
    """Loads the target under a ticking bar on a terminal: a first load (a GGUF's conversion) takes tens of
    seconds before any progress bar of the work can move. Not in logs and pipes, where a bad model's error
    stays the only line."""
    adapter = f" + adapter {target.adapter}" if target.adapter else ""
    verb, done = ("connecting to", "connected to") if is_served(target.model) else ("loading model", "loaded")
    with elapsed_bar(f"{verb} {target.model}{adapter}") as bar:
        scorer = build_scorer(target.arguments(), scoring)
        if bar is not None:
            where = (scorer.info["served"]["host"] if "served" in scorer.info
                     else f"{scorer.info.get('device')}, {scorer.info.get('dtype')}")
            bar.set_description_str(f"{done} {target.model}{adapter} ({where})")
    return scorer


def registries() -> dict[str, dict[str, str]]:
    """Name → one-line description of everything registered, by kind."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS
    from flexsearch.engine.methods import SEARCH_METHODS
    from flexsearch.model import ALIAS_DESCRIPTIONS
    from flexsearch.objectives import OBJECTIVES
    from flexsearch.policies import POLICIES

    return {"model aliases": dict(ALIAS_DESCRIPTIONS), "label policies (finetune)": POLICIES.describe(),
            "operators": OPERATORS.describe(), "constraints": CONSTRAINTS.describe(),
            "objectives": OBJECTIVES.describe(),
            "search methods": SEARCH_METHODS.describe()}


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
    # the similarity check (a sentence encoder) only judges word edits; a template operator is never slowed by it
    specs = [c for c in SearchConfig().constraints if op.edits_words or c["name"] != "similarity"]
    constraints = [build(CONSTRAINTS, c, resources) for c in constraint_specs(specs)]
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


def audit(run: str | Path) -> dict[str, Any]:
    """The label-validity audit (flexsearch/audit.py) of a search run's emitted rows: the benchmark split, the
    family split, and the forced-choice and research rows when present; `benchmark` is the split.jsonl part
    alone."""
    path = Path(run)
    if not (path / SPLIT_JSONL).is_file():
        raise FlexsearchError(f"{path}: no {SPLIT_JSONL} (not a finished search run directory)")
    emitted = [*(jsonl for jsonl, _ in SPLIT_FILES), FAMILY_JSONL]
    return _audit([{**row, "file": jsonl} for jsonl in emitted if (path / jsonl).is_file()
                   for row in read_jsonl(path / jsonl)])


def _audit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """audit_rows over every emitted row (each naming its file), with the benchmark split's count apart."""
    return {**audit_rows(rows), "benchmark": audit_rows([r for r in rows if r["file"] == SPLIT_JSONL], show=0)}


def compare(run_a: str | Path, run_b: str | Path, out: str | Path | None = None) -> Comparison:
    """Paired comparison of two run directories on their shared items; writes compare.json and
    compare.md under `out` when given."""
    from flexsearch.comparison import compare_runs, format_comparison

    result = compare_runs(Path(run_a), Path(run_b))
    text = format_comparison(result)
    files: dict[str, Path] = {}
    if out is not None:
        check_output_folder(Path(out), "--out", "compare.json", ("compare.json", "compare.md"))
        files = {"compare.json": Path(out) / "compare.json", "compare.md": Path(out) / "compare.md"}
        atomic_write_json(files["compare.json"], result)
        atomic_write_text(files["compare.md"], f"```\n{text}\n```\n")
    return Comparison(result, text, files)
