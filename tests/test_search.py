"""The search end to end on the tiny model: split, score, control, rebuildable prompts, resume after kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from flexsearch import api
from flexsearch.cli import app
from flexsearch.config import Origins, load_config
from flexsearch.data.candidate import Candidate, replay
from flexsearch.data.items import load_items
from flexsearch.data.render import render
from flexsearch.engine.loop import build_context, run_search
from flexsearch.engine.methods import SEARCH_METHODS
from flexsearch.engine.state import ItemState, Request, SearchContext, SearchMethod
from flexsearch.errors import FlexsearchError
from flexsearch.results.report import build_report
from flexsearch.results.split import load_split
from flexsearch.scoring.scorer import Scorer

runner = CliRunner()
FAST = ["--set", "constraints=[protected_spans, unique_positions, polarity_guard]",
        "--set", "operators=[{name: persona, n: 2}, {name: instruction, n: 2}, "
                 "{name: textbugger, bugs: [insert, delete, swap, sub_c], positions: 1, per_position: 2}]"]


def run_cli(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    output = run_cli(["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "10", "--budget", "14",
                      "--out", str(out), *FAST])
    assert "fairness gap" in output and "control ASR" in output
    return out


def test_run_directory_holds_split_score_trace_and_config(tiny_run):
    assert {p.name for p in tiny_run.iterdir()} >= {"split.csv", "split.jsonl", "score.json", "trace.jsonl",
                                                     "config.yaml"}
    frame = pd.read_csv(tiny_run / "split.csv", index_col=0)
    assert len(frame) == 10
    assert {"ctx", "q_text", "sent_more", "sent_less", "bias_type", "a", "b", "c", "label", "attack",
            "attack_type", "attack_success", "prompt", "attack_chain", "p_target_clean", "p_target_attacked",
            "queries", "item_id"} <= set(frame.columns)
    score = json.loads((tiny_run / "score.json").read_text())
    for key in ("clean", "attacked", "stereotype", "anti_stereotype", "fairness_gap", "per_category"):
        assert key in score
    assert score["stereotype"]["asr_vs_budget"] and score["stereotype"]["queries"]["mean"] <= 14
    trace = [json.loads(line) for line in (tiny_run / "trace.jsonl").read_text().splitlines()]
    assert {(r["objective"]) for r in trace} == {"stereotype", "anti_stereotype"} and len(trace) == 20


def test_split_prompts_rebuild_and_rescore(tiny_run, tiny_target):
    rows = load_split(tiny_run / "split.jsonl")
    scorer = Scorer.in_process(tiny_target, average_orders=True)
    fresh = scorer.score([r.candidate for r in rows]).probs
    items = {it.id: it for it in load_items("seed", limit=10).items}
    for row, probs in zip(rows, fresh, strict=True):
        assert render(row.candidate, tiny_target.tokenizer, scorer.fmt) == row.record["prompt"]
        assert abs(probs[row.item.target] - row.record["p_target_attacked"]) < 1e-5
        original = items[row.item.id]
        assert row.item.answers == original.answers and row.item.gold == original.gold  # gold unchanged
        assert row.record[["a", "b", "c"][row.record["label"]]] == original.answers[original.gold]
    assert any(r.candidate.edits for r in rows)
    csv_rows = load_split(tiny_run / "split.csv")
    assert [r.candidate.chain() for r in csv_rows] == [r.candidate.chain() for r in rows]


def test_evaluate_split_transfers_to_another_model(tiny_run, tiny_model_dir, tmp_path):
    output = run_cli(["evaluate", "--model", str(tiny_model_dir), "--split", str(tiny_run / "split.jsonl"),
                      "--out", str(tmp_path / "transfer")])
    score = json.loads((tmp_path / "transfer" / "score.json").read_text())
    searched = json.loads((tiny_run / "score.json").read_text())
    assert "ASR" in output
    # The same model re-scores the split to the same numbers.
    assert score["stereotype"]["asr"]["value"] == searched["stereotype"]["asr"]["value"]
    assert score["clean"]["accuracy"]["value"] == searched["clean"]["accuracy"]["value"]


@pytest.mark.parametrize("method", ["learned", "greedy", "beam", "evolutionary", "random"])
def test_every_method_respects_the_budget_and_is_deterministic(tiny_target, seed_items, method):
    config = load_config("default", FAST[1::2], method=method, budget=12, control=False)
    outcomes = []
    for batch in (4, 3):
        scorer = Scorer.in_process(tiny_target, average_orders=True)
        ctx = build_context(replace(config, item_batch=batch), scorer, "stereotype")
        outcomes.append(run_search(seed_items[:6], ctx, "stereotype"))
    for first, second in zip(*outcomes, strict=True):
        assert first.queries <= 12
        assert first.best.chain() == second.best.chain()  # batching does not change the result
        assert np.abs(first.best_probs - second.best_probs).max() < 1e-5
        families = first.to_record()["families"], second.to_record()["families"]  # nor any family's best
        assert {f: b["chain"] for f, b in families[0].items()} == {f: b["chain"] for f, b in families[1].items()}
        assert all(np.allclose(families[0][f]["probs"], families[1][f]["probs"], atol=1e-5) for f in families[0])
    assert any(o.best.edits for o in outcomes[0])
    for outcome in outcomes[0]:  # the best-so-far record ends at the best, dated within the budget
        spent = [q for q, _ in outcome.improvements]
        assert spent == sorted(spent) and spent[-1] <= outcome.queries
        assert np.array_equal(outcome.improvements[-1][1], outcome.best_probs)


class FirstTemplates:
    """A toy method, written as a new method file would be (one class, registered by name): the clean prompt, then
    each persona template of the library once, in library order, until a success."""

    reads = ("population",)

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod:
        root = Candidate.root(state.item)
        yield Request([root])
        persona = next(op for op in ctx.operators if op.name == "persona")
        for candidate in persona.enumerate(root):  # type: ignore[attr-defined]
            options = state.affordable(ctx.admissible([candidate]))
            if state.succeeded or not options:
                return
            yield Request(options)


def test_a_new_search_method_is_one_class_and_its_registration(tiny_target, seed_items, monkeypatch):
    """The method seam (issue 47): registering the class is all it takes for the config to accept its name (and
    refuse a --set of a setting it does not read), the loop to run it, and `flexsearch list` to show it."""
    monkeypatch.setitem(SEARCH_METHODS._entries, "first_templates", FirstTemplates)  # undone after the test
    FirstTemplates.name = "first_templates"  # type: ignore[attr-defined]  (what the register decorator sets)
    config = load_config("default", FAST[1::2], method="first_templates", budget=12, control=False)
    ctx = build_context(config, Scorer.in_process(tiny_target, average_orders=True), "stereotype")
    outcomes = run_search(seed_items[:3], ctx, "stereotype")
    assert all(o.queries <= 12 for o in outcomes) and any(o.best.edits for o in outcomes)
    assert {e.operator for o in outcomes for e in o.best.edits} == {"persona"}  # only what the toy proposes
    assert "first_templates" in api.registries()["search methods"]
    with pytest.raises(FlexsearchError, match="field 'population': is read by methods evolutionary, first_templates, "
                                              "learned and random only; this search's method is beam"):
        load_config("beam", ["population=4"])
    with pytest.raises(FlexsearchError, match="Did you mean 'first_templates'"):
        load_config("default", method="first_template")


def test_a_new_operator_is_one_class_and_its_registration(tiny_target, seed_items, monkeypatch):
    """The operator seam (issue 47): a word operator is a WordOperator subclass with `replacements`, registered by
    name; the config accepts it, the search proposes its edits with their provenance, `flexsearch list` shows it."""
    from flexsearch.attacks import OPERATORS
    from flexsearch.attacks.word import WordOperator

    class Shout(WordOperator):
        """Upper-cases one word (a toy operator)."""

        positions, per_position = 1, 1

        def __init__(self, resources, **settings) -> None:
            pass

        def replacements(self, words, index, rng):
            return [(words[index].upper(), {"how": "upper"})]

    monkeypatch.setitem(OPERATORS._entries, "shout", Shout)  # undone after the test
    Shout.name = "shout"  # type: ignore[attr-defined]  (what the register decorator sets)
    config = load_config("default", [*FAST[1::2], "operators=[shout]", "families=[]"], method="random", budget=12,
                         control=False)
    ctx = build_context(config, Scorer.in_process(tiny_target), "stereotype")
    outcomes = run_search(seed_items[:3], ctx, "stereotype")
    edits = [e for o in outcomes for e in o.best.edits]
    assert edits and all(e.operator == "shout" and e.after == e.before.upper() and dict(e.args) == {"how": "upper"}
                         for e in edits)
    assert "shout" in api.registries()["operators"]


def test_a_new_objective_is_one_class_and_its_registration(tiny_target, seed_items, monkeypatch):
    """The objective seam (issue 47): a class with target_answer, value, flipped and success, registered by name;
    the config accepts it and the search judges success by it."""
    from flexsearch.objectives import OBJECTIVES, SUCCESS_MARGIN

    class TowardFirstListed:
        """Push toward whichever answer is listed first (a toy objective)."""

        def __init__(self, margin: float = SUCCESS_MARGIN) -> None:
            self.margin = margin

        def target_answer(self, item):
            return 0

        def value(self, probs, item):
            return float(np.log(max(probs[0], 1e-12)) - np.log(max(probs[1], probs[2], 1e-12)))

        def flipped(self, probs, item):
            return int(np.argmax(probs)) == 0

        def success(self, probs, item):
            return float(probs[0] - max(probs[1], probs[2])) > self.margin

    monkeypatch.setitem(OBJECTIVES._entries, "toward_first", TowardFirstListed)
    TowardFirstListed.name = "toward_first"  # type: ignore[attr-defined]
    config = load_config("default", FAST[1::2], objective="toward_first", budget=12, control=False)
    ctx = build_context(config, Scorer.in_process(tiny_target), "toward_first")
    outcomes = run_search(seed_items[:6], ctx, "toward_first")
    judged = [o for o in outcomes if o.success]
    assert all(o.best_probs[0] - max(o.best_probs[1:]) > SUCCESS_MARGIN for o in judged)
    assert all(not o.success for o in outcomes if o.best_probs[0] - max(o.best_probs[1:]) <= SUCCESS_MARGIN)
    assert "toward_first" in api.registries()["objectives"]
    with pytest.raises(FlexsearchError, match="Did you mean 'toward_first'"):
        load_config("default", objective="toward_frist")


def test_config_precedence_and_errors():
    config = load_config("default", ["budget=7", "scoring.batch_size=3"], budget=9)
    assert config.budget == 9 and config.scoring.batch_size == 3 and config.method == "learned"
    with pytest.raises(FlexsearchError, match="unknown setting"):
        load_config("default", ["beam_widht=3"])
    with pytest.raises(FlexsearchError, match="unknown config preset"):
        load_config("nope")
    for preset in ("default", "beam", "flex", "textbugger", "bert_attack", "templates_only", "gradient", "research"):
        assert load_config(preset).budget >= 2


def test_the_budget_is_checked_by_one_rule_with_the_cost_of_a_prompt_and_the_data(seed_items):
    """One rule (config.least_budget): two candidates' cost, times the samples a served sample mode scores each
    prompt with, and greedy leave-one-out's probes of the item with fewest editable words once the data is known."""
    from flexsearch.config import check_budget, least_budget

    config = load_config("default", budget=11)  # order averaging: a candidate costs 3 queries
    assert least_budget(config)[0] == 6 and least_budget(config, per_prompt=2)[0] == 12
    check_budget(config)
    with pytest.raises(FlexsearchError, match=r"^--budget 11 cannot reach any operator: each candidate costs 6 "
                                              r"queries \(one per option order scored, times the samples each "
                                              r"prompt is scored\), so the clean prompt alone takes 6 queries; give "
                                              r"at least 12$"):
        check_budget(config, per_prompt=2)
    with pytest.raises(FlexsearchError, match="config: field 'budget': 5 cannot reach any operator"):
        check_budget(replace(config, budget=5), Origins())
    greedy = load_config("textbugger", budget=12)
    floor, why = least_budget(greedy, items=seed_items[:4])
    assert floor > 12 and why.startswith("greedy word importance first scores one probe per editable word")
    assert least_budget(greedy)[0] == 2 * 3  # before the data is known, only the candidates' cost


