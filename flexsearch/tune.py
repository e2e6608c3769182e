"""`flexsearch tune`: Optuna studies over search configurations, for attack-research ablations.

A trial is a search (stereotype objective, no control) on a development slice of items with a fixed
per-item query budget; its value is ASR, ties broken toward fewer queries. The search space is a
YAML file (configs/tune/*.yaml):

    base: default              # the preset each trial starts from
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy
import yaml

from flexsearch.config import SearchConfig, load_config, packaged_yaml, preset_path
from flexsearch.errors import FlexsearchError
from flexsearch.items import Item
from flexsearch.model import TargetModel
from flexsearch.objectives import attack_eligible
from flexsearch.runio import atomic_write_json, atomic_write_text, atomic_write_yaml
from flexsearch.scoring import Scorer
from flexsearch.search import ItemOutcome, build_context, run_search

STUDY_NAME = "flexsearch"
QUERY_TIE_BREAK = 1e-3  # value = ASR − this × mean queries / budget: equal ASR, fewer queries wins


def load_space(name_or_path: str) -> dict[str, Any]:
    path = packaged_yaml(name_or_path, "tune", "tuning space")
    space = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(space.get("params"), dict) or not space["params"]:
        raise FlexsearchError(f"{path}: expected a 'params' mapping")
    for name, spec in space["params"].items():
        if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("categorical", "int", "float")):
            raise FlexsearchError(f"{path}: param '{name}' must be {{categorical: [...]}}, {{int: [lo, hi]}} "
                                  "or {float: [lo, hi]}")
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
    specs = {kind: [{"name": s} if isinstance(s, str) else dict(s) for s in data[kind]]
             for kind in ("operators", "constraints")}
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


def asr_of(outcomes: list[ItemOutcome], objective) -> tuple[float, float]:
    """(ASR over eligible items, mean queries)."""
    wins = [o.success for o in outcomes if attack_eligible(objective, o.item, o.clean_probs)]
    return (float(np.mean(wins)) if wins else 0.0), float(np.mean([o.queries for o in outcomes]))


def evaluate_config(config: SearchConfig, target: TargetModel, items: list[Item],
                    trial: optuna.Trial | None = None) -> tuple[float, float]:
    """Runs a search with a fresh cache (so every trial pays for its own queries); with a trial,
    reports ASR after each batch of items and stops early when the pruner says so."""
    scorer = Scorer(target, average_orders=config.scoring.average_orders, batch_size=config.scoring.batch_size,
                    prefix_reuse=config.scoring.prefix_reuse)
    ctx = build_context(config, scorer, "stereotype")
    outcomes: list[ItemOutcome] = []

    def after_batch(batch: list[ItemOutcome]) -> None:
        outcomes.extend(batch)
        if trial is not None:
            trial.report(asr_of(outcomes, ctx.objective)[0], step=len(outcomes))
            if trial.should_prune():
                raise optuna.TrialPruned(f"ASR {asr_of(outcomes, ctx.objective)[0]:.2f} after {len(outcomes)} items")

    run_search(items, ctx, "stereotype", on_batch_done=after_batch)
    return asr_of(outcomes, ctx.objective)


def dev_and_holdout(items: list[Item], dev: int, holdout: int, seed: int) -> tuple[list[Item], list[Item]]:
    order = np.random.default_rng(seed).permutation(len(items))
    if dev + holdout > len(items):
        raise FlexsearchError(f"{dev} development + {holdout} held-out items requested, {len(items)} available")
    return [items[i] for i in order[:dev]], [items[i] for i in order[dev : dev + holdout]]


def open_study(url: str, seed: int, warmup_items: int) -> optuna.Study:
    """Creates or joins the study. SQLite gets a long lock timeout, and creation is retried, because
    several workers may open the same new file at once."""
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    attempt = 0
    while True:
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine)
            return optuna.create_study(
                study_name=STUDY_NAME, storage=storage, load_if_exists=True, direction="maximize",
                sampler=optuna.samplers.TPESampler(seed=seed),
                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup_items))
        except sqlalchemy.exc.SQLAlchemyError:
            attempt += 1
            if attempt == 5:
                raise
            time.sleep(0.5 * attempt)


def run_study(target: TargetModel, items: list[Item], space: dict[str, Any], out: Path, *, trials: int,
              budget: int, storage: str | None = None, dev_items: int = 24, holdout_items: int = 24,
              seed: int = 0, holdout: bool = True) -> dict[str, Any]:
    """Runs (or continues) the study until it holds `trials` finished trials, then writes the outputs."""
    out.mkdir(parents=True, exist_ok=True)
    dev, held = dev_and_holdout(items, dev_items, holdout_items, seed)
    base = load_config(space.get("base", "default"), budget=budget, control=False, seed=seed)
    study = open_study(storage or f"sqlite:///{(out / 'study.db').resolve()}", seed, base.item_batch)

    def objective(trial: optuna.Trial) -> float:
        config = apply_params(base, suggest(trial, space["params"]))
        asr, queries = evaluate_config(config, target, dev, trial)
        trial.set_user_attr("asr", asr)
        trial.set_user_attr("mean_queries", queries)
        return asr - QUERY_TIE_BREAK * queries / budget

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    study.optimize(objective, n_trials=trials,
                   callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished)])
    return write_outputs(study, base, space, target, held, out, holdout)


def trials_csv(study: optuna.Study) -> str:
    names = sorted({p for t in study.trials for p in t.params})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["number", "state", "value", "asr", "mean_queries", *names])
    for t in study.trials:
        writer.writerow([t.number, t.state.name, t.value, t.user_attrs.get("asr"), t.user_attrs.get("mean_queries"),
                         *(t.params.get(n) for n in names)])
    return buffer.getvalue()


def write_outputs(study: optuna.Study, base: SearchConfig, space: dict[str, Any], target: TargetModel,
                  held: list[Item], out: Path, holdout: bool) -> dict[str, Any]:
    atomic_write_text(out / "trials.csv", trials_csv(study))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise FlexsearchError("no trial completed (all were pruned or failed); widen the space or add trials")
    best = study.best_trial
    best_config = apply_params(base, best.params)
    best_data = asdict(best_config)
    atomic_write_yaml(out / "best_config.yaml", best_data)
    summary: dict[str, Any] = {
        "trials": len(study.trials), "complete": len(complete), "best_trial": best.number,
        "best_params": best.params, "tuning_asr": best.user_attrs.get("asr"),
        "tuning_mean_queries": best.user_attrs.get("mean_queries"),
    }
    if holdout and held:
        tuned_asr, tuned_q = evaluate_config(best_config, target, held)
        default_asr, default_q = evaluate_config(
            load_config("default", budget=base.budget, control=False, seed=base.seed), target, held)
        summary["holdout"] = {"items": len(held), "tuned_asr": tuned_asr, "tuned_mean_queries": tuned_q,
                              "default_asr": default_asr, "default_mean_queries": default_q}
    importances: dict[str, float] = {}
    if len(complete) >= 2 and len({tuple(sorted(t.params.items())) for t in complete}) >= 2:
        importances = {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()
                       if math.isfinite(v)}
    summary["param_importances"] = importances
    atomic_write_json(out / "tune.json", summary)
    atomic_write_text(out / "report.html", tune_report(study, summary))
    return summary


def tune_report(study: optuna.Study, summary: dict[str, Any]) -> str:
    """A self-contained page: optimisation history, parameter importances, the held-out check."""
    import html

    from flexsearch.report import png

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

    held = summary.get("holdout")
    held_text = ("no held-out check" if not held else
                 f"held-out ASR of the tuned config {held['tuned_asr']:.3f} vs the default preset "
                 f"{held['default_asr']:.3f} on {held['items']} items (tuning ASR {summary['tuning_asr']:.3f})")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>flexsearch tune</title></head>"
            "<body style='font-family:sans-serif;max-width:900px;margin:2em auto'><h1>flexsearch tune</h1>"
            f"<p>{summary['complete']} of {summary['trials']} trials complete; best trial {summary['best_trial']}: "
            f"<code>{html.escape(str(summary['best_params']))}</code>. {html.escape(held_text)}.</p>"
            f"<h2>Optimisation history</h2><img alt='history' src='data:image/png;base64,{png(history)}'>"
            f"<h2>Parameter importances</h2><img alt='importances' src='data:image/png;base64,{png(importance)}'>"
            "</body></html>")
