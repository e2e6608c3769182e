"""flexsearch tune: a tiny study completes, continues, writes a usable best config; two workers share a study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from flexsearch.cli import app
from flexsearch.config import SearchConfig, load_config
from flexsearch.errors import FlexsearchError
from flexsearch.tune import STUDY_NAME, apply_params, load_space

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
    assert summary["holdout"]["items"] == 4 and 0 <= summary["holdout"]["tuned_asr"] <= 1
    csv_lines = (out / "trials.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("number,state,value,asr,mean_queries")
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "held-out ASR" in page
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
