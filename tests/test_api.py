"""The typed Python API (`flexsearch.search / evaluate / compare`), score.json's provenance header,
the per-run README, `--json`, and the README's API snippet (slow: it runs on the embedded model)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flexsearch
from flexsearch.cli import app
from flexsearch.results.metrics import HIGHER_IS_BETTER
from flexsearch.results.run_dir import SCORE_SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
FAST = ["operators=[{name: persona, n: 2}, {name: instruction, n: 2}]", "constraints=[protected_spans]"]


@pytest.fixture(scope="module")
def api_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> flexsearch.RunResult:
    out = tmp_path_factory.mktemp("api") / "run"
    return flexsearch.search("seed", model=flexsearch.Target(str(tiny_model_dir), device="cpu"), out=out,
                             overrides=FAST, budget=8, limit=10)


def _metrics(tree: object, key: str = "") -> list[tuple[str, dict]]:
    """Every (key, metric) pair of a score: dicts holding a value and an interval."""
    if isinstance(tree, dict):
        found = [(key, tree)] if "ci" in tree else []
        return found + [m for k, v in tree.items() for m in _metrics(v, k)]
    return []


def test_search_returns_typed_score_rows_and_files(api_run):
    written = json.loads((api_run.run_dir / "score.json").read_text())
    assert api_run.score.to_dict() == written
    assert isinstance(api_run.score.asr, flexsearch.Rate) and api_run.score.objective == "stereotype"
    assert api_run.score.asr.n == written["stereotype"]["eligible_items"]
    assert api_run.score.verdict == written["verdict"]["verdict"] and api_run.score.items == 10
    assert api_run.score.control_asr is not None and api_run.score.fairness_gap is not None
    split = [json.loads(line) for line in (api_run.run_dir / "split.jsonl").read_text().splitlines()]
    assert api_run.rows == split
    assert {"config.yaml", "score.json", "split.jsonl", "split.csv", "trace.jsonl", "README.md"} <= set(api_run.files)
    assert "fairness gap" in api_run.table


def test_score_json_has_provenance_and_direction_on_every_metric(api_run):
    score = json.loads((api_run.run_dir / "score.json").read_text())
    assert score["schema_version"] == SCORE_SCHEMA_VERSION and score["command"] == "search"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", score["created"])
    assert score["duration_s"] > 0 and score["invocation"]
    assert set(score["versions"]) == {"flexsearch", "torch", "transformers", "python"}
    metrics = _metrics(score)
    assert len(metrics) > 40
    for key, metric in metrics:
        assert "n" in metric, key
        if key in HIGHER_IS_BETTER:
            assert metric["higher_is_better"] == HIGHER_IS_BETTER[key], key
    assert score["clean"]["accuracy"]["higher_is_better"] is True
    assert score["stereotype"]["asr"]["higher_is_better"] is False


def test_each_run_directory_has_a_readme_naming_its_files(api_run):
    readme = (api_run.run_dir / "README.md").read_text()
    for name in ("config.yaml", "score.json", "split.jsonl", "split.csv", "trace.jsonl"):
        assert f"`{name}`" in readme


def test_evaluate_and_compare_return_typed_results(api_run, tiny_model_dir, tmp_path):
    transfer = flexsearch.evaluate(split=api_run.files["split.jsonl"], model=flexsearch.Target(str(tiny_model_dir),
                                   device="cpu"), out=tmp_path / "transfer")
    assert transfer.score.attacked_accuracy is not None and len(transfer.rows) == 10
    assert "attacked_probs" in transfer.rows[0] and "predictions.jsonl" in transfer.files
    clean = flexsearch.evaluate("seed", model=flexsearch.Target(str(tiny_model_dir), device="cpu"),
                                out=tmp_path / "clean", limit=6)
    assert clean.score.clean_accuracy.n == 6 and clean.score.asr is None
    comparison = flexsearch.compare(api_run.run_dir, tmp_path / "transfer", out=tmp_path / "cmp")
    assert isinstance(comparison, flexsearch.Comparison) and comparison.files["compare.json"].is_file()
    assert json.loads(comparison.files["compare.json"].read_text()) == comparison.data


def test_json_flag_prints_the_score_as_json(tiny_model_dir, tmp_path):
    result = CliRunner().invoke(app, ["evaluate", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "4",
                                      "--out", str(tmp_path / "e"), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    score = json.loads(result.stdout)
    assert score["n_items"] == 4 and score == json.loads((tmp_path / "e" / "score.json").read_text())


def test_list_presets_prints_every_preset_resolved():
    result = CliRunner().invoke(app, ["list", "--presets"])
    assert result.exit_code == 0, result.output
    names = ("default", "beam", "flex", "textbugger", "bert_attack", "templates_only", "gradient", "research",
             "forced_choice")
    for name in names:
        assert f"# {name}\n" in result.output
    assert result.output.count("budget:") == len(names) and "scoring:" in result.output


@pytest.mark.slow
def test_readme_api_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"<!-- snippet: python-api.*?-->\n```python\n(.*?)```", readme, re.S)
    assert snippet, "README lost its API snippet"
    done = subprocess.run([sys.executable, "-c", snippet.group(1)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=3600)  # a hang guard only: far above the snippet's minutes
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "api-demo" / "split.jsonl").is_file()
    assert "fairness gap" not in done.stderr and "split.jsonl" in done.stdout


def test_a_model_load_shows_a_ticking_bar_on_a_terminal_only(monkeypatch):
    import io
    import sys
    import time

    from flexsearch.results.printing import elapsed_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with elapsed_bar("loading model m", tick_s=0.05) as bar:
        time.sleep(1.2)
        assert bar is not None
    drawn = terminal.getvalue()
    assert "loading model m: 00:00" in drawn and "loading model m: 00:01" in drawn
    # without the ticker tqdm draws twice (open, close); with it, about 24 times here: 3 is far from a loaded edge
    assert drawn.count("loading model m:") >= 3
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    with elapsed_bar("loading model m") as bar:
        assert bar is None
    assert pipe.getvalue() == ""
