"""`flexsearch tune`: Optuna studies over search configurations, for attack-research ablations.

A trial is a search (stereotype objective, no control) on a development slice of items with a fixed
per-item query budget; its value is ASR, ties broken toward fewer queries. Only attack-eligible items
(clean answer correct, gold answer not the stereotyped one) enter the development and held-out
slices, since no other item can move ASR. The search space is a YAML file (configs/tune/*.yaml):

    base: default              # the preset each trial starts from
    sampler: tpe               # or grid: every combination of categorical params, once (ablations)
    pruning: true              # stop clearly bad trials after a few item batches
    params:
      method: {categorical: [greedy, beam, evolutionary]}
      beam_width: {int: [1, 4]}
      operators.persona: {categorical: [true, false]}        # an operator family on/off
      operators.persona.n: {int: [1, 4]}                     # one of its settings
      constraints.similarity.threshold: {float: [0.6, 0.95]}

The study lives in an SQLite file in the run directory (rerunning continues it) or in any Optuna
RDB storage given by --storage, which several worker processes or machines can share.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy
from tqdm.auto import tqdm

from flexsearch.config import SearchConfig, load_config, packaged_yaml, preset_path, read_yaml
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item
from flexsearch.engine.loop import build_context, run_search
from flexsearch.engine.state import ItemOutcome
from flexsearch.errors import FlexsearchError
from flexsearch.files import atomic_write_json, atomic_write_text, atomic_write_yaml
from flexsearch.objectives import Objective, attack_eligible, get_objective
from flexsearch.results.differences import rate_difference
from flexsearch.results.metrics import metric_text, proportion
from flexsearch.scoring.scorer import Scorer, build_scorer

STUDY_NAME = "flexsearch"
QUERY_TIE_BREAK = 1e-3  # value = ASR − this × mean queries / budget: equal ASR, fewer queries wins


def load_space(name_or_path: str) -> dict[str, Any]:
    path = packaged_yaml(name_or_path, "tune", "tuning space")
    space, _ = read_yaml(path)
    if not isinstance(space, dict) or not isinstance(space.get("params"), dict) or not space["params"]:
        raise FlexsearchError(f"{path}: expected a 'params' mapping")
    for name, spec in space["params"].items():
        if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("categorical", "int", "float")):
            raise FlexsearchError(f"{path}: param '{name}' must be {{categorical: [...]}}, {{int: [lo, hi]}} "
                                  "or {float: [lo, hi]}")
    if space.setdefault("sampler", "tpe") not in ("tpe", "grid"):
        raise FlexsearchError(f"{path}: sampler must be 'tpe' or 'grid', not {space['sampler']!r}")
    if space["sampler"] == "grid" and any("categorical" not in spec for spec in space["params"].values()):
        raise FlexsearchError(f"{path}: the grid sampler needs every param to be categorical")
    if not isinstance(space.setdefault("pruning", True), bool):
        raise FlexsearchError(f"{path}: pruning must be true or false")
    preset_path(space.get("base", "default"))  # fail early on an unknown base preset
    return space


def suggest(trial: optuna.Trial, params: dict[str, Any]) -> dict[str, Any]:
    values = {}
    for name, spec in params.items():
        kind, bounds = next(iter(spec.items()))
        if kind == "categorical":
            values[name] = trial.suggest_categorical(name, bounds)
        elif kind == "int":
            values[name] = trial.suggest_int(name, *bounds)
        else:
            values[name] = trial.suggest_float(name, *bounds)
    return values


def apply_params(base: SearchConfig, values: dict[str, Any]) -> SearchConfig:
    """Maps sampled values onto a search config: top-level fields, `operators.NAME` (family on/off),
    `operators.NAME.SETTING` and `constraints.NAME.SETTING`."""
    data = asdict(base)
    specs = {kind: data[kind] for kind in ("operators", "constraints")}  # asdict made them copies
    dropped: set[str] = set()
    for key, value in values.items():
        kind, _, rest = key.partition(".")
        if kind in specs and rest:
            name, _, setting = rest.partition(".")
            entry = next((s for s in specs[kind] if s["name"] == name), None)
            if entry is None:
                raise FlexsearchError(f"tuning param '{key}': the base config has no {kind[:-1]} '{name}'")
            if setting:
                entry[setting] = value
            elif value is False:
                dropped.add(name)
        elif key in data and key not in ("operators", "constraints", "scoring"):
            data[key] = value
        else:
            raise FlexsearchError(f"tuning param '{key}' does not name a search setting")
    data["operators"] = [s for s in specs["operators"] if s["name"] not in dropped]
    data["constraints"] = specs["constraints"]
    if not data["operators"]:
        raise optuna.TrialPruned("every operator family is switched off")
    return load_config(None, None, **{k: v for k, v in data.items() if k != "scoring"},
                       scoring=data["scoring"])


@dataclass
class ConfigScore:
    """A config's attack on a slice: per-item success over eligible items, and mean queries per item."""

    wins: dict[str, bool]
    mean_queries: float

    @property
    def asr(self) -> float:
        return float(np.mean(list(self.wins.values()))) if self.wins else 0.0

    def asr_interval(self) -> dict[str, Any]:
        return proportion(list(self.wins.values()))


