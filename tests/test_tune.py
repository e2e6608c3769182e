"""flexsearch tune: a tiny study completes, continues, writes a usable best config; two workers share a study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml
from typer.testing import CliRunner

from flexsearch.cli import app
from flexsearch.config import SearchConfig, load_config
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import load_items
from flexsearch.errors import FlexsearchError
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.pipeline.tune import STUDY_NAME, apply_params, eligible_slices, load_space
from flexsearch.scoring.scorer import Scorer

runner = CliRunner()
SPACE = {"base": "templates_only", "params": {"operators.persona": {"categorical": [True, False]},
                                             "operators.instruction.n": {"int": [1, 3]},
                                             "beam_width": {"int": [1, 2]}}}


def write_space(directory: Path) -> Path:
    path = directory / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE))
    return path


def tune_args(model: Path, space: Path, out: Path, trials: int, *extra: str) -> list[str]:
    return ["tune", "--model", str(model), "--data", "seed", "--space", str(space), "--trials", str(trials),
            "--budget", "6", "--dev-items", "6", "--holdout-items", "4", "--out", str(out), "--device", "cpu", *extra]


def finished(storage: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    return study.trials


def completed(storage: str) -> int:
    try:
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in finished(storage))
    except (KeyError, sqlalchemy.exc.OperationalError):  # the study or its tables are not created yet
        return 0


def test_tiny_study_completes_continues_and_writes_a_usable_best_config(tiny_model_dir, tmp_path):
    space, out = write_space(tmp_path), tmp_path / "tune"
    result = runner.invoke(app, tune_args(tiny_model_dir, space, out, 2, "--no-holdout"))
    assert result.exit_code == 0, result.output
    assert len(finished(f"sqlite:///{out / 'study.db'}")) == 2
    result = runner.invoke(app, tune_args(tiny_model_dir, space, out, 4))  # continues the same study
    assert result.exit_code == 0, result.output
    trials = finished(f"sqlite:///{out / 'study.db'}")
    assert [t.number for t in trials] == [0, 1, 2, 3]
    summary = json.loads((out / "tune.json").read_text())
    held = summary["holdout"]
    assert held["items"] == 4 and 0 <= held["tuned_asr"]["value"] <= 1
    assert held["tuned_minus_default"]["value"] == pytest.approx(
        held["tuned_asr"]["value"] - held["default_asr"]["value"], abs=1e-6)  # same items, all eligible
    csv_lines = (out / "trials.csv").read_text().splitlines()
    assert len(csv_lines) == 5
    assert csv_lines[0].startswith("number,state,value,asr,asr_low,asr_high,eligible,mean_queries")
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Held-out ASR" in page
    assert "held-out (4 items): tuned" in result.output
    best = load_config(str(out / "best_config.yaml"))
    assert best.budget == 6 and best.control is False
    search = runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "3",
                                 "--config", str(out / "best_config.yaml"), "--out", str(tmp_path / "s")])
    assert search.exit_code == 0, search.output
    assert (tmp_path / "s" / "split.csv").exists()


def test_two_workers_share_one_study(tiny_model_dir, tmp_path):
    space = write_space(tmp_path)
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    env = {**os.environ, "TQDM_DISABLE": "1"}
    workers = [subprocess.Popen([sys.executable, "-m", "flexsearch.cli",
                                 *tune_args(tiny_model_dir, space, tmp_path / f"w{k}", 6, "--storage", storage,
                                            "--no-holdout")],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for k in range(2)]
    for worker in workers:
        assert worker.wait(timeout=600) == 0, worker.stderr.read().decode()[-2000:]
    trials = finished(storage)
    states = {t.state for t in trials}
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert [t.number for t in trials] == list(range(len(trials))) and len(trials) >= 6
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all("asr" in t.user_attrs for t in complete)


# `flexsearch tune` in a process that kills itself (kill -9) as its second trial starts: the first trial is
# stored, the second is not; a deterministic point, where killing from outside raced the study's end.
KILLED_AT_THE_SECOND_TRIAL = """
import os, signal
import flexsearch.pipeline.tune as tune
from flexsearch.cli import app
evaluate, calls = tune.evaluate_config, []
def evaluate_or_die(*args, **kwargs):
    calls.append(args)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return evaluate(*args, **kwargs)
