"""compare recovers a known shift and its sign; report writes a self-contained page with every figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flexsearch import api
from flexsearch.cli import app
from flexsearch.config import load_config
from flexsearch.data.items import load_items
from flexsearch.errors import FlexsearchError
from flexsearch.results.comparison import compare_runs
from flexsearch.results.metrics import holm
from flexsearch.results.report import build_report

runner = CliRunner()
CATEGORIES = ["Age", "Religion", "SES", "Nationality"]


def synthetic_run(directory: Path, flipped_share: float, n: int = 200, mode: str = "plain", slot: str = "user",
                  ids: range | None = None) -> Path:
    """An evaluate-style run: every item right when clean (gold = unknown = 0, target 1, anti 2);
    the first `flipped_share` of each category is pushed to the target when attacked."""
    directory.mkdir(parents=True)
    scoring = {"mode": mode, "slot": slot, "average_orders": True}
    (directory / "config.yaml").write_text(yaml.safe_dump({"scoring": scoring}))
    rows = []
    for k in ids or range(n):
        category = CATEGORIES[k % len(CATEGORIES)]
        flipped = (k // len(CATEGORIES)) < flipped_share * n / len(CATEGORIES)
        rows.append({"item_id": f"i{k}", "category": category, "condition": "ambig", "gold": 0, "target": 1,
                     "anti_target": 2, "unknown": 0, "probs": [0.6, 0.25, 0.15],
                     "attacked_probs": [0.2, 0.7, 0.1] if flipped else [0.6, 0.25, 0.15]})
    (directory / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


def test_known_shift_is_recovered_with_its_sign(tmp_path):
    base = synthetic_run(tmp_path / "a", 0.0)
    pushed = synthetic_run(tmp_path / "b", 0.6)
    result = compare_runs(base, pushed)
    asr = result["overall"]["ASR"]
    assert asr["a"] == 0 and asr["b"] == pytest.approx(0.6) and asr["delta"] == pytest.approx(0.6)
    assert 0 < asr["ci"][0] <= 0.6 <= asr["ci"][1]
    assert result["overall"]["attacked accuracy"]["delta"] == pytest.approx(-0.6)
    assert result["overall"]["clean abstention"]["b"] == 1.0  # the abstention rate is reported beside accuracy
    assert all(m["ASR"]["holm_significant"] for m in result["per_category"].values())
    assert result["worst_group"]["asr_delta"] == pytest.approx(0.6)
    reverse = compare_runs(pushed, base)
    assert reverse["overall"]["ASR"]["delta"] == pytest.approx(-0.6) and reverse["overall"]["ASR"]["ci"][1] < 0


def test_identical_runs_give_zero_deltas(tmp_path):
    a = synthetic_run(tmp_path / "a", 0.3)
    b = synthetic_run(tmp_path / "b", 0.3)
    result = compare_runs(a, b)
    for metric in result["overall"].values():
        if metric["delta"] is not None:
            assert metric["delta"] == 0 and metric["ci"][0] <= 0 <= metric["ci"][1]
    assert not any(m["ASR"]["holm_significant"] for m in result["per_category"].values())


def test_compare_refuses_incomparable_runs(tmp_path):
    a = synthetic_run(tmp_path / "a", 0.0, ids=range(0, 10))
    with pytest.raises(FlexsearchError, match="share no items"):
        compare_runs(a, synthetic_run(tmp_path / "b", 0.0, ids=range(10, 20)))
    with pytest.raises(FlexsearchError, match="different scoring modes .mode plain vs chat"):
        compare_runs(a, synthetic_run(tmp_path / "c", 0.0, ids=range(0, 10), mode="chat"))
    chat = synthetic_run(tmp_path / "d", 0.0, ids=range(0, 10), mode="chat")
    with pytest.raises(FlexsearchError, match="different scoring modes .slot user vs system"):
        compare_runs(chat, synthetic_run(tmp_path / "e", 0.0, ids=range(0, 10), mode="chat", slot="system"))
    result = runner.invoke(app, ["compare", str(a), str(tmp_path / "missing")])
    assert result.exit_code == 2 and "missing: no such run directory" in result.output


def test_holm_correction():
    assert holm([0.01, 0.04, 0.03, None]) == [True, False, False, False]
    assert holm([0.001, 0.012, 0.03]) == [True, True, True]


@pytest.fixture(scope="module")
def two_tiny_runs(tiny_model_dir, tmp_path_factory) -> list[Path]:
    runs = []
    for seed in (0, 1):
        config = load_config("default", ["constraints=[protected_spans]", "operators=[{name: persona, n: 2}, "
                                         "{name: instruction, n: 2}]"], budget=10, seed=seed)
        out = tmp_path_factory.mktemp("report") / f"run{seed}"
        api.search("seed", model=api.Target(str(tiny_model_dir), device="cpu"), out=out, config=config, limit=12)
        runs.append(out)
    return runs


def test_report_is_self_contained_with_every_figure(two_tiny_runs, tmp_path):
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", *map(str, two_tiny_runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", page) and "http://" not in page
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 4 + 2 and all(len(i) > 1000 for i in images)  # and one family heat map per run
    for section in ("Headline", "ASR vs query budget", "ASR per category", "P(target) shift per item",
                    "Letter-position bias", "Ten hardest prompts", "Attack families", "ASR per family and category"):
        assert section in page
    markdown = out.with_suffix(".md").read_text()
    score = json.loads((two_tiny_runs[0] / "score.json").read_text())
    assert f"{score['clean']['accuracy']['value']:.3f}" in markdown and "| run |" in markdown
    verdict = score["verdict"]["verdict"]
    toward, away = score["stereotype"]["eligible_items"], score["anti_stereotype"]["eligible_items"]
    eligible = f"{toward} toward, {away} control of 12"
    assert f"Verdict: {two_tiny_runs[0].name}" in page and f"| overall | {eligible} | {verdict} |" in markdown
    assert f"Label validity: {two_tiny_runs[0].name}" in page and "rows of split.jsonl break a rule" in page
    assert f"(n={score['stereotype']['asr']['n']})" in page  # every headline rate names its denominator


def test_report_opens_with_the_provenance_of_every_run(two_tiny_runs, tiny_model_dir):
    page, markdown = build_report(two_tiny_runs)
    config = yaml.safe_load((two_tiny_runs[0] / "config.yaml").read_text())
    score = json.loads((two_tiny_runs[0] / "score.json").read_text())
    assert page.index("Provenance") < page.index("Headline")
    for field in ("model", "model file sha256", "adapter", "data", "data sha256", "items", "search", "prompt",
                  "date", "versions"):
        assert f"<th>{field}</th>" in page and f"| {field} |" in markdown
    assert str(tiny_model_dir) in page and config["data_sha256"] in page and score["created"] in page
    eligible = score["stereotype"]["eligible_items"]
    assert f"12 scored, {eligible} attack-eligible, 0 skipped" in page
    assert "budget 10 prompts per item, seed 0, control on" in page and "flexsearch 0.1.0" in page
    assert "plain text (FLEX&#x27;s layout), the attack before the question" in page


def test_compare_on_real_runs_writes_files(two_tiny_runs, tmp_path):
    result = runner.invoke(app, ["compare", *map(str, two_tiny_runs), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["shared_items"] == 12 and saved["overall"]["clean accuracy"]["delta"] == 0  # same model
    assert set(saved["per_category"]) == {it.category for it in load_items("seed", limit=12).items}
    assert (tmp_path / "cmp" / "compare.md").exists()
    scores = [json.loads((run / "score.json").read_text()) for run in two_tiny_runs]
    assert saved["verdict"] == {"a": scores[0]["verdict"]["verdict"], "b": scores[1]["verdict"]["verdict"]}
    assert "verdict on the shared items (A -> B):" in result.output and "worst group: " in result.output


def test_report_needs_finished_runs(tmp_path):
    with pytest.raises(FlexsearchError, match="no score.json"):
        build_report([tmp_path])


def test_compare_breaks_down_per_group_and_warns_on_other_budgets(two_tiny_runs, tiny_model_dir, tmp_path):
    rows = [json.loads(line) for line in (two_tiny_runs[0] / "split.jsonl").read_text().splitlines()]
    result = compare_runs(two_tiny_runs[0], two_tiny_runs[1])
    assert set(result["per_group"]) == {r["stereotyped_group"] for r in rows} and result["warnings"] == []
    for cells in result["per_group"].values():
        assert {"ASR", "control ASR", "fairness gap"} <= set(cells) and "holm_significant" in cells["ASR"]
    config = load_config("default", ["constraints=[protected_spans]", "operators=[{name: persona, n: 2}]"], budget=7)
    other = tmp_path / "budget7"
    api.search("seed", model=api.Target(str(tiny_model_dir), device="cpu"), out=other, config=config, limit=12)
    output = runner.invoke(app, ["compare", str(two_tiny_runs[0]), str(other)]).output
    assert "warning: the runs searched with different budgets (10 vs 7 prompts per item)" in output
    assert "per stereotyped group" in output