def score_outcomes(outcomes: list[ItemOutcome], objective: Objective) -> ConfigScore:
    wins = {o.item.id: o.success for o in outcomes if attack_eligible(objective, o.item, o.clean_probs)}
    return ConfigScore(wins, float(np.mean([o.queries for o in outcomes])) if outcomes else 0.0)


def evaluate_config(config: SearchConfig, scorer: Scorer, items: list[Item], desc: str,
                    trial: optuna.Trial | None = None, prune: bool = True) -> ConfigScore:
    """Runs a search with a fresh cache (so every trial pays for its own queries); with a trial,
    reports ASR after each batch of items and, if `prune`, stops early when the pruner says so."""
    ctx = build_context(config, scorer.fresh(), "stereotype")
    outcomes: list[ItemOutcome] = []

    def after_batch(batch: list[ItemOutcome]) -> None:
        outcomes.extend(batch)
        if trial is not None:
            asr = score_outcomes(outcomes, ctx.objective).asr
            trial.report(asr, step=len(outcomes))
            if prune and trial.should_prune():
                raise optuna.TrialPruned(f"ASR {asr:.2f} after {len(outcomes)} items")

    with tqdm(total=len(items), desc=desc, unit="item") as progress:
        run_search(items, ctx, "stereotype", on_batch_done=after_batch, progress=progress)
    return score_outcomes(outcomes, ctx.objective)


def eligible_slices(items: list[Item], scorer: Scorer, dev: int, holdout: int, seed: int,
                    chunk: int = 32) -> tuple[list[Item], list[Item], int]:
    """Development and held-out items, drawn in a seeded random order from the attack-eligible ones;
    clean prompts are scored a chunk at a time until enough are found. Returns (dev, held, scored)."""
    objective = get_objective("stereotype")
    order = np.random.default_rng(seed).permutation(len(items))
    found: list[Item] = []
    scored = 0
    while len(found) < dev + holdout and scored < len(items):
        batch = [items[i] for i in order[scored : scored + chunk]]
        probs = scorer.score([Candidate.root(item) for item in batch]).probs
        found += [item for item, p in zip(batch, probs, strict=True) if attack_eligible(objective, item, p)]
        scored += len(batch)
    if len(found) < dev + holdout:
        raise FlexsearchError(f"{dev} development + {holdout} held-out items requested, but only {len(found)} of "
                              f"{len(items)} are attack-eligible (clean answer correct, gold answer not the "
                              "stereotyped one); ask for fewer or give more data")
    return found[:dev], found[dev : dev + holdout], scored


def sampler_for(space: dict[str, Any], seed: int) -> optuna.samplers.BaseSampler:
    if space["sampler"] == "grid":
        grid = {name: spec["categorical"] for name, spec in space["params"].items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def open_study(url: str, sampler: optuna.samplers.BaseSampler, warmup_items: int) -> optuna.Study:
    """Creates or joins the study. SQLite gets a long lock timeout, and creation is retried, because
    several workers may open the same new file at once."""
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    attempt = 0
    while True:
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine)
            return optuna.create_study(
                study_name=STUDY_NAME, storage=storage, load_if_exists=True, direction="maximize",
                sampler=sampler,
                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup_items))
        except sqlalchemy.exc.SQLAlchemyError:
            attempt += 1
            if attempt == 5:
                raise
            time.sleep(0.5 * attempt)