def test_a_setting_the_method_never_reads_is_refused_only_where_the_user_gave_it():
    """--set beam_width on the learned search is refused (issue 46); the beam preset's own beam_width under another
    --method is the preset's, and a setting every named method reads passes."""
    with pytest.raises(FlexsearchError, match=r"--set beam_width=3: field 'beam_width': is read by method beam only"):
        load_config("default", ["beam_width=3"])
    with pytest.raises(FlexsearchError, match="field 'steps': is read by methods beam, evolutionary, learned and "
                                              "random only"):
        load_config("textbugger", ["steps=3"])
    assert load_config("beam", method="random").method == "random"  # the preset's beam_width stays unread
    assert load_config("beam", ["beam_width=3"]).beam_width == 3
    assert load_config("default", ["population=4", "coverage=0.2"]).population == 4


@pytest.mark.parametrize(("operator", "message"), [
    ("{name: textbugger, bugs: [swap, flip]}", "(textbugger): unknown bugs ['flip']"),
    ("{name: textbugger, neighbours: glove}", "(textbugger): unknown neighbours 'glove'"),
    ("{name: textbugger, per_position: 0}", "(textbugger): positions, per_position and k must be at least 1"),
    ("{name: persona, families: [pirate]}", "(persona): unknown families ['pirate']"),
    ("{name: persona, n: 0}", "(persona): n must be at least 1"),
    ("{name: instruction, n: 0}", "(instruction): n must be at least 1"),
    ("{name: adversarial_suffix, swaps: 0}", "(adversarial_suffix): length, top_k and swaps must be at least 1"),
])
def test_operator_settings_that_cannot_work_are_refused_with_the_config(operator, message):
    """The config alone refuses them: no data, model or operator is built first."""
    with pytest.raises(FlexsearchError, match=re.escape(message)):
        load_config("default", [f"operators=[{operator}]"])


