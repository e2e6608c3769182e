"""`flexsearch export`: lm-eval tasks that reproduce flexsearch's accuracy in both scoring modes, the
generative variant's letter reading, and a parquet folder that `datasets.load_dataset` reads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flexsearch.cli import app
from flexsearch.results.export import LETTER_PATTERN, MARKER
from flexsearch.results.split import FLEX_FAMILIES, UNATTACKED

runner = CliRunner()
FAMILIES = {*FLEX_FAMILIES.values(), "text"}


@pytest.fixture(scope="module")
def search_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("export") / "run"
    result = runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "18",
                                 "--budget", "6", "--out", str(run), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return run


def _flexsearch_accuracy(model: Path, run: Path, out: Path, *options: str) -> float:
    result = runner.invoke(app, ["evaluate", "--model", str(model), "--split", str(run / "split.jsonl"),
                                 "--out", str(out), "--device", "cpu", *options])
    assert result.exit_code == 0, result.output
    return json.loads((out / "score.json").read_text())["attacked"]["accuracy"]["value"]


def test_lm_eval_reproduces_flexsearch_in_both_modes(search_run, tiny_model_dir, tmp_path):
    pytest.importorskip("lm_eval")
    folder = tmp_path / "tasks"
    result = runner.invoke(app, ["export", str(search_run), str(folder), "--to", "lm-eval", "--name", "fs"])
    assert result.exit_code == 0, result.output
    rows = len((search_run / "split.jsonl").read_text().splitlines())
    assert len((folder / "single.jsonl").read_text().splitlines()) == rows
    assert len((folder / "orders.jsonl").read_text().splitlines()) == 3 * rows
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={tiny_model_dir},dtype=float32",
         "--include_path", str(folder), "--tasks", "fs,fs_orders,fs_gen", "--device", "cpu",
         "--output_path", str(tmp_path / "lm-out")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next((tmp_path / "lm-out").rglob("results_*.json")).read_text())["results"]
    single = _flexsearch_accuracy(tiny_model_dir, search_run, tmp_path / "ev-single", "--no-average-orders")
    averaged = _flexsearch_accuracy(tiny_model_dir, search_run, tmp_path / "ev-orders")
    assert abs(results["fs"]["acc,none"] - single) <= 0.005
    assert abs(results["fs_orders"]["acc,none"] - averaged) <= 0.005
    generated = results["fs_gen"]
    shares = [generated[f"{m},letter"] for m in ("acc", "refusal", "unparseable")]
    assert all(0 <= s <= 1 for s in shares) and generated["acc,letter"] + generated["unparseable,letter"] <= 1


def test_generated_answers_are_read_as_letter_refusal_or_unparseable(search_run, tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.filters.extraction import RegexFilter

    folder = tmp_path / "tasks"
    assert runner.invoke(app, ["export", str(search_run), str(folder)]).exit_code == 0
    spec = importlib.util.spec_from_file_location("exported_utils", folder / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    answers = ["A) The grandfather", " (B", "C", "I'm sorry, I can't answer that.", "Both of them", "Dunno"]
    flagged = utils.flag_refusals([[a] for a in answers], [{}] * len(answers))
    read = [r[0] for r in RegexFilter(LETTER_PATTERN, fallback="[unparseable]").apply(flagged, [{}] * len(answers))]
    assert read == ["A", "B", "C", "[refusal]", "[unparseable]", "[unparseable]"]
    scored = utils.generated_answer({"letter": "B"}, ["B"]), utils.generated_answer({"letter": "B"}, ["[refusal]"])
    assert scored == ({"acc": 1, "refusal": 0, "unparseable": 0}, {"acc": 0, "refusal": 1, "unparseable": 0})


def test_order_averaged_aggregation_averages_before_the_argmax(search_run, tmp_path):
    folder = tmp_path / "tasks"
    assert runner.invoke(app, ["export", str(search_run), str(folder)]).exit_code == 0
    spec = importlib.util.spec_from_file_location("exported_utils2", folder / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    # One order is confidently wrong, two mildly right: two of the three orders pick the gold answer,
    # yet the averaged distribution does not (0.99 on answer 1 outweighs two 0.37s on answer 0).
    confident = [-5.0, 0.0, -5.0]
    mild = [-0.9, -1.0, -1.1]
    records = [("i", (0, 1, 2), confident, 0), ("i", (1, 2, 0), [-1.0, -1.1, -0.9], 0),
               ("i", (2, 0, 1), [-1.1, -0.9, -1.0], 0)]
    assert utils.order_averaged_accuracy(records) == 0.0
    assert utils.order_averaged_accuracy([("j", (0, 1, 2), mild, 0)]) == 1.0


def test_parquet_export_loads_with_datasets_and_has_a_card(search_run, tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "parquet"
    result = runner.invoke(app, ["export", str(search_run), str(folder), "--to", "parquet"])
    assert result.exit_code == 0, result.output
    table = datasets.load_dataset(str(folder))["test"]
    split = [json.loads(line) for line in (search_run / "split.jsonl").read_text().splitlines()]
    assert len(table) == len(split) and table["item_id"] == [r["item_id"] for r in split]
    card = (folder / "README.md").read_text()
    for field in ("license: apache-2.0", "| rows | 18 |", "budget 6", "`attack_type`", "flexsearch 0."):
        assert field in card, field
    assert json.loads((folder / MARKER).read_text())["rows"] == 18
    for attack, attack_type in zip(table["attack"], table["attack_type"], strict=True):
        assert attack == UNATTACKED or set(attack.split("+")) <= FAMILIES
        assert attack_type == UNATTACKED or all(":" in part for part in attack_type.split("+"))
    # Exporting again replaces the earlier export whole, but never deletes a file the export did not write.
    (folder / "split.parquet").write_bytes(b"stale")
    assert runner.invoke(app, ["export", str(search_run), str(folder), "--to", "parquet"]).exit_code == 0
    assert (folder / "split.parquet").read_bytes() != b"stale"
    (folder / "notes.txt").write_text("mine")
    refused = runner.invoke(app, ["export", str(search_run), str(folder), "--to", "parquet"])
    assert refused.exit_code == 2 and "holds notes.txt, which flexsearch did not write" in refused.output
    assert (folder / "notes.txt").read_text() == "mine"