def run_study(target: dict[str, Any], items: list[Item], space: dict[str, Any], out: Path, *, trials: int,
              budget: int, storage: str | None = None, dev_items: int = 12, holdout_items: int = 8,
              seed: int = 0, holdout: bool = True) -> dict[str, Any]:
    """Runs (or continues) the study on `target` (api.Target's arguments: a model loaded in process, or served)
    until it holds `trials` finished trials (a grid stops when it is exhausted), then writes the outputs."""
    base = load_config(space.get("base", "default"), budget=budget, control=False, seed=seed)
    scorer = build_scorer(target, asdict(base.scoring))
    out.mkdir(parents=True, exist_ok=True)
    dev, held, scored = eligible_slices(items, scorer.fresh(), dev_items,
                                        holdout_items if holdout else 0, seed)
    study = open_study(storage or f"sqlite:///{(out / 'study.db').resolve()}", sampler_for(space, seed),
                       base.item_batch)

    def objective(trial: optuna.Trial) -> float:
        config = apply_params(base, suggest(trial, space["params"]))
        result = evaluate_config(config, scorer, dev, f"trial {trial.number}", trial, prune=space["pruning"])
        interval = result.asr_interval()
        trial.set_user_attr("asr", result.asr)
        trial.set_user_attr("asr_ci", interval["ci"])
        trial.set_user_attr("eligible", len(result.wins))
        trial.set_user_attr("mean_queries", result.mean_queries)
        return result.asr - QUERY_TIE_BREAK * result.mean_queries / budget

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    study.optimize(objective, n_trials=trials,
                   callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished)])
    slices = {"items_scored_for_eligibility": scored, "dev_items": len(dev), "holdout_items": len(held)}
    return write_outputs(study, base, scorer, held, out, slices)


def holdout_check(tuned: SearchConfig, base: SearchConfig, scorer: Scorer, held: list[Item]) -> dict[str, Any]:
    """The tuned and the `default` config on items tuning never saw, with the paired difference."""
    default = load_config("default", budget=base.budget, control=False, seed=base.seed)
    tuned_score = evaluate_config(tuned, scorer, held, "held-out, tuned")
    # A tuned config equal to the preset would give the same searches again.
    default_score = (tuned_score if asdict(tuned) == asdict(default)
                     else evaluate_config(default, scorer, held, "held-out, default"))
    both = [i for i in tuned_score.wins if i in default_score.wins]
    return {"items": len(held), "tuned_asr": tuned_score.asr_interval(), "tuned_mean_queries": tuned_score.mean_queries,
            "default_asr": default_score.asr_interval(), "default_mean_queries": default_score.mean_queries,
            # paired over the items eligible for both: Tango's interval and the exact McNemar test
            "tuned_minus_default": rate_difference(np.array([tuned_score.wins[i] for i in both], dtype=bool),
                                                   np.ones(len(both), dtype=bool),
                                                   np.array([default_score.wins[i] for i in both], dtype=bool),
                                                   np.ones(len(both), dtype=bool))}