tune.evaluate_config = evaluate_or_die
app()
"""


def test_grid_ablation_resumes_after_a_kill_and_runs_every_combination_on_eligible_items(tiny_model_dir, tmp_path):
    space = tmp_path / "grid.yaml"
    space.write_text(yaml.safe_dump({"base": "templates_only", "sampler": "grid", "pruning": False, "params": {
        "operators.persona": {"categorical": [True, False]}, "operators.instruction": {"categorical": [True, False]}}}))
    out = tmp_path / "grid"
    args = tune_args(tiny_model_dir, space, out, 10, "--no-holdout")
    worker = subprocess.Popen([sys.executable, "-c", KILLED_AT_THE_SECOND_TRIAL, *args],
                              env={**os.environ, "TQDM_DISABLE": "1"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    assert worker.wait(timeout=600) == -signal.SIGKILL  # the limit only guards against a hang
    storage = f"sqlite:///{out / 'study.db'}"
    assert not (out / "tune.json").exists()  # interrupted before the study finished
    assert completed(storage) >= 1
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    trials = finished(storage)
    combos = sorted((t.params["operators.persona"], t.params["operators.instruction"]) for t in trials
                    if t.state.is_finished())
    assert combos == [(False, False), (False, True), (True, False), (True, True)]  # the grid once, then it stops
    summary = json.loads((out / "tune.json").read_text())
    assert summary["complete"] == 3 and len(summary["ranking"]) == 3  # all-off is pruned
    for row in summary["ranking"]:
        assert row["eligible"] == 6  # every development item counts toward ASR
        low, high = row["asr"]["ci"]
        assert low <= row["asr"]["value"] <= high
    asrs = [row["asr"]["value"] for row in summary["ranking"]]
    assert asrs == sorted(asrs, reverse=True)


def test_development_and_holdout_items_are_attack_eligible_and_disjoint(tiny_target):
    items = load_items("seed").items
    scorer = Scorer.in_process(tiny_target, average_orders=True)
    dev, held, scored = eligible_slices(items, scorer, 5, 3, seed=1)
    assert len(dev) == 5 and len(held) == 3 and not {i.id for i in dev} & {i.id for i in held}
    clean = scorer.score([Candidate.root(i) for i in dev + held]).probs
    assert all(attack_eligible(get_objective("stereotype"), i, p) for i, p in zip(dev + held, clean, strict=True))
    assert 8 <= scored <= len(items)
    with pytest.raises(FlexsearchError, match="attack-eligible"):
        eligible_slices(items, scorer, len(items), 1, seed=1)


def test_space_mapping_and_errors(tmp_path):
    base = load_config("default")
    config = apply_params(base, {"operators.textbugger": False, "operators.persona.n": 3, "beam_width": 4,
                                 "constraints.similarity.threshold": 0.7})
    assert [o["name"] for o in config.operators] == ["persona", "instruction"]
    assert config.operators[0]["n"] == 3 and config.beam_width == 4
    assert {"name": "similarity", "threshold": 0.7} in config.constraints
    assert isinstance(config, SearchConfig)
    with pytest.raises(optuna.TrialPruned):
        apply_params(base, {f"operators.{n}": False for n in ("persona", "instruction", "textbugger")})
    with pytest.raises(FlexsearchError, match="no operator 'bert_attack'"):
        apply_params(base, {"operators.bert_attack.k": 3})
    for name in ("operator_families", "search_methods", "budget_allocation"):
        assert load_space(name)["params"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("params: {beam_width: {range: [1, 2]}}\n")
    with pytest.raises(FlexsearchError, match="must be"):
        load_space(str(bad))
    bad.write_text("sampler: grid\nparams: {beam_width: {int: [1, 2]}}\n")
    with pytest.raises(FlexsearchError, match="every param to be categorical"):
        load_space(str(bad))
    bad.write_text("sampler: random\nparams: {beam_width: {int: [1, 2]}}\n")
    with pytest.raises(FlexsearchError, match="sampler must be"):
        load_space(str(bad))
