"""The command line: evaluate writes a run directory; bad input is one line, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flexsearch.cli import app

runner = CliRunner()


def test_evaluate_writes_score_and_predictions(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["evaluate", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "12",
                                 "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "overall" in result.output and "items: 12 scored, 0 skipped" in result.output
    score = json.loads((out / "score.json").read_text())
    assert score["n_items"] == 12 and 0 <= score["accuracy"]["value"] <= 1
    assert set(score["letter_bias"]) == {"A", "B", "C"} and "per_category" in score
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and abs(sum(rows[0]["probs"]) - 1) < 1e-4


def test_bad_input_is_one_line_without_traceback(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"example_id": 1}\n')
    result = runner.invoke(app, ["evaluate", "--model", str(tiny_model_dir), "--data", str(bad), "--out",
                                 str(tmp_path / "r")])
    assert result.exit_code == 2
    assert f"error: {bad}:1: field 'ans0': missing field" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "r").exists()


def test_version_and_module_entry_point():
    import subprocess
    import sys

    from flexsearch import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"flexsearch {__version__}"
    module = subprocess.run([sys.executable, "-m", "flexsearch", "--version"], capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout.strip() == f"flexsearch {__version__}"


def test_list_shows_model_aliases_and_policies():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("gemma3-bbq", "gemma3-bbq-planted", "smollm2", "label policies", "manipulable"):
        assert name in result.output


HEAVY_MODULES = ("torch", "transformers", "nltk", "sentence_transformers", "peft", "optuna", "scipy.stats")
PROBE = """import sys
from flexsearch.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    print("EXIT", exit.code)
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize(("args", "code"), [
    (["list"], 0), (["--help"], 0), (["--version"], 0), (["search", "--help"], 0),
    (["search", "--config", "no-such-preset"], 2), (["search", "--budget", "x"], 2),
    (["search", "--config", "{bomb}"], 2), (["search", "--set", "steps"], 2), (["search", "--slot", "system"], 2),
    (["evaluate", "--data", "seed", "--slot", "system"], 2),
])
def test_commands_that_need_no_model_import_no_model_library(tmp_path, args, code):
    """Printing names and refusing input answer at once: no torch, transformers, nltk... (issue 32)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n")
    argv = [a.format(bomb=bomb) for a in args]
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY_MODULES), *argv], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert f"EXIT {code}" in out.stdout, out.stdout + out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["search", "--slot", "system"], "--slot: field 'scoring.slot': system puts the attack in a system message"),
    (["search", "--slot", "assistant"], "--slot: field 'scoring.slot': expected one of user, system, got 'assistant'"),
    (["evaluate", "--data", "seed", "--slot", "system"], "--slot system puts the attack in a system message, which "
                                                         "only chat prompts have"),
    (["search", "--set", "scoring.slot=system"], "--set scoring.slot=system: field 'scoring.slot': system puts"),
])
def test_a_slot_without_chat_prompts_is_one_line(tmp_path, args, message):
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output and not (tmp_path / "run").exists()