def trials_csv(study: optuna.Study) -> str:
    names = sorted({p for t in study.trials for p in t.params})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["number", "state", "value", "asr", "asr_low", "asr_high", "eligible", "mean_queries", *names])
    for t in study.trials:
        low, high = t.user_attrs.get("asr_ci", [None, None])
        writer.writerow([t.number, t.state.name, t.value, t.user_attrs.get("asr"), low, high,
                         t.user_attrs.get("eligible"), t.user_attrs.get("mean_queries"),
                         *(t.params.get(n) for n in names)])
    return buffer.getvalue()


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """Complete trials, best ASR first: what each configuration changed and what it achieved."""
    rows = [{"trial": t.number, "params": t.params, "eligible": t.user_attrs.get("eligible"),
             "asr": {"value": t.user_attrs.get("asr"), "ci": t.user_attrs.get("asr_ci", [None, None]),
                     "n": t.user_attrs.get("eligible")},
             "mean_queries": t.user_attrs.get("mean_queries")}
            for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return sorted(rows, key=lambda r: (-(r["asr"]["value"] or 0.0), r["mean_queries"] or 0.0))


def write_outputs(study: optuna.Study, base: SearchConfig, scorer: Scorer, held: list[Item], out: Path,
                  slices: dict[str, int]) -> dict[str, Any]:
    atomic_write_text(out / "trials.csv", trials_csv(study))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise FlexsearchError("no trial completed (all were pruned or failed); widen the space or add trials")
    best = study.best_trial
    best_config = apply_params(base, best.params)
    atomic_write_yaml(out / "best_config.yaml", asdict(best_config))
    summary: dict[str, Any] = {
        "trials": len(study.trials), "complete": len(complete), "budget": base.budget, **slices,
        "best_trial": best.number, "best_params": best.params, "tuning_asr": best.user_attrs.get("asr"),
        "tuning_mean_queries": best.user_attrs.get("mean_queries"), "ranking": trial_rows(study),
    }
    if held:
        summary["holdout"] = holdout_check(best_config, base, scorer, held)
    importances: dict[str, float] = {}
    if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        importances = {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()
                       if math.isfinite(v)}
    summary["param_importances"] = importances
    atomic_write_json(out / "tune.json", summary)
    atomic_write_text(out / "report.html", tune_report(study, summary))
    return summary


def params_text(params: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    return text or "(base config)"


def format_tune_table(summary: dict[str, Any]) -> str:
    """The ranking of complete trials and the held-out check, as plain text."""
    lines = [f"{summary['complete']} of {summary['trials']} trials complete; budget {summary['budget']} prompts/item; "
             f"{summary['dev_items']} development items",
             f"{'trial':>5}  {'ASR [95% CI]':<20} {'queries':>7}  params"]
    lines += [f"{r['trial']:>5}  {metric_text(r['asr']):<20} {r['mean_queries']:>7.1f}  {params_text(r['params'])}"
              for r in summary["ranking"]]
    held = summary.get("holdout")
    if held:
        lines.append(f"held-out ({held['items']} items): tuned {metric_text(held['tuned_asr'])}, default preset "
                     f"{metric_text(held['default_asr'])}, tuned − default {metric_text(held['tuned_minus_default'])}")
    return "\n".join(lines)


def tune_report(study: optuna.Study, summary: dict[str, Any]) -> str:
    """A self-contained page: optimisation history, parameter importances, the held-out check."""
    import html

    from flexsearch.results.report import png

    values = [(t.number, t.value) for t in study.trials if t.value is not None]

    def history(ax) -> None:
        if values:
            xs, ys = zip(*values, strict=True)
            ax.plot(xs, ys, "o", label="trial")
            ax.plot(xs, np.maximum.accumulate(ys), "-", label="best so far")
        ax.set_xlabel("trial")
        ax.set_ylabel("objective (ASR, ties → fewer queries)")
        ax.legend(fontsize=7)

    def importance(ax) -> None:
        names = list(summary["param_importances"])
        ax.barh(names, [summary["param_importances"][n] for n in names])
        ax.set_xlabel("importance (Optuna's default evaluator, normalised)")

    rows = "".join(f"<tr><td>{r['trial']}</td><td>{html.escape(params_text(r['params']))}</td>"
                   f"<td>{metric_text(r['asr'])}</td><td>{r['eligible']}</td><td>{r['mean_queries']:.1f}</td></tr>"
                   for r in summary["ranking"])
    held = summary.get("holdout")
    held_text = ("No held-out check." if not held else
                 f"Held-out ASR on {held['items']} items tuning never saw: tuned config "
                 f"{metric_text(held['tuned_asr'])}, default preset {metric_text(held['default_asr'])}, "
                 f"tuned − default {metric_text(held['tuned_minus_default'])} (paired: Tango's interval). "
                 f"Tuning ASR of the tuned config: {summary['tuning_asr']:.2f}.")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>flexsearch tune</title></head>"
            "<body style='font-family:sans-serif;max-width:900px;margin:2em auto'><h1>flexsearch tune</h1>"
            f"<p>{summary['complete']} of {summary['trials']} trials complete at {summary['budget']} prompts per item "
            f"on {summary['dev_items']} development items; best trial {summary['best_trial']}.</p>"
            f"<p>{html.escape(held_text)}</p>"
            "<h2>Trials, best first</h2><table border='1' cellpadding='4' style='border-collapse:collapse'>"
            "<tr><th>trial</th><th>params</th><th>ASR [95% CI]</th><th>eligible items</th><th>mean queries</th></tr>"
            f"{rows}</table>"
            f"<h2>Optimisation history</h2><img alt='history' src='data:image/png;base64,{png(history)}'>"
            f"<h2>Parameter importances</h2><img alt='importances' src='data:image/png;base64,{png(importance)}'>"
            "</body></html>")