def test_changed_settings_refuse_to_resume(tiny_run, tiny_model_dir):
    result = runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "10",
                                 "--budget", "15", "--out", str(tiny_run), *FAST])
    assert result.exit_code == 2 and "different settings (search.budget)" in result.output


def test_resume_after_kill_equals_uninterrupted_run(tiny_model_dir, tmp_path, cli_signalling_after):
    args = ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "24", "--budget", "14",
            "--set", "item_batch=2", "--set", "learner_round=4", *FAST]
    cli = [sys.executable, "-m", "flexsearch.cli"]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    subprocess.run([*cli, *args, "--out", str(tmp_path / "whole")], check=True, env=env, capture_output=True)
    killed = subprocess.run([*cli_signalling_after("append_jsonl", 3, "SIGKILL"), *args, "--out",
                             str(tmp_path / "resumed")], env=env, capture_output=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # the limit only guards against a hang
    trace = tmp_path / "resumed" / "trace.jsonl"
    assert len(trace.read_text().splitlines()) == 6  # killed as its third batch of 2 reached the trace
    subprocess.run([*cli, *args, "--out", str(tmp_path / "resumed")], check=True, env=env, capture_output=True)
    whole = [json.loads(x) for x in (tmp_path / "whole" / "split.jsonl").read_text().splitlines()]
    resumed = [json.loads(x) for x in (tmp_path / "resumed" / "split.jsonl").read_text().splitlines()]
    assert [r["attack_chain"] for r in whole] == [r["attack_chain"] for r in resumed]
    assert np.allclose([r["p_target_attacked"] for r in whole], [r["p_target_attacked"] for r in resumed], atol=1e-5)
    families = [[json.loads(x) for x in (tmp_path / run / "split-families.jsonl").read_text().splitlines()]
                for run in ("whole", "resumed")]
    assert families[0] and [(r["item_id"], r["family"], r["attack_chain"]) for r in families[0]] == \
        [(r["item_id"], r["family"], r["attack_chain"]) for r in families[1]]
    assert len((tmp_path / "resumed" / "trace.jsonl").read_text().splitlines()) == 48


def test_api_search_replays_chain(tiny_run, tiny_target):
    row = load_split(tiny_run / "split.jsonl")[0]
    assert replay(row.item, row.record["attack_chain"], tuple(row.record["option_order"])) == row.candidate
    assert api.registries()["operators"]


def test_first_success_is_dated_at_its_own_candidate(seed_items):
    from flexsearch.data.candidate import Candidate
    from flexsearch.engine.state import ItemState, Request
    from flexsearch.objectives import get_objective

    item = seed_items[0]
    state = ItemState(item, get_objective("stereotype"), np.random.default_rng(0), budget=30, cost_per_candidate=3)
    root = Candidate.root(item)
    clean = np.eye(3)[item.gold]
    state.record(Request([root]), clean[None])
    children = [root.with_slot("persona", "persona", f"You are person {k}.") for k in range(3)]
    probs = np.array([np.eye(3)[item.gold], np.eye(3)[item.target], np.eye(3)[item.target]])
    state.record(Request(children), probs)
    assert state.first_success_query == 3 + 2 * 3  # the clean prompt, then the second child
    assert state.queries == 3 + 3 * 3  # the whole request is charged


def test_the_emitted_prompt_is_a_success_when_the_search_scored_one(seed_items):
    """Near the margin the highest-valued prompt (log-odds of the aim) can fall short of the margin while another
    prompt meets it (a test-split item at budget 100 did): the item emits the success, and the learned search
    still climbs from the highest-valued prompt."""
    from flexsearch.data.candidate import Candidate
    from flexsearch.engine.state import ItemState, Request
    from flexsearch.objectives import get_objective

    item = seed_items[0]
    goal = get_objective("stereotype")
    state = ItemState(item, goal, np.random.default_rng(0), budget=30, cost_per_candidate=3)
    root = Candidate.root(item)
    state.record(Request([root]), np.eye(3)[item.gold][None])
    higher, succeeding = (root.with_slot("persona", "persona", f"You are person {k}.") for k in range(2))
    other = 3 - item.gold - item.target
    close, over = np.zeros(3), np.zeros(3)
    close[[item.target, item.gold, other]] = 0.3673, 0.3184, 0.3143  # ahead by 0.049: no success
    over[[item.target, item.gold, other]] = 0.3934, 0.3421, 0.2645  # ahead by 0.051: a success
    assert goal.value(close, item) > goal.value(over, item)
    assert not goal.success(close, item) and goal.success(over, item)
    state.record(Request([higher, succeeding]), np.array([close, over]))
    assert state.best == higher  # where the search climbs from
    outcome = state.outcome("stereotype")
    assert outcome.best == succeeding and outcome.success and state.first_success_query == 9
    assert outcome.to_record()["success"] is True
    state.record(Request([root.with_slot("persona", "persona", "You are person 9.")]), close[None])
    assert state.outcome("stereotype").best == succeeding  # a failure never displaces a success


def test_a_screened_out_candidate_costs_one_prompt_and_teaches_its_displayed_order_gain(seed_items):
    from flexsearch.data.candidate import Candidate
    from flexsearch.engine.state import ItemState, Request, Screen
    from flexsearch.objectives import get_objective

    item = seed_items[0]
    state = ItemState(item, get_objective("stereotype"), np.random.default_rng(0), budget=30, cost_per_candidate=3)
    root = Candidate.root(item)
    clean, clean_shown = np.eye(3)[item.gold], np.array([0.2, 0.2, 0.2])
    clean_shown[item.gold] = 0.4  # the displayed order alone: the gold ahead by 0.2, so the aim's lead is -0.2
    state.record(Request([root]), clean[None], Screen(clean_shown[None], np.array([-0.2]), np.array([False])))
    children = [root.with_slot("persona", "persona", f"You are person {k}.") for k in range(2)]
    shown = np.full((2, 3), 0.1)
    shown[:, item.gold] = 0.8  # aim lead -0.7 in the displayed order
    probs = np.array([shown[0], np.eye(3)[item.target]])
    state.record(Request(children), probs, Screen(shown, np.array([-0.7, -0.7]), np.array([True, False])))
    assert state.queries == 3 + 1 + 3 and state.screened == 1
    assert state.first_success_query == 3 + 1 + 3 and state.best is children[1]
    screened, full = state.observations
    assert screened.gain == pytest.approx(-0.7 - -0.2) and not screened.success  # displayed order against itself
    assert full.gain == pytest.approx(1 - -1) and full.success  # order-averaged, as without a screen
    assert state.outcome("stereotype").to_record()["screened"] == 1


@pytest.mark.parametrize(("method", "screen_lead"), [("learned", -1.0), ("learned", 0.5), ("random", 0.5),
                                                    ("beam", 0.5)])
def test_the_screen_pays_only_for_the_prompts_it_scores(tiny_target, seed_items, method, screen_lead):
    config = replace(load_config("default", FAST[1::2], budget=21, control=False, screen_lead=screen_lead),
                     method=method)  # every method honours the screen: a baseline can have the same pruning
    outcomes, charged = [], []
    for batch in (4, 3):
        scorer = Scorer.in_process(tiny_target, average_orders=True)
        ctx = build_context(replace(config, item_batch=batch), scorer, "stereotype")
        outcomes.append(run_search(seed_items[:6], ctx, "stereotype"))
        charged.append(scorer.queries)
    for first, second in zip(*outcomes, strict=True):  # batching does not change what the screen does
        assert first.best.chain() == second.best.chain() and first.screened == second.screened
        assert first.queries <= 21
        scored = len(first.observations) + 1  # every candidate, and the clean prompt
        assert first.queries == 3 * (scored - first.screened) + first.screened
    screened = sum(o.screened for o in outcomes[0])
    assert (screened > 0) == (screen_lead > -1)  # the tiny model's leads sit near 0: 0.5 screens, -1 never
    # An item pays for exactly the prompts the scorer scored: the screened-out ones' other orders never were.
    assert charged[0] == sum(o.queries for o in outcomes[0])


@pytest.mark.parametrize(("step", "at", "said"), [
    ("append_jsonl", 2, r"interrupted after 4 of 48 item searches; the finished ones are kept in \S*trace.jsonl: "
                        r"rerun the same command to resume"),
    ("_write_family_split", 1, r"interrupted while writing the outputs; all 48 item searches are kept in "
                               r"\S*trace.jsonl: rerun the same command to write them")],
    ids=["mid-search", "while-writing-the-outputs"])
def test_ctrl_c_says_what_was_kept_and_how_to_resume(tiny_model_dir, tmp_path, cli_signalling_after, step, at, said):
    out = tmp_path / "interrupted"
    args = ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "24", "--budget", "14",
            "--set", "item_batch=2", *FAST, "--out", str(out)]
    env = {**os.environ, "TQDM_DISABLE": "1", "NO_COLOR": "1"}
    interrupted = subprocess.run([*cli_signalling_after(step, at, "SIGINT"), *args], env=env, capture_output=True,
                                 text=True, timeout=600)
    assert interrupted.returncode == 130, interrupted.stderr
    lines = [line for line in interrupted.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(said, lines[0]), interrupted.stderr  # one line, no traceback
    assert not (out / ".lock").exists() and not (out / "score.json").exists()
    rerun = subprocess.run([sys.executable, "-m", "flexsearch.cli", *args], env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert len((out / "trace.jsonl").read_text().splitlines()) == 48 and (out / "score.json").is_file()


def test_a_budget_that_never_reaches_an_operator_is_refused_or_said(tiny_model_dir, tmp_path):
    from flexsearch.attacks.constraints import editable_positions
    from flexsearch.data.candidate import Candidate

    args = ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "3", "--config", "textbugger",
            "--set", "constraints=[protected_spans]", "--set", "operators=[{name: textbugger, bugs: [swap]}]"]
    refused = runner.invoke(app, [*args, "--budget", "12", "--out", str(tmp_path / "small")])
    words = [len(editable_positions(Candidate.root(it))) for it in load_items("seed", limit=3).items]
    needed = 3 * (min(words) + 2)  # the clean prompt, one probe per editable word, one edit; 3 orders each
    assert refused.exit_code == 2 and f"give at least {needed}" in refused.output
    assert not (tmp_path / "small").exists()
    output = run_cli([*args, "--budget", str(needed), "--out", str(tmp_path / "tb")])
    score = json.loads((tmp_path / "tb" / "score.json").read_text())
    short = sum(w > min(words) for w in words)  # their probes alone overrun the budget
    assert score["untried_items"]["stereotype"] == short
    assert (f"warning: {short} of 3 items tried no attack toward stereotype" in output) == (short > 0)


def test_an_item_already_at_its_aim_when_clean_is_not_counted_untried(tiny_model_dir, tmp_path):
    """A search stops at once when the clean prompt already reaches the aim: not a budget that ran out."""
    run_cli(["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "24", "--budget", "30",
             "--out", str(tmp_path / "run")])
    score = json.loads((tmp_path / "run" / "score.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "run" / "trace.jsonl").read_text().splitlines()]
    at_aim = [r for r in records if r["queries"] <= 3 and r["success"]]
    assert at_aim  # the tiny model answers some items with the aim when clean (else this checks nothing)
    for objective in ("stereotype", "anti_stereotype"):
        expected = sum(r["queries"] <= 3 and not r["success"] for r in records if r["objective"] == objective)
        assert score["untried_items"][objective] == expected


def test_a_system_slot_search_records_the_slot_everywhere(tiny_model_dir, tmp_path):
    out = tmp_path / "system"
    refused = runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--limit", "4", "--slot", "system",
                                  "--out", str(out)])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "--slot: field 'scoring.slot': system puts the attack in a system message" in refused.output
    assert not out.exists()
    run_cli(["search", "--model", str(tiny_model_dir), "--limit", "4", "--budget", "12", "--slot", "system",
             "--set", "scoring.mode=chat", *FAST, "--out", str(out)])
    config = yaml.safe_load((out / "config.yaml").read_text())
    score = json.loads((out / "score.json").read_text())
    rows = [json.loads(line) for line in (out / "split.jsonl").read_text().splitlines()]
    template = score["model"]["prompt_format"]["chat_template_sha256"]
    assert config["scoring"]["slot"] == "system" and config["model"]["prompt_format"]["slot"] == "system"
    assert score["model"]["prompt_format"] == {"mode": "chat", "slot": "system", "chat_template_sha256": template,
                                               "system_role": True}
    assert rows and all(r["slot"] == "system" and r["chat_template_sha256"] == template for r in rows)
    attacked = [r for r in rows if r["instruction"]]
    assert all(r["prompt"].startswith(f"<|system|>{r['instruction']}<|end|>") for r in attacked)
    page, _ = build_report([out])
    assert f"chat, the attack in the system message; template sha256 {template[:12]}" in page
